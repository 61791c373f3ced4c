"""A view that changes nothing (`x.view(x.shape)`, `x[:]`, `x.permute(0, 1)`) is a new tensor object in eager,
viewing its argument; a few ops return their argument itself where nothing changes (`x.contiguous()`,
`x.flatten()` of a 1-d `x`, `x.to(x.dtype)`). The jitted function hands back the same objects as eager: which
result is an argument, which results are one object, what traced code finds with `is`, and so what an in-place
change of a result's metadata or a hook on it reaches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit

_CALLS: dict[str, Callable[[torch.Tensor], Any]] = {
    "view": lambda x: x.view(4, 3),
    "reshape": lambda x: x.reshape(4, 3),
    "reshape_as": lambda x: x.reshape_as(x),
    "view_as": lambda x: x.view_as(x),
    "slice": lambda x: x[:],
    "ellipsis": lambda x: x[...],
    "narrow": lambda x: x.narrow(0, 0, 4),
    "expand": lambda x: x.expand(4, 3),
    "expand_as": lambda x: x.expand_as(x),
    "squeeze": lambda x: x.squeeze(),
    "squeeze_dim": lambda x: x.squeeze(0),
    "permute": lambda x: x.permute(0, 1),
    "transpose": lambda x: x.transpose(1, 1),
    "swapaxes": lambda x: x.swapaxes(0, 0),
    "movedim": lambda x: x.movedim(0, 0),
    "unflatten": lambda x: x.unflatten(0, (4,)),
    "split": lambda x: x.split(4),
    "chunk": lambda x: x.chunk(1),
    "flatten_range": lambda x: x.flatten(0, 0),
    "flatten_1d": lambda x: x.view(-1).flatten(),
    "contiguous": lambda x: x.contiguous(),
    "to_same": lambda x: x.to(torch.float32),
    "float": lambda x: x.float(),
    "atleast_2d": lambda x: torch.atleast_2d(x),
    "twice": lambda x: (x.view(4, 3), x.view(4, 3), x),
}


def _objects(result: Any, x: torch.Tensor) -> list[tuple[bool, ...]]:
    """For each result: is it `x`, and is it each earlier result."""
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    return [(r is x, *(r is e for e in results[:i])) for i, r in enumerate(results)]


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_result_objects_as_eager(name: str) -> None:
    fn = _CALLS[name]
    x = torch.randn(4, 3)
    jitted = minijit.jit(lambda x: fn(x))
    for _ in range(2):  # the traced call and a cached one
        assert _objects(jitted(x), x) == _objects(fn(x), x)


def test_metadata_change_of_a_result_stays_off_the_argument() -> None:
    x_eager, x_jit = torch.randn(4, 3), torch.randn(4, 3)
    jitted = minijit.jit(lambda x: x.view(4, 3))
    for _ in range(2):
        jitted(x_jit).unsqueeze_(0)
        (lambda x: x.view(4, 3))(x_eager).unsqueeze_(0)
        assert x_jit.shape == x_eager.shape


def test_identity_view_compared_with_is_in_traced_code() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(x.shape)
        return x + 1 if y is x else x - 1

    x = torch.randn(3, 2)
    torch.testing.assert_close(minijit.jit(f)(x), f(x))


def test_identity_view_stored_on_an_object() -> None:
    class Holder:
        kept: Any = None

    def make(holder: Holder) -> Callable[[torch.Tensor], torch.Tensor]:
        def f(x: torch.Tensor) -> torch.Tensor:
            holder.kept = x[:]
            return x * 2
        return f

    eager_holder, jit_holder = Holder(), Holder()
    x = torch.randn(3)
    eager_fn, jitted = make(eager_holder), minijit.jit(make(jit_holder))
    for _ in range(2):
        eager_fn(x)
        jitted(x)
        assert (jit_holder.kept is x) == (eager_holder.kept is x)
        torch.testing.assert_close(jit_holder.kept, eager_holder.kept)


def test_hook_on_an_identity_view_sees_its_own_gradient() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 3, x.view(x.shape)

    def run(fn: Callable[..., Any]) -> tuple[list[torch.Tensor], torch.Tensor]:
        x = torch.ones(3, requires_grad=True)
        scaled, same = fn(x)
        seen: list[torch.Tensor] = []
        same.register_hook(lambda g: seen.append(g.clone()))
        (scaled.sum() + 2 * same.sum()).backward()
        return seen, x.grad

    eager_seen, eager_grad = run(f)
    jit_seen, jit_grad = run(minijit.jit(f))
    assert len(jit_seen) == len(eager_seen) == 1
    torch.testing.assert_close(jit_seen[0], eager_seen[0])
    torch.testing.assert_close(jit_grad, eager_grad)
