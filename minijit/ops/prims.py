"""prims: the small functional core every other op decomposes into.

Each prim is a `Symbol` with a meta function that checks its inputs and returns
proxies for its outputs. Prims do no implicit broadcasting or type promotion:
elementwise prims take tensors of one shape and one dtype (plus Python numbers);
`minijit.ops.ltorch` inserts the `broadcast_in_dim` and `convert_element_type`
calls that torch performs implicitly. The exceptions to "functional" are `copy_`
and `copy_to_out_`, which write into an existing tensor (docs/design.md, invariants 1, 2).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.errors import MetaError
from minijit.ir import Effects, FloatProxy, IntegerProxy, NumberProxy, Symbol, Tag, TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import (
    NUMBER_METHODS,
    broadcasts_to,
    data_dependent,
    number_value,
    rule_compare,
    rule_same_shape,
)

Number = int | float | bool | complex | NumberProxy
Shape = tuple[int | IntegerProxy, ...]

ALL_PRIMS: dict[str, Symbol] = {}

# The effects prims declare (minijit.ir.Effects): the few that are not pure functions.
VIEW = Effects(views=0)  # the output views the first argument (torch runs these as views)
REORDERING_VIEW = Effects(views=0, reorders=True)  # ... holding all its elements, reshaped or reordered
SAME_IF_UNCHANGED = Effects(views=0, same_if_unchanged=True)  # torch returns the argument itself for a no-op
RANDOM = Effects(random=True)  # draws from, seeds or reads torch's generator: kept, in order, never deduplicated
CHEAP = frozenset({Tag.CHEAP})  # the tags (minijit.ir.Tag) of the layout prims
ELEMENTWISE = frozenset({Tag.CHEAP, Tag.ELEMENTWISE})  # ... and of the pointwise prims


def _prim(name: str, meta: Callable[..., Any], effects: Effects | None = None,
          tags: frozenset[str] = frozenset()) -> Symbol:
    sym = Symbol(name, meta, namespace="prims", is_prim=True, effects=effects or Effects(), tags=tags)
    ALL_PRIMS[name] = sym
    return sym


def _fail(op: str, msg: str) -> MetaError:
    return MetaError(f"prims.{op}: {msg}{where_now()}")


def _check_tensor(op: str, x: Any, what: str = "input") -> TensorProxy:
    if not isinstance(x, TensorProxy):
        raise _fail(op, f"expected a tensor for {what}, got {type(x).__name__}")
    return x


def _check_same(op: str, tensors: Sequence[TensorProxy], dtype: bool = True) -> None:
    first = tensors[0]
    for t in tensors[1:]:
        if not rule_same_shape(t.shape, first.shape):
            raise _fail(op, f"shapes differ: {tuple(first.shape)} and {tuple(t.shape)}")
        if t.device != first.device:
            raise _fail(op, f"devices differ: {first.device} and {t.device}")
        if dtype and t.dtype != first.dtype:
            raise _fail(op, f"dtypes differ: {first.dtype} and {t.dtype}")


def _canonical_dim(op: str, dim: int, ndim: int) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise _fail(op, f"dimension {dim} is out of range for a tensor of rank {ndim}")
    return dim % max(ndim, 1)


# -- elementwise ---------------------------------------------------------------

def _elementwise_meta(op: str, result_dtype: Callable[[torch.dtype], torch.dtype] | None) -> Callable[..., Any]:
    def meta(*args: Any) -> TensorProxy:
        tensors = [a for a in args if isinstance(a, TensorProxy)]
        if not tensors:
            raise _fail(op, "needs at least one tensor argument")
        for a in args:
            if not isinstance(a, TensorProxy | int | float | bool | complex | NumberProxy):
                raise _fail(op, f"unsupported argument of type {type(a).__name__}")
        _check_same(op, tensors)
        t = tensors[0]
        dtype = result_dtype(t.dtype) if result_dtype else t.dtype
        return TensorProxy(t.shape, dtype, t.device, any(x.requires_grad for x in tensors))
    return meta


def _to_bool(_: torch.dtype) -> torch.dtype:
    return torch.bool


def _to_real(dtype: torch.dtype) -> torch.dtype:
    return dtype.to_real() if dtype.is_complex else dtype


_UNARY: list[str] = []
_BINARY: list[str] = []
_TERNARY: list[str] = []


def _elementwise(name: str, arity: list[str], result: Callable[[torch.dtype], torch.dtype] | None = None,
                 effects: Effects | None = None) -> Symbol:
    """Declares the elementwise prim `name`, listed in `arity` (`_UNARY`, ...); `result` maps its input dtype to
    its output's (the same dtype when None)."""
    arity.append(name)
    return _prim(name, _elementwise_meta(name, result), effects, ELEMENTWISE)


