"""torch functions called on Python numbers only: `torch.div(7, 2, rounding_mode="trunc")` returns a tensor.

Eager wraps a Python number passed as `input` into a 0-dim tensor (int64, the default float dtype,
complex or bool, by the number's type) and computes as for tensors. Where eager accepts such a call
(it is tried on the numbers themselves), the first argument is recorded as that 0-dim tensor
(`ltorch.tensor`), so the op runs on every call and returns a fresh tensor, as eager does.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from minijit.errors import UnsupportedOpError
from minijit.ir import NumberProxy, TensorProxy, tree_flatten
from minijit.ir.context import where_now
from minijit.ir.proxies import number_value
from minijit.ops import prims

_NUMBER_TYPES = (bool, int, float, complex)


def numbers_only(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bool:
    """True for a call whose first argument is a Python number and which is given no tensor."""
    if not args or not (isinstance(args[0], NumberProxy) or type(args[0]) in _NUMBER_TYPES):
        return False
    return not any(isinstance(x, TensorProxy | torch.Tensor) for x in tree_flatten((tuple(args), kwargs)))


def takes_tensor_first(decomposition: Any) -> bool:
    """True for an op whose first parameter is its tensor operand (`a`, `input`, `self`), not a size or a value
    it makes a tensor from (`torch.ones(2)`, `torch.arange(5)`, `torch.full((2,), 7)`)."""
    found = _TENSOR_FIRST.get(decomposition)
    if found is None:
        try:
            first = next(iter(inspect.signature(decomposition).parameters.values()), None)
        except (TypeError, ValueError):
            first = None
        found = _TENSOR_FIRST[decomposition] = first is not None and first.name in ("a", "input", "self") \
            and first.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return found


_TENSOR_FIRST: dict[Any, bool] = {}


def with_tensor_input(fn: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
                      ) -> tuple[tuple[Any, ...], torch.dtype] | None:
    """The arguments with the first one as the 0-dim tensor eager makes of it, and the result dtype eager
    gives, where eager returns a tensor for these numbers; None where eager refuses them (its error stands)."""
    concrete = [number_value(a) if isinstance(a, NumberProxy) else a for a in args]
    try:
        result = fn(*concrete, **kwargs)
    except Exception:  # eager refuses the numbers: the op's own checks raise its error
        return None
    if not isinstance(result, torch.Tensor):
        return None
    first = args[0]
    kind = first.python_type if isinstance(first, NumberProxy) else type(first)
    dtype = {bool: torch.bool, int: torch.int64, complex: torch.complex64 if torch.get_default_dtype() == torch.float32
             else torch.complex128}.get(kind, torch.get_default_dtype())
    return (prims.full((), first, dtype=dtype, device=torch.device("cpu")), *args[1:]), result.dtype


def check_dtype(name: str, got: Any, want: torch.dtype) -> Any:
    """Refuse a result whose dtype differs from eager's (never a silently different answer)."""
    if isinstance(got, TensorProxy) and got.dtype != want:
        raise UnsupportedOpError(f"{name} on Python numbers gives {got.dtype} where eager gives {want}{where_now()}; "
                                 "pass tensors (torch.tensor(x)) instead")
    return got
