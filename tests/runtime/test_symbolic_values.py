"""The "symbolic values" cache mode: sizes and Python numbers are traced, so new sizes reuse the trace."""

import pytest
import torch

import minijit


def _affine(x, w, scale):
    return (x * w + scale).sum(dim=-1) * scale


def test_new_sizes_and_numbers_reuse_one_trace():
    jf = minijit.jit(_affine, cache="symbolic values")
    for n, d, scale in [(3, 4, 0.5), (5, 4, 2.0), (7, 9, -1.0), (2, 16, 3.5)]:
        x, w = torch.randn(n, d), torch.randn(d)
        torch.testing.assert_close(jf(x, w, scale), _affine(x, w, scale))
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (1, 3)


def test_trace_binds_sizes_with_prims_shape():
    jf = minijit.jit(_affine, cache="symbolic values")
    jf(torch.randn(3, 4), torch.randn(4), 2.0)
    capture = minijit.last_traces(jf)[0].python()
    assert "(i0, i1) = prims.shape(x)" in capture
    assert "(i2,) = prims.shape(w)" in capture
    assert "def _affine(x, w, scale):" in capture


def test_size_one_is_specialised_and_explained():
    jf = minijit.jit(_affine, cache="symbolic values")
    jf(torch.randn(3, 4), torch.randn(4), 2.0)
    jf(torch.randn(3, 1), torch.randn(1), 2.0)  # broadcasting behaves differently with size 1
    info = minijit.cache_info(jf)
    assert info.misses == 2
    assert info.miss_reasons[1] == "constraint failed: x.shape[1] > 1; w.shape[0] > 1"


def test_broken_equality_constraint_retraces():
    def f(a, b):
        return a + b  # relies on a.shape[-1] == b.shape[-1]

    jf = minijit.jit(f, cache="symbolic values")
    torch.testing.assert_close(jf(torch.ones(2, 3), torch.ones(3)), torch.full((2, 3), 2.0))
    torch.testing.assert_close(jf(torch.ones(4, 5), torch.ones(5)), torch.full((4, 5), 2.0))
    assert minijit.cache_info(jf).misses == 1
    with pytest.raises(minijit.MetaError, match="cannot be broadcast"):
        jf(torch.ones(4, 5), torch.ones(3))
    assert "constraint failed: a.shape[1] == b.shape[0]" in minijit.cache_info(jf).miss_reasons[1]


def test_branch_on_a_size_is_guarded():
    def f(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    jf = minijit.jit(f, cache="symbolic values")
    for n in (6, 8, 3, 2, 9):
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), f(x))
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 3)
    assert "constraint failed: x.shape[0] > 4" in info.miss_reasons[1]
    assert "x_shape[0] > 4" in jf.last_prologue()  # the last call (n=9) used the first entry


def test_python_int_used_as_a_size_is_specialised():
    def f(x, n):
        return x.sum(dim=0) * len(range(n))

    jf = minijit.jit(f, cache="symbolic values")
    x = torch.randn(3, 2)
    torch.testing.assert_close(jf(x, 2), f(x, 2))
    torch.testing.assert_close(jf(x, 2), f(x, 2))
    torch.testing.assert_close(jf(x, 5), f(x, 5))
    assert minijit.cache_info(jf).misses == 2


def test_unsqueeze_add_trace_from_the_issue():
    def foo(a, b):
        a = a.unsqueeze(1)
        return a + b

    jf = minijit.jit(foo, cache="symbolic values")
    for sa, sb in [((1, 3, 4), (3, 3, 4)), ((1, 5, 6), (5, 5, 6)), ((1, 2, 7), (4, 2, 7))]:
        a, b = torch.randn(sa), torch.randn(sb)
        torch.testing.assert_close(jf(a, b), foo(a, b))
    assert minijit.cache_info(jf).misses == 1
    capture = minijit.last_traces(jf)[0].python()
    assert "(i0, i1, i2) = prims.shape(a)" in capture  # a size traced at 1 stays symbolic too
    prologue = jf.last_prologue()
    assert "a_shape[1] == a_shape[1]" not in prologue
    assert "a_shape[1] == b_shape[1]" in prologue


def test_unsqueeze_add_backward_serves_other_sizes():
    def foo(a, b):
        a = a.unsqueeze(1)
        return a + b

    jf = minijit.jit(foo, cache="symbolic values")
    for sa, sb in [((1, 3, 4), (3, 3, 4)), ((1, 5, 6), (5, 5, 6))]:
        a, b = torch.randn(sa, requires_grad=True), torch.randn(sb, requires_grad=True)
        ea, eb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        out, expected = jf(a, b), foo(ea, eb)
        torch.testing.assert_close(out, expected)
        g = torch.randn_like(expected)
        out.backward(g)
        expected.backward(g)
        torch.testing.assert_close(a.grad, ea.grad)
        torch.testing.assert_close(b.grad, eb.grad)
    assert minijit.cache_info(jf).misses == 1
    assert "prims.shape(a)" in str(minijit.last_traces(jf)[0])
    assert minijit.last_backward_traces(jf)


def test_backward_reads_sizes_that_the_forward_does_not():
    # The forward never reads x's size (dce drops its prims.shape), the sum's VJP does.
    def f(x):
        return (x.sin() * 2.0).sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n in (3, 5):
        x = torch.randn(n, dtype=torch.float64, requires_grad=True)
        jf(x).backward()
        x_eager = x.detach().requires_grad_()
        f(x_eager).backward()
        torch.testing.assert_close(x.grad, x_eager.grad)
    assert minijit.cache_info(jf).misses == 1


def test_backward_reads_a_size_the_forward_computes_but_never_reads():
    # split's chunk sizes are arithmetic on x's sizes that only the chunks' shapes mention; dce
    # must keep it, as the backward of split needs those sizes (it failed with a NameError).
    def f(x, w):
        q, k, v = (x @ w).split(4, dim=-1)
        return (q * k).sum() + v.sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n in (3, 5):
        x, w = torch.randn(2, n, 6, requires_grad=True), torch.randn(6, 12, requires_grad=True)
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        jf(x, w).backward()
        f(xe, we).backward()
        torch.testing.assert_close((x.grad, w.grad), (xe.grad, we.grad))
    assert minijit.cache_info(jf).misses == 1


def test_passes_know_sizes_equal_through_a_chain_of_constraints():
    # Functionalized, `c` is `a`'s value: `c + b` asks whether a's and b's sizes are equal, which
    # the capture knew only as a.shape == c.shape and c.shape == b.shape.
    def f(a, b, c):
        d = c.copy_(a)
        return d + b

    jf = minijit.jit(f, cache="symbolic values")
    for n in (4, 6):
        a, b, c = torch.randn(n, n), torch.randn(n), torch.randn(n, n)
        c2 = c.clone()
        torch.testing.assert_close(jf(a, b, c), f(a, b, c2))
        torch.testing.assert_close(c, c2)
    assert minijit.cache_info(jf).misses == 1


def test_view_minus_one_of_a_regenerated_view():
    # After x is written, the view is rebuilt from x's new value; `view(-1)` needs no divisibility check.
    def f(x, y):
        v = x.unsqueeze(0)
        x.copy_(y + 1)
        v.transpose(0, 1).view(-1).fill_(2.0)
        return x, v

    jf = minijit.jit(f, cache="symbolic values")
    for shape in ((2, 3, 6), (3, 4, 5)):
        x, y = torch.randn(shape), torch.randn(shape)
        x2 = x.clone()
        for got, expected in zip(jf(x, y), f(x2, y), strict=True):
            torch.testing.assert_close(got, expected)
