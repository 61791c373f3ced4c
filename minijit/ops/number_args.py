"""torch functions called on Python numbers only: `torch.div(7, 2, rounding_mode="trunc")` returns a tensor.

Eager wraps a Python number passed as `input` into a 0-dim tensor (int64, the default float dtype,
complex or bool, by the number's type) and computes as for tensors. Where eager accepts such a call
(it is tried on the numbers themselves), the first argument is recorded as that 0-dim tensor
(`ltorch.tensor`), so the op runs on every call and returns a fresh tensor, as eager does.

Such a 0-dim int64 tensor made of sizes and ints (and arithmetic on it: `torch.div(x.size(1), w,
rounding_mode="trunc") - 1`) holds a number the trace knows without reading data: `note_number_tensor`
keeps it, as an expression of the trace's numbers, in `CaptureState.number_tensors`, so that where the tensor
is then given as a size (eager reads it through `__index__`) the size stays symbolic, with no guard
on its value. A tensor computed from data never gets there: it keeps the value-guard path.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from minijit.errors import MinijitError, UnsupportedOpError
from minijit.ir import IntegerProxy, NumberProxy, TensorProxy, current_trace, tree_flatten
from minijit.ir.context import where_now
from minijit.ir.proxies import data_dependent, number_value, rule_compare
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
    tensor = prims.full((), first, dtype=dtype, device=torch.device("cpu"))
    note_number_tensor("tensor", (first,), {}, tensor)
    return (tensor, *args[1:]), result.dtype


def check_dtype(name: str, got: Any, want: torch.dtype) -> Any:
    """Refuse a result whose dtype differs from eager's (never a silently different answer)."""
    if isinstance(got, TensorProxy) and got.dtype != want:
        raise UnsupportedOpError(f"{name} on Python numbers gives {got.dtype} where eager gives {want}{where_now()}; "
                                 "pass tensors (torch.tensor(x)) instead")
    return got


def _trunc_div(a: Any, b: Any) -> Any:
    """`a / b` rounded toward zero, as torch.div(rounding_mode="trunc") computes on integers."""
    if rule_compare(a, "<", 0) == rule_compare(b, "<", 0):
        return a // b
    return -((-a) // b)


def _div(a: Any, b: Any, *, rounding_mode: str | None = None) -> Any:
    return {"floor": lambda: a // b, "trunc": lambda: _trunc_div(a, b)}.get(rounding_mode, lambda: None)()


def _same(a: Any, *_: Any, **__: Any) -> Any:
    return a


# ltorch op -> the number its int64 result holds, given its number operands (None: not known).
_NUMBER_RULES: dict[str, Any] = {
    "add": lambda a, b, *, alpha=None: a + (b if alpha is None else alpha * b),
    "sub": lambda a, b, *, alpha=None: a - (b if alpha is None else alpha * b),
    "mul": lambda a, b: a * b,
    "div": _div,
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "neg": lambda a: -a,
    "abs": lambda a: abs(a),
    "tensor": _same, "clone": _same, "to": _same, "contiguous": _same, "detach": _same,
}


class _NotANumber(Exception):
    pass


def note_number_tensor(op: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], output: Any) -> None:
    """Keep the number the 0-dim int64 `output` of ltorch op `op` holds, where every operand is an int, a symbolic
    int of sizes and arguments (not one computed from data), or a tensor whose number is kept
    (`CaptureState.number_tensors`)."""
    trace = current_trace()
    rule = _NUMBER_RULES.get(op)
    if (rule is None or trace is None or trace.capture is None or not isinstance(output, TensorProxy)
            or output.ndim != 0 or output.dtype != torch.int64):
        return
    try:
        operands = [_operand(trace, a) for a in args]
        options = {k: _operand(trace, v) if k == "alpha" else v for k, v in kwargs.items()}
        number = rule(*operands, **options)
    except (_NotANumber, TypeError, ZeroDivisionError, MinijitError):
        return  # not made of numbers only, or eager's own checks decide (a division by zero)
    if type(number) is int or (isinstance(number, IntegerProxy) and not data_dependent(number)):
        trace.capture.number_tensors[id(output)] = (output, number)


def _operand(trace: Any, x: Any) -> Any:
    """`x` as a number operand of a numbers-only rule; other Python values (dtypes, devices, strings) unchanged."""
    if isinstance(x, TensorProxy | torch.Tensor):
        known = trace.known_number(x)
        if known is None:
            raise _NotANumber
        return known
    if type(x) is int or (isinstance(x, IntegerProxy) and not data_dependent(x)):
        return x
    if isinstance(x, NumberProxy) or type(x) in _NUMBER_TYPES:
        raise _NotANumber  # a float, complex or bool: not a size
    return x


def known_slice_bounds(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """`args` with each slice bound (in a key: `x[:, :k]`) that is a tensor whose number the trace keeps
    (`CaptureState.number_tensors`) given as that number, as eager reads a slice bound (`__index__`), with no guard on it."""
    trace = current_trace()
    if trace is None or trace.capture is None or not trace.capture.number_tensors:
        return args

    def bounds(x: Any) -> Any:
        if isinstance(x, slice):
            parts = (x.start, x.stop, x.step)
            known = [trace.known_number(p) if isinstance(p, TensorProxy) else None for p in parts]
            return slice(*(p if k is None else k for p, k in zip(parts, known, strict=True)))
        if type(x) in (tuple, list):
            return type(x)(bounds(item) for item in x)
        return x

    return tuple(bounds(a) for a in args)
