"""Prims that run one aten kernel: convolution, pooling, upsampling, batch norm and a few more.

These ops have no useful decomposition into the elementwise core (a convolution
written as slices and matmuls would be slow and would round differently from
torch's kernel), so each is a prim of its own, declared once from a stub with the
aten op's signature::

    @aten_prim(aten.convolution.default)
    def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        \"\"\"aten.convolution: ...\"\"\"

The stub checks its arguments (raising `MetaError`). It may return its outputs'
metadata itself, where that is simple and torch's meta kernel is slow (the upsample
and batch norm ones run Python decompositions) or wrong for the CPU (grouped_mm's
asks for bfloat16). Otherwise the metadata comes from running the aten op on meta
tensors, so the shape formulas (pooling with `ceil_mode`, transposed convolutions)
are torch's own. Symbolic sizes ("symbolic values" mode) stay symbolic where the
output sizes follow from them (`minijit.ops.symbolic_sizes`: the kernel run on torch's
symbolic sizes, its decisions guarded); elsewhere they are specialised to their values,
which records the constraints the cache guard checks. Either way an
output requires grad when a tensor argument does and it is floating point. The
torch executor runs each prim as its aten op (`aten_prim_implementations`).
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import MetaError, UnsupportedSyntaxError, ValueGuardMiss, as_eager
from minijit.ir import TENSOR_METHODS, Effects, FloatProxy, IntegerProxy, NumberProxy, Symbol, Tag, TensorProxy, tree_map
from minijit.ir.context import value_reader, where_now
from minijit.ir.layouts import outside_inference_mode
from minijit.ir.proxies import number_value, rule_compare, rule_same_shape
from minijit.ops import prims
from minijit.ops.prims import _fail
from minijit.ops.registry import TORCH_TO_LTORCH
from minijit.ops.symbolic_sizes import has_symbolic_sizes, symbolic_output_shapes

aten = torch.ops.aten

# prim -> the aten callable the torch executor runs it with
ATEN_IMPLS: dict[Symbol, Callable[..., Any]] = {}


def aten_prim(aten_fn: Callable[..., Any]) -> Callable[[Callable[..., Any]], Symbol]:
    """Declare a prim computed by `aten_fn`, from a stub with the same signature (see the module docstring)."""

    def register(stub: Callable[..., Any]) -> Symbol:
        name = stub.__name__
        signature = inspect.signature(stub)

        def meta(*args: Any, **kwargs: Any) -> Any:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as e:
                raise MetaError(f"prims.{name}: {e}{where_now()}") from None
            given = stub(*args, **kwargs)
            if given is not None:
                return _with_requires_grad(given, args, kwargs)
            return _meta_outputs(name, aten_fn, args, kwargs)

        meta.__signature__ = signature  # type: ignore[attr-defined]
        meta.__name__ = name
        meta.__doc__ = stub.__doc__
        sym = prims._prim(name, meta)
        sym.__doc__ = stub.__doc__
        ATEN_IMPLS[sym] = aten_fn
        return sym

    return register


def aten_prim_implementations() -> dict[Symbol, Callable[..., Any]]:
    """prim -> the aten callable that runs it with the prim's own arguments."""
    return dict(ATEN_IMPLS)


