"""VJP rules of the dtype, shape, layout, reduction, matmul, indexing and selection (sort, topk) prims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.errors import MinijitError
from minijit.ir import TensorProxy, tree_flatten
from minijit.ir.proxies import data_dependent, rule_compare, rule_same_shape, same_size
from minijit.ops import prims
from minijit.ops.registry import ALL_LTORCH
from minijit.ops.runtime_bounds import computed_int
from minijit.ops.utils import larger, restore_reduced
from minijit.transforms.vjp.registry import matrix_transpose, reshape_to, vjp, zeros_like

P = prims
Saved = tuple[Any, ...]


# -- dtype -------------------------------------------------------------------------------

@vjp(prims.convert_element_type)
def convert_element_type_fwd(x: TensorProxy, dtype: torch.dtype) -> tuple[TensorProxy, Saved]:
    return prims.convert_element_type(x, dtype), (x,)


@convert_element_type_fwd.backward
def convert_element_type_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    # The gradient goes back to the input's dtype (docs/design.md, invariant 5); a round trip
    # this creates (bf16 -> f32 in forward, f32 -> bf16 here) is the user's own cast.
    # A same-dtype conversion (a clone, `.contiguous()`) passes the gradient through, as eager's does: no copy.
    (x,) = saved
    return (g if g.dtype == x.dtype else P.convert_element_type(g, x.dtype), None)


# -- shape and layout ------------------------------------------------------------------------

@vjp(prims.broadcast_in_dim)
def broadcast_in_dim_fwd(x: TensorProxy, shape: Sequence[Any], broadcast_dims: Sequence[int]) -> tuple[TensorProxy, Saved]:
    return prims.broadcast_in_dim(x, shape, broadcast_dims), (x.shape, tuple(shape), tuple(broadcast_dims))


@broadcast_in_dim_fwd.backward
def broadcast_in_dim_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    in_shape, out_shape, bdims = saved
    # Sum over the added and the expanded dims; an added dim of size 1 needs only the reshape.
    # A size only the trace knows is summed over as any size (a sum over a dim of 1 is a reshape too).
    expanded = [d for size, d in zip(in_shape, bdims) if not same_size(size, out_shape[d])
                and rule_compare(size, "==", 1) and (data_dependent(out_shape[d]) or rule_compare(out_shape[d], "!=", 1))]
    new = [d for d in range(len(out_shape))
           if d not in bdims and (data_dependent(out_shape[d]) or rule_compare(out_shape[d], "!=", 1))]
    dims = tuple(sorted(new + expanded))
    out = P.sum(g, dims) if dims else g
    if not rule_same_shape(out.shape, in_shape):
        out = reshape_to(out, tuple(in_shape))
    return (out, None, None)


def _same_elements(prim: Any) -> None:
    """reshape/squeeze: the same elements in a new shape; the gradient is reshaped back."""

    @vjp(prim)
    def forward(x: TensorProxy, shape_or_dims: Sequence[Any]) -> tuple[TensorProxy, Saved]:
        return prim(x, shape_or_dims), (x.shape,)

    @forward.backward
    def backward(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
        return (reshape_to(g, tuple(saved[0])), None)


_same_elements(prims.reshape)
_same_elements(prims.squeeze)


@vjp(prims.transpose)
def transpose_fwd(x: TensorProxy, permutation: Sequence[int]) -> tuple[TensorProxy, Saved]:
    return prims.transpose(x, permutation), (tuple(permutation),)


@transpose_fwd.backward
def transpose_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    (perm,) = saved
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (P.transpose(g, tuple(inverse)), None)


def _pad_dim(g: TensorProxy, dim: int, start: int, stride: int, size: int) -> TensorProxy:
    """Place `g`'s slices along `dim` at start, start+stride, ... of a zero tensor with `size` there."""
    n = g.shape[dim]
    if rule_compare(stride, ">", 1) and rule_compare(n, ">", 0):
        # Interleave stride-1 zero slices after each slice: (.., n, ..) -> (.., n, stride, ..) -> (.., n*stride, ..).
        shape = list(g.shape)
        col = reshape_to(g, (*shape[: dim + 1], 1, *shape[dim + 1:]))
        zeros_shape = (*shape[: dim + 1], stride - 1, *shape[dim + 1:])
        zeros = P.full(zeros_shape, 0, dtype=g.dtype, device=g.device)
        g = reshape_to(P.cat([col, zeros], dim + 1), (*shape[:dim], n * stride, *shape[dim + 1:]))
        if rule_compare(start + n * stride, ">", size):
            end = list(g.shape)
            end[dim] = size - start
            g = P.slice_prim(g, [0] * g.ndim, end, [1] * g.ndim)
    pieces = []
    after = size - start - g.shape[dim]
    for length, piece in ((start, None), (g.shape[dim], g), (after, None)):
        if rule_compare(length, "==", 0):
            continue
        if piece is None:
            shape = list(g.shape)
            shape[dim] = length
            piece = P.full(tuple(shape), 0, dtype=g.dtype, device=g.device)
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else P.cat(pieces, dim)


