"""Symbolic sizes that only the backward reads, under `cache="symbolic values"`, compared with eager.

The forward/backward split saves the sizes a VJP rule reads (a slice's padding, a
reshape's input shape). A size computed inside an op's decomposition (`w[pos]` slices
`pos:pos + 1`, whose length is `i5 = (pos + 1) - pos`) must stay defined in the forward
that returns it; the verifier (on in the tests) names a forward that does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit


def _w(n: int, m: int = 3) -> torch.Tensor:
    return torch.randn(n, m, requires_grad=True)


CASES: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[Any, Any]]]] = {
    "index by int": (lambda w, pos: w[pos] * 2, lambda n, s: (_w(n), s % n)),
    "index by int, negative": (lambda w, pos: w[-pos].exp(), lambda n, s: (_w(n), 1 + s % n)),
    "index by 0-d tensor": (lambda w, pos: w[pos] * 2, lambda n, s: (_w(n), torch.tensor(s % n))),
    "index by tensor": (lambda w, pos: w[pos].sin(), lambda n, s: (_w(n), torch.tensor([s % n, 0, s % n]))),
    "two ints": (lambda w, pos: w[pos, 1] * w[0], lambda n, s: (_w(n), s % n)),
    "slice from pos": (lambda w, pos: w[pos:pos + 2].sin(), lambda n, s: (_w(n), s % (n - 1))),
    "reshape to a computed size": (lambda w, pos: w.reshape(w.shape[0] * w.shape[1] // 2, 2).cos(),
                                   lambda n, s: (_w(n, 4), s)),
    "view with -1": (lambda w, pos: (w.view(-1, 2) * pos).sum(1), lambda n, s: (_w(n, 4), s)),
    "expand to pos": (lambda w, pos: w[:1].expand(pos + 1, -1) * 3, lambda n, s: (_w(n), s + 1)),
    "narrow at pos": (lambda w, pos: w.narrow(0, pos, 2).exp(), lambda n, s: (_w(n), s % (n - 1))),
    "arange(n)": (lambda w, pos: w * torch.arange(w.shape[0])[:, None], lambda n, s: (_w(n), s)),
    "arange(pos)": (lambda w, pos: w[:pos] * torch.arange(pos)[:, None], lambda n, s: (_w(n), 1 + s % n)),
    "select then unsqueeze": (lambda w, pos: w.select(0, pos).unsqueeze(0).expand(2, -1) ** 2,
                              lambda n, s: (_w(n), s % n)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sizes_read_by_the_backward_only_match_eager(name: str) -> None:
    fn, make = CASES[name]
    jf = minijit.jit(fn, cache="symbolic values")
    for seed, (n, s) in enumerate(((5, 2), (7, 3), (4, 1))):
        torch.manual_seed(seed)
        w, pos = make(n, s)
        w_eager = w.detach().clone().requires_grad_()
        got, expected = jf(w, pos), fn(w_eager, pos)
        torch.testing.assert_close(got, expected)
        grad = torch.randn_like(expected)
        got.backward(grad)
        expected.backward(grad)
        torch.testing.assert_close(w.grad, w_eager.grad)
    # New sizes and positions reuse the one trace.
    assert minijit.cache_info(jf).entries == 1


def _second_order(fn: Callable[..., Any], x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of `fn(x, target)` made with create_graph=True, and a Hessian-vector product through it."""
    x = x.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(fn(x, target), x, create_graph=True)
    v = torch.randn(g.shape, dtype=g.dtype, generator=torch.Generator().manual_seed(1))
    assert g.requires_grad, "the gradient made with create_graph=True has no history"
    (hv,) = torch.autograd.grad((g * v).sum(), x)
    return g, hv


def test_double_backward_of_cross_entropy_differentiates_its_log_softmax() -> None:
    # cross_entropy's VJP rule computes log_softmax on the way to the loss and saves it; the backward reads it, so
    # a second backward must differentiate it too (constant sizes take the rule; symbolic ones decompose the op).
    def fn(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(x, target)

    jf = minijit.jit(fn)
    for n in (4, 5, 3):
        torch.manual_seed(n)
        x, target = torch.randn(n, 4, dtype=torch.float64), torch.randint(0, 4, (n,))
        for got, expected in zip(_second_order(jf, x, target), _second_order(fn, x, target)):
            torch.testing.assert_close(got, expected)


def test_sizes_an_opaque_op_s_rule_multiplies_are_bound_in_the_forward() -> None:
    # torch.dist runs as an opaque op; its VJP rule's forward computes with the symbolic sizes of both inputs,
    # which no op of the trace reads before the split (dce dropped their `prims.shape`).
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.dist(x, y)

    jf = minijit.jit(fn, cache="symbolic values")
    for n in (5, 3):
        torch.manual_seed(n)
        x, y = torch.randn(n, 2, n, dtype=torch.float64), torch.randn(n, 1, n, dtype=torch.float64)
        xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
        xe, ye = x.clone().requires_grad_(), y.clone().requires_grad_()
        got, expected = jf(xs, ys), fn(xe, ye)
        torch.testing.assert_close(got, expected)
        for g, e in zip(torch.autograd.grad(got, (xs, ys)), torch.autograd.grad(expected, (xe, ye))):
            torch.testing.assert_close(g, e)
    assert minijit.cache_info(jf).entries == 1


def test_double_backward_through_an_opaque_op_keeps_the_history() -> None:
    # softmax with a symbolic dim, and dist always, run as opaque torch ops; their backward differentiates the op
    # with torch's autograd, which under a double backward must keep the saved inputs' history.
    def fn(x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.softmax(x, dim) * torch.dist(x, y)

    def second_order(f: Callable[..., Any], x: torch.Tensor, y: torch.Tensor, dim: int) -> list[torch.Tensor]:
        x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
        out = f(x, y, dim)
        w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad((out * w).sum(), (x, y), create_graph=True)
        assert all(g.requires_grad for g in grads), "a gradient made with create_graph=True has no history"
        return [*grads, *torch.autograd.grad(sum((g * g).sum() for g in grads), (x, y))]

    jf = minijit.jit(fn)
    for n, dim in ((4, 0), (5, 1), (3, 0)):
        torch.manual_seed(n)
        x, y = torch.randn(n, 3, dtype=torch.float64), torch.randn(1, 3, dtype=torch.float64)
        for got, expected in zip(second_order(jf, x, y, dim), second_order(fn, x, y, dim)):
            torch.testing.assert_close(got, expected)


def test_double_backward_of_silu_differentiates_its_backward() -> None:
    # A double backward runs the backward again as eager ops; aten.silu_backward has no derivative, so under grad
    # mode eager's autograd computes silu's backward with torch ops instead, and so must minijit's.
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x)

    def second_order(f: Callable[..., Any], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.clone().requires_grad_()
        out = f(x)
        w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        (g,) = torch.autograd.grad((out * w).sum(), x, create_graph=True)
        (h,) = torch.autograd.grad((g * g).sum(), x)
        return g, h

    jf = minijit.jit(fn)
    for n in (4, 5, 3):
        x = torch.randn(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
        for got, expected in zip(second_order(jf, x), second_order(fn, x)):
            torch.testing.assert_close(got, expected)
