"""Type promotion and broadcasting as torch does them, for ltorch decompositions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.errors import DeviceError, MetaError, UnsupportedOpError
from minijit.ir import FloatProxy, IntegerProxy, NumberProxy, TensorProxy
from minijit.ir.context import capturing, where_now
from minijit.ir.proxies import (
    checked_sizes,
    equal_sizes,
    is_one,
    number_value,
    rule_compare,
    rule_same_shape,
    same_size,
)
from minijit.ops import prims

_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}


def _dtype_category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _number_type(x: Any) -> type:
    if isinstance(x, NumberProxy):
        return x.python_type
    return type(x)


def result_dtype(*args: Any) -> torch.dtype:
    """The dtype torch gives an elementwise op on `args` (tensors and Python numbers).

    Tensors with dims outrank 0-d tensors, which outrank Python numbers, unless a
    lower-ranked argument is of a higher category (bool < int < float < complex).
    """
    dims: torch.dtype | None = None
    zero_dim: torch.dtype | None = None
    number_cat = -1
    for a in args:
        if isinstance(a, TensorProxy):
            if a.ndim > 0:
                dims = a.dtype if dims is None else torch.promote_types(dims, a.dtype)
            else:
                zero_dim = a.dtype if zero_dim is None else torch.promote_types(zero_dim, a.dtype)
        elif a is not None:
            number_cat = max(number_cat, _CATEGORY.get(_number_type(a), -1))
    result = dims
    if zero_dim is not None:
        if result is None or _dtype_category(zero_dim) > _dtype_category(result):
            result = zero_dim if result is None else torch.promote_types(result, zero_dim)
    if number_cat >= 0 and (result is None or number_cat > _dtype_category(result)):
        default = {0: torch.bool, 1: torch.int64, 2: torch.get_default_dtype(),
                   3: torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128}[number_cat]
        if result is not None and number_cat == 3 and result in (torch.float64,):
            default = torch.complex128
        result = default
    if result is None:
        raise MetaError(f"cannot determine a result dtype from {args!r}{where_now()}")
    return result


def float_dtype(dtype: torch.dtype) -> torch.dtype:
    """`dtype` if floating or complex, else the default float dtype (int -> float ops)."""
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.get_default_dtype()


def broadcast_shapes(*shapes: Sequence[Any]) -> tuple[Any, ...]:
    """The shape that all `shapes` broadcast to, or a MetaError naming them."""
    ndim = max((len(s) for s in shapes), default=0)
    columns = [[s[i - ndim + len(s)] for s in shapes if i - ndim + len(s) >= 0] for i in range(ndim)]
    try:
        return tuple(_broadcast_dim(dims, shapes) for dims in columns)
    except MetaError:
        if capturing():
            raise
        # A pass re-recording an op the capture checked (functionalization's replay) may hold sizes
        # equal on every call but spelt otherwise, which it cannot prove equal: the values decide
        # where the pass's own answer would refuse (the capture's constraints keep them true).
        return tuple(_broadcast_by_value(dims, shapes) for dims in columns)


def _broadcast_by_value(dims: list[Any], shapes: tuple[Sequence[Any], ...]) -> Any:
    out: Any = 1
    for d in dims:
        if number_value(d) == 1:
            continue
        if number_value(out) == 1:
            out = d
        elif number_value(out) != number_value(d):
            raise MetaError(f"shapes {', '.join(str(tuple(x)) for x in shapes)} cannot be broadcast together{where_now()}")
    return out


def _broadcast_dim(dims: list[Any], shapes: tuple[Sequence[Any], ...]) -> Any:
    """The size that the sizes `dims` of one dim broadcast to.

    A literal 1 broadcasts whatever the others are, and sizes all the same (one symbolic size,
    or equal ints) need no broadcast: neither records a constraint, so a symbolic size traced at
    1 stays symbolic. Sizes of equal values are guarded equal (two batches of 1 stay one batch
    size, not a broadcast). Otherwise which size broadcasts depends on the values: comparing
    them records it (a symbolic size is then guarded `== 1` where it broadcast).
    """
    sized = [d for d in dims if not is_one(d)]
    if not sized:
        return 1
    if all(same_size(d, sized[0]) for d in sized[1:]):
        return sized[0]
    if all(number_value(d) == number_value(sized[0]) for d in sized[1:]):
        if all(rule_compare(d, "==", sized[0]) for d in sized[1:]):  # records the equalities
            return sized[0]
    out: Any = 1
    for d in sized:
        if rule_compare(d, "==", 1):
            continue
        if rule_compare(out, "==", 1):
            out = d
        elif rule_compare(out, "!=", d):
            raise MetaError(f"shapes {', '.join(str(tuple(x)) for x in shapes)} cannot be broadcast together{where_now()}")
    return out


def expand_to(x: Any, shape: Sequence[Any]) -> Any:
    """`x` broadcast to `shape` with `prims.broadcast_in_dim` (numbers pass through)."""
    # Compare lengths first: comparing sizes of different ranks would record needless
    # constraints between unrelated symbolic sizes.
    if not isinstance(x, TensorProxy) or (x.ndim == len(shape) and all(map(equal_sizes, x.shape, shape))):
        return x
    offset = len(shape) - x.ndim
    return prims.broadcast_in_dim(x, tuple(shape), tuple(range(offset, len(shape))))


def to_dtype(x: Any, dtype: torch.dtype) -> Any:
    """`x` converted to `dtype` (tensors through `prims.convert_element_type`; numbers unchanged)."""
    if isinstance(x, TensorProxy) and x.dtype != dtype:
        return prims.convert_element_type(x, dtype)
    return x


def is_cpu_scalar(x: Any) -> bool:
    """True for a 0-dim CPU tensor, which eager reads as a scalar next to tensors of any device."""
    return isinstance(x, TensorProxy) and x.ndim == 0 and x.device.type == "cpu"


def common_device(op: str, tensors: Sequence[TensorProxy]) -> torch.device:
    """The device of an elementwise op's result on `tensors`, by eager's rule: all on one device, except that
    0-dim CPU tensors go with any device; a DeviceError naming the op and the user's line otherwise."""
    device = None
    for t in tensors:
        if is_cpu_scalar(t):
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            raise DeviceError(f"{op}: expected all tensors on one device, got {device} and {t.device} (only a "
                              f"0-dim CPU tensor combines with tensors on another device){where_now()}")
    return device if device is not None else tensors[0].device


