"""Elementwise ltorch ops: unary and binary math, comparisons, where, clamp, lerp."""

from __future__ import annotations

from typing import Any

import torch

from minijit.errors import DeviceError, MetaError
from minijit.ir import NumberProxy, TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import rule_compare
from minijit.ops import prims
from minijit.ops.registry import ALL_LTORCH, ltorch_op
from minijit.ops.utils import (
    broadcast_shapes,
    common_device,
    elementwise,
    expand_to,
    float_dtype,
    result_dtype,
    to_device,
    to_dtype,
)

# Other names torch gives an op (torch.greater is torch.gt), as functions and Tensor methods.
_ALIASES = {
    "ne": ("not_equal",), "lt": ("less",), "le": ("less_equal",), "gt": ("greater",), "ge": ("greater_equal",),
    "abs": ("absolute",), "neg": ("negative",), "trunc": ("fix",), "asin": ("arcsin",), "acos": ("arccos",),
    "atan": ("arctan",), "asinh": ("arcsinh",), "acosh": ("arccosh",), "atanh": ("arctanh",), "atan2": ("arctan2",),
}


def _names_of(name: str) -> tuple[list[Any], list[str]]:
    """The torch functions and Tensor methods named `name` or one of its aliases."""
    names = [name, *_ALIASES.get(name, ())]
    return [f for n in names for f in (getattr(torch, n), getattr(torch.Tensor, n))], names


def _declare_unary(name: str, promote_int_to_float: bool) -> None:
    prim = getattr(prims, name)

    def decomposition(a: TensorProxy) -> TensorProxy:
        dtype = float_dtype(a.dtype) if promote_int_to_float else a.dtype
        return elementwise(prim, a, compute_dtype=dtype)

    decomposition.__name__ = name
    decomposition.__doc__ = f"torch.{name}, elementwise."
    fns, methods = _names_of(name)
    globals()[name] = ltorch_op(name, torch_fns=fns, methods=methods)(decomposition)


_FLOAT_UNARY = (
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal",
    "erf", "erfc", "erfinv", "lgamma", "digamma",
)
_SAME_DTYPE_UNARY = ("abs", "neg", "floor", "ceil", "round", "trunc", "sign", "bitwise_not")
_BOOL_UNARY = ("isfinite", "isnan", "isinf", "signbit", "logical_not")

for _name in _FLOAT_UNARY:
    _declare_unary(_name, promote_int_to_float=True)
for _name in _SAME_DTYPE_UNARY + _BOOL_UNARY:
    _declare_unary(_name, promote_int_to_float=False)


@ltorch_op(torch_fns=[torch.positive, torch.Tensor.positive], methods=["positive"])
def positive(a: TensorProxy) -> TensorProxy:
    """torch.positive: returns its input."""
    return a


def _declare_binary(name: str, *, float_result: bool = False) -> None:
    prim = getattr(prims, name)

    def decomposition(a: Any, b: Any) -> TensorProxy:
        dtype = result_dtype(a, b)
        if float_result:
            dtype = float_dtype(dtype)
        return elementwise(prim, a, b, compute_dtype=dtype)

    decomposition.__name__ = name
    decomposition.__doc__ = f"torch.{name}, elementwise with broadcasting and type promotion."
    fns, methods = _names_of(name)
    globals()[name] = ltorch_op(name, torch_fns=fns, methods=methods)(decomposition)


for _name in ("remainder", "fmod", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
              "bitwise_left_shift", "bitwise_right_shift", "floor_divide"):
    _declare_binary(_name)
_declare_binary("atan2", float_result=True)
_declare_binary("copysign", float_result=True)
# Comparisons compute in the promoted dtype; the prims return bool.
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _declare_binary(_name)


def _is_int(x: Any) -> bool:
    return type(x) in (int, bool) or (isinstance(x, NumberProxy) and x.python_type in (int, bool))


def _exact_in_float32(n: Any) -> bool:
    """Whether the integer `n` is exact in float32 (and so in every dtype eager might compute it in)."""
    return rule_compare(-(2**24), "<", n) and rule_compare(n, "<", 2**24)