@vjp(prims.slice_prim)
def slice_fwd(x: TensorProxy, start_indices: Sequence[int], end_indices: Sequence[int],
              strides: Sequence[int] | None = None) -> tuple[TensorProxy, Saved]:
    strides = tuple(strides) if strides is not None else (1,) * x.ndim
    saved = (x.shape, tuple(start_indices), tuple(end_indices), strides)
    return prims.slice_prim(x, start_indices, end_indices, strides), saved


@slice_fwd.backward
def slice_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    shape, starts, ends, strides = saved
    if any(computed_int(d) for d in (*g.shape, *shape, *starts, *strides)):
        # Bounds, steps or sizes the trace computes (`x[:n.item()]`, minijit.ops.runtime_bounds; `x[::n.item() + 1]`;
        # `x[x > 0][:2]`): nothing to compare, so the gradient is written into zeros where the slice read, whatever
        # its length.
        zeros = P.full(tuple(shape), 0, dtype=g.dtype, device=g.device)
        return (P.slice_scatter(zeros, g, list(starts), list(ends), list(strides)), None, None, None)
    for dim, (size, start, stride) in enumerate(zip(shape, starts, strides)):
        if rule_compare(g.shape[dim], "!=", size):
            g = _pad_dim(g, dim, start, stride, size)
    return (g, None, None, None)


@vjp(prims.cat)
def cat_fwd(tensors: Sequence[TensorProxy], dim: int) -> tuple[TensorProxy, Saved]:
    dim = dim % max(tensors[0].ndim, 1)
    return prims.cat(tensors, dim), (tuple(t.shape[dim] for t in tensors), dim)


@cat_fwd.backward
def cat_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    sizes, dim = saved
    grads, offset = [], 0
    for size in sizes:
        start = [0] * g.ndim
        end = list(g.shape)
        start[dim], end[dim] = offset, offset + size
        grads.append(P.slice_prim(g, start, end, [1] * g.ndim))
        offset += size
    return (grads, None)


# -- reductions ----------------------------------------------------------------------------

@vjp(prims.sum)
def sum_fwd(x: TensorProxy, dims: Sequence[int]) -> tuple[TensorProxy, Saved]:
    return prims.sum(x, dims), (x.shape, tuple(dims))


@sum_fwd.backward
def sum_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    shape, dims = saved
    return (restore_reduced(g, shape, dims), None)


@vjp(prims.prod)
def prod_fwd(x: TensorProxy, dims: Sequence[int]) -> tuple[TensorProxy, Saved]:
    return prims.prod(x, dims), (x, tuple(dims))


@prod_fwd.backward
def prod_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    # d prod / d x_i is the product of the others. Where a reduced group has no zero that is
    # prod / x_i (torch's formula); with exactly one zero, it is the product of the nonzero
    # elements at the zero and 0 elsewhere; with two or more zeros, 0 everywhere. The
    # product of the nonzero elements (zeros replaced by 1) gives all three without a nan.
    x, dims = saved
    is_zero = P.eq(x, 0)
    nonzero = P.where(is_zero, 1, x)
    nonzero_prod = restore_reduced(P.prod(nonzero, dims), x.shape, dims)
    zeros = restore_reduced(P.sum(P.convert_element_type(is_zero, torch.int64), dims), x.shape, dims)
    scaled = P.mul(restore_reduced(g, x.shape, dims), nonzero_prod)
    only_zero = P.logical_and(P.eq(zeros, 1), is_zero)
    grad = P.where(P.eq(zeros, 0), P.div(scaled, nonzero), P.where(only_zero, scaled, zeros_like(x)))
    return (grad, None)