def to_device(x: Any, device: torch.device) -> Any:
    """`x` moved to `device` with `prims.device_put` where it is a tensor elsewhere (numbers unchanged)."""
    if isinstance(x, TensorProxy) and x.device != device:
        return prims.device_put(x, device)
    return x


def elementwise(prim: Any, *args: Any, compute_dtype: torch.dtype | None = None,
                out_dtype: torch.dtype | None = None) -> TensorProxy:
    """Promote, broadcast and call an elementwise prim, then cast to `out_dtype` if given.

    A 0-dim CPU tensor next to tensors on another device is moved to theirs first (eager reads it as a scalar).
    """
    tensors = [a for a in args if isinstance(a, TensorProxy)]
    dtype = compute_dtype if compute_dtype is not None else result_dtype(*args)
    shape = broadcast_shapes(*(t.shape for t in tensors))
    if not tensors:
        raise MetaError(f"{prim.id} needs a tensor argument{where_now()}")
    device = common_device(prim.name, tensors)
    converted = [expand_to(to_dtype(to_device(a, device), dtype), shape) for a in args]
    out = prim(*converted)
    return to_dtype(out, out_dtype) if out_dtype is not None else out


def canonical_dim(dim: int, ndim: int) -> int:
    """`dim` wrapped into range(ndim), or a MetaError (0-d tensors accept dim 0 and -1; a bool or a float is no dim,
    as eager's argument parser refuses it: `x.transpose(True, 1)` is not `x.transpose(1, 1)`)."""
    if isinstance(dim, bool | float | FloatProxy):
        raise MetaError(f"a dimension must be an int, got {type(dim).__name__} {dim}{where_now()}")
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        raise MetaError(f"dimension {dim} is out of range for a tensor of rank {ndim}{where_now()}")
    return dim % bound