abs = _elementwise("abs", _UNARY, result=_to_real)  # noqa: A001 - mirrors torch.abs
neg = _elementwise("neg", _UNARY)
exp = _elementwise("exp", _UNARY)
exp2 = _elementwise("exp2", _UNARY)
expm1 = _elementwise("expm1", _UNARY)
log = _elementwise("log", _UNARY)
log1p = _elementwise("log1p", _UNARY)
log2 = _elementwise("log2", _UNARY)
log10 = _elementwise("log10", _UNARY)
sin = _elementwise("sin", _UNARY)
cos = _elementwise("cos", _UNARY)
tan = _elementwise("tan", _UNARY)
asin = _elementwise("asin", _UNARY)
acos = _elementwise("acos", _UNARY)
atan = _elementwise("atan", _UNARY)
sinh = _elementwise("sinh", _UNARY)
cosh = _elementwise("cosh", _UNARY)
tanh = _elementwise("tanh", _UNARY)
asinh = _elementwise("asinh", _UNARY)
acosh = _elementwise("acosh", _UNARY)
atanh = _elementwise("atanh", _UNARY)
sqrt = _elementwise("sqrt", _UNARY)
rsqrt = _elementwise("rsqrt", _UNARY)
reciprocal = _elementwise("reciprocal", _UNARY)
erf = _elementwise("erf", _UNARY)
erfc = _elementwise("erfc", _UNARY)
erfinv = _elementwise("erfinv", _UNARY)
lgamma = _elementwise("lgamma", _UNARY)
digamma = _elementwise("digamma", _UNARY)
floor = _elementwise("floor", _UNARY)
ceil = _elementwise("ceil", _UNARY)
round = _elementwise("round", _UNARY)  # noqa: A001 - mirrors torch.round
trunc = _elementwise("trunc", _UNARY)
sign = _elementwise("sign", _UNARY)
bitwise_not = _elementwise("bitwise_not", _UNARY)
logical_not = _elementwise("logical_not", _UNARY, result=_to_bool)
isfinite = _elementwise("isfinite", _UNARY, result=_to_bool)
isnan = _elementwise("isnan", _UNARY, result=_to_bool)
isinf = _elementwise("isinf", _UNARY, result=_to_bool)
signbit = _elementwise("signbit", _UNARY, result=_to_bool)
# torch.real and torch.imag return views of a complex tensor.
real = _elementwise("real", _UNARY, result=_to_real, effects=VIEW)
imag = _elementwise("imag", _UNARY, result=_to_real, effects=VIEW)

add = _elementwise("add", _BINARY)
sub = _elementwise("sub", _BINARY)
mul = _elementwise("mul", _BINARY)
div = _elementwise("div", _BINARY)
floor_divide = _elementwise("floor_divide", _BINARY)
remainder = _elementwise("remainder", _BINARY)
fmod = _elementwise("fmod", _BINARY)
pow = _elementwise("pow", _BINARY)  # noqa: A001 - mirrors torch.pow
maximum = _elementwise("maximum", _BINARY)
minimum = _elementwise("minimum", _BINARY)
atan2 = _elementwise("atan2", _BINARY)
copysign = _elementwise("copysign", _BINARY)
bitwise_and = _elementwise("bitwise_and", _BINARY)
bitwise_or = _elementwise("bitwise_or", _BINARY)
bitwise_xor = _elementwise("bitwise_xor", _BINARY)
bitwise_left_shift = _elementwise("bitwise_left_shift", _BINARY)
bitwise_right_shift = _elementwise("bitwise_right_shift", _BINARY)
eq = _elementwise("eq", _BINARY, result=_to_bool)
ne = _elementwise("ne", _BINARY, result=_to_bool)
lt = _elementwise("lt", _BINARY, result=_to_bool)
le = _elementwise("le", _BINARY, result=_to_bool)
gt = _elementwise("gt", _BINARY, result=_to_bool)
ge = _elementwise("ge", _BINARY, result=_to_bool)
logical_and = _elementwise("logical_and", _BINARY, result=_to_bool)
logical_or = _elementwise("logical_or", _BINARY, result=_to_bool)
logical_xor = _elementwise("logical_xor", _BINARY, result=_to_bool)

lerp = _elementwise("lerp", _TERNARY)


def _where_meta(pred: TensorProxy, a: Any, b: Any) -> TensorProxy:
    _check_tensor("where", pred, "the condition")
    if pred.dtype != torch.bool:
        raise _fail("where", f"the condition must be bool, got {pred.dtype}")
    values = [x for x in (a, b) if isinstance(x, TensorProxy)]
    _check_same("where", values)
    _check_same("where", [pred, *values], dtype=False)
    like = values[0] if values else pred
    dtype = values[0].dtype if values else torch.get_default_dtype()
    return TensorProxy(pred.shape, dtype, like.device, any(v.requires_grad for v in values))


where = _prim("where", _where_meta, tags=ELEMENTWISE)

# The elementwise prims' names by arity (read by the executors and the batching rules).
UNARY = tuple(_UNARY)
BINARY = tuple(_BINARY)
TERNARY = (where.name, *_TERNARY)


def _polygamma_meta(n: int, x: TensorProxy) -> TensorProxy:
    if type(n) is not int or n < 0:
        raise _fail("polygamma", f"the order n must be a non-negative Python int, got {n!r}")
    _check_tensor("polygamma", x)
    if not x.dtype.is_floating_point:
        raise _fail("polygamma", f"needs a floating point tensor, got {x.dtype}; convert it first")
    return TensorProxy.like(x)


# `polygamma(n, x)`: the n-th derivative of digamma at x (torch.polygamma's argument order);
# digamma's VJP needs polygamma(1, x), and polygamma(n, x)'s needs polygamma(n + 1, x).
polygamma = _prim("polygamma", _polygamma_meta)


# -- dtype, shape and layout -----------------------------------------------------

def _convert_element_type_meta(x: Any, dtype: torch.dtype) -> Any:
    if not isinstance(dtype, torch.dtype):
        raise _fail("convert_element_type", f"expected a torch.dtype, got {dtype!r}")
    if isinstance(x, TensorProxy):
        return TensorProxy.like(x, dtype=dtype, requires_grad=x.requires_grad and (dtype.is_floating_point or dtype.is_complex))
    raise _fail("convert_element_type", f"expected a tensor, got {type(x).__name__}")


convert_element_type = _prim("convert_element_type", _convert_element_type_meta, SAME_IF_UNCHANGED,
                             CHEAP | {Tag.CAST})