def _extremum(prim: Any) -> None:
    """amax/amin: the gradient is shared evenly among the elements equal to the result."""

    @vjp(prim)
    def forward(x: TensorProxy, dims: Sequence[int]) -> tuple[TensorProxy, Saved]:
        out = prim(x, dims)
        return out, (x, out, tuple(dims))

    @forward.backward
    def backward(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
        x, out, dims = saved
        hit = P.convert_element_type(P.eq(x, restore_reduced(out, x.shape, dims)), g.dtype)
        count = restore_reduced(P.sum(hit, dims), x.shape, dims)
        return (P.div(P.mul(restore_reduced(g, x.shape, dims), hit), count), None)


_extremum(prims.amax)
_extremum(prims.amin)


@vjp(prims.var_mean)
def var_mean_fwd(x: TensorProxy, dims: Sequence[int], correction: Any) -> tuple[Any, Saved]:
    var, mean = prims.var_mean(x, dims, correction)
    return (var, mean), (x, mean, tuple(dims), correction)


@var_mean_fwd.backward
def var_mean_bwd(saved: Saved, g_var: TensorProxy | None, g_mean: TensorProxy | None) -> tuple[Any, ...]:
    # Two outputs, two cotangents; either may be None when that output was not differentiated.
    x, mean, dims, correction = saved
    n = 1
    for d in dims:
        n *= x.shape[d]
    grad = None
    if g_mean is not None:
        grad = P.div(restore_reduced(g_mean, x.shape, dims), n)
    if g_var is not None:
        centered = P.sub(x, restore_reduced(mean, x.shape, dims))
        g = restore_reduced(g_var, x.shape, dims)
        if rule_compare(n - correction, ">", 0):
            term = P.mul(P.mul(g, centered), 2 / larger(n - correction, 0))
        elif len(dims) == x.ndim:
            # No degree of freedom left, over every element (`x.var()`): eager's gradient is NaN where x equals
            # the mean, else infinite, of the cotangent's sign.
            nans = P.add(zeros_like(centered), float("nan"))
            term = P.mul(g, P.where(P.eq(centered, 0), nans, float("inf")))
        else:
            # Over some dims, eager scales by 2 / (n - correction) as it is: negative past the correction
            # (`var(x, dim=1, correction=1.3)` of one row), infinite at it.
            scale = 2 / (n - correction) if rule_compare(n - correction, "!=", 0) else float("inf")
            term = P.mul(P.mul(g, centered), scale)
        grad = term if grad is None else P.add(grad, term)
    return (grad, None, None)


# -- linear algebra ----------------------------------------------------------------------------

@vjp(prims.matmul)
def matmul_fwd(a: TensorProxy, b: TensorProxy) -> tuple[TensorProxy, Saved]:
    return prims.matmul(a, b), (a, b)


def matmul_grads(a: TensorProxy, b: TensorProxy, g: TensorProxy) -> tuple[TensorProxy, TensorProxy]:
    """Gradients of `a @ b` (as prims.matmul computes it) for the output cotangent `g`."""
    if a.ndim == 1 and b.ndim == 1:
        g1 = P.broadcast_in_dim(g, a.shape, ())
        return P.mul(g1, b), P.mul(g1, a)
    a2 = reshape_to(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape_to(b, (b.shape[0], 1)) if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = reshape_to(g2, (*g2.shape[:-1], 1, g2.shape[-1]))
    if b.ndim == 1:
        g2 = reshape_to(g2, (*g2.shape, 1))
    ga = P.matmul(g2, matrix_transpose(b2))
    gb = P.matmul(matrix_transpose(a2), g2)
    # An operand without batch dims was used by every batch: sum its gradient over them.
    if ga.ndim > a2.ndim:
        ga = P.sum(ga, tuple(range(ga.ndim - a2.ndim)))
    if gb.ndim > b2.ndim:
        gb = P.sum(gb, tuple(range(gb.ndim - b2.ndim)))
    return (reshape_to(ga, a.shape) if not rule_same_shape(ga.shape, a.shape) else ga,
            reshape_to(gb, b.shape) if not rule_same_shape(gb.shape, b.shape) else gb)


@matmul_fwd.backward
def matmul_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    return matmul_grads(*saved, g)


# -- indexing -----------------------------------------------------------------------------------

@vjp(prims.take)
def take_fwd(x: TensorProxy, index: TensorProxy, dim: int) -> tuple[TensorProxy, Saved]:
    return prims.take(x, index, dim), (x, index, dim)


@take_fwd.backward
def take_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, index, dim = saved
    return (P.index_add(zeros_like(x), index, g, dim), None, None)


@vjp(prims.take_along_axis)
def take_along_axis_fwd(x: TensorProxy, index: TensorProxy, dim: int) -> tuple[TensorProxy, Saved]:
    return prims.take_along_axis(x, index, dim), (x, index, dim)


@take_along_axis_fwd.backward
def take_along_axis_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, index, dim = saved
    return (P.scatter_add(zeros_like(x), index, g, dim), None, None)


@vjp(prims.index_add)
def index_add_fwd(x: TensorProxy, index: TensorProxy, value: TensorProxy, dim: int) -> tuple[TensorProxy, Saved]:
    return prims.index_add(x, index, value, dim), (index, dim)


@index_add_fwd.backward
def index_add_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    index, dim = saved
    return (g, None, P.take(g, index, dim), None)


@vjp(prims.index_copy)
def index_copy_fwd(x: TensorProxy, index: TensorProxy, value: TensorProxy, dim: int) -> tuple[TensorProxy, Saved]:
    return prims.index_copy(x, index, value, dim), (index, value, dim)


@index_copy_fwd.backward
def index_copy_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    index, value, dim = saved
    return (P.index_copy(g, index, zeros_like(value), dim), None, P.take(g, index, dim), None)


@vjp(prims.scatter_add)
def scatter_add_fwd(x: TensorProxy, index: TensorProxy, value: TensorProxy, dim: int) -> tuple[TensorProxy, Saved]:
    if not rule_same_shape(value.shape, index.shape):
        raise MinijitError("the gradient of scatter_add with a source larger than its index is not supported")
    return prims.scatter_add(x, index, value, dim), (index, dim)


@scatter_add_fwd.backward
def scatter_add_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    index, dim = saved
    return (g, None, P.take_along_axis(g, index, dim), None)


@vjp(prims.slice_scatter)
def slice_scatter_fwd(x: TensorProxy, value: TensorProxy, start_indices: Sequence[int], end_indices: Sequence[int],
                      strides: Sequence[int] | None = None) -> tuple[TensorProxy, Saved]:
    out = prims.slice_scatter(x, value, start_indices, end_indices, strides)
    strides = tuple(strides) if strides is not None else (1,) * x.ndim
    return out, (tuple(value.shape), tuple(start_indices), tuple(end_indices), strides)


@slice_scatter_fwd.backward
def slice_scatter_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    # The region came from value, the rest from x: x's gradient is g with the region zeroed.
    value_shape, starts, ends, strides = saved
    region_zeros = P.full(value_shape, 0, dtype=g.dtype, device=g.device)
    g_x = P.slice_scatter(g, region_zeros, starts, ends, strides)
    return (g_x, P.slice_prim(g, starts, ends, strides), None, None, None)


# -- selection (multi-output: values are differentiable, indices are not) -----------------------

def _scatter_back(saved: Saved, g: TensorProxy | None) -> TensorProxy | None:
    """The values' cotangent put back where the values came from (zeros elsewhere)."""
    if g is None:
        return None
    shape, indices, dim = saved
    # Indices along dim are distinct (a permutation, or part of one), so adding is scattering.
    return P.scatter_add(P.full(shape, 0, dtype=g.dtype, device=g.device), indices, g, dim)


@vjp(prims.topk)
def topk_fwd(x: TensorProxy, k: int, dim: int, largest: bool, sorted: bool) -> tuple[Any, Saved]:  # noqa: A002
    values, indices = prims.topk(x, k, dim, largest, sorted)
    return (values, indices), (tuple(x.shape), indices, dim)


@topk_fwd.backward
def topk_bwd(saved: Saved, g_values: TensorProxy | None, g_indices: None) -> tuple[Any, ...]:
    return (_scatter_back(saved, g_values), None, None, None, None)


@vjp(prims.sort)
def sort_fwd(x: TensorProxy, dim: int, descending: bool, stable: bool) -> tuple[Any, Saved]:
    values, indices = prims.sort(x, dim, descending, stable)
    return (values, indices), (tuple(x.shape), indices, dim)


@sort_fwd.backward
def sort_bwd(saved: Saved, g_values: TensorProxy | None, g_indices: None) -> tuple[Any, ...]:
    return (_scatter_back(saved, g_values), None, None, None)


# -- prims declared by later ops (rules wait for them) ---------------------------------------

@vjp("prims.cumsum")
def cumsum_fwd(x: TensorProxy, dim: int) -> tuple[TensorProxy, Saved]:
    return prims.cumsum(x, dim), (dim % max(x.ndim, 1),)


@cumsum_fwd.backward
def cumsum_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    # The reversed cumulative sum of g: total - cumsum(g) + g.
    (dim,) = saved
    total = restore_reduced(P.sum(g, (dim,)), g.shape, (dim,))
    return (P.add(P.sub(total, prims.cumsum(g, dim)), g), None)


@vjp("prims.device_put")
def device_put_fwd(x: TensorProxy, device: torch.device) -> tuple[TensorProxy, Saved]:
    return prims.device_put(x, device), (x.device,)


@device_put_fwd.backward
def device_put_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    return (prims.device_put(g, saved[0]), None)


# -- ltorch ops that cut a tensor into pieces (multi-output) ---------------------------------------

def _pieces_fwd(name: str, x: TensorProxy, dim: int, *args: Any) -> Any:
    if not all(type(s) is int for s in x.shape) or any(computed_int(a) for a in tree_flatten(args)):
        # Symbolic piece sizes (or sizes the trace computes: `n.item()`) are computed inside the op's
        # decomposition, out of the backward's reach: differentiate the decomposition instead.
        return NotImplemented
    out = ALL_LTORCH[name](x, *args)
    d = dim % max(x.ndim, 1)
    return out, (d, tuple(tuple(p.shape) for p in out), x.dtype, x.device)


def _pieces_bwd(saved: Saved, gs: Sequence[TensorProxy | None], keeps_dim: bool) -> TensorProxy:
    """The cotangents of the pieces, joined back along the cut dim (zeros where a piece was unused)."""
    dim, shapes, dtype, device = saved
    parts = []
    for shape, g in zip(shapes, gs):
        if g is None:
            g = P.full(shape, 0, dtype=dtype, device=device)
        if not keeps_dim:
            g = reshape_to(g, (*shape[:dim], 1, *shape[dim:]))
        parts.append(g)
    return parts[0] if len(parts) == 1 else P.cat(parts, dim)


@vjp("ltorch.split")
def split_fwd(tensor: TensorProxy, split_size_or_sections: Any, dim: int = 0) -> Any:
    return _pieces_fwd("split", tensor, dim, split_size_or_sections, dim)


@split_fwd.backward
def split_bwd(saved: Saved, *gs: TensorProxy | None) -> tuple[Any, ...]:
    return (_pieces_bwd(saved, gs, keeps_dim=True), None, None)


@vjp("ltorch.chunk")
def chunk_fwd(input: TensorProxy, chunks: int, dim: int = 0) -> Any:  # noqa: A002 - torch's name
    return _pieces_fwd("chunk", input, dim, chunks, dim)


@chunk_fwd.backward
def chunk_bwd(saved: Saved, *gs: TensorProxy | None) -> tuple[Any, ...]:
    return (_pieces_bwd(saved, gs, keeps_dim=True), None, None)


@vjp("ltorch.unbind")
def unbind_fwd(input: TensorProxy, dim: int = 0) -> Any:  # noqa: A002 - torch's name
    return _pieces_fwd("unbind", input, dim, dim)


@unbind_fwd.backward
def unbind_bwd(saved: Saved, *gs: TensorProxy | None) -> tuple[Any, ...]:
    return (_pieces_bwd(saved, gs, keeps_dim=False), None)


@vjp(prims.copy_in_format)
def copy_in_format_fwd(x: TensorProxy, memory_format: torch.memory_format) -> tuple[TensorProxy, Saved]:
    return prims.copy_in_format(x, memory_format), ()


@copy_in_format_fwd.backward
def copy_in_format_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    return (g, None)


@vjp("prims.clone")
def clone_fwd(x: TensorProxy) -> tuple[TensorProxy, Saved]:
    return prims.clone(x), ()


@clone_fwd.backward
def clone_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    return (g,)


@vjp(prims.no_grad_update)
def no_grad_update_fwd(old: TensorProxy, new: TensorProxy) -> Any:
    return prims.no_grad_update(old, new), ()


@no_grad_update_fwd.backward
def no_grad_update_bwd(saved: Saved, g: TensorProxy | None) -> tuple[Any, None]:
    return g, None
