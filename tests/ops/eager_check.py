"""Checking an op against eager torch: through its prims decomposition and through the ltorch trace.

Both runs get fresh clones of the arguments, so in-place ops are checked on the
values they leave in their inputs as well as on what they return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minijit.ir import Proxy, tree_flatten, tree_iter, tree_map
from minijit.ops import ltorch_symbol_for
from tests.oputil import run_decomposed, run_trace_source

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool)


def make(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """A reproducible tensor of `shape` and `dtype` with distinct-looking values."""
    gen = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 4).to(dtype)
    return torch.randint(-9, 10, shape, generator=gen, dtype=dtype)


def clone_args(args: Any) -> Any:
    """`args` with every tensor replaced by a clone (so a run cannot touch another's inputs)."""
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, args)


def assert_same(actual: Any, expected: Any, exact: bool = True) -> None:
    """Outputs match eager: same structure, and tensors of the same shape, dtype and values."""
    a_leaves, e_leaves = tree_flatten(actual), tree_flatten(expected)
    assert len(a_leaves) == len(e_leaves), f"{actual!r} vs {expected!r}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"expected a tensor, got {a!r}"
            assert a.shape == e.shape, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
            assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
            tol = {"rtol": 0, "atol": 0} if exact else {}
            torch.testing.assert_close(a, e, equal_nan=True, **tol)
        else:
            assert a == e, f"{a!r} != {e!r}"


def check_against_eager(fn: Callable[..., Any], *args: Any, exact: bool = True) -> None:
    """Run `fn` eagerly, decomposed into prims, and as the ltorch trace; outputs and mutated inputs must agree."""
    expected_args = clone_args(args)
    torch.manual_seed(0)  # every run from one seed: random ops (x.bernoulli_()) draw as eager does
    expected = fn(*expected_args)
    for runner in (run_decomposed, run_trace_source):
        got_args = clone_args(args)
        torch.manual_seed(0)
        got = runner(fn, *got_args)
        assert_same(got, expected, exact)
        assert_same(got_args, expected_args, exact)


class _TorchOrLtorch:
    """`tt.cat(...)`: torch.cat on tensors, and the ltorch symbol mapped to torch.cat on proxies.

    Stands in for the interpreter, which maps torch calls to ltorch symbols, so that
    one test function runs both eagerly and traced (and checks the mapping exists).
    """

    def __getattr__(self, name: str) -> Callable[..., Any]:
        torch_fn = getattr(torch, name)
        sym = ltorch_symbol_for(torch_fn)
        assert sym is not None, f"torch.{name} is not mapped to an ltorch symbol"

        def call(*args: Any, **kwargs: Any) -> Any:
            traced = any(isinstance(x, Proxy) for x in tree_iter((args, kwargs)))
            return (sym if traced else torch_fn)(*args, **kwargs)

        return call


tt = _TorchOrLtorch()