def _broadcast_in_dim_meta(x: TensorProxy, shape: Shape, broadcast_dims: Sequence[int]) -> TensorProxy:
    _check_tensor("broadcast_in_dim", x)
    if len(broadcast_dims) != x.ndim:
        raise _fail("broadcast_in_dim",
                    f"broadcast_dims {tuple(broadcast_dims)} must name one output dim per input dim ({x.ndim})")
    last = -1
    for d, size in zip(broadcast_dims, x.shape, strict=True):
        if not last < d < len(shape):
            raise _fail("broadcast_in_dim", f"broadcast_dims {tuple(broadcast_dims)} must be increasing and < {len(shape)}")
        if not broadcasts_to(size, shape[d]):
            raise _fail("broadcast_in_dim", f"cannot broadcast {tuple(x.shape)} to {tuple(shape)}")
        last = d
    return TensorProxy.like(x, shape=tuple(shape))


broadcast_in_dim = _prim("broadcast_in_dim", _broadcast_in_dim_meta, VIEW, CHEAP)


def _device_put_meta(x: TensorProxy, device: torch.device) -> TensorProxy:
    _check_tensor("device_put", x)
    if not isinstance(device, torch.device):
        raise _fail("device_put", f"expected a torch.device, got {device!r}")
    return TensorProxy.like(x, device=device)


device_put = _prim("device_put", _device_put_meta, SAME_IF_UNCHANGED)


def _numel(shape: Shape) -> Any:
    return math.prod(shape) if all(type(d) is int for d in shape) else None


def _reshape_meta(x: TensorProxy, shape: Shape) -> TensorProxy:
    _check_tensor("reshape", x)
    if any(type(d) is int and d < 0 for d in shape):
        raise _fail("reshape", f"shape {tuple(shape)} has a negative size; ltorch resolves -1 before this prim")
    a, b = _numel(x.shape), _numel(shape)
    if a is not None and b is not None and rule_compare(a, "!=", b):
        raise _fail("reshape", f"cannot reshape {tuple(x.shape)} ({a} elements) to {tuple(shape)} ({b} elements)")
    return TensorProxy.like(x, shape=tuple(shape))


reshape = _prim("reshape", _reshape_meta, REORDERING_VIEW, CHEAP)


def _transpose_meta(x: TensorProxy, permutation: Sequence[int]) -> TensorProxy:
    _check_tensor("transpose", x)
    if sorted(permutation) != list(range(x.ndim)):
        raise _fail("transpose", f"{tuple(permutation)} is not a permutation of the {x.ndim} dims")
    return TensorProxy.like(x, shape=tuple(x.shape[p] for p in permutation))


transpose = _prim("transpose", _transpose_meta, REORDERING_VIEW, CHEAP)