def refuse_non_int(op: str, what: str, x: Any) -> None:
    """A MetaError where `x`, an int argument of `op`, is a bool or a float (symbolic or not), as eager's argument
    parser raises a TypeError for it: never read as the int it equals (`narrow(0, 0, 2.0)`, `repeat(True, 1)`)."""
    if isinstance(x, bool | float | FloatProxy):
        raise MetaError(f"ltorch.{op}: {what} must be an int, got {type(x).__name__} {x}{where_now()}")


def relied_on(x: Any) -> Any:
    """`x`, or the value of `x`, a symbolic number, relied on (the trace's guard checks it): for an argument an op
    decides on as a whole (a dim, an order, a norm's ord), where a proxy would otherwise be refused as no int."""
    return x.python_type(x) if isinstance(x, NumberProxy) else x


def canonical_dims(dims: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """A tuple of wrapped dims, sorted; None or () means every dim. A dim named twice is a MetaError, as in eager's
    reductions (`sum((0, 0))`, `sum((0, -2))` of a matrix)."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    if len(dims) == 0:
        return tuple(range(ndim))
    wrapped = [canonical_dim(d, ndim) for d in dims]
    if len(set(wrapped)) != len(wrapped):
        raise MetaError(f"dim {next(d for d in wrapped if wrapped.count(d) > 1)} appears multiple times in the list "
                        f"of dims {tuple(dims)}")
    return tuple(sorted(wrapped))


def is_number(x: Any) -> bool:
    """True for Python numbers and number proxies."""
    return isinstance(x, int | float | complex | IntegerProxy | FloatProxy) and not isinstance(x, TensorProxy)


def shape_arg(args: Sequence[Any]) -> tuple[Any, ...]:
    """The shape given either as separate ints (`x.view(2, -1)`) or as one sequence (`x.view((2, -1))`)."""
    if len(args) == 1 and isinstance(args[0], tuple | list | torch.Size):
        return tuple(args[0])
    return tuple(args)


def infer_shape(op: str, shape: Sequence[Any], numel: Any) -> tuple[Any, ...]:
    """`shape` with its one -1 entry resolved so the element count is `numel` (reshape, view)."""
    shape = tuple(shape)
    for d in shape:
        if type(d) is not int and not isinstance(d, IntegerProxy):
            raise MetaError(f"ltorch.{op}: shape {shape} must contain ints, got {type(d).__name__}{where_now()}")
    # A symbolic entry (an outside int under symbolic values) that is negative is guarded to its value: -1 is the
    # size to infer, as a plain -1 is (`x.view(n, -1)` with n and -1 passed in).
    shape = tuple(-1 if isinstance(d, IntegerProxy) and rule_compare(d, "<", 0) and rule_compare(d, "==", -1) else d
                  for d in shape)
    if any(isinstance(d, IntegerProxy) and rule_compare(d, "<", 0) for d in shape):
        raise MetaError(f"ltorch.{op}: invalid shape dimension in {list(shape)}{where_now()}")
    unknown = [i for i, d in enumerate(shape) if type(d) is int and d == -1]
    if len(unknown) > 1:
        raise MetaError(f"ltorch.{op}: only one dimension can be inferred, shape {list(shape)}{where_now()}")
    if any(type(d) is int and d < -1 for d in shape):
        raise MetaError(f"ltorch.{op}: invalid shape dimension in {list(shape)}{where_now()}")
    # With symbolic sizes the arithmetic below records number prims, and the checks
    # record the constraints the trace relies on.
    product: Any = 1
    for i, d in enumerate(shape):
        if i not in unknown:
            product = d if type(product) is int and product == 1 else product * d
    n, p = checked_sizes(numel, product)
    if unknown:
        if rule_compare(p, "==", 0) or rule_compare(n % p, "!=", 0):
            raise MetaError(f"ltorch.{op}: shape {list(shape)} is invalid for input of size {numel}{where_now()}")
        return tuple(numel // product if i in unknown else d for i, d in enumerate(shape))
    if rule_compare(p, "!=", n):
        raise MetaError(f"ltorch.{op}: shape {list(shape)} is invalid for input of size {numel}{where_now()}")
    return shape


def dtype_scalar(value: Any, dtype: torch.dtype) -> Any:
    """A Python number of `dtype`'s category, so that a prim taking it does not promote (1.5 -> 1 for ints).

    Mirrors the C++ cast torch applies when it fills a tensor of `dtype` with `value`.
    """
    if isinstance(value, NumberProxy):
        return value
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    if dtype.is_floating_point:
        return value if isinstance(value, bool | int | float) else float(value.real)
    if isinstance(value, complex):
        value = value.real
    return int(value)


def fail(op: str, msg: str) -> MetaError:
    """A MetaError for ltorch op `op`, naming it and the user line being traced."""
    return MetaError(f"{op}: {msg}{where_now()}")


def tensor_argument(op: str, x: Any) -> TensorProxy:
    """`x`, which ltorch op `op` takes as a tensor; a MetaError naming the op where it is not one."""
    if not isinstance(x, TensorProxy):
        raise fail(op, f"expected a tensor, got {type(x).__name__}")
    return x


def unsupported(op: str, msg: str) -> UnsupportedOpError:
    """An UnsupportedOpError for a call of ltorch op `op` that eager accepts but the decomposition does not.

    The call is then recorded as an opaque torch op instead (minijit/ops/opaque.py).
    """
    return UnsupportedOpError(f"{op}: {msg}{where_now()}")


def reshape_to(x: TensorProxy, shape: Sequence[Any]) -> TensorProxy:
    """`x` reshaped to `shape` with `prims.reshape`, or `x` itself when the shape already matches."""
    shape = tuple(shape)
    # Lengths first: comparing sizes of different ranks would record needless constraints
    # between unrelated symbolic sizes.
    return x if len(shape) == x.ndim and rule_same_shape(tuple(x.shape), shape) else prims.reshape(x, shape)


def restore_reduced(g: TensorProxy, shape: Sequence[Any], dims: Sequence[int]) -> TensorProxy:
    """Broadcast `g`, the result of reducing a tensor of `shape` over `dims`, back to `shape`."""
    ndim = len(shape)
    reduced = {d % max(ndim, 1) for d in dims}
    kept = tuple(i for i in range(ndim) if i not in reduced)
    return prims.broadcast_in_dim(g, tuple(shape), kept)


def unsqueeze_at(x: TensorProxy, dims: Sequence[int]) -> TensorProxy:
    """`x` with size-1 dims inserted so that they sit at positions `dims` of the result."""
    ndim = x.ndim + len(dims)
    wanted = {canonical_dim(d, ndim) for d in dims}
    sizes = iter(x.shape)
    return reshape_to(x, tuple(1 if i in wanted else next(sizes) for i in range(ndim)))


def is_low_precision(dtype: torch.dtype) -> bool:
    """True for float16 and bfloat16, which torch's kernels compute in float32."""
    return dtype in (torch.float16, torch.bfloat16)


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The dtype a numerically sensitive decomposition computes in: float32 for half types."""
    return torch.float32 if is_low_precision(dtype) else dtype


def smaller(a: Any, b: Any) -> Any:
    """`min(a, b)` of numbers (plain or proxies), compared as an op's rules compare (`rule_compare`)."""
    return b if rule_compare(b, "<", a) else a


def larger(a: Any, b: Any) -> Any:
    """`max(a, b)` of numbers (plain or proxies), compared as an op's rules compare (`rule_compare`)."""
    return b if rule_compare(b, ">", a) else a


def numel_of(shape: Sequence[Any], dims: Sequence[int] | None = None) -> Any:
    """The product of `shape`'s sizes (over `dims` if given); may be a number proxy."""
    n: Any = 1
    for i, s in enumerate(shape):
        if dims is None or i in dims:
            n = n * s
    return n


def parse_shape(op: str, size: Sequence[Any]) -> tuple[Any, ...]:
    """A shape from `*size` call forms: `f(2, 3)`, `f((2, 3))`, `f([2, 3])`, `f(torch.Size(...))`."""
    if len(size) == 1 and isinstance(size[0], tuple | list | torch.Size):
        size = tuple(size[0])
    for s in size:
        if not isinstance(s, int | IntegerProxy) or isinstance(s, bool):
            raise fail(op, f"sizes must be ints, got {size!r}")
        if isinstance(s, int) and s < 0:
            raise fail(op, f"negative size in {tuple(size)}")
    return tuple(size)
