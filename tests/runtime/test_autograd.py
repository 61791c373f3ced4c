"""The torch.autograd.Function bridge: outputs, saved tensors, errors, memory."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.ops import ltorch, prims

F64 = torch.float64


def test_nested_outputs_with_non_differentiable_leaves():
    def f(x, w):
        h = ltorch.linear(x, w)
        return {"loss": (h * h).sum(), "hidden": h, "argmax": prims.argmax(h, 1), "n": 3}

    x = torch.randn(4, 3, dtype=F64)
    w = torch.randn(2, 3, dtype=F64, requires_grad=True)
    out = minijit.jit(f)(x, w)
    h = x @ w.T
    assert out["n"] == 3
    assert torch.equal(out["argmax"], h.argmax(1)) and out["argmax"].grad_fn is None
    torch.testing.assert_close(out["hidden"], h)
    g_loss, g_hidden = torch.randn((), dtype=F64), torch.randn(4, 2, dtype=F64)
    (got,) = torch.autograd.grad((out["loss"], out["hidden"]), (w,), (g_loss, g_hidden))
    (want,) = torch.autograd.grad(((h * h).sum(), h), (w,), (g_loss, g_hidden))
    torch.testing.assert_close(got, want)


def test_output_used_twice_and_input_returned():
    def f(x):
        y = x.exp()
        return y, y, x

    x = torch.randn(3, dtype=F64, requires_grad=True)
    a, b, c = minijit.jit(f)(x)
    (a.sum() + 2 * b.sum() + 3 * c.sum()).backward()
    torch.testing.assert_close(x.grad, 3 * x.exp().detach() + 3)


def test_unused_input_gets_no_gradient():
    x = torch.randn(3, dtype=F64, requires_grad=True)
    y = torch.randn(3, dtype=F64, requires_grad=True)
    minijit.jit(lambda x, y: x.sin().sum())(x, y).backward()
    assert y.grad is None
    torch.testing.assert_close(x.grad, x.cos().detach())


def test_gradients_accumulate_over_calls():
    x = torch.randn(3, dtype=F64, requires_grad=True)
    jf = minijit.jit(lambda x: (x * x).sum())
    jf(x).backward()
    jf(x).backward()
    torch.testing.assert_close(x.grad, 4 * x.detach())
    assert minijit.cache_info(jf).hits == 1


def test_retain_graph_backward_twice():
    x = torch.randn(3, dtype=F64, requires_grad=True)
    out = minijit.jit(lambda x: x.exp().sum())(x)
    out.backward(retain_graph=True)
    out.backward()
    torch.testing.assert_close(x.grad, 2 * x.exp().detach())


def test_composes_with_eager_ops_around_it():
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    jf = minijit.jit(lambda h: h.tanh() * 2)
    loss = jf(x * 3).sum() ** 2
    loss.backward()
    want_x = x.detach().clone().requires_grad_()
    ((want_x * 3).tanh() * 2).sum().pow(2).backward()
    torch.testing.assert_close(x.grad, want_x.grad)


def test_double_backward_matches_eager():
    # More cases (a gradient penalty, refusals) in test_double_backward.py.
    def second(fn):
        x = torch.linspace(-1, 1, 3, dtype=F64, requires_grad=True)
        (g,) = torch.autograd.grad(fn(x), (x,), create_graph=True)
        return torch.autograd.grad(g.sum(), (x,))[0]

    torch.testing.assert_close(second(minijit.jit(lambda x: (x * x * x).sum())), second(lambda x: (x * x * x).sum()))


def test_saved_tensor_modified_in_place_raises_eagers_error():
    # docs/design.md, invariant 3: the saved input goes through save_for_backward, so autograd's
    # version counter catches the mutation instead of computing a wrong gradient.
    x = torch.randn(3, dtype=F64, requires_grad=True)
    w = torch.randn(3, dtype=F64)
    out = minijit.jit(lambda x, w: (x * w).sum())(x, w)
    with torch.no_grad():
        w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_in_place_write_into_input_not_requiring_grad():
    def f(x, buf):
        buf.add_(1)
        return (x * buf).sum()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    buf = torch.zeros(3, dtype=F64)
    minijit.jit(f)(x, buf).backward()
    torch.testing.assert_close(buf, torch.ones(3, dtype=F64))
    torch.testing.assert_close(x.grad, torch.ones(3, dtype=F64))


def test_in_place_write_into_input_requiring_grad_is_an_error():
    def f(x):
        x.mul_(2)
        return x.sum()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    with pytest.raises(minijit.MinijitError, match=r"in.place"):
        minijit.jit(f)(x)


def test_backward_trace_releases_saved_tensors():
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    w = torch.randn(4, 5, dtype=F64, requires_grad=True)
    jf = minijit.jit(lambda x, w: (x @ w).tanh().sum())
    jf(x, w).backward()
    bwd = minijit.last_backward_traces(jf)[-1]
    source = bwd.python()
    assert bwd.pass_name == "release dead values"
    for p in bwd.args:  # every saved tensor and cotangent is deleted after its last use
        assert any(line.strip().startswith("del ") and p.name in line.split("del ", 1)[1].split(", ")
                   for line in source.splitlines()), (p.name, source)


def test_backward_runs_compiled_trace():
    x = torch.randn(3, dtype=F64, requires_grad=True)
    out = minijit.jit(lambda x: x.exp().sum())(x)
    assert type(out.grad_fn).__name__.startswith("_JitFunction")


def test_in_place_on_intermediate_that_requires_grad_is_handled_or_refused():
    # Either the trace was functionalized (the gradient is eager's) or it is a clear error.
    def f(x):
        h = x * 2
        h.add_(x)
        return (h * h).sum()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    try:
        out = minijit.jit(f)(x)
    except minijit.MinijitError as e:
        assert "in place" in str(e)
        return
    (got,) = torch.autograd.grad(out, x)
    (want,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(got, want)
