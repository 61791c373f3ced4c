"""Turning argument values into Python source for the printed trace.

Literals print with `repr` (so no string can inject code); dtypes and devices
print as `torch.<dtype>` and `torch.device(...)`; any other object is bound to
a constant name (`_c0`, ...) in the namespace the source runs in.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from minijit.errors import MinijitError
from minijit.ir.containers import contains_proxy
from minijit.ir.proxies import Proxy


class Constants:
    """Names for objects that have no literal form, shared by one printed trace."""

    def __init__(self) -> None:
        self.by_id: dict[int, str] = {}
        self.values: dict[str, Any] = {}

    def name_for(self, value: Any) -> str:
        name = self.by_id.get(id(value))
        if name is None:
            if contains_proxy(value):
                # A constant is shared by every call: a traced tensor inside it would reach later
                # calls, or the user, as a proxy (docs/design.md, invariant 8).
                raise MinijitError(f"a {type(value).__name__} holding a traced tensor would become a constant of the "
                                   "compiled trace; pass its tensors to the op directly")
            name = f"_c{len(self.values)}"
            self.by_id[id(value)] = name
            self.values[name] = value
        return name


def to_source(value: Any, constants: Constants) -> str:
    """Python source that evaluates to `value` (proxies print as their names)."""
    if isinstance(value, Proxy):
        return value.name
    t = type(value)
    if value is None or t is bool or t is int or t is str or t is bytes:
        return repr(value)
    if t is float:
        if math.isnan(value) or math.isinf(value):
            return f"float({str(value)!r})"
        return repr(value)
    if t is complex:
        return f"complex({to_source(value.real, constants)}, {to_source(value.imag, constants)})"
    if value is Ellipsis:
        return "..."
    if t is tuple:
        inner = ", ".join(to_source(v, constants) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if t is list:
        return "[" + ", ".join(to_source(v, constants) for v in value) + "]"
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple keeps its type
        return f"{constants.name_for(t)}({', '.join(to_source(v, constants) for v in value)})"
    if t is dict and all(type(k) is str for k in value):
        return "{" + ", ".join(f"{k!r}: {to_source(v, constants)}" for k, v in value.items()) + "}"
    if t is slice:
        parts = (value.start, value.stop, value.step)
        return "slice(" + ", ".join(to_source(v, constants) for v in parts) + ")"
    if t is torch.dtype:
        return str(value)  # 'torch.float32'
    if t is torch.device:
        return f"torch.device({str(value)!r})"
    if t is torch.Size:
        return to_source(tuple(value), constants)
    return constants.name_for(value)


def output_source(value: Any) -> str | None:
    """The left-hand side that binds an op's output: a name, a tuple pattern, or None."""
    if isinstance(value, Proxy):
        return value.name
    if type(value) in (tuple, list) or (isinstance(value, tuple) and hasattr(value, "_fields")):
        if not value:
            return None
        parts = [output_source(v) or "_" for v in value]
        if all(p == "_" for p in parts):
            return None
        return "(" + ", ".join(parts) + (",)" if len(parts) == 1 else ")")
    return None
