"""`torch._foreach_*`: the list ops of torch.optim's multi-tensor (foreach) implementations.

`torch._foreach_add_(tensors, others, alpha=a)` is the per-tensor op applied to each element:
`tensors[i].add_(others[i], alpha=a)`. The lookasides here record exactly that, element by
element, through the interpreter's own call path, so each element is an ordinary ltorch op
(in-place ones are functionalized and written back once, like any `add_`). An argument that
is a list (or tuple) gives element `i` to call `i`; anything else (a number, a 0-dim tensor)
is passed to every call. The "scalars" of `_foreach_addcmul/addcdiv` may also be a 1-D tensor,
one value per element.

On a CPU, eager torch runs these ops the same way (its foreach "slow path" is this loop), with one
difference the lookaside follows: `_foreach_mul_(tensors, number)` on float16/bfloat16 tensors first rounds
the number to the tensor's dtype (`t.mul_(tensor(number, dtype=t.dtype))`), where `t.mul_(number)` does
not. Elsewhere a fusion executor may fuse the recorded elementwise ops across the list.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import UnsupportedOpError
from minijit.frontend.calls import call
from minijit.frontend.frame import observe_iteration
from minijit.frontend.lookasides import LOOKASIDES
from minijit.ir import NumberProxy, TensorProxy
from minijit.ir.context import where_now
from minijit.ops.eager_facts import FOREACH_MUL_ROUNDS_NUMBER_FIRST

# foreach op (without the trailing "_") -> the per-tensor torch callable, where it is not torch.<name>.
_PER_TENSOR = {"norm": torch.linalg.vector_norm, "max": torch.amax}
# foreach ops with no per-tensor counterpart minijit records.
_NOT_LOOKED_ASIDE = {"mm", "powsum"}


def _elements(value: Any) -> list[Any]:
    """The elements of a list argument, as the interpreted code sees them (reads of an outside list are guarded)."""
    observe_iteration(value)
    return list(value)


def _per_element(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[list[Any], dict[str, Any]]]:
    """(args, kwargs) of each per-tensor call of `torch._foreach_<name>(*args, **kwargs)`."""
    per_element_kwargs = dict(kwargs)
    scalars = None
    if name.startswith(("addcmul", "addcdiv")):
        # The fourth argument (or `scalars=`) is a number, a list of numbers (one per element), or a 1-D tensor.
        if len(args) > 3:
            scalars, args = args[3], args[:3]
        elif "scalars" in per_element_kwargs:
            scalars = per_element_kwargs.pop("scalars")
        if isinstance(scalars, list | tuple):
            scalars = _elements(scalars)
    lists = {i: _elements(a) for i, a in enumerate(args) if isinstance(a, list | tuple)}
    if not lists:
        raise UnsupportedOpError(f"torch._foreach_{name} without a list of tensors{where_now()} is not supported by minijit")
    lengths = {len(v) for v in lists.values()} | ({len(scalars)} if isinstance(scalars, list) else set())
    if len(lengths) != 1:
        raise RuntimeError(f"torch._foreach_{name}: tensor lists must have the same number of tensors, got "
                           f"{sorted(lengths)}")
    n = lengths.pop()

    calls = []
    for i in range(n):
        element_args = [lists[j][i] if j in lists else a for j, a in enumerate(args)]
        element_kwargs = dict(per_element_kwargs)
        if scalars is not None:
            if isinstance(scalars, list | tuple):
                element_kwargs["value"] = scalars[i]
            elif _tensor_value(scalars) and scalars.ndim == 1:
                element_kwargs["value"] = call(operator.getitem, (scalars, i), {})
            else:
                element_kwargs["value"] = scalars
        calls.append((element_args, element_kwargs))
    return calls


def _tensor_value(value: Any) -> bool:
    return isinstance(value, torch.Tensor | TensorProxy)


def _as_eager_foreach_mul_(args: list[Any]) -> list[Any]:
    """The per-tensor arguments of one element of the CPU's `_foreach_mul_(tensors, number)`: a float16 or bfloat16
    tensor's number becomes a 0-dim tensor of its dtype, as eager's kernel rounds it (`t.mul_(0.9)` computes with 0.9,
    `torch._foreach_mul_([t], 0.9)` with bfloat16's 0.8984375)."""
    t, other = args[0], args[1] if len(args) > 1 else None
    if (_tensor_value(t) and t.dtype in FOREACH_MUL_ROUNDS_NUMBER_FIRST and t.device.type == "cpu"
            and (isinstance(other, NumberProxy) or type(other) in (int, float, bool))):
        return [t, call(torch.full, ((), other), {"dtype": t.dtype, "device": t.device}), *args[2:]]
    return args


def _addc(op: Callable[..., Any], a: Any, t1: Any, t2: Any, value: Any) -> Any:
    """a + value * op(t1, t2) where `value` is a 0-dim tensor (torch's addcmul/addcdiv take only numbers)."""
    return call(torch.add, (a, call(torch.mul, (call(op, (t1, t2), {}), value), {})), {})


def _foreach_lookaside(name: str, inplace: bool) -> Callable[..., Any]:
    per_tensor = _PER_TENSOR.get(name, getattr(torch, name, None))
    method = getattr(torch.Tensor, f"{name}_", None)

    def run(*args: Any, **kwargs: Any) -> Any:
        results = []
        for element_args, element_kwargs in _per_element(name, args, kwargs):
            value = element_kwargs.get("value")
            if name in ("addcmul", "addcdiv") and _tensor_value(value):
                result = _addc(torch.mul if name == "addcmul" else torch.div, *element_args, value)
                if inplace:
                    call(torch.Tensor.copy_, (element_args[0], result), {})
                results.append(result)
            elif inplace and method is not None:
                if name == "mul":
                    element_args = _as_eager_foreach_mul_(element_args)
                call(method, element_args, element_kwargs)
            elif inplace:  # no in-place Tensor method (maximum_): the op, then a copy into the element
                call(torch.Tensor.copy_, (element_args[0], call(per_tensor, element_args, element_kwargs)), {})
            else:
                results.append(call(per_tensor, element_args, element_kwargs))
        return None if inplace else results

    run.__name__ = f"_foreach_{name}{'_' if inplace else ''}"
    run.__doc__ = f"torch._foreach_{name}{'_' if inplace else ''}: the per-tensor op on each element of the lists."
    return run


def _register() -> None:
    for attr in dir(torch):
        if not attr.startswith("_foreach_"):
            continue
        inplace = attr.endswith("_") and not attr.endswith("__")
        name = attr[len("_foreach_"):].rstrip("_") if inplace else attr[len("_foreach_"):]
        if name in _NOT_LOOKED_ASIDE:
            continue
        if name not in _PER_TENSOR and not hasattr(torch, name) and not (inplace and hasattr(torch.Tensor, f"{name}_")):
            continue
        LOOKASIDES[getattr(torch, attr)] = _foreach_lookaside(name, inplace)


_register()

__all__: list[str] = []