def _meta_outputs(name: str, aten_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    tensors = [x for x in _leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    if not tensors:
        raise MetaError(f"prims.{name}: needs at least one tensor argument{where_now()}")
    device = tensors[0].device
    requires_grad = any(t.requires_grad for t in tensors)

    def to_meta(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            return torch.empty(tuple(number_value(d) for d in x.shape), dtype=x.dtype, device="meta")
        return number_value(x)

    try:
        with outside_inference_mode():
            out = aten_fn(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as e:
        _specialise((args, kwargs))
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MetaError(f"prims.{name}: {first_line}{where_now()}") from None
    outs = list(out) if isinstance(out, tuple | list) else [out]
    shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in outs]
    if has_symbolic_sizes((args, kwargs)):
        # Sizes that follow from symbolic input sizes stay symbolic (guarded by torch's own decisions).
        derived = symbolic_output_shapes(aten_fn, args, kwargs, shapes)
        if derived is None:
            _specialise((args, kwargs))
        else:
            shapes = derived

    def to_proxy(x: Any, shape: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        differentiable = x.dtype.is_floating_point or x.dtype.is_complex
        return TensorProxy(shape, x.dtype, device, requires_grad and differentiable)

    proxies = tuple(to_proxy(x, shape) for x, shape in zip(outs, shapes, strict=True))
    return proxies if isinstance(out, tuple | list) else proxies[0]


def _specialise(args: Any) -> None:
    """Use the values of the symbolic numbers among `args` (a tree), recording that the trace relies on them."""
    for x in _leaves(args):
        for d in x.shape if isinstance(x, TensorProxy) else (x,):
            _concrete(d)


def _with_requires_grad(outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    requires_grad = any(x.requires_grad for x in _leaves((args, kwargs)) if isinstance(x, TensorProxy))

    def mark(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            x.requires_grad = requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)
        return x

    return tuple(mark(x) for x in outputs) if isinstance(outputs, tuple) else mark(outputs)


def _concrete(x: Any) -> Any:
    """A number proxy's value: specialised on (a recorded constraint) unless it is only known at run time."""
    if not isinstance(x, NumberProxy):
        return x
    if x.expr is None:  # a value computed by the trace (Tensor.item()): it cannot change a shape here
        return x.value
    return x.python_type(x)


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, tuple | list):
        return [leaf for v in x for leaf in _leaves(v)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    return [x]


def _check_float(op: str, x: Any, what: str = "input") -> None:
    if not isinstance(x, TensorProxy):
        raise _fail(op, f"expected a tensor for {what}, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise _fail(op, f"needs a floating point {what}, got {x.dtype}")


# -- convolution -------------------------------------------------------------------------------

@aten_prim(aten.convolution.default)
def convolution(input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None, stride: list[int],  # noqa: A002
                padding: list[int], dilation: list[int], transposed: bool, output_padding: list[int],
                groups: int) -> None:
    """aten.convolution: a (transposed) convolution of a batched input, with explicit per-dim parameters."""


@aten_prim(aten.convolution_backward.default)
def convolution_backward(grad_output: TensorProxy, input: TensorProxy, weight: TensorProxy,  # noqa: A002
                         bias_sizes: list[int] | None, stride: list[int], padding: list[int], dilation: list[int],
                         transposed: bool, output_padding: list[int], groups: int,
                         output_mask: list[bool]) -> None:
    """aten.convolution_backward: the gradients of input, weight and bias (None where output_mask is False)."""


# -- pooling --------------------------------------------------------------------------------------

_MAX_POOL = {2: aten.max_pool2d_with_indices.default, 3: aten.max_pool3d_with_indices.default}
_AVG_POOL = {2: aten.avg_pool2d.default, 3: aten.avg_pool3d.default}
_AVG_POOL_BACKWARD = {2: aten.avg_pool2d_backward.default, 3: aten.avg_pool3d_backward.default}
_ADAPTIVE_AVG = {2: aten._adaptive_avg_pool2d.default, 3: aten._adaptive_avg_pool3d.default}
_ADAPTIVE_AVG_BACKWARD = {2: aten._adaptive_avg_pool2d_backward.default, 3: aten._adaptive_avg_pool3d_backward.default}
_ADAPTIVE_MAX = {2: aten.adaptive_max_pool2d.default, 3: aten.adaptive_max_pool3d.default}


def _by_dims(table: dict[int, Callable[..., Any]], sizes_at: int) -> Callable[..., Any]:
    """The aten op of `table` for as many spatial dims as the list argument at position `sizes_at` has."""
    def run(*args: Any) -> Any:
        return table[len(args[sizes_at])](*args)
    return run


def _check_spatial(op: str, x: Any, sizes: Any) -> None:
    if not isinstance(x, TensorProxy):
        raise _fail(op, f"expected a tensor, got {type(x).__name__}")
    if len(sizes) not in (2, 3):
        raise _fail(op, f"pools over 2 or 3 dims (ltorch lifts 1-d pooling), got {len(sizes)}")


@aten_prim(_by_dims(_MAX_POOL, 1))
def max_pool(input: TensorProxy, kernel_size: list[int], stride: list[int], padding: list[int],  # noqa: A002
             dilation: list[int], ceil_mode: bool) -> None:
    """aten.max_pool{2,3}d_with_indices: the window maxima and, per output, the flat spatial index of its maximum."""
    _check_spatial("max_pool", input, kernel_size)


@aten_prim(_by_dims(_AVG_POOL, 1))
def avg_pool(input: TensorProxy, kernel_size: list[int], stride: list[int], padding: list[int],  # noqa: A002
             ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> None:
    """aten.avg_pool{2,3}d: window means (of the padded input, or of its in-bounds part)."""
    _check_spatial("avg_pool", input, kernel_size)


@aten_prim(_by_dims(_AVG_POOL_BACKWARD, 2))
def avg_pool_backward(grad_output: TensorProxy, input: TensorProxy, kernel_size: list[int],  # noqa: A002
                      stride: list[int], padding: list[int], ceil_mode: bool, count_include_pad: bool,
                      divisor_override: int | None) -> None:
    """aten.avg_pool{2,3}d_backward: the gradient of avg_pool's input."""
    _check_spatial("avg_pool_backward", input, kernel_size)


@aten_prim(_by_dims(_ADAPTIVE_AVG, 1))
def adaptive_avg_pool(input: TensorProxy, output_size: list[int]) -> None:  # noqa: A002
    """aten._adaptive_avg_pool{2,3}d: means over windows that split each spatial dim into output_size parts."""
    _check_spatial("adaptive_avg_pool", input, output_size)


def _adaptive_avg_backward(grad_output: torch.Tensor, input: torch.Tensor, dims: int) -> torch.Tensor:  # noqa: A002
    return _ADAPTIVE_AVG_BACKWARD[dims](grad_output, input)


@aten_prim(_adaptive_avg_backward)
def adaptive_avg_pool_backward(grad_output: TensorProxy, input: TensorProxy, dims: int) -> None:  # noqa: A002
    """aten._adaptive_avg_pool{dims}d_backward: the gradient of adaptive_avg_pool's input."""
    _check_spatial("adaptive_avg_pool_backward", input, [0] * dims)


@aten_prim(_by_dims(_ADAPTIVE_MAX, 1))
def adaptive_max_pool(input: TensorProxy, output_size: list[int]) -> None:  # noqa: A002
    """aten.adaptive_max_pool{2,3}d: window maxima and their flat spatial indices."""
    _check_spatial("adaptive_max_pool", input, output_size)


# -- upsampling -------------------------------------------------------------------------------------

_UPSAMPLE_MODES = {"nearest": "upsample_nearest", "nearest-exact": "_upsample_nearest_exact",
                   "linear": "upsample_linear", "bilinear": "upsample_bilinear", "bicubic": "upsample_bicubic",
                   "trilinear": "upsample_trilinear"}


def _upsample_op(mode: str, dims: int, backward: bool) -> Any:
    base = _UPSAMPLE_MODES[mode]
    return getattr(aten, f"{base}{dims}d{'_backward' if backward else ''}")


def _has_align_corners(mode: str) -> bool:
    return "nearest" not in mode


def _upsample(input: torch.Tensor, mode: str, output_size: list[int], align_corners: bool | None,  # noqa: A002
              scales: list[float | None]) -> torch.Tensor:
    op = _upsample_op(mode, len(output_size), backward=False).default
    if _has_align_corners(mode):
        return op(input, output_size, align_corners, *scales)
    return op(input, output_size, *scales)


def _upsample_backward(grad_output: torch.Tensor, mode: str, output_size: list[int], input_size: list[int],
                       align_corners: bool | None, scales: list[float | None]) -> torch.Tensor:
    op = _upsample_op(mode, len(output_size), backward=True).default
    if _has_align_corners(mode):
        return op(grad_output, output_size, input_size, align_corners, *scales)
    return op(grad_output, output_size, input_size, *scales)


def _check_upsample(op: str, mode: Any, output_size: Any, scales: Any) -> None:
    if mode not in _UPSAMPLE_MODES:
        raise _fail(op, f"unknown mode {mode!r}")
    if len(output_size) not in (1, 2, 3) or len(scales) != len(output_size):
        raise _fail(op, f"needs one output size and one scale per spatial dim, got {output_size} and {scales}")


@aten_prim(_upsample)
def upsample(input: TensorProxy, mode: str, output_size: list[int], align_corners: bool | None,  # noqa: A002
             scales: list[float | None]) -> TensorProxy:
    """aten.upsample_<mode><n>d: resample the spatial dims to output_size (scales, where given, set the
    source positions as in F.interpolate with a scale_factor)."""
    _check_upsample("upsample", mode, output_size, scales)
    _check_float("upsample", input)
    k = len(output_size)
    if input.ndim != k + 2 or any(rule_compare(s, "<=", 0) for s in (*input.shape[2:], *output_size)):
        raise _fail("upsample", f"cannot resample an input of shape {tuple(input.shape)} to {tuple(output_size)}")
    return TensorProxy((*input.shape[:2], *output_size), input.dtype, input.device)


@aten_prim(_upsample_backward)
def upsample_backward(grad_output: TensorProxy, mode: str, output_size: list[int], input_size: list[int],
                      align_corners: bool | None, scales: list[float | None]) -> TensorProxy:
    """aten.upsample_<mode><n>d_backward: the gradient of upsample's input."""
    _check_upsample("upsample_backward", mode, output_size, scales)
    expected = (*input_size[:2], *output_size)
    if not isinstance(grad_output, TensorProxy) or not rule_same_shape(grad_output.shape, expected):
        raise _fail("upsample_backward", f"grad_output must have shape {expected}")
    return TensorProxy(tuple(input_size), grad_output.dtype, grad_output.device)


# -- batch normalization --------------------------------------------------------------------------

@aten_prim(aten._native_batch_norm_legit_functional.default)
def batch_norm_training(input: TensorProxy, weight: TensorProxy | None, bias: TensorProxy | None,  # noqa: A002
                        running_mean: TensorProxy, running_var: TensorProxy, training: bool, momentum: float,
                        eps: float) -> None:
    """aten._native_batch_norm_legit_functional: (output, batch mean, batch 1/std, new running mean,
    new running var), normalizing with the batch statistics; the running statistics are not written."""
    if training is not True:
        raise _fail("batch_norm_training", "only computes training-mode batch norm")
    stats = _batch_norm_stats("batch_norm_training", input, weight, bias, running_mean, running_var)
    if stats is None:
        return None
    return (TensorProxy.like(input), stats, TensorProxy.like(stats), TensorProxy.like(running_mean),
            TensorProxy.like(running_var))


@aten_prim(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(input: TensorProxy, weight: TensorProxy | None, bias: TensorProxy | None,  # noqa: A002
                        training: bool, momentum: float, eps: float) -> Any:
    """aten._native_batch_norm_legit.no_stats: (output, batch mean, batch 1/std) without running statistics."""
    if training is not True:
        raise _fail("batch_norm_no_stats", "only computes training-mode batch norm")
    stats = _batch_norm_stats("batch_norm_no_stats", input, weight, bias)
    return None if stats is None else (TensorProxy.like(input), stats, TensorProxy.like(stats))


@aten_prim(aten.native_batch_norm_backward.default)
def batch_norm_backward(grad_out: TensorProxy, input: TensorProxy, weight: TensorProxy | None,  # noqa: A002
                        running_mean: TensorProxy | None, running_var: TensorProxy | None,
                        save_mean: TensorProxy | None, save_invstd: TensorProxy | None, train: bool, eps: float,
                        output_mask: list[bool]) -> Any:
    """aten.native_batch_norm_backward: the gradients of input, weight and bias (None where not asked for)."""
    stats = _batch_norm_stats("batch_norm_backward", input, weight, running_mean, running_var, save_mean, save_invstd)
    if stats is None:
        return None
    if not isinstance(grad_out, TensorProxy) or not rule_same_shape(grad_out.shape, input.shape):
        raise _fail("batch_norm_backward", f"grad_out must have the input's shape {tuple(input.shape)}")
    param = weight if isinstance(weight, TensorProxy) else stats
    return (TensorProxy.like(input) if output_mask[0] else None,
            TensorProxy.like(param) if output_mask[1] else None,
            TensorProxy.like(param) if output_mask[2] else None)


def _batch_norm_stats(op: str, input: Any, *per_channel: Any) -> TensorProxy | None:  # noqa: A002
    """A (C,) proxy in the dtype of the CPU kernel's statistics (that of the first per-channel tensor, else
    the input's), after checking shapes; None off the CPU, where torch's meta kernel decides."""
    _check_float(op, input)
    if input.ndim < 2:
        raise _fail(op, f"expects an input with a channel dim 1, got shape {tuple(input.shape)}")
    c = input.shape[1]
    given = [t for t in per_channel if t is not None]
    for t in given:
        if not isinstance(t, TensorProxy) or not rule_same_shape(t.shape, (c,)):
            raise _fail(op, f"per-channel tensors must have shape ({c},), got {getattr(t, 'shape', t)}")
    if input.device.type != "cpu":
        return None
    return TensorProxy((c,), given[0].dtype if given else input.dtype, input.device)


# -- others --------------------------------------------------------------------------------------------

@aten_prim(aten.histc.default)
def histc(input: TensorProxy, bins: int, min: float, max: float) -> None:  # noqa: A002
    """aten.histc: counts of the values in `bins` equal bins between min and max (the data's range if equal)."""
    _check_float("histc", input)


@aten_prim(aten._grouped_mm.default)
def grouped_mm(mat_a: TensorProxy, mat_b: TensorProxy, offs: TensorProxy | None, bias: TensorProxy | None,
               out_dtype: torch.dtype | None) -> TensorProxy:
    """aten._grouped_mm: one matrix product per group; `offs` (int32 end offsets) splits the ragged dim
    (the rows of a 2-d mat_a against a 3-d mat_b, the shared dim of two 2-d operands, the columns of a
    2-d mat_b against a 3-d mat_a)."""
    for x, what in ((mat_a, "mat_a"), (mat_b, "mat_b")):
        if not isinstance(x, TensorProxy) or x.ndim not in (2, 3):
            raise _fail("grouped_mm", f"{what} must be a 2-d or 3-d tensor, got {getattr(x, 'shape', x)}")
    if mat_a.dtype != mat_b.dtype or rule_compare(mat_a.shape[-1], "!=", mat_b.shape[-2]):
        raise _fail("grouped_mm", f"cannot multiply {mat_a.type_string()} by {mat_b.type_string()}")
    if offs is not None and (not isinstance(offs, TensorProxy) or offs.ndim != 1 or offs.dtype != torch.int32):
        raise _fail("grouped_mm", "offs must be a 1-d int32 tensor")
    groups = offs.shape[0] if offs is not None else mat_a.shape[0]
    if mat_a.ndim == 3 and mat_b.ndim == 3:
        if offs is not None or rule_compare(mat_a.shape[0], "!=", mat_b.shape[0]):
            raise _fail("grouped_mm", "two 3-d operands need the same number of groups and no offs")
        shape = (groups, mat_a.shape[1], mat_b.shape[2])
    elif offs is None:
        raise _fail("grouped_mm", "a 2-d operand needs offs")
    elif mat_a.ndim == 2 and mat_b.ndim == 3:
        shape = (mat_a.shape[0], mat_b.shape[2])
        groups = mat_b.shape[0]
    elif mat_a.ndim == 2:
        shape = (groups, mat_a.shape[0], mat_b.shape[1])
    else:
        shape = (mat_a.shape[1], mat_b.shape[1])
        groups = mat_a.shape[0]
    if offs is not None and rule_compare(offs.shape[0], "!=", groups):
        raise _fail("grouped_mm", f"offs has {offs.shape[0]} entries for {groups} groups")
    return TensorProxy(shape, out_dtype or mat_a.dtype, mat_a.device)


# -- tensor values as Python numbers ------------------------------------------------------------------

def _item_meta(x: TensorProxy) -> NumberProxy:
    if not isinstance(x, TensorProxy):
        raise _fail("item", f"expected a tensor, got {type(x).__name__}")
    if rule_compare(math.prod(x.shape), "!=", 1):
        raise _fail("item", f"only one-element tensors can be converted to Python numbers, got shape {tuple(x.shape)}")
    if x.dtype.is_complex:
        raise _fail("item", "complex values are not supported")
    # The value is only known when the trace runs: arithmetic on it is recorded, any use that
    # would need it now (a branch, a shape) is an error naming where it came from.
    number: NumberProxy
    if x.dtype.is_floating_point:
        number = FloatProxy(math.nan)
    else:
        number = IntegerProxy(False if x.dtype == torch.bool else 0)
    number.origin = f"computed by Tensor.item(){where_now()}"
    return number


# Tensor.item(): the value of a one-element tensor as a Python number, computed when the trace runs.
item = prims._prim("item", _item_meta)
ATEN_IMPLS[item] = torch.Tensor.item  # (eager's own call: a third of `aten._local_scalar_dense`'s time)
TENSOR_METHODS["item"] = item
TORCH_TO_LTORCH[torch.Tensor.item] = item


def _size_meta(x: TensorProxy, dim: int) -> Any:
    if not isinstance(x, TensorProxy) or not -x.ndim <= dim < max(x.ndim, 1):
        raise _fail("size", f"expected a tensor and one of its dims, got {type(x).__name__} and {dim}")
    return x.shape[dim]


# One size of a tensor the trace made: where a size only the trace knows is bound (minijit/ops/unbacked.py).
size = prims._prim("size", _size_meta, tags=frozenset({Tag.METADATA}))
ATEN_IMPLS[size] = aten.sym_size.int


# -- values read while tracing ---------------------------------------------------------------------
# `if x.sum() > 0`, `int(n.item())`, `t.tolist()`: the capture reads the real value (minijit.runtime.values)
# and records `prims.check_value`, which checks on every call that the value is the one the trace was
# made for, and raises ValueGuardMiss (before any write into an input) where it is not.

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
# How a check reads its value: the value itself, Python's conversions, or a comparison with `other`.
READS = ("value", "tolist", "shape", "bool", "int", "float", "index", *_COMPARE)


def observe(value: Any, how: str, other: Any = None) -> Any:
    """What a traced function saw when it read `value` (a real tensor or number) the way `how` names."""
    if how == "shape":
        return tuple(value.shape)
    if isinstance(value, torch.Tensor):
        value = value.tolist() if how == "tolist" else value.item()
    if how in ("value", "tolist"):
        return value
    if how == "bool":
        return bool(value)
    if how == "int":
        return int(value)
    if how == "float":
        return float(value)
    if how == "index":
        return operator.index(value)
    return bool(_COMPARE[how](value, other))


def same_value(a: Any, b: Any) -> bool:
    """`a == b` for what `observe` returns, where a NaN equals a NaN (and lists compare element by element)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def check_readable(x: Any, how: str) -> None:
    """Raise eager's error (as a MetaError) where reading `x` the way `how` names is not allowed."""
    if how not in READS:
        raise _fail("check_value", f"unknown read {how!r}")
    if not isinstance(x, TensorProxy) or how in ("tolist", "shape"):
        return
    if rule_compare(math.prod(x.shape), "!=", 1):
        what = {"bool": "the truth value of a tensor", "index": "a tensor used as an index"}.get(how, "a Python number")
        raise _fail("check_value", f"{what} needs a one-element tensor, got shape {tuple(x.shape)}")
    if x.dtype.is_complex:
        raise _fail("check_value", "complex values are not supported")
    if how == "index" and (x.dtype.is_floating_point or x.dtype == torch.bool):
        raise _fail("check_value", f"only integer tensors of a single element can be used as an index, got {x.dtype}")


def _check_value_meta(x: Any, how: str, other: Any, expected: Any, ordinal: int) -> None:
    check_readable(x, how)


def _check_value_impl(x: Any, how: str, other: Any, expected: Any, ordinal: int) -> None:
    observed = observe(x, how, other)
    if not same_value(observed, expected):
        raise ValueGuardMiss(ordinal, observed)


# external: never dropped, never moved, a fusion region boundary; `write_copies_in_place` keeps writes into
# inputs after it, so a miss leaves the call's inputs as they were.
check_value = prims._prim("check_value", _check_value_meta, Effects(external=True), tags=frozenset({Tag.VALUE_CHECK}))
ATEN_IMPLS[check_value] = _check_value_impl


def is_value_check(bsym: Any) -> bool:
    """Whether a bound symbol is a `prims.check_value`, as captured or as an executor runs it."""
    return Tag.VALUE_CHECK in bsym.sym.tags


def _tolist(x: TensorProxy) -> Any:
    """Tensor.tolist(): the values, read while tracing (the trace checks them on every call)."""
    reader = value_reader()
    value = reader(x, "tolist", None) if reader is not None else NotImplemented
    if value is NotImplemented:
        raise UnsupportedSyntaxError(
            f"Tensor.tolist on {x.name}{where_now()} needs the tensor's values, which are only known when the "
            "trace runs here (inside an op's decomposition or a traced autograd.Function); call it in the function itself")
    return value


TENSOR_METHODS["tolist"] = _tolist


def _no_derivative_meta(g: Any, op: str) -> None:
    """No output: the backward of an op eager has no derivative for records it where a gradient reaches the op."""


def _no_derivative_impl(g: Any, op: str) -> None:
    # Autograd runs eager's node only where the backward reaches it; here an output's cotangent that autograd left
    # None comes as zeros, so a zero `g` may be one not reached: only a nonzero one is surely reached (the backward
    # is linear in the cotangents). A reached op whose cotangent is all zeros gets zero gradients, unlike eager.
    if not bool(g.ne(0).any()):
        return
    raise as_eager(MetaError(f"the derivative for '{op}' is not implemented (as in eager, which raises when the "
                             "backward reaches it); compute it under torch.no_grad() or detach its inputs"),
                   RuntimeError)


# external: never dropped or moved, so the backward raises where eager's would, at `.backward()`, not before.
no_derivative = prims._prim("no_derivative", _no_derivative_meta, Effects(external=True))
ATEN_IMPLS[no_derivative] = _no_derivative_impl
