"""Reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std, all/any, logsumexp, cumsum (and its
inverse, diff), norms, topk/sort.

Low-precision (float16, bfloat16) inputs are reduced in float32 and cast back, as
torch's kernels accumulate in float32; dims follow torch (None or () means all dims).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from minijit.errors import MetaError, as_eager
from minijit.ir import TensorProxy
from minijit.ir.proxies import rule_compare, rule_same_shape
from minijit.ops import prims
from minijit.ops.ltorch.elementwise import abs as abs_
from minijit.ops.ltorch.elementwise import add, exp, isinf, log, logical_xor, maximum, minimum, mul, sqrt, sub, where
from minijit.ops.ltorch.elementwise import pow as pow_
from minijit.ops.ltorch.shape import cat, clone, slice_dim
from minijit.ops.registry import declare_op, ltorch_op
from minijit.ops.utils import (
    canonical_dims,
    compute_dtype_for,
    fail,
    numel_of,
    refuse_non_int,
    relied_on,
    reshape_to,
    tensor_argument,
    to_dtype,
    unsupported,
)


def keep_dims(out: TensorProxy, shape: Sequence[Any], dims: Sequence[int]) -> TensorProxy:
    """Re-insert reduced `dims` as size-1 dims (keepdim=True)."""
    kept = tuple(1 if i in dims else s for i, s in enumerate(shape))
    return prims.reshape(out, kept) if not rule_same_shape(kept, tuple(out.shape)) else out


def reduction_dims(op: str, dim: Any, ndim: int) -> tuple[int, ...]:
    """torch's reduction dims (an int, a sequence, or None/() for all) as sorted non-negative ints."""
    try:
        return canonical_dims(dim, ndim)
    except MetaError as e:
        raise fail(op, str(e)) from None


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _finish(out: TensorProxy, dtype: torch.dtype, shape: Sequence[Any], dims: Sequence[int], keepdim: bool) -> TensorProxy:
    out = to_dtype(out, dtype)
    return keep_dims(out, shape, dims) if keepdim else out


def _sum_or_product(op: str, x: Any, dim: Any, keepdim: bool, dtype: torch.dtype | None) -> TensorProxy:
    """sum, mean and prod: `x` reduced over `dim` in `dtype`. By default a floating input keeps its dtype and a
    bool or integer one reduces in int64, as torch does; mean takes floating dtypes only and divides by the count."""
    tensor_argument(op, x)
    if dtype is None:
        dtype = x.dtype if _is_float(x.dtype) or op == "mean" else torch.int64
    if op == "mean" and not _is_float(dtype):
        raise fail("mean", f"needs a floating point or complex input or dtype, got {dtype}")
    dims = reduction_dims(op, dim, x.ndim)
    out = (prims.prod if op == "prod" else prims.sum)(to_dtype(x, compute_dtype_for(dtype)), dims)
    if op == "mean":
        out = prims.div(out, numel_of(x.shape, dims))
    return _finish(out, dtype, x.shape, dims, keepdim)


@ltorch_op(torch_fns=[torch.sum, torch.Tensor.sum], methods=["sum"])
def sum(a: TensorProxy, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,  # noqa: A001
        dtype: torch.dtype | None = None) -> TensorProxy:
    """torch.sum; bool and integer inputs sum in int64 as torch does."""
    return _sum_or_product("sum", a, dim, keepdim, dtype)


@ltorch_op(torch_fns=[torch.mean, torch.Tensor.mean], methods=["mean"])
def mean(input: TensorProxy, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,  # noqa: A002
         dtype: torch.dtype | None = None) -> TensorProxy:
    """torch.mean: sum over `dim` divided by the number of reduced elements (floating inputs only)."""
    return _sum_or_product("mean", input, dim, keepdim, dtype)


@ltorch_op(torch_fns=[torch.prod, torch.Tensor.prod], methods=["prod"])
def prod(input: TensorProxy, dim: int | None = None, keepdim: bool = False, *,  # noqa: A002
         dtype: torch.dtype | None = None) -> TensorProxy:
    """torch.prod over all elements or one dim; bool and integer inputs multiply in int64."""
    return _sum_or_product("prod", input, dim, keepdim, dtype)


def _declare_extremum(name: str, prim: Any) -> Any:
    def decomposition(input: TensorProxy, dim: int | Sequence[int] = (), keepdim: bool = False) -> TensorProxy:  # noqa: A002
        tensor_argument(name, input)
        dims = reduction_dims(name, dim, input.ndim)
        return _finish(prim(input, dims), input.dtype, input.shape, dims, keepdim)

    return declare_op(name, decomposition, f"torch.{name}: the {name[1:]}imum over `dim` (all dims when empty); "
                      "NaN propagates.")


amax = _declare_extremum("amax", prims.amax)
amin = _declare_extremum("amin", prims.amin)


