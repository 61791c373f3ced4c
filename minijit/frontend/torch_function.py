"""`__torch_function__`: objects that override torch's functions, dispatched as eager torch dispatches them.

A tensor-like class (a logging wrapper, a tensor carrying units) defines the classmethod
`__torch_function__(cls, func, types, args, kwargs)`; eager torch calls it when such an object is
among a torch function's arguments, and the override usually unwraps its arguments and calls
`func` on plain tensors. Here the same happens while tracing:

- a torch callable the traced code calls (a C function: `torch.add`, `torch.Tensor.mul`,
  `F.linear`) whose arguments hold such an object calls the overrides in eager's order
  (subclasses first, then left to right) with `(func, types, args, kwargs)` until one does not
  return NotImplemented (eager's TypeError if all do); each override runs as traced code, so the
  trace records the ops it performs on proxies, and what it returns (a wrapper rebuilt around
  traced tensors) is the call's result, as in eager; `tensor + obj` and the other arithmetic
  operators pass the Tensor method eager passes (`OPERATOR_METHODS`);
- torch's Python functions (`F.relu`, `F.layer_norm`, ...) ask `has_torch_function*` themselves:
  the lookasides answer as eager does for real objects, and no for proxies (plain tensors).

Tensor subclasses are left to the input checks: a traced tensor is a plain tensor, so an input that
is a Tensor subclass overriding `__torch_function__` is refused (`minijit/runtime/arguments.py`, `refuse_tensor_subclass`), and
one that disables it (`__torch_function__ = torch._C._disabled_torch_function_impl`) is traced as
the plain tensor it behaves as.
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir import Proxy

__all__ = ["OPERATOR_METHODS", "dispatch_order", "has_override", "overloaded_arguments", "overrides_torch_function"]

_DISABLED = torch._C._disabled_torch_function_impl
# `tensor <op> obj` and `obj <op> tensor` (obj without the operator) give an override these Tensor methods,
# with the tensor first in both cases, as eager does.
OPERATOR_METHODS: dict[str, tuple[Any, Any]] = {
    "__add__": (torch.Tensor.add, torch.Tensor.add),
    "__sub__": (torch.Tensor.sub, torch.Tensor.__rsub__),
    "__mul__": (torch.Tensor.mul, torch.Tensor.mul),
    "__truediv__": (torch.Tensor.div, torch.Tensor.__rdiv__),
    "__matmul__": (torch.Tensor.matmul, torch.Tensor.__rmatmul__),
    "__pow__": (torch.Tensor.pow, torch.Tensor.__rpow__),
}
_OVERRIDES: dict[type, bool] = {}


def overrides_torch_function(t: type) -> bool:
    """True for a class whose instances torch dispatches to its own `__torch_function__` (not a proxy, not a tensor)."""
    known = _OVERRIDES.get(t)
    if known is None:
        tf = getattr(t, "__torch_function__", None)
        known = _OVERRIDES[t] = (tf is not None and tf is not _DISABLED and not issubclass(t, Proxy | torch.Tensor))
    return known


def overloaded_arguments(args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The arguments torch would check for overrides (top-level ones, elements of lists and tuples) that have one."""
    found: list[Any] = []
    for a in (*args, *kwargs.values()):
        t = type(a)
        if t is list or t is tuple:
            found.extend(x for x in a if overrides_torch_function(type(x)))
        elif overrides_torch_function(t):
            found.append(a)
    return found


def dispatch_order(overloaded: list[Any]) -> list[Any]:
    """One argument per class, in the order torch calls their overrides: a subclass before its base, else left to right."""
    ordered: list[Any] = []
    for a in overloaded:
        t = type(a)
        if any(type(o) is t for o in ordered):
            continue
        at = next((i for i, o in enumerate(ordered) if issubclass(t, type(o))), len(ordered))
        ordered.insert(at, a)
    return ordered


def has_override(relevant: Any) -> bool:
    """torch.overrides.has_torch_function on `relevant`: True when one of them overrides and torch functions are on."""
    return torch._C._is_torch_function_enabled() and any(overrides_torch_function(type(a)) for a in relevant)
