"""Custom torch.autograd.Function subclasses under minijit.jit: forward traced, backward used as the VJP rule."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import MinijitError, UnsupportedSyntaxError


class SinScaled(torch.autograd.Function):
    """Saves an input and an intermediate, and a number on ctx."""

    @staticmethod
    def forward(ctx, x, k):
        y = x.sin()
        ctx.save_for_backward(x, y)
        ctx.k = k
        return y * k

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * ctx.k * x.cos() + 0 * y, None


class StraightThrough(torch.autograd.Function):
    """Round in the forward, identity in the backward: the true derivative would be zero."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


class MulSetupContext(torch.autograd.Function):
    """The forward-without-ctx style, with setup_context."""

    @staticmethod
    def forward(x, w):
        return x * w

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w = inputs
        ctx.save_for_backward(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)


class MaxWithIndex(torch.autograd.Function):
    """Two outputs, the second an integer tensor marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, idx = x.max(dim=1)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        return values, idx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_values, g_idx):
        (idx,) = ctx.saved_tensors
        out = torch.zeros(ctx.shape, dtype=g_values.dtype)
        return out.scatter(1, idx.unsqueeze(1), g_values.unsqueeze(1))


def _grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*inputs)
    loss = sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,)) if o.is_floating_point())
    loss.backward()
    return out, [x.grad for x in inputs]


def _check_like_eager(fn, *inputs):
    expected_out, expected_grads = _grads(fn, *inputs)
    jf = minijit.jit(fn)
    out, grads = _grads(jf, *inputs)
    torch.testing.assert_close(out, expected_out)
    for g, e in zip(grads, expected_grads):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e)
    return jf


def test_saved_input_intermediate_and_number():
    def f(x):
        return SinScaled.apply(x * 2, 3.0).exp().sum()

    jf = _check_like_eager(f, torch.randn(5, dtype=torch.float64, requires_grad=True))
    assert "autograd_function.SinScaled" in str(minijit.last_traces(jf)[0])
    assert "y = x.sin()" in str(minijit.last_traces(jf)[-1])  # the forward's own lines, once decomposed
    assert "x.cos()" in str(minijit.last_backward_traces(jf)[-1])  # the user's backward


def test_backward_is_the_vjp_rule_not_the_decomposition():
    def f(x):
        return (StraightThrough.apply(x) * x).sum()

    _check_like_eager(f, torch.randn(6, dtype=torch.float64, requires_grad=True))


def test_setup_context_style_and_two_inputs():
    def f(x, w):
        return torch.tanh(MulSetupContext.apply(x, w))

    _check_like_eager(f, torch.randn(4, 3, dtype=torch.float64, requires_grad=True),
                      torch.randn(3, dtype=torch.float64, requires_grad=True))


def test_non_differentiable_integer_output_and_once_differentiable():
    def f(x):
        values, idx = MaxWithIndex.apply(x)
        return values * 2, idx

    _check_like_eager(f, torch.randn(3, 5, dtype=torch.float64, requires_grad=True))


def test_same_function_applied_twice_and_tensor_passed_twice():
    def f(x, w):
        return MulSetupContext.apply(MulSetupContext.apply(x, w), w).sum()

    _check_like_eager(f, torch.randn(2, 3, dtype=torch.float64, requires_grad=True),
                      torch.randn(3, dtype=torch.float64, requires_grad=True))


def test_inference_does_not_trace_a_missing_backward():
    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x + 1

    def f(x):
        return NoBackward.apply(x) * 2

    x = torch.randn(3)
    torch.testing.assert_close(minijit.jit(f)(x), f(x))


def test_backward_reading_a_global_is_guarded():
    def f(x):
        return ScaledGrad.apply(x).sum()

    jf = minijit.jit(f)
    global GRAD_SCALE
    for scale in (2.0, 5.0):
        GRAD_SCALE = scale
        _, want = _grads(f, torch.randn(3, requires_grad=True))
        x = torch.randn(3, requires_grad=True)
        _, got = _grads(jf, x)
        torch.testing.assert_close(got[0], want[0])
        assert not torch.equal(got[0], torch.ones(3))  # the global's value reached the gradient


GRAD_SCALE = 2.0


class ScaledGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * GRAD_SCALE


def test_module_with_custom_function_trains_like_eager():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return SinScaled.apply(self.fc(x), 0.5).square().mean()

    torch.manual_seed(0)
    eager = Block().double()
    jitted = Block().double()
    jitted.load_state_dict(eager.state_dict())
    jm = minijit.jit(jitted)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_j = torch.optim.SGD(jitted.parameters(), lr=0.1)
    x = torch.randn(8, 4, dtype=torch.float64)
    for _ in range(3):
        for model, opt in ((eager, opt_e), (jm, opt_j)):
            opt.zero_grad()
            model(x).backward()
            opt.step()
        torch.testing.assert_close(eager(x), jitted(x))
        for pe, pj in zip(eager.parameters(), jitted.parameters()):
            torch.testing.assert_close(pe.grad, pj.grad)


def test_symbolic_values_mode():
    def f(x):
        return SinScaled.apply(x, 2.0).sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n in (3, 7):
        x = torch.randn(n, dtype=torch.float64, requires_grad=True)
        want_out, want = _grads(f, x)
        got_out, got = _grads(jf, x)
        torch.testing.assert_close(got_out, want_out)
        torch.testing.assert_close(got[0], want[0])
    assert minijit.cache_info(jf).misses == 1


# -- errors ---------------------------------------------------------------------------------


def test_mark_dirty_is_refused_with_the_function_named():
    class InplaceDouble(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def f(x):
        return InplaceDouble.apply(x * 1)

    with pytest.raises(UnsupportedSyntaxError, match=r"mark_dirty in InplaceDouble\.forward"):
        minijit.jit(f)(torch.randn(3, requires_grad=True))


def test_wrong_number_of_gradients():
    class TooFew(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    def f(x, y):
        return TooFew.apply(x, y).sum()

    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    with pytest.raises(RuntimeError):
        f(x, y).backward()  # eager refuses it too
    with pytest.raises(MinijitError, match=r"TooFew\.backward returned 1 gradients, expected 2"):
        minijit.jit(f)(x, y)


def test_wrong_gradient_shape():
    class BadShape(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.sum()

    def f(x):
        return BadShape.apply(x).sum()

    with pytest.raises(MinijitError, match=r"BadShape.backward returned a gradient of shape \(\)"):
        minijit.jit(f)(torch.randn(3, requires_grad=True))