def scaled(x: Any, factor: Any) -> Any:
    """`x * factor` for a Scalar argument (`alpha=`, `value=`): a number, or a 0-d tensor, which eager
    reads as a number (it neither broadcasts nor promotes the result's dtype)."""
    if isinstance(factor, TensorProxy):
        if factor.ndim != 0:
            raise MetaError(f"a Scalar argument must be a number or a 0-d tensor, got shape {tuple(factor.shape)}"
                            f"{where_now()}")
        like = x.dtype if isinstance(x, TensorProxy) else factor.dtype
        return mul(x, to_dtype(factor, like))
    if factor is None or rule_compare(factor, "==", 1):
        return x
    if _is_int(x) and _is_int(factor) and (isinstance(x, NumberProxy) or _exact_in_float32(x * factor)):
        return x * factor  # exact in every dtype eager might compute it in (a symbolic one: at its usual sizes)
    return mul(x, factor)


@ltorch_op(torch_fns=[torch.add, torch.Tensor.add], methods=["add"])
def add(a: Any, b: Any, *, alpha: Any = None) -> TensorProxy:
    """torch.add: a + alpha * b."""
    return elementwise(prims.add, a, scaled(b, alpha))


@ltorch_op(torch_fns=[torch.sub, torch.subtract, torch.Tensor.sub], methods=["sub"])
def sub(a: Any, b: Any, *, alpha: Any = None) -> TensorProxy:
    """torch.sub: a - alpha * b (bool operands are an error, as in torch)."""
    for x in (a, b):
        if (x.dtype if isinstance(x, TensorProxy) else type(x)) in (torch.bool, bool):
            raise MetaError(f"sub: subtraction with a bool tensor is not supported; use logical_not or ~ to invert "
                            f"a mask{where_now()}")
    return elementwise(prims.sub, a, scaled(b, alpha))


@ltorch_op(torch_fns=[torch.rsub], methods=[])
def rsub(a: Any, b: Any, *, alpha: Any = None) -> TensorProxy:
    """torch.rsub: b - alpha * a."""
    return sub(b, a, alpha=alpha)


@ltorch_op(torch_fns=[torch.mul, torch.multiply, torch.Tensor.mul], methods=["mul", "multiply"])
def mul(a: Any, b: Any) -> TensorProxy:
    """torch.mul."""
    return elementwise(prims.mul, a, b)


