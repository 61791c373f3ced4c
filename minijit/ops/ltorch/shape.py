"""Shape and layout ops: views, reshapes, permutations, cat/stack/split, flip/roll/repeat, tril/triu.

Ops declaring the VIEW effect return a tensor that aliases their input in eager torch
(VIEW_OR_COPY: where eager can make a view); the `functionalize` pass uses the effect
to make writes through a view update its base
(docs/design.md, invariant 1). A view op whose result equals its input returns the
input proxy itself (the trace then records nothing). Every other op always
returns a new proxy, even when its value equals the input (`x.repeat(1)`,
`x.flip([])`), because a later in-place write to it must not reach the input.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.errors import MetaError, UnsupportedOpError
from minijit.ir import VIEWS_ANY_LAYOUT, VIEWS_IF_SPLITS, Effects, NumberProxy, Tag, TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import broadcasts_to, equal_sizes, number_value, rule_compare, rule_same_shape
from minijit.ops import prims
from minijit.ops.registry import ltorch_op
from minijit.ops.runtime_bounds import computed_int, from_end, seen_values
from minijit.ops.strides import check_viewable, is_already_contiguous, reshape_copies
from minijit.ops.utils import (
    canonical_dim,
    infer_shape,
    is_number,
    larger,
    refuse_non_int,
    relied_on,
    reshape_to,
    shape_arg,
    smaller,
    unsqueeze_at,
)

# The output views the input (functionalization makes writes through it update the input);
# with VIEW_OR_COPY only where eager can make a view, else it is a copy.
VIEW = Effects(views=0)
VIEW_OR_COPY = Effects(views=0, may_copy=True)
# Views that keep all the input's elements, only reshaped, reordered or broadcast: a view of any layout,
# or (RESHAPE) a view where the new shape only splits dimensions, else a copy.
REORDERING_VIEW = Effects(views=0, reorders=True, view_layouts=VIEWS_ANY_LAYOUT)
RESHAPE = Effects(views=0, may_copy=True, reorders=True, view_layouts=VIEWS_IF_SPLITS)


def _fail(op: str, msg: str) -> MetaError:
    return MetaError(f"ltorch.{op}: {msg}{where_now()}")


def fresh(a: TensorProxy) -> TensorProxy:
    """A new tensor equal to `a`, for ops that never alias their input.

    It is a same-dtype `convert_element_type`, which the torch executor runs as a copy;
    a pass may only drop such a conversion once the trace is functional.
    """
    return prims.convert_element_type(a, a.dtype)


def slice_dim(a: TensorProxy, dim: int, start: int, stop: int, step: int = 1) -> TensorProxy:
    """`a` sliced along one dim (start <= stop, already clamped into range)."""
    starts = [0] * a.ndim
    stops = list(a.shape)
    steps = [1] * a.ndim
    starts[dim], stops[dim], steps[dim] = start, stop, step
    return prims.slice_prim(a, starts, stops, steps)


# -- transposes ---------------------------------------------------------------

@ltorch_op(torch_fns=[torch.transpose, torch.swapaxes, torch.swapdims, torch.Tensor.transpose, torch.Tensor.swapaxes,
                      torch.Tensor.swapdims],
           methods=["transpose", "swapaxes", "swapdims"], effects=REORDERING_VIEW)
def transpose(a: TensorProxy, dim0: int, dim1: int) -> TensorProxy:
    """torch.transpose: swaps two dims."""
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    if a.ndim < 2 or d0 == d1:
        return a
    perm = list(range(a.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return prims.transpose(a, tuple(perm))


@ltorch_op(torch_fns=[torch.t, torch.Tensor.t], methods=["t"], effects=REORDERING_VIEW)
def t(a: TensorProxy) -> TensorProxy:
    """torch.t: transposes a matrix (0-d and 1-d tensors are returned as they are)."""
    if a.ndim > 2:
        raise _fail("t", f"expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return transpose(a, 0, 1) if a.ndim == 2 else a


@ltorch_op(torch_fns=[torch.permute, torch.Tensor.permute], methods=["permute"], impl=torch.Tensor.permute,
           effects=REORDERING_VIEW)
def permute(a: TensorProxy, *dims: int | Sequence[int]) -> TensorProxy:
    """torch.permute (dims as one sequence or as separate ints)."""
    perm = tuple(canonical_dim(d, a.ndim) for d in shape_arg(dims))
    if sorted(perm) != list(range(a.ndim)):
        raise _fail("permute", f"{perm} is not a permutation of the {a.ndim} dims")
    return prims.transpose(a, perm) if perm != tuple(range(a.ndim)) else a


def _T_eager(a: torch.Tensor) -> torch.Tensor:
    return a.T


def _mT_eager(a: torch.Tensor) -> torch.Tensor:
    return a.mT


@ltorch_op("T", methods=["T"], impl=_T_eager, effects=VIEW)
def T(a: TensorProxy) -> TensorProxy:
    """Tensor.T: reverses the dims."""
    return permute(a, tuple(reversed(range(a.ndim))))


@ltorch_op("mT", methods=["mT"], impl=_mT_eager, effects=VIEW)
def mT(a: TensorProxy) -> TensorProxy:
    """Tensor.mT: transposes the last two dims."""
    if a.ndim < 2:
        raise _fail("mT", f"needs a tensor with at least 2 dimensions, got {a.ndim}")
    return transpose(a, -2, -1)


@ltorch_op(torch_fns=[torch.movedim, torch.moveaxis, torch.Tensor.movedim, torch.Tensor.moveaxis],
           methods=["movedim", "moveaxis"], effects=REORDERING_VIEW)
def movedim(input: TensorProxy, source: int | Sequence[int], destination: int | Sequence[int]) -> TensorProxy:  # noqa: A002
    """torch.movedim: moves dims `source` to positions `destination`, keeping the others in order."""
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise _fail("movedim", f"source {src} and destination {dst} must have the same number of dims")
    src = tuple(canonical_dim(d, input.ndim) for d in src)
    dst = tuple(canonical_dim(d, input.ndim) for d in dst)
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise _fail("movedim", f"repeated dim in source {src} or destination {dst}")
    perm: list[int | None] = [None] * input.ndim
    for s, d in zip(src, dst, strict=True):
        perm[d] = s
    rest = iter(i for i in range(input.ndim) if i not in src)
    return permute(input, tuple(p if p is not None else next(rest) for p in perm))


# -- reshapes -----------------------------------------------------------------

@ltorch_op(torch_fns=[torch.reshape, torch.Tensor.reshape], methods=["reshape"],
           impl=torch.Tensor.reshape, effects=RESHAPE)
def reshape(a: TensorProxy, *shape: Any) -> TensorProxy:
    """torch.reshape / Tensor.reshape, shape as ints or one sequence, with one -1 inferred."""
    return _view_or_copy(a, infer_shape("reshape", shape_arg(shape), a.numel()))


def _view_or_copy(a: TensorProxy, shape: Sequence[Any]) -> TensorProxy:
    """`a` reshaped to `shape` for an op that views where eager can, else copies (`reshape`, `flatten`): recorded as
    `prims.reshape` either way (passes decide the memory from the layouts). Under no_grad, eager's copy of a tensor
    that requires grad does not (a view keeps its base's flag), and code may branch on it."""
    out = reshape_to(a, shape)
    if out is not a and a.requires_grad and not torch.is_grad_enabled() and reshape_copies(a, tuple(shape)):
        out.requires_grad = False
    return out


# A view the user's code asks for is checked against the tensor's eager layout
# (minijit.ops.strides: `x.t().view(-1)` raises eager's error), then runs as a reshape:
# values recomputed by passes (functionalization, fusions) may have other layouts, and
# where eager's view succeeds, reshape returns the same view.
@ltorch_op(torch_fns=[torch.Tensor.view], methods=["view"], impl=torch.Tensor.reshape, effects=REORDERING_VIEW,
           tags={Tag.LAYOUT_STRICT})
def view(a: TensorProxy, *shape: Any) -> TensorProxy:
    """Tensor.view(shape); the dtype-reinterpreting form `view(dtype)` is not supported."""
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise UnsupportedOpError(f"ltorch.view: reinterpreting a tensor as dtype {shape[0]} is not supported"
                                 f"{where_now()}; use .to({shape[0]}) to convert values instead")
    requested = shape_arg(shape)
    new_shape = infer_shape("view", requested, a.numel())
    check_viewable("view", a, tuple(new_shape), requested)
    return reshape_to(a, new_shape)


@ltorch_op(torch_fns=[torch.Tensor.view_as], methods=["view_as"], impl=torch.Tensor.reshape_as,
           effects=REORDERING_VIEW, tags={Tag.LAYOUT_STRICT})
def view_as(a: TensorProxy, other: TensorProxy) -> TensorProxy:
    """Tensor.view_as: a view with other's shape."""
    new_shape = infer_shape("view_as", other.shape, a.numel())
    check_viewable("view_as", a, tuple(new_shape))
    return reshape_to(a, new_shape)


@ltorch_op(torch_fns=[torch.Tensor.reshape_as], methods=["reshape_as"], effects=RESHAPE)
def reshape_as(a: TensorProxy, other: TensorProxy) -> TensorProxy:
    """Tensor.reshape_as: a reshape to other's shape."""
    return _view_or_copy(a, infer_shape("reshape_as", other.shape, a.numel()))


@ltorch_op(torch_fns=[torch.flatten, torch.Tensor.flatten], methods=["flatten"], effects=RESHAPE)
def flatten(input: TensorProxy, start_dim: int = 0, end_dim: int = -1) -> TensorProxy:  # noqa: A002
    """torch.flatten: merges dims start_dim..end_dim into one (a 0-d tensor becomes 1-d)."""
    if input.ndim == 0:
        return reshape_to(input, (1,))
    start, end = canonical_dim(start_dim, input.ndim), canonical_dim(end_dim, input.ndim)
    if start > end:
        raise _fail("flatten", f"start_dim {start_dim} cannot come after end_dim {end_dim}")
    merged = 1
    for s in input.shape[start:end + 1]:
        merged = merged * s
    return _view_or_copy(input, (*input.shape[:start], merged, *input.shape[end + 1:]))


@ltorch_op(torch_fns=[torch.ravel, torch.Tensor.ravel], methods=["ravel"], effects=VIEW_OR_COPY)
def ravel(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.ravel: the tensor as 1-d, a view where it is contiguous, else a contiguous copy (of a 1-d one too: no
    reshape would copy it). Where the layout is not known, taken as a view (the passes refuse a write that the
    layout decides)."""
    copies = is_already_contiguous(input, torch.contiguous_format, decides=None) is False
    return reshape_to(fresh(input) if copies else input, (input.numel(),))


@ltorch_op(torch_fns=[torch.unflatten, torch.Tensor.unflatten], methods=["unflatten"], effects=REORDERING_VIEW)
def unflatten(input: TensorProxy, dim: int, sizes: Sequence[int]) -> TensorProxy:  # noqa: A002
    """torch.unflatten: splits one dim into `sizes` (one -1 inferred)."""
    d = canonical_dim(dim, input.ndim)
    if len(sizes) == 0:
        raise _fail("unflatten", "sizes must be non-empty")
    sizes = infer_shape("unflatten", sizes, input.shape[d] if input.ndim else 1)
    return reshape_to(input, (*input.shape[:d], *sizes, *input.shape[d + 1:]))


@ltorch_op(torch_fns=[torch.squeeze, torch.Tensor.squeeze], methods=["squeeze"], effects=REORDERING_VIEW)
def squeeze(input: TensorProxy, dim: int | Sequence[int] | None = None) -> TensorProxy:  # noqa: A002
    """torch.squeeze: removes size-1 dims (all, or those named; named dims of other sizes stay)."""
    if dim is None:
        dims = range(input.ndim)
    else:
        dims = {canonical_dim(d, input.ndim) for d in ((dim,) if isinstance(dim, int) else dim)}
    dims = tuple(d for d in sorted(dims) if input.ndim > 0 and rule_compare(input.shape[d], "==", 1))
    return prims.squeeze(input, dims) if dims else input


@ltorch_op(torch_fns=[torch.unsqueeze, torch.Tensor.unsqueeze], methods=["unsqueeze"], effects=REORDERING_VIEW)
def unsqueeze(input: TensorProxy, dim: int) -> TensorProxy:  # noqa: A002
    """torch.unsqueeze: inserts a size-1 dim at `dim` (in range -ndim-1 .. ndim)."""
    return unsqueeze_at(input, [canonical_dim(dim, input.ndim + 1)])


@ltorch_op(torch_fns=[torch.Tensor.expand], methods=["expand"], effects=REORDERING_VIEW)
def expand(a: TensorProxy, *sizes: Any) -> TensorProxy:
    """Tensor.expand: broadcasts to `sizes` (-1 keeps a dim; new dims go in front)."""
    return _expand("expand", a, shape_arg(sizes))


def _expand(op: str, a: TensorProxy, sizes: tuple[Any, ...]) -> TensorProxy:
    offset = len(sizes) - a.ndim
    if offset < 0:
        raise _fail(op, f"the number of sizes {list(sizes)} must be at least the tensor's {a.ndim} dims")
    shape = list(sizes)
    for i, size in enumerate(sizes):
        refuse_non_int(op, f"size {i} of {list(sizes)}", size)
        if i < offset:
            if type(size) is int and size < 0:
                raise _fail(op, f"-1 is not allowed for the new leading dim {i} in {list(sizes)}")
            continue
        old = a.shape[i - offset]
        if _keeps_size(size):
            shape[i] = old
        elif not broadcasts_to(old, size):
            raise _fail(op, f"the size {old} of dim {i - offset} must match {size} in {list(sizes)} "
                            f"(only size-1 dims expand), tensor shape {tuple(a.shape)}")
    if offset == 0 and all(map(equal_sizes, shape, a.shape)):
        return a
    return prims.broadcast_in_dim(a, tuple(shape), tuple(range(offset, len(shape))))


def _keeps_size(size: Any) -> bool:
    """Whether an expand size is -1 (keep the dim's size): a symbolic number (an int argument) only where its value
    is, relied on then (a size is never -1, so nothing is relied on otherwise)."""
    if type(size) is int:
        return size == -1
    return isinstance(size, NumberProxy) and number_value(size) == -1 and rule_compare(size, "==", -1)


@ltorch_op(torch_fns=[torch.Tensor.expand_as], methods=["expand_as"], effects=REORDERING_VIEW)
def expand_as(a: TensorProxy, other: TensorProxy) -> TensorProxy:
    """Tensor.expand_as: broadcasts to other's shape."""
    return _expand("expand_as", a, tuple(other.shape))


@ltorch_op(torch_fns=[torch.broadcast_to, torch.Tensor.broadcast_to], methods=["broadcast_to"],
           effects=REORDERING_VIEW)
def broadcast_to(input: TensorProxy, size: Sequence[Any]) -> TensorProxy:  # noqa: A002
    """torch.broadcast_to: like expand with the shape as one sequence."""
    return _expand("broadcast_to", input, tuple(size))


# -- copies and passthroughs ------------------------------------------------------

@ltorch_op(torch_fns=[torch.Tensor.contiguous], methods=["contiguous"],
           effects=Effects(views=0, may_copy=True, reorders=True))
def contiguous(a: TensorProxy, memory_format: torch.memory_format = torch.contiguous_format) -> TensorProxy:
    """Tensor.contiguous: the input itself where its eager layout already is `memory_format`, else a copy."""
    if is_already_contiguous(a, memory_format) is False:
        # Not `fresh`: its copy keeps `a`'s layout where the op runs decomposed (under autograd).
        return prims.copy_in_format(a, memory_format)
    return a


@ltorch_op(torch_fns=[torch.clone, torch.Tensor.clone], methods=["clone"])
def clone(input: TensorProxy, *, memory_format: torch.memory_format = torch.preserve_format) -> TensorProxy:  # noqa: A002
    """torch.clone: a new tensor with the same values (a same-dtype convert_element_type), laid out in
    `memory_format` where one is given."""
    if memory_format != torch.preserve_format:
        return prims.copy_in_format(input, memory_format)
    return fresh(input)


@ltorch_op(torch_fns=[torch.detach, torch.Tensor.detach], methods=["detach", "data"], effects=REORDERING_VIEW)
def detach(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.detach: the same values, cut from autograd (prims.detach, requires_grad=False)."""
    return prims.detach(input)


# -- slicing and splitting ------------------------------------------------------

@ltorch_op(torch_fns=[torch.narrow, torch.Tensor.narrow], methods=["narrow"], effects=VIEW)
def narrow(input: TensorProxy, dim: int, start: int, length: int) -> TensorProxy:  # noqa: A002
    """torch.narrow: `length` elements of `dim` from `start` (negative start counts from the end)."""
    if isinstance(start, TensorProxy):
        raise UnsupportedOpError(f"ltorch.narrow: a tensor start is data-dependent{where_now()}; pass an int")
    refuse_non_int("narrow", "start", start)
    refuse_non_int("narrow", "length", length)
    d = canonical_dim(dim, input.ndim)
    size = input.shape[d]
    # Bounds the trace computes (`n.item()`): seen, so that the checks below read only their outcome.
    computed = seen_values(start, length)
    if computed and computed_int(start):
        start = from_end(start, size)  # arithmetic the trace computes: no trace per sign
    elif rule_compare(start, "<", 0):
        start += size
    if (not (rule_compare(0, "<=", start) and rule_compare(start, "<=", size)) or rule_compare(length, "<", 0)
            or rule_compare(start + length, ">", size)):
        raise _fail("narrow", f"start {number_value(start)} and length {number_value(length)} exceed dim {d} of size "
                              f"{size}")
    if not computed and rule_compare(start, "==", 0) and rule_compare(length, "==", size):
        return input
    return slice_dim(input, d, start, start + length)


@ltorch_op(torch_fns=[torch.select, torch.Tensor.select], methods=["select"], effects=VIEW)
def select(input: TensorProxy, dim: int, index: int) -> TensorProxy:  # noqa: A002
    """torch.select: the slice at `index` of `dim`, with that dim removed."""
    if input.ndim == 0:
        raise _fail("select", "cannot select from a 0-d tensor")
    refuse_non_int("select", "index", index)
    d = canonical_dim(dim, input.ndim)
    return _select(input, d, index, "select")


def _select(a: TensorProxy, d: int, index: int, op: str) -> TensorProxy:
    size = a.shape[d]
    if not (rule_compare(-size, "<=", index) and rule_compare(index, "<", size)):
        raise _fail(op, f"index {index} is out of bounds for dimension {d} with size {size}")
    index %= size
    return prims.squeeze(slice_dim(a, d, index, index + 1), (d,))


@ltorch_op(torch_fns=[torch.unbind, torch.Tensor.unbind], methods=["unbind"], effects=VIEW)
def unbind(input: TensorProxy, dim: int = 0) -> tuple[TensorProxy, ...]:  # noqa: A002
    """torch.unbind: the slices along `dim`, each with that dim removed."""
    if input.ndim == 0:
        raise _fail("unbind", "cannot unbind a 0-d tensor")
    d = canonical_dim(dim, input.ndim)
    return tuple(_select(input, d, i, "unbind") for i in range(input.shape[d]))


def _split_at(a: TensorProxy, d: int, bounds: Sequence[tuple[int, int]]) -> tuple[TensorProxy, ...]:
    # Always new proxies, even for a piece that is all of `a`, so each output has its own name.
    return tuple(slice_dim(a, d, lo, hi) for lo, hi in bounds)


def _bounds_of_sizes(sizes: Sequence[int]) -> list[tuple[int, int]]:
    bounds, lo = [], 0
    for s in sizes:
        bounds.append((lo, lo + s))
        lo += s
    return bounds


@ltorch_op(torch_fns=[torch.split, torch.Tensor.split], methods=["split"], effects=VIEW)
def split(tensor: TensorProxy, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[TensorProxy, ...]:
    """torch.split: pieces of one size (the last may be smaller) or of the listed sizes."""
    if tensor.ndim == 0:
        raise _fail("split", "cannot split a 0-d tensor")
    d = canonical_dim(dim, tensor.ndim)
    n = tensor.shape[d]
    for size in (split_size_or_sections,) if is_number(split_size_or_sections) else split_size_or_sections:
        refuse_non_int("split", "a split size", size)
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if rule_compare(size, "<", 0) or (rule_compare(size, "==", 0) and rule_compare(n, "!=", 0)):
            raise _fail("split", f"split size {size} must be positive for a dim of size {n}")
        count = int(n // size) if size else 0  # the number of outputs: specialised on symbolic sizes
        sizes = [size] * count + ([n - count * size] if rule_compare(n, "!=", count * size) else []) if size else [0]
        sizes = sizes or [0]  # a dim of size 0 splits into one empty piece, as eager's
    else:
        sizes = list(split_size_or_sections)
        seen_values(*sizes)  # sizes the trace computes: their checks below read only the outcome
        if any(rule_compare(s, "<", 0) for s in sizes) or rule_compare(sum(sizes), "!=", n):
            shown = [number_value(s) for s in sizes]
            raise _fail("split", f"split sizes {shown} must be non-negative and sum to dim {d}'s size {n}")
    return _split_at(tensor, d, _bounds_of_sizes(sizes))


@ltorch_op(torch_fns=[torch.chunk, torch.Tensor.chunk], methods=["chunk"], effects=VIEW)
def chunk(input: TensorProxy, chunks: int, dim: int = 0) -> tuple[TensorProxy, ...]:  # noqa: A002
    """torch.chunk: at most `chunks` pieces of ceil(size / chunks) elements each."""
    refuse_non_int("chunk", "chunks", chunks)
    if rule_compare(chunks, "<=", 0):
        raise _fail("chunk", f"chunks must be positive, got {chunks}")
    if input.ndim == 0:
        raise _fail("chunk", "cannot chunk a 0-d tensor")
    d = canonical_dim(dim, input.ndim)
    n = input.shape[d]
    if rule_compare(n, "==", 0):
        return _split_at(input, d, [(0, 0)] * chunks)
    size = -(-n // chunks)
    return _split_at(input, d, [(lo, smaller(lo + size, n)) for lo in range(0, n, size)])


@ltorch_op(torch_fns=[torch.tensor_split, torch.Tensor.tensor_split], methods=["tensor_split"], effects=VIEW)
def tensor_split(input: TensorProxy, indices_or_sections: int | Sequence[int], dim: int = 0) -> tuple[TensorProxy, ...]:  # noqa: A002
    """torch.tensor_split: `sections` near-equal pieces, or pieces between the listed indices."""
    if isinstance(indices_or_sections, TensorProxy):
        raise UnsupportedOpError(f"ltorch.tensor_split: tensor indices are data-dependent{where_now()}; "
                                 "pass an int or a list of ints")
    if input.ndim == 0:
        raise _fail("tensor_split", "cannot split a 0-d tensor")
    d = canonical_dim(dim, input.ndim)
    n = input.shape[d]
    if isinstance(indices_or_sections, int):
        sections = indices_or_sections
        if sections <= 0:
            raise _fail("tensor_split", f"sections must be positive, got {sections}")
        sizes = [n // sections + (1 if rule_compare(i, "<", n % sections) else 0) for i in range(sections)]
        return _split_at(input, d, _bounds_of_sizes(sizes))
    points = [0, *indices_or_sections, n]
    bounds = []
    for lo, hi in itertools.pairwise(points):
        lo, hi, _ = slice(lo, hi).indices(n)
        bounds.append((lo, larger(lo, hi)))
    return _split_at(input, d, bounds)


# -- joining ---------------------------------------------------------------------

def _joined(op: str, tensors: Sequence[TensorProxy], dim: int) -> TensorProxy:
    if not isinstance(tensors, tuple | list) or not tensors:
        raise _fail(op, "expects a non-empty list of tensors")
    for t in tensors:
        if not isinstance(t, TensorProxy):
            raise _fail(op, f"expects tensors, got {type(t).__name__}")
    # torch skips legacy empty 1-d tensors of shape (0,) when joining tensors of more dims.
    real = [t for t in tensors if not (t.ndim == 1 and rule_compare(t.shape[0], "==", 0))] or [tensors[0]]
    if any(t.ndim == 0 for t in real):
        raise _fail(op, "zero-dimensional tensors cannot be concatenated")
    dtype = real[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    d = canonical_dim(dim, real[0].ndim)
    for t in real:
        others = (rule_compare(a, "!=", b) for i, (a, b) in enumerate(zip(t.shape, real[0].shape)) if i != d)
        if t.ndim != real[0].ndim or any(others):
            raise _fail(op, f"sizes of tensors must match except in dim {d}: {tuple(real[0].shape)} and {tuple(t.shape)}")
    return prims.cat([prims.convert_element_type(t, dtype) if t.dtype != dtype else t for t in real], d)


@ltorch_op(torch_fns=[torch.cat, torch.concat, torch.concatenate], effects=Effects(refuses_overlap=True))  # with out=
def cat(tensors: Sequence[TensorProxy], dim: int = 0) -> TensorProxy:
    """torch.cat: joins tensors along an existing dim, promoting their dtypes."""
    return _joined("cat", tensors, dim)


@ltorch_op(torch_fns=[torch.stack])
def stack(tensors: Sequence[TensorProxy], dim: int = 0) -> TensorProxy:
    """torch.stack: joins equal-shaped tensors along a new dim."""
    if not isinstance(tensors, tuple | list) or not tensors:
        raise _fail("stack", "expects a non-empty list of tensors")
    for t in tensors:
        if not isinstance(t, TensorProxy) or not rule_same_shape(t.shape, tensors[0].shape):
            raise _fail("stack", f"expects tensors of one shape, got {[getattr(x, 'shape', x) for x in tensors]}")
    d = canonical_dim(dim, tensors[0].ndim + 1)
    return _joined("stack", [unsqueeze_at(t, [d]) for t in tensors], d)


def _at_least(a: TensorProxy, ndim: int) -> TensorProxy:
    if a.ndim >= ndim:
        return a
    return reshape_to(a, (1,) * (ndim - a.ndim) + tuple(a.shape)) if a.ndim == 0 else unsqueeze_at(a, [0])


@ltorch_op(torch_fns=[torch.hstack])
def hstack(tensors: Sequence[TensorProxy]) -> TensorProxy:
    """torch.hstack: joins along dim 1 (dim 0 for 1-d tensors)."""
    ts = [_at_least(t, 1) for t in tensors]
    return _joined("hstack", ts, 0 if ts and ts[0].ndim == 1 else 1)


@ltorch_op(torch_fns=[torch.vstack, torch.row_stack])
def vstack(tensors: Sequence[TensorProxy]) -> TensorProxy:
    """torch.vstack: joins along dim 0 after making every tensor at least 2-d."""
    return _joined("vstack", [_at_least(t, 2) for t in tensors], 0)


# -- reordering and repeating -------------------------------------------------------

def reversed_index(n: int, device: torch.device) -> TensorProxy:
    """The int64 index n-1, ..., 0."""
    return prims.iota(n, start=n - 1, step=-1, dtype=torch.int64, device=device)


@ltorch_op(torch_fns=[torch.flip, torch.Tensor.flip], methods=["flip"], impl=torch.Tensor.flip)
def flip(input: TensorProxy, *dims: int | Sequence[int]) -> TensorProxy:  # noqa: A002
    """torch.flip / Tensor.flip: reverses the order along `dims` (one take per dim)."""
    ds = sorted({canonical_dim(d, input.ndim) for d in shape_arg(dims)})
    out = input
    for d in ds:
        if rule_compare(input.shape[d], ">", 1):
            out = prims.take(out, reversed_index(input.shape[d], input.device), d)
    return out if out is not input else fresh(input)


@ltorch_op(torch_fns=[torch.fliplr])
def fliplr(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.fliplr: flips dim 1."""
    if input.ndim < 2:
        raise _fail("fliplr", "needs a tensor with at least 2 dims")
    return flip(input, (1,))


@ltorch_op(torch_fns=[torch.flipud])
def flipud(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.flipud: flips dim 0."""
    if input.ndim < 1:
        raise _fail("flipud", "needs a tensor with at least 1 dim")
    return flip(input, (0,))


@ltorch_op(torch_fns=[torch.roll, torch.Tensor.roll], methods=["roll"])
def roll(input: TensorProxy, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> TensorProxy:  # noqa: A002
    """torch.roll: rotates elements along dims (the flattened tensor when dims is None)."""
    shifts_t = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    for shift in shifts_t:
        refuse_non_int("roll", "shifts", shift)
    if dims is None:
        if len(shifts_t) != 1:
            raise _fail("roll", f"with dims=None, shifts must be one int, got {shifts}")
        flat = roll(reshape_to(input, (input.numel(),)), shifts_t[0], 0)
        return reshape_to(flat, input.shape)
    dims_t = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(dims_t) != len(shifts_t):
        raise _fail("roll", f"shifts {shifts_t} and dims {dims_t} must have the same length")
    out = input
    for shift, dim in zip(shifts_t, dims_t):
        d = canonical_dim(dim, input.ndim)
        n = input.shape[d]
        s = shift % n if n else 0
        if s:
            out = prims.cat([slice_dim(out, d, n - s, n), slice_dim(out, d, 0, n - s)], d)
    return out if out is not input else fresh(input)


def _repeat(op: str, a: TensorProxy, repeats: tuple[int, ...]) -> TensorProxy:
    for r in repeats:
        refuse_non_int(op, "a repeat count", r)
    if len(repeats) < a.ndim:
        raise _fail(op, f"the number of repeats {list(repeats)} can not be smaller than the tensor's {a.ndim} dims")
    if any(type(r) is int and r < 0 for r in repeats):
        raise _fail(op, f"repeats {list(repeats)} must be non-negative")
    offset = len(repeats) - a.ndim
    sizes = (1,) * offset + tuple(a.shape)
    if all(rule_compare(r, "==", 1) for r in repeats):
        return fresh(reshape_to(a, sizes))
    # (r0, s0, r1, s1, ...) broadcast, then merged pairwise into (r0 * s0, r1 * s1, ...).
    interleaved = tuple(x for r, s in zip(repeats, sizes) for x in (r, s))
    b = prims.broadcast_in_dim(a, interleaved, tuple(2 * (offset + i) + 1 for i in range(a.ndim)))
    return prims.reshape(b, tuple(r * s for r, s in zip(repeats, sizes)))


@ltorch_op(torch_fns=[torch.Tensor.repeat], methods=["repeat"])
def repeat(a: TensorProxy, *repeats: Any) -> TensorProxy:
    """Tensor.repeat: tiles the tensor `repeats[i]` times along dim i (new dims in front)."""
    return _repeat("repeat", a, shape_arg(repeats))


@ltorch_op(torch_fns=[torch.tile, torch.Tensor.tile], methods=["tile"], impl=torch.Tensor.tile)
def tile(input: TensorProxy, *dims: Any) -> TensorProxy:  # noqa: A002
    """torch.tile: like repeat, with missing leading repeats taken as 1."""
    reps = shape_arg(dims)
    return _repeat("tile", input, (1,) * (input.ndim - len(reps)) + reps)


@ltorch_op(torch_fns=[torch.repeat_interleave, torch.Tensor.repeat_interleave], methods=["repeat_interleave"])
def repeat_interleave(input: TensorProxy, repeats: Any = None, dim: int | None = None, *,  # noqa: A002
                      output_size: int | None = None) -> TensorProxy:
    """torch.repeat_interleave with an int `repeats`: each element `repeats` times in a row along `dim`
    (along the flattened tensor for None)."""
    if repeats is None or isinstance(repeats, TensorProxy):
        raise UnsupportedOpError(
            f"ltorch.repeat_interleave with repeats given as a tensor{where_now()}: the output's shape depends on the "
            "tensor's values, which a trace cannot; pass repeats as an int, or give output_size")
    repeats = relied_on(repeats)
    if type(repeats) is not int or repeats < 0:
        raise _fail("repeat_interleave", f"repeats must be a non-negative int, got {repeats!r}")
    a = reshape_to(input, (math.prod(input.shape),)) if dim is None else input
    d = canonical_dim(0 if dim is None else dim, a.ndim)
    size = a.shape[d] * repeats
    if output_size is not None and rule_compare(output_size, "!=", size):
        raise _fail("repeat_interleave", f"output_size {output_size} differs from the output's size {size}")
    # (..., s_d, repeats, ...) broadcast, then s_d and repeats merged.
    spread = (*a.shape[:d + 1], repeats, *a.shape[d + 1:])
    b = prims.broadcast_in_dim(a, spread, tuple(i if i <= d else i + 1 for i in range(a.ndim)))
    return prims.reshape(b, (*a.shape[:d], size, *a.shape[d + 1:]))

# -- triangles and diagonals -------------------------------------------------------

def zero_of(dtype: torch.dtype) -> bool | int | float:
    """A Python zero that prims accept as a scalar of `dtype` without promoting it."""
    return False if dtype == torch.bool else 0.0 if dtype.is_floating_point or dtype.is_complex else 0


def _triangle(op: str, a: TensorProxy, diagonal: int, lower: bool) -> TensorProxy:
    refuse_non_int(op, "diagonal", diagonal)
    if a.ndim < 2:
        raise _fail(op, f"needs a tensor with at least 2 dims, got {a.ndim}")
    n, m = a.shape[-2], a.shape[-1]
    rows = prims.broadcast_in_dim(prims.iota(n, start=0, step=1, dtype=torch.int64, device=a.device), (n, m), (0,))
    cols = prims.broadcast_in_dim(prims.iota(m, start=0, step=1, dtype=torch.int64, device=a.device), (n, m), (1,))
    offset = prims.sub(cols, rows)
    keep = prims.le(offset, diagonal) if lower else prims.ge(offset, diagonal)
    keep = prims.broadcast_in_dim(keep, a.shape, (a.ndim - 2, a.ndim - 1))
    return prims.where(keep, a, zero_of(a.dtype))


@ltorch_op(torch_fns=[torch.tril, torch.Tensor.tril], methods=["tril"])
def tril(input: TensorProxy, diagonal: int = 0) -> TensorProxy:  # noqa: A002
    """torch.tril: zeroes the elements above the `diagonal`-th diagonal."""
    return _triangle("tril", input, diagonal, lower=True)


@ltorch_op(torch_fns=[torch.triu, torch.Tensor.triu], methods=["triu"])
def triu(input: TensorProxy, diagonal: int = 0) -> TensorProxy:  # noqa: A002
    """torch.triu: zeroes the elements below the `diagonal`-th diagonal."""
    return _triangle("triu", input, diagonal, lower=False)


@ltorch_op(torch_fns=[torch.diagonal, torch.Tensor.diagonal], methods=["diagonal"], effects=VIEW)
def diagonal(input: TensorProxy, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorProxy:  # noqa: A002
    """torch.diagonal: the `offset`-th diagonal of dims dim1, dim2, as a new last dim."""
    refuse_non_int("diagonal", "offset", offset)
    d1, d2 = canonical_dim(dim1, input.ndim), canonical_dim(dim2, input.ndim)
    if input.ndim < 2 or d1 == d2:
        raise _fail("diagonal", f"needs two distinct dims, got {dim1} and {dim2} of a {input.ndim}-d tensor")
    # The two dims moved last and merged: element (i, j) sits at i * m + j, so a diagonal
    # is a strided slice with stride m + 1.
    moved = movedim(input, (d1, d2), (-2, -1))
    n, m = moved.shape[-2], moved.shape[-1]
    flat = reshape_to(moved, (*moved.shape[:-2], n * m))
    if rule_compare(offset, ">=", 0):
        length, start = larger(0, smaller(n, m - offset)), offset
    else:
        length, start = larger(0, smaller(n + offset, m)), -offset * m
    if rule_compare(length, "==", 0):
        start = 0
    stop = start + (length - 1) * (m + 1) + 1 if length else start
    return slice_dim(flat, flat.ndim - 1, start, stop, m + 1)