def _slice_meta(x: TensorProxy, start_indices: Sequence[int], end_indices: Sequence[int],
                strides: Sequence[int] | None = None) -> TensorProxy:
    _check_tensor("slice", x)
    strides = strides if strides is not None else [1] * x.ndim
    if not len(start_indices) == len(end_indices) == len(strides) == x.ndim:
        raise _fail("slice", "start_indices, end_indices and strides need one entry per dim")
    shape = []
    for start, end, step, size in zip(start_indices, end_indices, strides, x.shape, strict=True):
        # Bounds the trace computes (`x[:n.item()]`) are clamped by the caller with arithmetic the trace runs
        # (minijit.ops.runtime_bounds): comparing them here would put a check of each in the trace.
        computed = _computed_bound(start) or _computed_bound(end)
        if (type(size) is int and not computed and not (rule_compare(0, "<=", start) and rule_compare(start, "<=", end)
                                                        and rule_compare(end, "<=", size))) or rule_compare(step, "<", 1):
            raise _fail("slice", f"bad slice {start}:{end}:{step} of a dim of size {size}")
        shape.append((end - start + (step - 1)) // step)  # unchanged sizes stay the same value
    return TensorProxy.like(x, shape=tuple(shape))


def _computed_bound(x: Any) -> bool:
    """Whether slice bound `x` is a number the trace computes whose real value the capture saw (not read)."""
    return isinstance(x, NumberProxy) and data_dependent(x) and x.seen


slice_prim = _prim("slice", _slice_meta, VIEW)


def _squeeze_meta(x: TensorProxy, dims: Sequence[int]) -> TensorProxy:
    _check_tensor("squeeze", x)
    dims = {_canonical_dim("squeeze", d, x.ndim) for d in dims}
    for d in dims:
        if rule_compare(x.shape[d], "!=", 1):
            raise _fail("squeeze", f"dim {d} has size {x.shape[d]}, not 1")
    return TensorProxy.like(x, shape=tuple(s for i, s in enumerate(x.shape) if i not in dims))


squeeze = _prim("squeeze", _squeeze_meta, REORDERING_VIEW, CHEAP)


def _cat_meta(tensors: Sequence[TensorProxy], dim: int) -> TensorProxy:
    if not tensors:
        raise _fail("cat", "needs at least one tensor")
    for t in tensors:
        _check_tensor("cat", t)
    first = tensors[0]
    dim = _canonical_dim("cat", dim, first.ndim)
    size = 0
    for t in tensors:
        others = (rule_compare(a, "!=", b) for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != dim)
        if t.ndim != first.ndim or any(others):
            raise _fail("cat", f"shapes {tuple(first.shape)} and {tuple(t.shape)} differ outside dim {dim}")
        if t.dtype != first.dtype or t.device != first.device:
            raise _fail("cat", "all tensors need the same dtype and device")
        size = size + t.shape[dim]
    shape = list(first.shape)
    shape[dim] = size
    return TensorProxy(tuple(shape), first.dtype, first.device, any(t.requires_grad for t in tensors))


cat = _prim("cat", _cat_meta)


def _shape_meta(x: TensorProxy) -> tuple[Any, ...]:
    _check_tensor("shape", x)
    return tuple(x.shape)


shape = _prim("shape", _shape_meta, tags=frozenset({Tag.METADATA}))


def _detach_meta(x: TensorProxy) -> TensorProxy:
    _check_tensor("detach", x)
    return TensorProxy.like(x, requires_grad=False)


# The same values with requires_grad=False: where gradients stop (torch.detach, x.data). Eager's result
# shares the argument's memory: a write through it (`w.detach().mul_(2)`) writes `w`.
detach = _prim("detach", _detach_meta, VIEW, tags=frozenset({Tag.STOPS_GRADIENT}))


# -- reductions ---------------------------------------------------------------

def _reduced_shape(op: str, x: TensorProxy, dims: Sequence[int]) -> tuple[Any, ...]:
    dims = {_canonical_dim(op, d, x.ndim) for d in dims}
    return tuple(s for i, s in enumerate(x.shape) if i not in dims)


def _reduction_meta(op: str) -> Callable[..., TensorProxy]:
    def meta(x: TensorProxy, dims: Sequence[int]) -> TensorProxy:
        _check_tensor(op, x)
        return TensorProxy.like(x, shape=_reduced_shape(op, x, dims))
    return meta


sum = _prim("sum", _reduction_meta("sum"))  # noqa: A001 - the prim is called sum
prod = _prim("prod", _reduction_meta("prod"))
amax = _prim("amax", _reduction_meta("amax"))
amin = _prim("amin", _reduction_meta("amin"))


def _arg_reduction_meta(op: str) -> Callable[..., TensorProxy]:
    def meta(x: TensorProxy, dim: int) -> TensorProxy:
        _check_tensor(op, x)
        return TensorProxy.like(x, shape=_reduced_shape(op, x, [dim]), dtype=torch.int64, requires_grad=False)
    return meta


argmax = _prim("argmax", _arg_reduction_meta("argmax"))
argmin = _prim("argmin", _arg_reduction_meta("argmin"))


def _var_mean_meta(x: TensorProxy, dims: Sequence[int], correction: Number) -> tuple[TensorProxy, TensorProxy]:
    _check_tensor("var_mean", x)
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise _fail("var_mean", f"needs a floating point tensor, got {x.dtype}")
    shape_ = _reduced_shape("var_mean", x, dims)
    return TensorProxy.like(x, shape=shape_, dtype=_to_real(x.dtype)), TensorProxy.like(x, shape=shape_)


var_mean = _prim("var_mean", _var_mean_meta)


def _cumsum_meta(x: TensorProxy, dim: int) -> TensorProxy:
    _check_tensor("cumsum", x)
    _canonical_dim("cumsum", dim, x.ndim)
    return TensorProxy.like(x)


cumsum = _prim("cumsum", _cumsum_meta)


def _topk_meta(x: TensorProxy, k: int, dim: int, largest: bool, sorted: bool) -> tuple[TensorProxy, TensorProxy]:  # noqa: A002
    _check_tensor("topk", x)
    d = _canonical_dim("topk", dim, x.ndim)
    size = x.shape[d] if x.ndim else 1
    if type(k) is int and type(size) is int and not 0 <= k <= size:
        raise _fail("topk", f"k={k} is out of range for a dim of size {size}")
    shape_ = tuple(k if i == d else s for i, s in enumerate(x.shape))
    return TensorProxy.like(x, shape=shape_), TensorProxy.like(x, shape=shape_, dtype=torch.int64, requires_grad=False)


topk = _prim("topk", _topk_meta)


def _sort_meta(x: TensorProxy, dim: int, descending: bool, stable: bool) -> tuple[TensorProxy, TensorProxy]:
    _check_tensor("sort", x)
    _canonical_dim("sort", dim, x.ndim)
    return TensorProxy.like(x), TensorProxy.like(x, dtype=torch.int64, requires_grad=False)


sort = _prim("sort", _sort_meta)


# -- linear algebra -------------------------------------------------------------

def _matmul_meta(a: TensorProxy, b: TensorProxy) -> TensorProxy:
    _check_tensor("matmul", a)
    _check_tensor("matmul", b)
    if a.dtype != b.dtype or a.device != b.device:
        raise _fail("matmul", f"operands differ: {a.dtype} on {a.device} and {b.dtype} on {b.device}")
    if a.ndim == 0 or b.ndim == 0:
        raise _fail("matmul", "both operands need at least one dimension")
    if a.ndim == 1 and b.ndim == 1:
        if rule_compare(a.shape[0], "!=", b.shape[0]):
            raise _fail("matmul", f"vector sizes differ: {a.shape[0]} and {b.shape[0]}")
        return TensorProxy((), a.dtype, a.device, a.requires_grad or b.requires_grad)
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if rule_compare(k_a, "!=", k_b):
        raise _fail("matmul", f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}")
    if a.ndim == 1:
        out = (*tuple(b.shape[:-2]), b.shape[-1])
    elif b.ndim == 1:
        out = tuple(a.shape[:-1])
    else:
        batch_a, batch_b = a.shape[:-2], b.shape[:-2]
        if batch_a and batch_b and not rule_same_shape(batch_a, batch_b):
            raise _fail("matmul", f"batch dims differ: {tuple(batch_a)} and {tuple(batch_b)}; ltorch broadcasts them")
        out = (*tuple(batch_a or batch_b), a.shape[-2], b.shape[-1])
    return TensorProxy(out, a.dtype, a.device, a.requires_grad or b.requires_grad)


matmul = _prim("matmul", _matmul_meta)


# -- attention ------------------------------------------------------------------------

_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _check_flash_inputs(op: str, q: Any, k: Any, v: Any, attn_mask: Any, is_causal: Any, scale: Any) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        _check_tensor(op, t, name)
        if t.ndim != 4:
            raise _fail(op, f"{name} must have 4 dims (batch, heads, length, head size), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in _FLASH_DTYPES:
        raise _fail(op, f"query, key and value need one dtype among float32, float64, bfloat16; got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device or q.device.type != "cpu":
        raise _fail(op, f"query, key and value must be on the CPU, got {q.device}, {k.device}, {v.device}")
    # Key/value heads may be shared by groups of query heads (GQA), which the kernel takes as they are.
    if (not (rule_compare(q.shape[0], "==", k.shape[0]) and rule_compare(k.shape[0], "==", v.shape[0]))
            or rule_compare(k.shape[1], "!=", v.shape[1]) or rule_compare(k.shape[1], "==", 0)
            or q.shape[1] % k.shape[1] or rule_compare(k.shape[2], "!=", v.shape[2])):
        raise _fail(op, f"batch, heads or key length differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (rule_compare(q.shape[3], "==", k.shape[3]) and rule_compare(k.shape[3], "==", v.shape[3])):
        raise _fail(op, f"query, key and value need one head size, got {q.shape[3]}, {k.shape[3]}, {v.shape[3]}")
    if attn_mask is not None:
        _check_tensor(op, attn_mask, "attn_mask")
        if attn_mask.ndim not in (2, 4) or attn_mask.dtype != q.dtype or attn_mask.device != q.device:
            raise _fail(op, f"attn_mask must be a 2-d or 4-d {q.dtype} tensor, got {attn_mask.dtype}"
                            f"{list(attn_mask.shape)}")
        full = (*q.shape[:3], k.shape[2])
        for m, f in zip(reversed(attn_mask.shape), reversed(full), strict=False):
            if not broadcasts_to(m, f):
                raise _fail(op, f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {full}")
    if not isinstance(is_causal, bool):
        raise _fail(op, f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is not None and not isinstance(scale, int | float | NumberProxy):
        raise _fail(op, f"scale must be a number or None, got {type(scale).__name__}")


def _logsumexp_proxy(q: TensorProxy) -> TensorProxy:
    dtype = torch.float32 if q.dtype == torch.bfloat16 else q.dtype
    return TensorProxy.like(q, shape=tuple(q.shape[:3]), dtype=dtype, requires_grad=False)


def _sdpa_flash_meta(query: TensorProxy, key: TensorProxy, value: TensorProxy, attn_mask: Any, is_causal: bool,
                     scale: Any) -> tuple[TensorProxy, TensorProxy]:
    _check_flash_inputs("sdpa_flash", query, key, value, attn_mask, is_causal, scale)
    rg = query.requires_grad or key.requires_grad or value.requires_grad
    out = TensorProxy.like(query, shape=(*query.shape[:3], value.shape[3]), requires_grad=rg)
    return out, _logsumexp_proxy(query)


# Attention without dropout as one CPU flash-attention kernel: the output and the
# logsumexp of each query row (batch, heads, length; float32 for bfloat16 inputs).
sdpa_flash = _prim("sdpa_flash", _sdpa_flash_meta)


def _sdpa_flash_backward_meta(grad_out: TensorProxy, query: TensorProxy, key: TensorProxy, value: TensorProxy,
                              out: TensorProxy, logsumexp: TensorProxy, attn_mask: Any, is_causal: bool,
                              scale: Any) -> tuple[TensorProxy, TensorProxy, TensorProxy]:
    op = "sdpa_flash_backward"
    _check_flash_inputs(op, query, key, value, attn_mask, is_causal, scale)
    expected = (*query.shape[:3], value.shape[3])
    for name, t in (("grad_out", grad_out), ("out", out)):
        _check_tensor(op, t, name)
        if not rule_same_shape(t.shape, expected) or t.dtype != query.dtype:
            raise _fail(op, f"{name} must be {query.dtype}{list(expected)}, got {t.dtype}{list(t.shape)}")
    lse = _logsumexp_proxy(query)
    _check_tensor(op, logsumexp, "logsumexp")
    if not rule_same_shape(logsumexp.shape, lse.shape) or logsumexp.dtype != lse.dtype:
        raise _fail(op, f"logsumexp must be {lse.dtype}{list(lse.shape)}, got {logsumexp.dtype}{list(logsumexp.shape)}")
    return TensorProxy.like(query), TensorProxy.like(key), TensorProxy.like(value)


# The gradients of query, key and value of `sdpa_flash` (none for the mask).
sdpa_flash_backward = _prim("sdpa_flash_backward", _sdpa_flash_backward_meta)


# -- creation and randomness -------------------------------------------------------

def _full_meta(shape: Shape, fill_value: Number, *, dtype: torch.dtype, device: torch.device) -> TensorProxy:
    return TensorProxy(tuple(shape), dtype, torch.device(device))


full = _prim("full", _full_meta)


def _iota_meta(length: int, *, start: Number, step: Number, dtype: torch.dtype, device: torch.device) -> TensorProxy:
    return TensorProxy((length,), dtype, torch.device(device))


iota = _prim("iota", _iota_meta)


# -- randomness ------------------------------------------------------------------------
#
# Random prims draw from torch's default generator (or the `generator=` given) exactly as eager's ops do (the torch
# executor runs each as that very call), so a seeded run matches eager bit for bit and
# leaves the generator where eager leaves it. Their first argument is the result's size,
# or a tensor whose size and memory layout the result takes (as `torch.empty_like`, which
# eager's `*_like` ops, in-place fills and dropout start from: the layout decides which
# element gets which draw). Tagged RANDOM, as are the prims that seed or read the
# generator: they run in trace order, each exactly once, and no pass merges or drops them.

def _check_generator(op: str, generator: Any, device: Any) -> None:
    """An explicit `generator=`: a torch.Generator on the result's device (eager refuses another)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise _fail(op, f"generator must be a torch.Generator, got {type(generator).__name__}")
    if device is not None and torch.device(generator.device).type != torch.device(device).type:
        raise _fail(op, f"the generator is on {generator.device}, the result on {device}")


def _random_result(op: str, size_or_like: Any, dtype: torch.dtype, device: Any,
                   kinds: str = "floating", generator: Any = None) -> TensorProxy:
    if isinstance(size_or_like, TensorProxy):
        shape_, device = tuple(size_or_like.shape), device if device is not None else size_or_like.device
    elif isinstance(size_or_like, tuple | list):
        shape_ = tuple(size_or_like)
    else:
        raise _fail(op, f"expected a size or a tensor to take it from, got {type(size_or_like).__name__}")
    if not isinstance(dtype, torch.dtype) or (kinds == "floating" and not dtype.is_floating_point):
        raise _fail(op, f"needs a {kinds} dtype, got {dtype}")
    if device is None:
        raise _fail(op, "needs a device when given a size")
    _check_generator(op, generator, device)
    return TensorProxy(shape_, dtype, torch.device(device), requires_grad=False)


def _two_parameter_meta(op: str, kinds: str = "floating") -> Callable[..., TensorProxy]:
    def meta(size_or_like: Any, a: Number, b: Number, *, dtype: torch.dtype, device: Any = None,
             generator: torch.Generator | None = None) -> TensorProxy:
        return _random_result(op, size_or_like, dtype, device, kinds, generator)
    return meta


def _one_parameter_meta(op: str) -> Callable[..., TensorProxy]:
    def meta(size_or_like: Any, a: Number, *, dtype: torch.dtype, device: Any = None,
             generator: torch.Generator | None = None) -> TensorProxy:
        return _random_result(op, size_or_like, dtype, device, generator=generator)
    return meta


# `uniform(size, low, high)`: `torch.empty(size).uniform_(low, high)` (torch.rand is (0, 1)).
uniform = _prim("uniform", _two_parameter_meta("uniform"), RANDOM)
# `normal(size, mean, std)`: `torch.empty(size).normal_(mean, std)` (torch.randn is (0, 1)).
normal = _prim("normal", _two_parameter_meta("normal"), RANDOM)
# `random_integers(size, low, high)`: `torch.empty(size).random_(low, high)`, as torch.randint draws.
random_integers = _prim("random_integers", _two_parameter_meta("random_integers", kinds="real"), RANDOM)
# `exponential(size, rate)`: `torch.empty(size).exponential_(rate)`.
exponential = _prim("exponential", _one_parameter_meta("exponential"), RANDOM)


def _bernoulli_meta(size_or_like: Any, p: Any, *, dtype: torch.dtype, device: Any = None,
                    generator: torch.Generator | None = None) -> TensorProxy:
    out = _random_result("bernoulli", size_or_like, dtype, device, kinds="real", generator=generator)
    if isinstance(p, TensorProxy):
        if not p.dtype.is_floating_point:
            raise _fail("bernoulli", f"needs floating point probabilities, got {p.dtype}")
        if p.requires_grad:
            raise _fail("bernoulli", "the probabilities require grad; eager gives them a zero gradient, which "
                                     "minijit does not reproduce: detach them")
    return out


# `bernoulli(size, p)`: `torch.empty(size).bernoulli_(p)`: 1 with probability p (a number, or a tensor of
# probabilities per element), else 0: torch.bernoulli, and dropout's mask.
bernoulli = _prim("bernoulli", _bernoulli_meta, RANDOM)


def _native_dropout_meta(x: TensorProxy, p: float) -> tuple[TensorProxy, TensorProxy]:
    _check_tensor("native_dropout", x)
    if not x.dtype.is_floating_point or not (rule_compare(0, "<", p) and rule_compare(p, "<", 1)):
        raise _fail("native_dropout", f"needs a floating point tensor and 0 < p < 1, got {x.dtype} and p={p}")
    return TensorProxy.like(x), TensorProxy.like(x, dtype=torch.bool, requires_grad=False)


# `native_dropout(x, p)`: torch.native_dropout, the fused kernel eager's dropout runs on CUDA: the
# result and the mask of kept elements.
native_dropout = _prim("native_dropout", _native_dropout_meta, RANDOM)


def _native_dropout_backward_meta(grad: TensorProxy, mask: TensorProxy, scale: float) -> TensorProxy:
    _check_tensor("native_dropout_backward", grad, "grad")
    _check_tensor("native_dropout_backward", mask, "mask")
    return TensorProxy.like(grad, requires_grad=False)


# `native_dropout_backward(grad, mask, scale)`: grad * mask * scale, as eager's dropout backward on CUDA.
native_dropout_backward = _prim("native_dropout_backward", _native_dropout_backward_meta)


def _randperm_meta(n: int, *, dtype: torch.dtype, device: Any, generator: torch.Generator | None = None) -> TensorProxy:
    if type(n) is not int or n < 0:
        raise _fail("randperm", f"n must be a non-negative int, got {n!r}")
    _check_generator("randperm", generator, device)
    return TensorProxy((n,), dtype, torch.device(device), requires_grad=False)


# `randperm(n)`: torch.randperm: a random permutation of 0 .. n-1.
randperm = _prim("randperm", _randperm_meta, RANDOM)


def _multinomial_meta(probs: TensorProxy, num_samples: int, replacement: bool, *,
                      generator: torch.Generator | None = None) -> TensorProxy:
    _check_tensor("multinomial", probs, "the probabilities")
    _check_generator("multinomial", generator, probs.device)
    if probs.ndim not in (1, 2) or type(num_samples) is not int or num_samples <= 0:
        raise _fail("multinomial", f"needs 1-d or 2-d probabilities and a positive number of samples, got "
                                   f"{probs.type_string()} and {num_samples!r}")
    if not replacement and type(probs.shape[-1]) is int and rule_compare(num_samples, ">", probs.shape[-1]):
        raise _fail("multinomial", f"cannot draw {num_samples} samples from {probs.shape[-1]} categories "
                                   "without replacement")
    return TensorProxy((*probs.shape[:-1], num_samples), torch.int64, probs.device, requires_grad=False)


# `multinomial(probs, num_samples, replacement)`: torch.multinomial: category indices drawn by weight.
multinomial = _prim("multinomial", _multinomial_meta, RANDOM)


def _manual_seed_meta(seed: int | IntegerProxy) -> None:
    if not isinstance(seed, int | IntegerProxy) or isinstance(seed, bool):
        raise _fail("manual_seed", f"the seed must be an int, got {type(seed).__name__}")


# `manual_seed(seed)`: torch.manual_seed: reseeds the default generators of every device.
manual_seed = _prim("manual_seed", _manual_seed_meta, RANDOM)


def _seed_meta() -> IntegerProxy:
    return IntegerProxy(0)


# `seed()`: torch.seed: reseeds from a non-deterministic source and returns the seed.
seed = _prim("seed", _seed_meta, RANDOM)
# `initial_seed()`: torch.initial_seed: the seed the default generator was last seeded with.
initial_seed = _prim("initial_seed", _seed_meta, RANDOM)


def _get_rng_state_meta(device: torch.device) -> TensorProxy:
    size = torch.get_rng_state().numel() if torch.device(device).type == "cpu" else 16
    return TensorProxy((size,), torch.uint8, torch.device("cpu"), requires_grad=False)


# `get_rng_state(device)`: the state of that device's default generator, a uint8 CPU tensor.
get_rng_state = _prim("get_rng_state", _get_rng_state_meta, RANDOM)


def _set_rng_state_meta(state: TensorProxy, device: torch.device) -> None:
    _check_tensor("set_rng_state", state, "the state")
    if state.dtype != torch.uint8:
        raise _fail("set_rng_state", f"the state must be a uint8 tensor (from get_rng_state), got {state.dtype}")


# `set_rng_state(state, device)`: restores that device's default generator to `state`.
set_rng_state = _prim("set_rng_state", _set_rng_state_meta, RANDOM)


# -- indexing -------------------------------------------------------------------

def _check_index(op: str, index: TensorProxy, ndim: int = 1) -> None:
    _check_tensor(op, index, "index")
    if index.dtype not in (torch.int64, torch.int32):
        raise _fail(op, f"the index must be int64 or int32, got {index.dtype}")
    if ndim is not None and index.ndim != ndim:
        raise _fail(op, f"the index must have {ndim} dimension(s), got {index.ndim}")


def _take_meta(x: TensorProxy, index: TensorProxy, dim: int) -> TensorProxy:
    _check_tensor("take", x)
    _check_index("take", index)
    dim = _canonical_dim("take", dim, x.ndim)
    shape_ = list(x.shape)
    shape_[dim] = index.shape[0]
    return TensorProxy.like(x, shape=tuple(shape_))


take = _prim("take", _take_meta)


def _take_along_axis_meta(x: TensorProxy, index: TensorProxy, dim: int) -> TensorProxy:
    _check_tensor("take_along_axis", x)
    _check_index("take_along_axis", index, ndim=x.ndim)
    return TensorProxy.like(x, shape=index.shape)


take_along_axis = _prim("take_along_axis", _take_along_axis_meta)


def _index_update_meta(op: str) -> Callable[..., TensorProxy]:
    def meta(x: TensorProxy, index: TensorProxy, value: TensorProxy, dim: int) -> TensorProxy:
        _check_tensor(op, x)
        _check_tensor(op, value, "value")
        _check_index(op, index, ndim=None if op == "scatter_add" else 1)
        if x.dtype != value.dtype:
            raise _fail(op, f"value dtype {value.dtype} differs from the tensor's {x.dtype}")
        _canonical_dim(op, dim, x.ndim)
        return TensorProxy.like(x, requires_grad=x.requires_grad or value.requires_grad)
    return meta


index_add = _prim("index_add", _index_update_meta("index_add"))
index_copy = _prim("index_copy", _index_update_meta("index_copy"))
scatter_add = _prim("scatter_add", _index_update_meta("scatter_add"))


def _slice_scatter_meta(x: TensorProxy, value: TensorProxy, start_indices: Sequence[int], end_indices: Sequence[int],
                        strides: Sequence[int] | None = None) -> TensorProxy:
    region = _slice_meta(x, start_indices, end_indices, strides)
    _check_tensor("slice_scatter", value, "value")
    # Where a bound or step is computed by the trace, `value` is what the caller read or wrote through the same
    # bounds (a gradient, a view written back): its size there is that slice's, which is computed anew here.
    steps = strides if strides is not None else [1] * x.ndim
    computed = {d for d, bounds in enumerate(zip(start_indices, end_indices, steps)) if any(map(_computed_bound, bounds))}
    shapes = [tuple(s for d, s in enumerate(t.shape) if d not in computed) for t in (value, region)]
    if value.ndim != region.ndim or not rule_same_shape(*shapes) or value.dtype != x.dtype:
        raise _fail("slice_scatter", f"value {value.type_string()} does not match the region {region.type_string()}")
    return TensorProxy.like(x, requires_grad=x.requires_grad or value.requires_grad)


# `slice_scatter(x, value, ...)`: a copy of x with the region `slice(x, ...)` replaced by value
# (the inverse update of `slice`, used by functionalization to write a view back into its base).
slice_scatter = _prim("slice_scatter", _slice_scatter_meta)


def _clone_meta(x: TensorProxy) -> TensorProxy:
    _check_tensor("clone", x)
    return TensorProxy.like(x)


# A fresh tensor with x's values: never an alias of x, unlike reshape or convert_element_type.
clone = _prim("clone", _clone_meta)


def _copy_in_format_meta(x: TensorProxy, memory_format: torch.memory_format) -> TensorProxy:
    _check_tensor("copy_in_format", x)
    if not isinstance(memory_format, torch.memory_format):
        raise _fail("copy_in_format", f"expected a torch.memory_format, got {memory_format!r}")
    return TensorProxy.like(x)


# A fresh tensor with x's values laid out in `memory_format` (`Tensor.contiguous`'s copy), where `clone` and a
# same-dtype `convert_element_type` keep x's layout.
copy_in_format = _prim("copy_in_format", _copy_in_format_meta)


# -- tensors from outside the trace ---------------------------------------------------

def _tensor_constant_meta(value: torch.Tensor) -> TensorProxy:
    if not isinstance(value, torch.Tensor):
        raise _fail("tensor_constant", f"expected a torch.Tensor, got {type(value).__name__}")
    return TensorProxy(tuple(value.shape), value.dtype, value.device, requires_grad=False)


# A real tensor the traced code got from outside its inputs (a global, a closure, a natively
# created tensor). The trace holds it as a constant; it is read, never copied, at run time.
tensor_constant = _prim("tensor_constant", _tensor_constant_meta)


# -- writes into existing tensors (the only non-functional prims) ---------------------------

def _copy_meta(src: TensorProxy, dst: TensorProxy) -> TensorProxy:
    _check_tensor("copy_", src, "source")
    _check_tensor("copy_", dst, "destination")
    if not rule_same_shape(src.shape, dst.shape):
        raise _fail("copy_", f"source shape {tuple(src.shape)} differs from destination {tuple(dst.shape)}")
    return dst


copy_ = _prim("copy_", _copy_meta, Effects(writes=(1,), copies=True))


def _copy_to_out_meta(computed: TensorProxy, *, out: TensorProxy) -> TensorProxy:
    _check_tensor("copy_to_out_", computed, "computed")
    _check_tensor("copy_to_out_", out, "out")
    if not rule_same_shape(computed.shape, out.shape) or computed.dtype != out.dtype:
        raise _fail("copy_to_out_", f"computed {computed.type_string()} does not match out {out.type_string()}")
    return out


# `copy_to_out_(computed, out=x)`: x now holds computed. An executor may produce
# `computed` directly in x's memory when the analysis allows it (docs/design.md, invariant 2).
copy_to_out_ = _prim("copy_to_out_", _copy_to_out_meta, Effects(writes=("out",), copies=True, unread=("out",)))


def _no_grad_update_meta(old: TensorProxy, new: TensorProxy) -> TensorProxy:
    _check_tensor("no_grad_update", old, "old")
    _check_tensor("no_grad_update", new, "new")
    if not rule_same_shape(old.shape, new.shape) or old.dtype != new.dtype:
        raise _fail("no_grad_update", f"new {new.type_string()} does not match old {old.type_string()}")
    return TensorProxy.like(new, requires_grad=old.requires_grad)


# The value of `old` after `new` was written into it under torch.no_grad(): `new`'s data, but for
# autograd still `old` (its gradient goes to `old`, none to `new`), as eager's in-place write under
# no_grad leaves the tensor's autograd identity alone.
no_grad_update = _prim("no_grad_update", _no_grad_update_meta)


# -- arithmetic on symbolic Python numbers ("symbolic values" mode) ---------------------

# The functions of the math module a trace computes with a symbolic number, each call with its own value.
MATH_FUNCTIONS = ("cos", "sin", "tan", "acos", "asin", "atan", "atan2", "cosh", "sinh", "tanh", "acosh", "asinh",
                  "atanh", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "pow", "fmod", "erf",
                  "erfc", "floor", "ceil", "trunc", "hypot", "degrees", "radians")

NUMBER_OPS = {
    "add": ("+", operator.add), "sub": ("-", operator.sub), "mul": ("*", operator.mul),
    "truediv": ("/", operator.truediv), "floordiv": ("//", operator.floordiv), "mod": ("%", operator.mod),
    "pow": ("**", operator.pow), "neg": ("-", operator.neg), "pos": ("+", operator.pos), "abs": ("abs", operator.abs),
    # Conversions and the math module's functions, written as calls: `float(n)`, `math.cos(t)` (an lr schedule's
    # cosine, computed by each call rather than fixed to the value traced).
    "int": ("int", int), "float": ("float", float),
    # (`math_pow`, not `pow`: math.pow always gives a float, where `n ** 2` of an int is an int)
    **{f"math_{name}": (f"math.{name}", getattr(math, name)) for name in MATH_FUNCTIONS},
}


def _number_meta(op: str) -> Callable[..., Any]:
    symbol, fn = NUMBER_OPS[op]

    def meta(*args: Any) -> NumberProxy:
        values = [number_value(a) for a in args]
        result = fn(*values)
        exprs = [a.expr if isinstance(a, NumberProxy) else repr(a) for a in args]
        if any(isinstance(a, NumberProxy) and a.expr is None for a in args):
            expr = None
        elif symbol[0].isalpha():
            expr = f"{symbol}({', '.join(exprs)})"
        elif len(args) == 1:
            expr = f"({symbol}{exprs[0]})"
        else:
            expr = f"({exprs[0]} {symbol} {exprs[1]})"
        out: NumberProxy
        if type(result) is int:
            out = IntegerProxy(result, expr=expr)
        elif type(result) is float:
            out = FloatProxy(result, expr=expr)
        else:
            raise _fail(f"num_{op}", f"unsupported result type {type(result).__name__}")
        # Computed from values the trace computes, all seen (their real values): so is the result.
        computed = [a for a in args if data_dependent(a)]
        out.seen = bool(computed) and all(a.seen for a in computed)
        if op == "add" and type(result) is int and all(type(a) is int or isinstance(a, IntegerProxy) for a in args):
            out.addends = (args[0], args[1])
        return out
    return meta


# `prims.num_add`, ...: by the key of NUMBER_OPS, also the methods of number proxies.
# All but add, sub, mul, neg, pos and abs raise for some values (a zero divisor, `int(nan)`, `math.sqrt(-1)`).
NUMBER_PRIMS = {op: _prim(f"num_{op}", _number_meta(op),
                          Effects(raises=op not in ("add", "sub", "mul", "neg", "pos", "abs"))) for op in NUMBER_OPS}
NUMBER_METHODS.update(NUMBER_PRIMS)
