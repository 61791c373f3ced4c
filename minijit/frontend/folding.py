"""Torch arithmetic on Python numbers only, folded at trace time: `torch.div(seq_len, w, rounding_mode="trunc")`.

Eager wraps the numbers into 0-dim tensors and returns one; code written for tracing (Hugging Face
Longformer) then uses it as a size (`x.new_zeros((n, chunks + 1))`, `view`, `as_strided`), where
eager reads its value. In a trace such a value is known: it comes from numbers the trace was
specialised on. So:

- a torch call whose arguments hold no traced value and no tensor but these folded ones, which
  ltorch cannot record (`prims.div needs a tensor argument`) or which reads only folded tensors
  (`chunks - 1`), runs natively at trace time; its tensor result is a folded constant too;
- a folded 0-dim integer tensor that reaches a call with traced values is the number it holds, as
  eager's size arguments read it (and as an int it promotes like the 0-dim integer tensor it is);
  a folded tensor of another kind reaches the trace as a constant (`prims.tensor_constant`).

Random ops are never folded (their draws would be frozen), and a tensor from outside the call is
never folded (its value may change between calls: it is a trace input).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from minijit.ir import Proxy, TensorProxy, Trace, current_trace, tree_flatten, tree_map
from minijit.ir.context import value_reader
from minijit.ir.proxies import TENSOR_METHODS
from minijit.ops.opaque import draws_random_numbers

__all__ = ["NOT_FOLDED", "fold", "fold_numbers_only", "fresh_folded", "unfold_sizes", "with_known_numbers"]

NOT_FOLDED = object()


def _folded(trace: Trace | None) -> dict[int, torch.Tensor]:
    return trace.capture.folded_constants if trace is not None and trace.capture is not None else {}


def _run(trace: Trace, fn: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    with torch.no_grad():
        out = fn(*args, **kwargs)
    if trace.capture is not None:
        for t in tree_flatten(out):
            if isinstance(t, torch.Tensor):
                trace.capture.folded_constants[id(t)] = t
    return out


def fold(fn: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` run now when every tensor among the arguments is folded (none traced); else NOT_FOLDED."""
    trace = current_trace()
    folded = _folded(trace)
    if not folded:
        return NOT_FOLDED
    leaves = tree_flatten((list(args), kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if (not tensors or any(isinstance(x, Proxy) for x in leaves) or any(id(t) not in folded for t in tensors)
            or draws_random_numbers(fn)):
        return NOT_FOLDED
    return _run(trace, fn, args, kwargs)


def fold_numbers_only(fn: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` run now when its arguments are plain Python values (no tensor, no proxy); else NOT_FOLDED."""
    trace = current_trace()
    leaves = tree_flatten((list(args), kwargs))
    if (trace is None or any(isinstance(x, torch.Tensor | Proxy) for x in leaves) or draws_random_numbers(fn)
            or not any(isinstance(x, int | float) for x in leaves)):
        return NOT_FOLDED
    return _run(trace, fn, args, kwargs)


def unfold_sizes(args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The arguments with each folded 0-dim integer tensor replaced by its value (unchanged when there is none)."""
    trace = current_trace()
    if not _folded(trace):
        return args, kwargs

    def value(x: Any) -> Any:
        known = trace.known_number(x) if isinstance(x, torch.Tensor) else None
        return x if known is None else known

    return tree_map(value, (args, kwargs))


def with_known_numbers(args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """The arguments with each traced 0-dim integer tensor replaced by the number it holds, as `__index__` reads it:
    the number the trace knows where it was computed from sizes and numbers only (`CaptureState.number_tensors`), with no
    guard on its value; else its value read from data (the value-guard path); None where there is no such tensor.

    For a call refused with the tensors: eager reads such a tensor given where it needs an int (`__index__`:
    `x.view(n, torch.div(x.size(1), n, rounding_mode="trunc"))`), so the call with the number is eager's."""
    trace = current_trace()
    if trace is None or not ((trace.capture is not None and trace.capture.number_tensors) or value_reader() is not None):
        return None
    found = False

    def value(x: Any) -> Any:
        nonlocal found
        if not (isinstance(x, TensorProxy) and x.shape == () and not x.dtype.is_floating_point
                and not x.dtype.is_complex and x.dtype != torch.bool):
            return x
        known = trace.known_number(x)
        if known is None and value_reader() is None:
            return x
        found = True
        return known if known is not None else operator.index(x)

    replaced = tree_map(value, (args, kwargs))
    return replaced if found else None


def fresh_folded(value: Any) -> Any:
    """`value` (a result, or a value stored outside the call) with each folded tensor in it (in tuples, lists
    and dicts) replaced by a copy the trace makes on every call: eager gives a new tensor each time, which the
    caller may change without changing later results."""
    trace = current_trace()
    folded = _folded(trace)
    if not folded or trace is None or trace.capture_tensor is None:
        return value

    def fresh(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and id(x) in folded:
            return TENSOR_METHODS["clone"](trace.capture_tensor(x))
        return x

    return tree_map(fresh, value)
