"""Double backward (create_graph=True) through a jitted call: equal to eager's, or refused with the reason."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import minijit

F64 = torch.float64


def _discriminator() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 16), nn.Tanh(), nn.LayerNorm(16),
                         nn.Linear(16, 1)).to(F64)


def _gradient_penalty_step(d: nn.Module, real: torch.Tensor, fake: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """WGAN-GP: the critic's loss plus the penalty on its gradient at interpolated points; backward."""
    x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(d(x_hat).sum(), x_hat, create_graph=True)
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss = d(fake).mean() - d(real).mean() + 10 * penalty
    loss.backward()
    return loss.detach()


def test_gradient_penalty_through_a_jitted_module_matches_eager() -> None:
    eager = _discriminator()
    jitted = copy.deepcopy(eager)
    jd = minijit.jit(jitted)
    for step in range(2):  # a trace, then a cache hit
        real, fake, eps = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64), torch.rand(4, 1, dtype=F64)
        want = _gradient_penalty_step(eager, real, fake, eps)
        have = _gradient_penalty_step(jd, real, fake, eps)
        torch.testing.assert_close(have, want)
        for (name, p), q in zip(eager.named_parameters(), jitted.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, msg=lambda m, name=name: f"step {step}, {name}: {m}")
        eager.zero_grad()
        jitted.zero_grad()


def test_hessian_vector_product_and_third_order_match_eager() -> None:
    def f(x, w):
        return (torch.sin(x @ w) * x.sum(dim=1, keepdim=True)).exp().sum()

    x, w, v = torch.randn(3, 4, dtype=F64), torch.randn(4, 2, dtype=F64), torch.randn(3, 4, dtype=F64)

    def orders(fn):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        (gx,) = torch.autograd.grad(fn(xr, wr), xr, create_graph=True)
        (hv,) = torch.autograd.grad((gx * v).sum(), xr, create_graph=True)
        third = torch.autograd.grad(hv.pow(2).sum(), (xr, wr))
        return gx, hv, *third

    for have, want in zip(orders(minijit.jit(f)), orders(f), strict=True):
        torch.testing.assert_close(have, want)


def test_values_computed_under_no_grad_stay_constant_in_the_double_backward() -> None:
    def f(x):
        with torch.no_grad():
            scale = x.norm()
        return (x * x * scale).sum()

    def grads(fn):
        x = torch.linspace(-1, 2, 5, dtype=F64, requires_grad=True)
        (g,) = torch.autograd.grad(fn(x), x, create_graph=True)
        return torch.autograd.grad(g.pow(3).sum(), x)[0]

    torch.testing.assert_close(grads(minijit.jit(f)), grads(f))


def test_double_backward_after_the_input_changed_raises_eagers_error() -> None:
    x = torch.randn(3, dtype=F64, requires_grad=True)
    w = torch.randn(3, dtype=F64, requires_grad=True)
    out = minijit.jit(lambda x, w: (x * x * w).sum())(x, w.clone())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with torch.no_grad():
            x.add_(1)
        torch.autograd.grad(out, (x,), create_graph=True)


def test_gradient_penalty_through_dropout_draws_the_same_mask_as_eager() -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.Tanh(), nn.Linear(16, 1)).to(F64)
    jitted = copy.deepcopy(eager)
    jd = minijit.jit(jitted)
    real, fake, eps = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64), torch.rand(4, 1, dtype=F64)
    torch.manual_seed(1)
    want = _gradient_penalty_step(eager, real, fake, eps)
    after_eager = torch.rand(3)
    torch.manual_seed(1)
    have = _gradient_penalty_step(jd, real, fake, eps)
    assert torch.equal(torch.rand(3), after_eager)  # the recompute left the generator as eager's run did
    torch.testing.assert_close(have, want)
    for (name, p), q in zip(eager.named_parameters(), jitted.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, name=name: f"{name}: {m}")


def test_double_backward_through_a_custom_function_is_refused() -> None:
    class Clamp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clamp(-1, 1)

        @staticmethod
        def backward(ctx, g):
            return g  # straight through: not the derivative of the forward's ops

    def f(x):
        return (Clamp.apply(x) * x).sum()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    with pytest.raises(minijit.MinijitError, match=r"custom autograd\.Function"):
        torch.autograd.grad(minijit.jit(f)(x), (x,), create_graph=True)
    # Without create_graph the same call differentiates as eager does.
    torch.testing.assert_close(torch.autograd.grad(minijit.jit(f)(x), (x,))[0], torch.autograd.grad(f(x), (x,))[0])


@pytest.mark.parametrize("f", [lambda x, w: (x @ w).sum(), lambda x, w: (x @ w * x.sum()).sum()],
                         ids=["saves only inputs", "saves a computed value"])
def test_mixed_second_derivatives_match_eager(f) -> None:
    # The first saves only x and w: its double backward runs the backward again on them, keeping no other input.
    x, w = torch.randn(3, 4, dtype=F64), torch.randn(4, 2, dtype=F64)
    v, u = torch.randn(3, 4, dtype=F64), torch.randn(4, 2, dtype=F64)

    def second(fn):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        gx, gw = torch.autograd.grad(fn(xr, wr), (xr, wr), create_graph=True)
        return (gx, gw, *torch.autograd.grad((gx * v).sum() + (gw * u).sum(), (xr, wr), allow_unused=True))

    for have, want in zip(second(minijit.jit(f)), second(f), strict=True):
        torch.testing.assert_close(have, want)


def test_double_backward_from_saved_inputs_after_one_changed_raises_eagers_error() -> None:
    x = torch.randn(3, dtype=F64, requires_grad=True)
    w = torch.randn(3, dtype=F64, requires_grad=True)
    out = minijit.jit(lambda x, w: (x * w).sum())(x, w.clone())
    with torch.no_grad():
        x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (x,), create_graph=True)