@ltorch_op(torch_fns=[torch.div, torch.divide, torch.true_divide, torch.Tensor.div], methods=["div", "divide", "true_divide"])
def div(a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorProxy:
    """torch.div with rounding_mode None (true division), 'trunc' or 'floor'."""
    if rounding_mode is None:
        return elementwise(prims.div, a, b, compute_dtype=float_dtype(result_dtype(a, b)))
    if rounding_mode == "floor":
        return elementwise(prims.floor_divide, a, b)
    if rounding_mode == "trunc":
        trunc = ALL_LTORCH["trunc"]
        dtype = result_dtype(a, b)
        if dtype.is_floating_point:
            return trunc(elementwise(prims.div, a, b, compute_dtype=dtype))
        q = elementwise(prims.div, a, b, compute_dtype=float_dtype(dtype))
        return to_dtype(trunc(q), dtype)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


@ltorch_op(torch_fns=[torch.pow, torch.Tensor.pow], methods=["pow"])
def pow(a: Any, b: Any) -> TensorProxy:  # noqa: A001 - mirrors torch.pow
    """torch.pow."""
    if isinstance(a, TensorProxy) and not isinstance(b, TensorProxy) and rule_compare(b, "==", 2):
        return mul(a, a)
    return elementwise(prims.pow, a, b)


def _declare_logical(name: str) -> None:
    prim = getattr(prims, name)

    def decomposition(a: Any, b: Any) -> TensorProxy:
        return elementwise(prim, a, b, compute_dtype=torch.bool)

    decomposition.__name__ = name
    decomposition.__doc__ = f"torch.{name}: compares truth values elementwise."
    fns = [getattr(torch, name), getattr(torch.Tensor, name)]
    globals()[name] = ltorch_op(name, torch_fns=fns, methods=[name])(decomposition)


for _name in ("logical_and", "logical_or", "logical_xor"):
    _declare_logical(_name)


@ltorch_op(torch_fns=[torch.where])
def where(condition: TensorProxy, input: Any, other: Any) -> TensorProxy:  # noqa: A002 - torch's names
    """torch.where(condition, input, other) with broadcasting and promotion."""
    if not isinstance(condition, TensorProxy) or condition.dtype not in (torch.bool, torch.uint8):
        got = condition.dtype if isinstance(condition, TensorProxy) else type(condition).__name__
        raise MetaError(f"where: expected a bool condition tensor, got {got}{where_now()}")
    dtype = result_dtype(input, other)
    shape = broadcast_shapes(*(t.shape for t in (condition, input, other) if isinstance(t, TensorProxy)))
    device = common_device("where", [t for t in (condition, input, other) if isinstance(t, TensorProxy)])
    args = [expand_to(to_dtype(to_device(x, device), dtype), shape) for x in (input, other)]
    cond = expand_to(to_dtype(to_device(condition, device), torch.bool), shape)
    return prims.where(cond, *args)


@ltorch_op("where_method", torch_fns=[torch.Tensor.where], methods=["where"])
def where_method(input: TensorProxy, condition: Any, other: Any) -> TensorProxy:  # noqa: A002 - torch's names
    """Tensor.where(condition, other): the tensor itself is where's `input`, the value where condition holds."""
    return where(condition, input, other)


@ltorch_op(torch_fns=[torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip], methods=["clamp", "clip"])
def clamp(a: TensorProxy, min: Any = None, max: Any = None) -> TensorProxy:  # noqa: A002
    """torch.clamp: elementwise bounds (either may be None)."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    for name, bound in (("min", min), ("max", max)):
        # Unlike the arithmetic ops, eager's clamp checks its tensor bounds' device strictly (no 0-dim CPU
        # tensor as a scalar); the meta device lets it pass, CUDA does not.
        if isinstance(bound, TensorProxy) and bound.device != a.device:
            raise DeviceError(f"clamp: {name} is on {bound.device} and the input on {a.device}; eager's clamp "
                              f"takes tensor bounds on the input's device only{where_now()}")
    out = a
    if min is not None:
        dtype = result_dtype(a, min)
        out = elementwise(prims.maximum, out, min, compute_dtype=dtype)
    if max is not None:
        dtype = result_dtype(out, max)
        out = elementwise(prims.minimum, out, max, compute_dtype=dtype)
    return out


@ltorch_op(torch_fns=[torch.lerp, torch.Tensor.lerp], methods=["lerp"])
def lerp(start: TensorProxy, end: TensorProxy, weight: Any) -> TensorProxy:
    """torch.lerp: start + weight * (end - start)."""
    dtype = result_dtype(start, end)
    return elementwise(prims.lerp, start, end, weight, compute_dtype=dtype)


@ltorch_op(torch_fns=[torch.addcmul, torch.Tensor.addcmul], methods=["addcmul"])
def addcmul(a: TensorProxy, t1: TensorProxy, t2: TensorProxy, *, value: Any = 1) -> TensorProxy:
    """torch.addcmul: a + value * t1 * t2."""
    return add(a, scaled(mul(t1, t2), value))


@ltorch_op(torch_fns=[torch.addcdiv, torch.Tensor.addcdiv], methods=["addcdiv"])
def addcdiv(a: TensorProxy, t1: TensorProxy, t2: TensorProxy, *, value: Any = 1) -> TensorProxy:
    """torch.addcdiv: a + value * t1 / t2."""
    return add(a, scaled(div(t1, t2), value))


@ltorch_op(torch_fns=[torch.square, torch.Tensor.square], methods=["square"])
def square(a: TensorProxy) -> TensorProxy:
    """torch.square (bool squares to int64, as torch computes it with pow)."""
    if a.dtype == torch.bool:
        a = to_dtype(a, torch.int64)
    return mul(a, a)

