"""Test helpers: trace a call of an ltorch op on proxies and run its decomposition into prims."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from minijit.errors import MinijitError
from minijit.extend import OperatorExecutor, get_executor, prims
from minijit.ir import TensorProxy, Trace, tracing, tree_iter, tree_map
from minijit.runtime import trace_callable
from minijit.transforms import claim_executors, dce

_prims_only: OperatorExecutor | None = None


def prims_only_executor() -> OperatorExecutor:
    """An executor with the torch executor's prim implementations and nothing else."""
    global _prims_only
    if _prims_only is None:
        _prims_only = OperatorExecutor("primsonly")
        all_prims = set(prims.ALL_PRIMS.values())
        for sym, impl in get_executor("torch").implementations.items():
            if sym in all_prims:
                _prims_only.implementations[sym] = impl
    return _prims_only


def trace_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trace:
    """Trace `fn(*args, **kwargs)` with every tensor argument replaced by a trace input."""
    trace = Trace("op")
    with tracing(trace):
        def to_proxy(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return trace.add_input(TensorProxy(tuple(x.shape), x.dtype, x.device, x.requires_grad))
            return x
        pargs, pkwargs = tree_map(to_proxy, (args, kwargs))
        trace.output = fn(*pargs, **pkwargs)
    return trace


def tensors_of(args: Any) -> list[torch.Tensor]:
    """The tensors among (nested) arguments, in trace-input order."""
    return [x for x in tree_iter(args) if isinstance(x, torch.Tensor)]


def run_decomposed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Trace `fn`, lower every op to prims, and run the prims with the torch executor."""
    trace = trace_call(fn, *args, **kwargs)
    final = dce(claim_executors(dce(trace), [prims_only_executor()]))
    return final.python_callable()(*tensors_of((args, kwargs)))


def run_trace_source(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Trace `fn` and run the ltorch-level trace from its printed source."""
    trace = trace_call(fn, *args, **kwargs)
    return trace_callable(trace)(*tensors_of((args, kwargs)))


def assert_same_grads(want: Any, have: Any, inputs: list[torch.Tensor], **tolerances: Any) -> None:
    """Gradients from minijit (`have`) equal eager's (`want`), one per input; None where eager gives none."""
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        if w is None:
            assert h is None or not h.any(), f"input {i}: eager gives no gradient, minijit {h}"
            continue
        assert h is not None, f"input {i}: no gradient from minijit"
        assert h.dtype == inputs[i].dtype
        torch.testing.assert_close(h, w, **tolerances, msg=lambda m, i=i: f"grad of input {i}: {m}")


def assert_refused_as_eager(jitted: Callable[..., Any], eager: Callable[..., Any], *args: Any) -> None:
    """`eager(*args)` raises a RuntimeError, and `jitted(*args)` a MinijitError holding its message's first line."""
    with pytest.raises(RuntimeError) as raised:
        eager(*args)
    with pytest.raises(MinijitError) as info:
        jitted(*args)
    assert str(raised.value).splitlines()[0] in str(info.value)