def _declare_arg_extremum(name: str, prim: Any) -> Any:
    def decomposition(input: TensorProxy, dim: int | None = None, keepdim: bool = False) -> TensorProxy:  # noqa: A002
        tensor_argument(name, input)
        if input.dtype == torch.bool:
            raise fail(name, "does not support bool input")
        if dim is None:
            out = prim(reshape_to(input, (numel_of(input.shape),)), 0)
            return reshape_to(out, (1,) * input.ndim) if keepdim else out
        d = reduction_dims(name, dim, input.ndim)
        out = prim(input, d[0] if d else 0)
        return keep_dims(out, input.shape, d) if keepdim else out

    return declare_op(name, decomposition, f"torch.{name}: the index of the first {name[3:]}imum (over all elements "
                      "when dim is None).")


argmax = _declare_arg_extremum("argmax", prims.argmax)
argmin = _declare_arg_extremum("argmin", prims.argmin)


class ValuesIndices(NamedTuple):
    """(values, indices), as torch.max/min with a dim return them (so `.values` and `.indices` work)."""

    values: Any
    indices: Any


def _declare_max_min(name: str, reduce: Any, arg_reduce: Any, binary: Any) -> Any:
    def decomposition(input: TensorProxy, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
        tensor_argument(name, input)
        if isinstance(dim, TensorProxy):  # torch.max(input, other)
            return binary(input, dim)
        if dim is None:
            if rule_compare(numel_of(input.shape), "==", 0):  # eager's RuntimeError, not the maximum's IndexError
                raise as_eager(fail(name, f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                                          "Specify the reduction dim with the 'dim' argument."), RuntimeError)
            return reduce(input)
        dim = relied_on(dim)
        if not isinstance(dim, int):
            raise fail(name, f"dim must be an int, got {dim!r}")
        values = reduce(input, dim, keepdim)
        indexed = to_dtype(input, torch.uint8) if input.dtype == torch.bool else input
        return ValuesIndices(values, arg_reduce(indexed, dim, keepdim))

    return declare_op(name, decomposition, f"torch.{name}: over all elements; with dim, a (values, indices) named "
                      f"tuple; with a tensor, the elementwise {binary.name}.")


max = _declare_max_min("max", amax, argmax, maximum)  # noqa: A001 - mirrors torch.max
min = _declare_max_min("min", amin, argmin, minimum)  # noqa: A001 - mirrors torch.min


@ltorch_op(torch_fns=[torch.topk, torch.Tensor.topk], methods=["topk"])
def topk(input: TensorProxy, k: int, dim: int = -1, largest: bool = True,  # noqa: A002
         sorted: bool = True) -> ValuesIndices:  # noqa: A002
    """torch.topk: the k largest (or smallest) elements along dim and their indices."""
    tensor_argument("topk", input)
    refuse_non_int("topk", "k", k)
    (d,) = reduction_dims("topk", dim, input.ndim)
    return ValuesIndices(*prims.topk(input, k, d, largest, sorted))


@ltorch_op(torch_fns=[torch.sort, torch.Tensor.sort], methods=["sort"])
def sort(input: TensorProxy, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:  # noqa: A002
    """torch.sort along dim: the sorted values and the indices they came from."""
    tensor_argument("sort", input)
    (d,) = reduction_dims("sort", dim, input.ndim)
    return ValuesIndices(*prims.sort(input, d, descending, bool(stable)))


@ltorch_op(torch_fns=[torch.argsort, torch.Tensor.argsort], methods=["argsort"])
def argsort(input: TensorProxy, dim: int = -1, descending: bool = False, stable: bool = False) -> TensorProxy:  # noqa: A002
    """torch.argsort: the indices that sort input along dim."""
    tensor_argument("argsort", input)
    (d,) = reduction_dims("argsort", dim, input.ndim)
    return prims.sort(input, d, descending, bool(stable))[1]


def _correction(op: str, dim: Any, unbiased: Any, correction: Any) -> tuple[Any, Any]:
    """torch's var/std overloads: `(x, unbiased)`, `(x, dim, unbiased)`, `(x, dim, correction=c)`."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if correction is not None and unbiased is not None:
        raise fail(op, "give either unbiased or correction, not both")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return dim, correction


def _var_mean(op: str, input: TensorProxy, dim: Any, unbiased: Any, keepdim: bool,  # noqa: A002
              correction: Any) -> tuple[TensorProxy, TensorProxy]:
    tensor_argument(op, input)
    if not _is_float(input.dtype):
        raise fail(op, f"only supports floating point and complex inputs, got {input.dtype}")
    dim, correction = _correction(op, dim, unbiased, correction)
    dims = reduction_dims(op, dim, input.ndim)
    var, mean_ = prims.var_mean(to_dtype(input, compute_dtype_for(input.dtype)), dims, correction)
    real = input.dtype.to_real() if input.dtype.is_complex else input.dtype
    return _finish(var, real, input.shape, dims, keepdim), _finish(mean_, input.dtype, input.shape, dims, keepdim)


@ltorch_op(torch_fns=[torch.var, torch.Tensor.var], methods=["var"])
def var(input: TensorProxy, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,  # noqa: A002
        correction: Any = None) -> TensorProxy:
    """torch.var with `unbiased` or `correction` (default: Bessel's correction, 1)."""
    return _var_mean("var", input, dim, unbiased, keepdim, correction)[0]


def _root_eager(s: torch.Tensor, n: float) -> torch.Tensor:
    return torch.sqrt(s) if n == 2 else torch.pow(s, 1.0 / n)


@ltorch_op(impl=_root_eager)
def root_of_nonnegative(s: TensorProxy, n: float) -> TensorProxy:
    """`s ** (1/n)` of a value that is never negative (a variance, a sum of |x|**n): the last step of std and
    of the norms. A symbol of its own for its gradient (minijit/transforms/vjp/nn.py): 0 where the result is 0,
    as eager's std and norm backward define it, not the 0 * inf = nan of differentiating `sqrt`."""
    return sqrt(s) if n == 2 else pow_(s, 1.0 / n)


@ltorch_op(torch_fns=[torch.std, torch.Tensor.std], methods=["std"])
def std(input: TensorProxy, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,  # noqa: A002
        correction: Any = None) -> TensorProxy:
    """torch.std: the square root of torch.var."""
    return root_of_nonnegative(_var_mean("std", input, dim, unbiased, keepdim, correction)[0], 2)


@ltorch_op(torch_fns=[torch.var_mean])
def var_mean(input: TensorProxy, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,  # noqa: A002
             correction: Any = None) -> tuple[TensorProxy, TensorProxy]:
    """torch.var_mean: (variance, mean) in one pass."""
    return _var_mean("var_mean", input, dim, unbiased, keepdim, correction)


@ltorch_op(torch_fns=[torch.std_mean])
def std_mean(input: TensorProxy, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,  # noqa: A002
             correction: Any = None) -> tuple[TensorProxy, TensorProxy]:
    """torch.std_mean: (standard deviation, mean)."""
    v, m = _var_mean("std_mean", input, dim, unbiased, keepdim, correction)
    return root_of_nonnegative(v, 2), m


def _declare_truth_reduction(name: str, prim: Any) -> Any:
    def decomposition(input: TensorProxy, dim: Any = None, keepdim: bool = False) -> TensorProxy:  # noqa: A002
        tensor_argument(name, input)
        dims = reduction_dims(name, dim, input.ndim)
        out = prim(to_dtype(input, torch.bool), dims)
        # torch keeps uint8 for uint8 inputs (a legacy of byte masks); every other dtype gives bool.
        return _finish(out, torch.uint8 if input.dtype == torch.uint8 else torch.bool, input.shape, dims, keepdim)

    return declare_op(name, decomposition, f"torch.{name}: whether {name} elements over `dim` are nonzero.")


all = _declare_truth_reduction("all", prims.amin)  # noqa: A001 - mirrors torch.all
any = _declare_truth_reduction("any", prims.amax)  # noqa: A001 - mirrors torch.any


@ltorch_op(torch_fns=[torch.logsumexp, torch.Tensor.logsumexp], methods=["logsumexp"])
def logsumexp(input: TensorProxy, dim: Any, keepdim: bool = False) -> TensorProxy:  # noqa: A002
    """torch.logsumexp, stabilised by subtracting the (finite) maximum."""
    tensor_argument("logsumexp", input)
    dtype = input.dtype if _is_float(input.dtype) else torch.get_default_dtype()
    dims = reduction_dims("logsumexp", dim, input.ndim)
    x = to_dtype(input, compute_dtype_for(dtype))
    if rule_compare(numel_of(x.shape, dims), "==", 0):
        # No element to take the maximum of (amax raises there): the empty sum's log is -inf, as eager's
        top = prims.full(tuple(1 if i in dims else s for i, s in enumerate(x.shape)), 0, dtype=x.dtype, device=x.device)
    else:
        top = keep_dims(prims.amax(x, dims), x.shape, dims)
        # An infinite maximum would give inf - inf = nan; shifting by 0 there is exact anyway.
        top = where(isinf(top), 0, top)
    out = add(log(prims.sum(exp(sub(x, top)), dims)), reshape_to(top, tuple(s for i, s in enumerate(x.shape) if i not in dims)))
    return _finish(out, dtype, input.shape, dims, keepdim)


@ltorch_op(torch_fns=[torch.cumsum, torch.Tensor.cumsum], methods=["cumsum"])
def cumsum(input: TensorProxy, dim: int, *, dtype: torch.dtype | None = None) -> TensorProxy:  # noqa: A002
    """torch.cumsum along `dim`; bool and integer inputs accumulate in int64."""
    tensor_argument("cumsum", input)
    if dtype is None:
        dtype = input.dtype if _is_float(input.dtype) else torch.int64
    dim = relied_on(dim)
    if not isinstance(dim, int):
        raise fail("cumsum", f"dim must be an int, got {dim!r}")
    d = reduction_dims("cumsum", dim, input.ndim)[0]
    return to_dtype(prims.cumsum(to_dtype(input, compute_dtype_for(dtype)), d), dtype)


@ltorch_op(torch_fns=[torch.diff, torch.Tensor.diff], methods=["diff"])
def diff(input: TensorProxy, n: int = 1, dim: int = -1, prepend: TensorProxy | None = None,  # noqa: A002
         append: TensorProxy | None = None) -> TensorProxy:
    """torch.diff: the `n`-th forward difference along `dim` (a logical xor for bool), after joining
    `prepend` and `append` to `input` along `dim`."""
    tensor_argument("diff", input)
    n, dim = relied_on(n), relied_on(dim)
    if not isinstance(n, int) or n < 0:
        raise fail("diff", f"order must be a non-negative int, got {n!r}")
    if input.ndim == 0:
        raise fail("diff", "expects input to be at least one-dimensional")
    d = reduction_dims("diff", dim, input.ndim)[0]
    if n == 0:
        return clone(input)  # a copy, without prepend or append, as torch's
    parts = [t for t in (prepend, input, append) if t is not None]
    for t in parts:
        if not isinstance(t, TensorProxy) or t.ndim != input.ndim:
            raise fail("diff", "expects prepend or append to be tensors with the input's number of dimensions")
    x = cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        length = x.shape[d]
        if rule_compare(length, "==", 0):
            break
        later, earlier = slice_dim(x, d, 1, length), slice_dim(x, d, 0, length - 1)
        x = logical_xor(later, earlier) if x.dtype == torch.bool else sub(later, earlier)
    return x


def vector_norm_of(op: str, x: TensorProxy, ord: Any, dim: Any, keepdim: bool, dtype: torch.dtype | None) -> TensorProxy:  # noqa: A002
    """The `ord`-norm of `x` over `dim` (all dims for None), as torch.linalg.vector_norm computes it."""
    tensor_argument(op, x)
    if dtype is not None:
        x = to_dtype(x, dtype)
    if not _is_float(x.dtype):
        raise fail(op, f"needs a floating point or complex input, got {x.dtype}")
    ord = relied_on(ord)  # noqa: A001
    if not isinstance(ord, int | float) or isinstance(ord, bool):
        raise fail(op, f"ord must be a number, got {ord!r}")
    dims = reduction_dims(op, dim, x.ndim)
    real = x.dtype.to_real() if x.dtype.is_complex else x.dtype
    a = to_dtype(abs_(x), compute_dtype_for(real))
    if ord == math.inf:
        out = prims.amax(a, dims)
    elif ord == -math.inf:
        out = prims.amin(a, dims)
    elif ord == 0:
        out = prims.sum(to_dtype(to_dtype(a, torch.bool), a.dtype), dims)
    elif ord == 1:
        out = prims.sum(a, dims)
    elif ord == 2:
        out = root_of_nonnegative(prims.sum(mul(a, a), dims), 2)
    else:
        out = root_of_nonnegative(prims.sum(pow_(a, ord), dims), ord)
    return _finish(out, real, x.shape, dims, keepdim)


@ltorch_op(torch_fns=[torch.linalg.vector_norm])
def vector_norm(x: TensorProxy, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                dtype: torch.dtype | None = None) -> TensorProxy:
    """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord), with ord = ±inf and 0 as torch defines them."""
    return vector_norm_of("linalg.vector_norm", x, ord, dim, keepdim, dtype)


@ltorch_op(torch_fns=[torch.norm, torch.Tensor.norm], methods=["norm"])
def norm(input: TensorProxy, p: Any = "fro", dim: Any = None, keepdim: bool = False,  # noqa: A002
         dtype: torch.dtype | None = None) -> TensorProxy:
    """torch.norm: vector norms of any order, and the Frobenius norm ('fro', over at most two dims)."""
    if p is None:
        p = "fro"
    if p == "fro":
        if dim is not None and not isinstance(dim, int) and len(dim) > 2:
            raise fail("norm", f"the Frobenius norm takes at most two dims, got {dim!r}")
        p = 2
    elif isinstance(p, str):
        raise unsupported("norm", f"p={p!r} is not supported; use 'fro' or a number")
    return vector_norm_of("norm", input, p, dim, keepdim, dtype)
