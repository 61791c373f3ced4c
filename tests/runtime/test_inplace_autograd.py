"""In-place writes and eager autograd: version counters, dirty inputs, mutations in a custom backward."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import InplaceError, MinijitError


def scale_in_place(p):
    p.mul_(3)
    return p.sum()


def scale_and_return(p):
    p.mul_(3)
    return p


def _run(fn, use_jit):
    """Call fn on a non-leaf p = 2x, then use p again afterwards; the grads of x and what p became."""
    x = torch.arange(1.0, 4.0, dtype=torch.float64, requires_grad=True)
    p = x * 2
    out = (minijit.jit(fn) if use_jit else fn)(p)
    loss = out.sum() + (p * p).sum()  # reads p after the call: its history must include the write
    loss.backward()
    return out.detach(), p.detach(), x.grad, out is p


@pytest.mark.parametrize("fn", [scale_in_place, scale_and_return])
def test_writing_a_non_leaf_input_that_requires_grad(fn):
    expected = _run(fn, use_jit=False)
    got = _run(fn, use_jit=True)
    for e, g in zip(expected, got):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(g, e)
        else:
            assert g == e


def test_softmax_output_modified_by_jitted_function_raises_like_eager():
    # softmax saves its output; writing into it must make backward refuse, never give a wrong grad.
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        scale_in_place(torch.softmax(x, 0)).backward()
    p = torch.softmax(x, 0)
    version = p._version
    loss = minijit.jit(scale_in_place)(p)
    assert p._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_leaf_that_requires_grad_cannot_be_written():
    leaf = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        scale_in_place(leaf)
    with pytest.raises(InplaceError, match="leaf Variable that requires grad"):
        minijit.jit(scale_in_place)(leaf)
    # Traced for a non-leaf first, then called with a leaf: refused at call time, leaf untouched.
    jf = minijit.jit(scale_in_place)
    jf(torch.ones(3, requires_grad=True) * 1)
    with pytest.raises(InplaceError, match="leaf Variable that requires grad"):
        jf(leaf)
    torch.testing.assert_close(leaf.detach(), torch.ones(3))


def test_leaf_may_be_written_under_no_grad():
    leaf, leaf_eager = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    with torch.no_grad():
        out = minijit.jit(scale_in_place)(leaf)
        expected = scale_in_place(leaf_eager)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(leaf.detach(), leaf_eager.detach())


def test_saved_input_overwritten_by_the_forward_raises_at_backward_like_eager():
    def f(x, w):
        y = (x * w).sum()  # saves x for w's gradient
        x.mul_(2)
        return y

    for fn in (f, minijit.jit(f)):
        x, w = torch.ones(3), torch.randn(3, requires_grad=True)
        loss = fn(x, w)
        torch.testing.assert_close(x, torch.full((3,), 2.0))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_recomputation_never_reads_an_overwritten_input():
    def f(x, w):
        z = x * 2  # cheap: recomputed from x in the backward, unless x is overwritten
        y = (z * w).sum()
        x.add_(1)
        return y

    x, w = torch.ones(3), torch.randn(3, requires_grad=True)
    x_e, w_e = x.clone(), w.detach().clone().requires_grad_()
    minijit.jit(f)(x, w).backward()
    f(x_e, w_e).backward()
    torch.testing.assert_close(w.grad, w_e.grad)
    torch.testing.assert_close(x, x_e)


# -- a custom Function whose backward writes into a forward input --------------------------------


class AccumulateInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, buf):
        ctx.save_for_backward(buf)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (buf,) = ctx.saved_tensors
        buf.add_(g)  # data mutation of a forward input
        return g * 2, None


def accumulate(x, buf):
    return AccumulateInBackward.apply(x, buf).sum()


def test_backward_writes_into_a_forward_input_like_eager():
    results = []
    for fn in (accumulate, minijit.jit(accumulate)):
        x, buf = torch.randn(3, requires_grad=True), torch.zeros(3)
        loss = fn(x, buf)
        version = buf._version
        loss.backward()
        results.append((x.grad, buf.clone(), buf._version > version))
    (eg, ebuf, ebumped), (jg, jbuf, jbumped) = results
    torch.testing.assert_close(jg, eg)
    torch.testing.assert_close(jbuf, ebuf)
    assert ebumped and jbumped


def test_backward_mutation_of_an_input_requiring_grad_under_create_graph_raises():
    jf = minijit.jit(accumulate)
    x, buf = torch.randn(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    loss = jf(x, buf)
    entry = jf._entries[next(iter(jf._entries))][0]
    # The run-time check is generated for the inputs the backward writes, known when the entry was compiled.
    assert entry.epilogue.grad.backward_mutated_inputs == (1,)
    assert "(('buf', buf),)" in entry.epilogue.source
    with pytest.raises(MinijitError, match="writes in place into buf, which requires grad"):
        loss.backward(create_graph=True)
    # Without grad mode in the backward, the same write is allowed (eager allows it too).
    x2, buf2 = torch.randn(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    jf(x2, buf2).backward()
    torch.testing.assert_close(buf2.detach(), torch.ones(3))


def test_metadata_mutation_in_backward_is_a_trace_time_error():
    class Transposing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            x.t_()
            return g * 2

    def f(x):
        return Transposing.apply(x).sum()

    with pytest.raises(MinijitError, match=r"t_"):
        minijit.jit(f)(torch.randn(2, 3, requires_grad=True))


def test_triton_kernel_writes_bump_the_version_counter():
    pytest.importorskip("triton", reason="the triton extra is not installed")

    def f(p, x):
        p.add_(x)
        return p.sum()

    # p does not require grad, but the product saved it for x's gradient.
    x, p = torch.randn(4, requires_grad=True), torch.randn(4)
    y = (x * p).sum()
    version = p._version
    minijit.jit(f, executors=["triton"])(p, torch.ones(4))  # a Triton kernel writes p
    assert p._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def write_into_a_view(p, w):
    p[0].add_(w)
    return (p * w).sum()


def test_writing_a_view_of_a_non_leaf_input():
    results = []
    for fn in (write_into_a_view, minijit.jit(write_into_a_view)):
        x = torch.arange(1.0, 4.0, dtype=torch.float64, requires_grad=True)
        w = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
        p = x * 2
        out = fn(p, w)
        (out + (p * p).sum()).backward()
        results.append((out.detach(), p.detach(), x.grad, w.grad))
    for e, g in zip(*results):
        torch.testing.assert_close(g, e)


def _copy_sum(x, buf):
    buf.copy_(x.sum(0))
    return buf


def _add_sum_scaled(x, buf):
    buf.add_(x.sum(0))
    return buf * 2


def _setitem_then_other_output(x, buf):
    buf[1:3] = x[0, :2]
    return x.mean()


def _write_into_a_view(x, buf):
    buf[0].copy_(x[1])
    return buf.sum()


def _write_under_no_grad(x, buf):
    with torch.no_grad():
        buf.copy_(x.sum(0))
    return x.mean() + buf.sum()


@pytest.mark.parametrize("fn", [_copy_sum, _add_sum_scaled, _setitem_then_other_output, _write_into_a_view,
                                _write_under_no_grad])
def test_an_input_not_requiring_grad_takes_the_history_of_what_is_written_into_it(fn):
    # Eager: `buf.copy_(value requiring grad)` makes buf require grad, with the value's history; a loss
    # that reads buf afterwards differentiates through it into x.
    jf = minijit.jit(fn)
    for _ in range(2):
        results = []
        for run in (fn, jf):
            torch.manual_seed(0)
            x = torch.randn(3, 4, requires_grad=True)
            buf = torch.zeros(3, 4) if fn is _write_into_a_view else torch.zeros(4)
            out = run(x, buf)
            (out.sum() + (buf * buf).sum()).backward()
            results.append((out.detach(), buf.detach(), buf.requires_grad, x.grad))
        (want_out, want_buf, want_rg, want_grad), (out, buf, rg, grad) = results
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(buf, want_buf)
        assert rg == want_rg
        torch.testing.assert_close(grad, want_grad)


def _aten_batch_norm_legit(x, w, b, mean, var):
    return torch.ops.aten._native_batch_norm_legit(x, w, b, mean, var, True, 0.1, 1e-5)[0]


def _aten_batch_norm_with_update(x, w, b, mean, var):
    return torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.1, 1e-5)[0]


@pytest.mark.parametrize("fn", [_aten_batch_norm_legit, _aten_batch_norm_with_update])
def test_running_statistics_an_aten_op_writes_take_no_history(fn):
    # Torch's autograd does not differentiate the running statistics a batch norm writes (an opaque op here, whose
    # outputs require grad as autograd says on its meta run): the buffers stay without history, as in eager.
    results = []
    for run in (fn, minijit.jit(fn)):
        torch.manual_seed(0)
        x, w, b = (torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True),
                   torch.randn(3, requires_grad=True))
        mean, var = torch.zeros(3), torch.ones(3)
        run(x, w, b, mean, var).sum().backward()
        results.append((mean, var, x.grad, w.grad))
    (want_mean, want_var, want_x, want_w), (mean, var, grad_x, grad_w) = results
    assert (mean.requires_grad, mean.grad_fn, var.requires_grad) == (want_mean.requires_grad, None, want_var.requires_grad)
    torch.testing.assert_close(mean, want_mean)
    torch.testing.assert_close(var, want_var)
    torch.testing.assert_close(grad_x, want_x)
    torch.testing.assert_close(grad_w, want_w)


@pytest.mark.parametrize("overwrite", [
    lambda y: y.zero_(), lambda y: y.fill_(2.0), lambda y: y.copy_(torch.ones(3, 4)),
    lambda y: y.__setitem__(slice(None), 1.0), lambda y: y.fill_(torch.tensor(3.0)),
], ids=["zero_", "fill_", "copy_ of a constant", "setitem of everything", "fill_ with a 0-d tensor"])
def test_a_tensor_requiring_grad_overwritten_whole_stays_in_the_graph(overwrite):
    # Eager's in-place op keeps the tensor in the graph: the result requires grad, and the tensors before it get a
    # zero gradient (not None: an optimizer steps a parameter with a zero gradient, and skips one with None).
    def fn(x, w):
        y = x * 2
        overwrite(y)
        return y * w

    results = []
    for run in (fn, minijit.jit(fn)):
        torch.manual_seed(0)
        x, w = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
        out = run(x, w)
        requires = out.requires_grad
        out.sum().backward()
        results.append((out.detach(), requires, x.grad, w.grad))
    (want, want_requires, want_x, want_w), (have, requires, grad_x, grad_w) = results
    torch.testing.assert_close(have, want)
    assert requires == want_requires
    assert (grad_x is None) == (want_x is None)
    torch.testing.assert_close(grad_x, want_x)
    torch.testing.assert_close(grad_w, want_w)
