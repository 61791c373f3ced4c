"""Elementwise ltorch ops: unary and binary math, comparisons, where, clamp, lerp."""

from __future__ import annotations

from typing import Any

import torch

from minijit.errors import DeviceError, MetaError
from minijit.ir import NumberProxy, Symbol, TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import data_dependent, rule_compare
from minijit.ops import prims
from minijit.ops.registry import ALL_LTORCH, declare_op, ltorch_op
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


def _unary(name: str, promote_int_to_float: bool = False) -> Symbol:
    """Declares the ltorch op `name`: the prim of that name applied to one tensor, computed in its dtype
    (in a float dtype if `promote_int_to_float`)."""
    prim = getattr(prims, name)

    def decomposition(a: TensorProxy) -> TensorProxy:
        dtype = float_dtype(a.dtype) if promote_int_to_float else a.dtype
        return elementwise(prim, a, compute_dtype=dtype)

    fns, methods = _names_of(name)
    return declare_op(name, decomposition, f"torch.{name}, elementwise.", torch_fns=fns, methods=methods)


exp = _unary("exp", promote_int_to_float=True)
exp2 = _unary("exp2", promote_int_to_float=True)
expm1 = _unary("expm1", promote_int_to_float=True)
log = _unary("log", promote_int_to_float=True)
log1p = _unary("log1p", promote_int_to_float=True)
log2 = _unary("log2", promote_int_to_float=True)
log10 = _unary("log10", promote_int_to_float=True)
sin = _unary("sin", promote_int_to_float=True)
cos = _unary("cos", promote_int_to_float=True)
tan = _unary("tan", promote_int_to_float=True)
asin = _unary("asin", promote_int_to_float=True)
acos = _unary("acos", promote_int_to_float=True)
atan = _unary("atan", promote_int_to_float=True)
sinh = _unary("sinh", promote_int_to_float=True)
cosh = _unary("cosh", promote_int_to_float=True)
tanh = _unary("tanh", promote_int_to_float=True)
asinh = _unary("asinh", promote_int_to_float=True)
acosh = _unary("acosh", promote_int_to_float=True)
atanh = _unary("atanh", promote_int_to_float=True)
sqrt = _unary("sqrt", promote_int_to_float=True)
rsqrt = _unary("rsqrt", promote_int_to_float=True)
reciprocal = _unary("reciprocal", promote_int_to_float=True)
erf = _unary("erf", promote_int_to_float=True)
erfc = _unary("erfc", promote_int_to_float=True)
erfinv = _unary("erfinv", promote_int_to_float=True)
lgamma = _unary("lgamma", promote_int_to_float=True)
digamma = _unary("digamma", promote_int_to_float=True)

abs = _unary("abs")  # noqa: A001 - mirrors torch.abs
neg = _unary("neg")
floor = _unary("floor")
ceil = _unary("ceil")
round = _unary("round")  # noqa: A001 - mirrors torch.round
trunc = _unary("trunc")
sign = _unary("sign")
bitwise_not = _unary("bitwise_not")
isfinite = _unary("isfinite")
isnan = _unary("isnan")
isinf = _unary("isinf")
signbit = _unary("signbit")
logical_not = _unary("logical_not")


@ltorch_op(torch_fns=[torch.positive, torch.Tensor.positive], methods=["positive"])
def positive(a: TensorProxy) -> TensorProxy:
    """torch.positive: returns its input."""
    return a


def _binary(name: str, *, float_result: bool = False) -> Symbol:
    """Declares the ltorch op `name`: the prim of that name with broadcasting and type promotion (to a float
    dtype if `float_result`)."""
    prim = getattr(prims, name)

    def decomposition(a: Any, b: Any) -> TensorProxy:
        dtype = result_dtype(a, b)
        if float_result:
            dtype = float_dtype(dtype)
        return elementwise(prim, a, b, compute_dtype=dtype)

    fns, methods = _names_of(name)
    return declare_op(name, decomposition, f"torch.{name}, elementwise with broadcasting and type promotion.",
                      torch_fns=fns, methods=methods)


remainder = _binary("remainder")
fmod = _binary("fmod")
maximum = _binary("maximum")
minimum = _binary("minimum")
bitwise_and = _binary("bitwise_and")
bitwise_or = _binary("bitwise_or")
bitwise_xor = _binary("bitwise_xor")
bitwise_left_shift = _binary("bitwise_left_shift")
bitwise_right_shift = _binary("bitwise_right_shift")
floor_divide = _binary("floor_divide")
atan2 = _binary("atan2", float_result=True)
copysign = _binary("copysign", float_result=True)
# Comparisons compute in the promoted dtype; the prims return bool.
eq = _binary("eq")
ne = _binary("ne")
lt = _binary("lt")
le = _binary("le")
gt = _binary("gt")
ge = _binary("ge")


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
    if factor is None or (not data_dependent(factor) and rule_compare(factor, "==", 1)):
        return x  # (a factor the trace computes is multiplied by: exact at 1, and no trace per value)
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
    # Only a constant 2 becomes a product: comparing a symbolic exponent would guard it (an exponent read from a
    # tensor, `beta ** step` in torch.optim with tensor betas, by value: a trace per step); pow is eager's op anyway.
    if isinstance(a, TensorProxy) and not isinstance(b, TensorProxy | NumberProxy) and b == 2:
        return mul(a, a)
    return elementwise(prims.pow, a, b)


def _logical(name: str) -> Symbol:
    """Declares the ltorch op `name`: the prim of that name on truth values, with broadcasting."""
    prim = getattr(prims, name)

    def decomposition(a: Any, b: Any) -> TensorProxy:
        return elementwise(prim, a, b, compute_dtype=torch.bool)

    return declare_op(name, decomposition, f"torch.{name}: compares truth values elementwise.")


logical_and = _logical("logical_and")
logical_or = _logical("logical_or")
logical_xor = _logical("logical_xor")


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

