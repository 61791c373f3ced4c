"""Tensors from outside the call that native code computes with.

The interpreter records what Python code does with tensors, but a C function it calls runs natively:
`sum(xs)`, `abs(t)`, `functools.reduce(torch.add, xs)`, `map(torch.sin, xs)`, `max(xs)` call tensor
operations from C. Given tensors that exist outside the call (a global list, a module attribute),
those operations would run once, while tracing, and their result would be frozen into the trace
as a constant: later calls would see stale values.

`run_native` holds a torch function mode around such native calls: a torch operation
that native code makes on a tensor from outside is recorded instead, on that tensor's proxy (an input
of the trace read again on every call), so the native code goes on with a proxy. Operations on other
real tensors (constants the trace made natively, meta tensors of minijit's own shape work) run as usual,
and so does what only looks at a tensor's identity or metadata.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from minijit.frontend.frame import current_state
from minijit.ir import current_trace, tree_flatten, tree_map

# What native code may do with a tensor from outside without computing on it: its identity, its printed
# form, its metadata (read through the descriptors torch passes to the mode as `__get__`).
_NOT_COMPUTING = frozenset({torch.Tensor.__hash__, torch.Tensor.__repr__, torch.Tensor.__str__,
                            torch.Tensor.__format__, torch.Tensor.__len__, torch.Tensor.__reduce_ex__,
                            torch.Tensor.__deepcopy__, torch.Tensor.__dir__})
# Conversions of a tensor to a Python value.
_TO_PYTHON = frozenset({"__bool__", "__float__", "__int__", "__index__", "__complex__", "item", "tolist"})
# Iterators whose `next` calls functions natively (`map(torch.sin, xs)`).
COMPUTING_ITERATORS = (map, filter, itertools.accumulate, itertools.starmap, itertools.filterfalse,
                       itertools.takewhile, itertools.dropwhile)


class _ComputeOnProxies(TorchFunctionMode):
    """Records the torch operations that native code makes on tensors from outside the call."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        trace = current_trace()
        if (trace is None or trace.capture_tensor is None or func in _NOT_COMPUTING
                or getattr(func, "__name__", None) == "__get__" or _called_by_minijit()):
            return func(*args, **kwargs)
        outside = current_state().outside
        found = {id(x) for x in tree_flatten((args, kwargs)) if _real(x) and outside.source_of(x) is not None}
        if not found:
            return func(*args, **kwargs)
        capture = trace.capture_tensor
        args, kwargs = tree_map(lambda x: capture(x) if id(x) in found else x, (tuple(args), kwargs))
        name = getattr(func, "__name__", None)
        if name in _TO_PYTHON:  # the proxy's own conversion: a value known only when the trace runs
            return getattr(args[0], name)(*args[1:], **kwargs)
        from minijit.frontend.calls import call

        return call(func, args, kwargs)


def _real(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not x.is_meta


def _called_by_minijit() -> bool:
    """True when the torch operation was called by minijit's own machinery (a meta run, a layout query), not by
    native code the interpreter ran for the user's code: the first frame below torch's is minijit's, outside
    its frontend. Another of these modes passing the operation on (modes nest where native code runs inside
    traced code inside native code) is skipped too: it already asked."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_globals.get("__name__", "").startswith("torch")
                                 or frame.f_code is _ComputeOnProxies.__torch_function__.__code__):
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return (module.startswith(("minijit.", "executors.")) and not module.startswith("minijit.frontend")) \
        or module == "<minijit trace>"


def run_native(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, native code called for the user's code while tracing: torch operations it makes on tensors
    from outside the call are recorded on their proxies (see the module's docstring)."""
    trace = current_trace()
    if trace is None or trace.capture_tensor is None or not current_state().outside.roots:
        return fn(*args, **kwargs)
    with _ComputeOnProxies():
        return fn(*args, **kwargs)


__all__ = ["COMPUTING_ITERATORS", "run_native"]
