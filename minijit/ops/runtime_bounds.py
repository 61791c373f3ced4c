"""Slice bounds the trace computes: `x[:n.item()]`, `x.narrow(0, 0, k)`, `torch.split(x, [k, n - k])`.

A bound read from a tensor (`Tensor.item()`) is a number only the trace knows. Clamping it as Python's slice
does (`x[:k]` is `x[:min(max(k + len if k < 0 else k, 0), len)]`) with comparisons would read its value in the
op's rules, and a value read is a value checked: one trace per value. Instead:

- the capture sees its real value with no check (`seen_value`, `ValueReader.see`): like a size only the trace
  knows (`NumberProxy.seen`), its comparisons then read only their outcome, which the trace checks;
- the clamp is arithmetic the trace computes, with no comparison at all (`max(a, b)` is
  `(a + b + abs(a - b)) // 2`, exact on ints): one trace for every value, negative ones and ones past the end
  included;
- the slice's length is a number the trace computes from those bounds (`prims.slice` compares no bound the trace
  computes: they are clamped here).
"""

from __future__ import annotations

from typing import Any

from minijit.ir import IntegerProxy
from minijit.ir.context import value_reader
from minijit.ir.proxies import data_dependent

__all__ = ["computed_int", "computed_min", "computed_slice_bounds", "from_end", "seen_value", "seen_values"]


def computed_int(x: Any) -> bool:
    """Whether `x` is an int the trace computes (`n.item()`, a size only the trace knows) that was not read."""
    return isinstance(x, IntegerProxy) and x.python_type is int and data_dependent(x)


def seen_value(x: IntegerProxy) -> bool:
    """Whether the capture knows the real value of `x`, an int the trace computes, without a check on it;
    sees it where the capture can read it (a number the trace computed before the op being recorded)."""
    if x.seen:
        return True
    reader = value_reader()
    return reader is not None and bool(reader.see(x))


def seen_values(*xs: Any) -> bool:
    """Whether some of `xs` are ints the trace computes and all of those are seen (`seen_value`)."""
    computed = [x for x in xs if computed_int(x)]
    return bool(computed) and all(seen_value(x) for x in computed)


def _max(a: Any, b: Any) -> Any:
    return (a + b + abs(a - b)) // 2


def computed_min(a: Any, b: Any) -> Any:
    """`min(a, b)` of ints, computed by the trace where one is a number it computes: no comparison."""
    return (a + b - abs(a - b)) // 2


def from_end(v: Any, size: Any) -> Any:
    """`v + size` where `v` is negative, else `v`, computed by the trace: `v // (abs(v) + 1)` is -1 or 0."""
    return v - (v // (abs(v) + 1)) * size


def _clamped(v: Any, size: Any) -> Any:
    """A slice bound `v` of a dim of `size`, as Python clamps it: from the end where negative, then into [0, size]."""
    return computed_min(_max(from_end(v, size), 0), size)


def computed_slice_bounds(s: slice, size: Any, bound: Any) -> tuple[Any, Any]:
    """(start, stop) of `s`, some of whose bounds the trace computes (all seen), on a dim of `size`; `bound(v,
    default)` clamps the others. The trace computes the clamped bounds, stop never before start."""
    start = _clamped(s.start, size) if computed_int(s.start) else bound(s.start, 0)
    stop = _clamped(s.stop, size) if computed_int(s.stop) else bound(s.stop, size)
    if (type(start) is int and start == 0) or s.stop is None:
        return start, stop  # stop is at least start already
    return start, _max(stop, start)
