"""Indexing ops: `x[key]`, index_select, gather, take, masked_fill, scatter_add, index_add/copy/fill.

`x[key]` is applied in two steps, as torch does: first the basic indices (ints
select, slices slice, None and True insert dims, Ellipsis fills), then the integer
index tensors ("advanced indexing"), which gather along the dims they index. The
dims an index tensor produces replace its dim when the index tensors sit next to
each other after the basic step, and go first otherwise.

`indexed_update(x, key, value)` computes, functionally, the tensor that `x[key] = value`
leaves in x; `ltorch.setitem` (in inplace.py) writes it back with one `prims.copy_`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.errors import UnsupportedOpError
from minijit.ir import TENSOR_METHODS, VIEWS_IF_BASIC_KEY, Effects, IntegerProxy, NumberProxy, TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import broadcasts_to, rule_compare, rule_same_shape
from minijit.ops import prims
from minijit.ops.ltorch.shape import _fail, movedim, permute, slice_dim
from minijit.ops.registry import ltorch_op
from minijit.ops.runtime_bounds import computed_int, computed_slice_bounds, from_end, seen_value, seen_values
from minijit.ops.utils import (
    broadcast_shapes,
    canonical_dim,
    dtype_scalar,
    expand_to,
    reshape_to,
    to_dtype,
    unsqueeze_at,
)

_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8)
_MASK_DTYPES = (torch.bool, torch.uint8)


def _mask_error(op: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"ltorch.{op}: indexing with a boolean mask{where_now()} gives a result whose shape depends on "
        "the mask's values, which a trace cannot know; use torch.where(mask, x, other) or "
        "x.masked_fill(~mask, value) to keep the shape, or move the masking outside the jitted function"
    )


def _constant_index(op: str, values: Sequence[Any], device: torch.device) -> TensorProxy:
    """An int64 index tensor holding the (nested) list of ints `values`, built from prims (symbolic ints among them
    become elements computed at run time)."""
    as_tensor = torch.tensor(_placeholders(values))
    if as_tensor.dtype == torch.bool:
        raise _mask_error(op)
    if as_tensor.dtype != torch.int64:
        raise _fail(op, f"a list index must hold ints, got {values!r}")
    flat = as_tensor.flatten().tolist()
    n = len(flat)
    symbolic = _leaves(values)
    if any(isinstance(v, NumberProxy) for v in symbolic):
        index = prims.cat([prims.full((1,), v, dtype=torch.int64, device=device) for v in symbolic], 0)
        return reshape_to(index, tuple(as_tensor.shape))
    step = flat[1] - flat[0] if n > 1 else 1
    if n and all(b - a == step for a, b in itertools.pairwise(flat)):
        index = prims.iota(n, start=flat[0], step=step, dtype=torch.int64, device=device)
    elif n:
        index = prims.cat([prims.full((1,), v, dtype=torch.int64, device=device) for v in flat], 0)
    else:
        index = prims.full((0,), 0, dtype=torch.int64, device=device)
    return reshape_to(index, tuple(as_tensor.shape))


def _placeholders(values: Any) -> Any:
    """The (nested) list `values` with each symbolic number replaced by a number of its type, for torch.tensor to
    tell the shape and dtype of."""
    if isinstance(values, list | tuple):
        return [_placeholders(v) for v in values]
    if isinstance(values, NumberProxy):
        return 0 if isinstance(values, IntegerProxy) else 0.5
    return values


def _leaves(values: Any) -> list[Any]:
    """The numbers of the (nested) list `values`, in row-major order."""
    if isinstance(values, list | tuple):
        return [leaf for v in values for leaf in _leaves(v)]
    return [values]


def _is_int(x: Any) -> bool:
    # Symbolic ints index like ints; the comparisons that clamp them record constraints.
    return type(x) is int or isinstance(x, IntegerProxy)


def _key_tuple(key: Any) -> tuple[Any, ...]:
    """The key as a tuple of indices."""
    if isinstance(key, list):
        # Like torch (for now), a list holding sequences, slices, None or tensors is a tuple of indices.
        legacy = any(k is None or k is Ellipsis or isinstance(k, list | tuple | slice | TensorProxy) for k in key)
        return tuple(key) if legacy else (key,)
    return key if isinstance(key, tuple) else (key,)


def _key_items(op: str, a: TensorProxy, key: Any) -> list[Any]:
    """The key as a list of items, with list indices turned into index tensors and the Ellipsis expanded."""
    items = list(_key_tuple(key))
    consumed = 0
    ellipses = 0
    for i, item in enumerate(items):
        if item is None or item is True or item is False:
            continue
        if item is Ellipsis:
            ellipses += 1
            continue
        if isinstance(item, list | tuple):
            items[i] = item = _constant_index(op, item, a.device)
        if isinstance(item, TensorProxy):
            if item.dtype in _MASK_DTYPES:
                raise _mask_error(op)
            if item.dtype not in _INDEX_DTYPES:
                raise _fail(op, f"tensors used as indices must be integer or bool tensors, got {item.dtype}")
        elif isinstance(item, slice):
            for part in (item.start, item.stop, item.step):
                if type(part) is float or (isinstance(part, NumberProxy) and part.python_type is float):
                    # eager's TypeError for bad input (a MetaError is typed as eager's error), not a limitation
                    value = part.value if isinstance(part, NumberProxy) else part
                    raise _fail(op, f"slice indices must be integers or None, got {value!r}")
                if part is not None and not _is_int(part):
                    raise UnsupportedOpError(f"ltorch.{op}: slice bounds must be ints, got "
                                             f"{type(part).__name__}{where_now()}")
        elif not _is_int(item):
            raise UnsupportedOpError(f"ltorch.{op}: unsupported index of type {type(item).__name__}: {item!r}{where_now()}")
        consumed += 1
    if ellipses > 1:
        raise UnsupportedOpError(f"ltorch.{op}: an index with more than one ellipsis ('...'){where_now()}")
    if consumed > a.ndim:
        raise _fail(op, f"too many indices for a tensor of dimension {a.ndim}")
    fill = [slice(None)] * (a.ndim - consumed)
    if ellipses:
        at = next(j for j, item in enumerate(items) if item is Ellipsis)
        return items[:at] + fill + items[at + 1:]
    return items + fill


def slice_bounds(s: slice, size: Any) -> tuple[Any, Any, int]:
    """(start, stop, step) of a positive-step slice of a dim of `size`, clamped like Python's.

    Written with comparisons rather than `slice.indices`, so that a symbolic size is
    only constrained by the comparisons the result depends on. A bound the trace computes
    (`x[:n.item()]`) is clamped by arithmetic the trace runs: no comparison, one trace for
    all its values (minijit.ops.runtime_bounds).
    """
    def bound(v: int | None, default: Any) -> Any:
        if v is None:
            return default
        if rule_compare(v, "<", 0):
            v = v + size
            return 0 if rule_compare(v, "<", 0) else v
        return size if rule_compare(v, ">", size) else v

    step = 1 if s.step is None else s.step
    if seen_values(s.start, s.stop):
        return (*computed_slice_bounds(s, size, bound), step)
    start, stop = bound(s.start, 0), bound(s.stop, size)
    return start, (start if rule_compare(stop, "<", start) else stop), step


def _check_step(op: str, step: Any) -> None:
    """Refuse a slice step that is not positive, as eager does. A step the trace computes (`x[::n.item()]`) is
    seen first: its sign is then an outcome the trace checks, not its value."""
    if computed_int(step):
        seen_value(step)
    if step is not None and rule_compare(step, "<=", 0):
        raise _fail(op, f"slice step must be greater than zero, got {_shown(step)}")


def _shown(x: Any) -> Any:
    """`x` for a message: the value the capture saw of a number the trace computes (formatting it would read it)."""
    return x.value if isinstance(x, NumberProxy) and computed_int(x) else x


def _index_start(op: str, index: Any, size: Any, dim: int) -> Any:
    """Where int `index` selects in a dim of `size`, checked in bounds. An index the trace computes
    (`x[n.item()]`) is seen: its bounds are outcomes the trace checks, and counting from the end is arithmetic,
    so one trace serves every index in bounds."""
    computed = computed_int(index) and seen_value(index)
    if not (rule_compare(-size, "<=", index) and rule_compare(index, "<", size)):
        raise _fail(op, f"index {_shown(index)} is out of bounds for dimension {dim} with size {size}")
    return from_end(index, size) if computed else index + size if rule_compare(index, "<", 0) else index


def _basic_index(op: str, a: TensorProxy, items: list[Any]) -> tuple[TensorProxy, list[tuple[int, TensorProxy]]]:
    """Apply the ints, slices, None and bools of `items`; return the result and where each index tensor now applies.

    A 0-d integer tensor selects like an int, as in eager torch (with a take, since its
    value is only known when the trace runs).
    """
    starts, stops, steps = [0] * a.ndim, list(a.shape), [1] * a.ndim
    squeezed: list[int] = []  # input dims removed by an int or a 0-d index tensor
    selected: list[tuple[int, TensorProxy]] = []  # (input dim, 0-d index tensor)
    new_dims: list[int] = []  # output dims inserted by None/True/False
    empty_dims: list[int] = []  # output dims inserted by False (size 0)
    tensors: list[tuple[int, TensorProxy]] = []
    sliced = False
    in_dim = out_dim = 0
    for item in items:
        if item is None or item is True or item is False:
            new_dims.append(out_dim)
            if item is False:
                empty_dims.append(out_dim)
            out_dim += 1
            continue
        size = a.shape[in_dim]
        if isinstance(item, TensorProxy) and item.ndim == 0:
            selected.append((in_dim, item))
            squeezed.append(in_dim)
        elif isinstance(item, TensorProxy):
            tensors.append((out_dim, item))
            out_dim += 1
        elif isinstance(item, slice):
            _check_step(op, item.step)
            if item.start is not None or item.stop is not None or item.step is not None:
                starts[in_dim], stops[in_dim], steps[in_dim] = slice_bounds(item, size)
                sliced = True
            out_dim += 1
        else:
            start = _index_start(op, item, size, in_dim)
            starts[in_dim], stops[in_dim] = start, start + 1
            squeezed.append(in_dim)
            sliced = True
        in_dim += 1
    out = a
    if sliced:
        out = prims.slice_prim(out, starts, stops, steps)
    for d, index in selected:
        out = prims.take(out, reshape_to(_nonnegative(index, a.shape[d]), (1,)), d)
    if squeezed:
        out = prims.squeeze(out, tuple(squeezed))
    if new_dims:
        out = unsqueeze_at(out, new_dims)
    for d in empty_dims:
        out = slice_dim(out, d, 0, 0)
    return out, tensors


def _nonnegative(index: TensorProxy, size: int) -> TensorProxy:
    """`index` with negative entries counted from the end of a dim of `size` (as int64)."""
    index = to_dtype(index, torch.int64)
    return prims.where(prims.lt(index, 0), prims.add(index, size), index)


def _advanced_index(a: TensorProxy, tensors: list[tuple[int, TensorProxy]]) -> TensorProxy:
    """Gather along the dims that the index tensors index (positions in `a`, increasing)."""
    shape = broadcast_shapes(*(t.shape for _, t in tensors))
    positions = [p for p, _ in tensors]
    index = [expand_to(_nonnegative(t, a.shape[p]), shape) for p, t in tensors]
    if len(tensors) == 1:
        src, dim, linear = a, positions[0], index[0]
    else:
        # Move the indexed dims to the front and merge them into one, so that one
        # take with the row-major linear index gathers every indexed element.
        rest = [d for d in range(a.ndim) if d not in positions]
        moved = permute(a, tuple(positions + rest))
        sizes = [a.shape[p] for p in positions]
        src, dim = reshape_to(moved, (math.prod(sizes), *(a.shape[d] for d in rest))), 0
        linear = None
        for k, idx in enumerate(index):
            stride = math.prod(sizes[k + 1:])
            term = prims.mul(idx, stride) if rule_compare(stride, "!=", 1) else idx
            linear = term if linear is None else prims.add(linear, term)
    n = math.prod(shape)
    taken = prims.take(src, reshape_to(linear, (n,)), dim)
    out = reshape_to(taken, (*src.shape[:dim], *shape, *src.shape[dim + 1:]))
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if len(tensors) > 1 and adjacent and positions[0] != 0 and shape:
        out = movedim(out, tuple(range(len(shape))), tuple(range(positions[0], positions[0] + len(shape))))
    return out


def index_with_key(op: str, a: TensorProxy, key: Any) -> TensorProxy:
    """`a[key]`: basic indexing, then integer index tensors."""
    out, tensors = _basic_index(op, a, _key_items(op, a, key))
    return _advanced_index(out, tensors) if tensors else out


def _getitem_eager(a: torch.Tensor, key: Any) -> torch.Tensor:
    return a[key]


def _is_advanced(key: Any) -> bool:
    """Whether `key` holds index tensors or lists, which make `a[key]` a copy rather than a view.

    Like eager torch, a 0-d integer tensor alone selects like an int, giving a view.
    """
    return any(isinstance(item, list | tuple) or (isinstance(item, TensorProxy) and item.ndim > 0)
               for item in _key_tuple(key))


@ltorch_op("getitem", impl=_getitem_eager, effects=Effects(views=0, may_copy=True, view_layouts=VIEWS_IF_BASIC_KEY))
def getitem(a: TensorProxy, key: Any) -> TensorProxy:
    """`a[key]` with ints, slices, None, Ellipsis, bools and 0-d int tensors: a view of `a`."""
    if _is_advanced(key):
        raise _fail("getitem", "index tensors make a copy; use ltorch.index for such keys")
    return index_with_key("getitem", a, key)


@ltorch_op("index", impl=_getitem_eager)
def index(a: TensorProxy, key: Any) -> TensorProxy:
    """`a[key]` with integer index tensors or lists among the indices: a new tensor (a bool mask is unsupported)."""
    return index_with_key("getitem", a, key)


def _getitem_method(a: TensorProxy, key: Any) -> TensorProxy:
    """`a[key]` on a proxy: `getitem` (a view) or `index` (a copy), so functionalization can tell them apart."""
    return (index if _is_advanced(key) else getitem)(a, key)


TENSOR_METHODS["getitem"] = _getitem_method


def _mask_key(key: Any) -> TensorProxy | None:
    """The mask if `key` is one bool tensor, alone or in a 1-tuple (uint8 masks are refused, as eager does)."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    if isinstance(key, TensorProxy) and key.dtype == torch.uint8:
        raise _fail("setitem", "only supports boolean masks, but got a mask of dtype torch.uint8")
    if isinstance(key, TensorProxy) and key.dtype == torch.bool:
        return key
    return None


def _drop_leading_ones(v: TensorProxy, ndim: int) -> TensorProxy:
    while v.ndim > ndim and rule_compare(v.shape[0], "==", 1):
        v = reshape_to(v, v.shape[1:])
    return v


def _value_tensor(op: str, a: TensorProxy, value: Any, shape: tuple[Any, ...],
                  out_shape: tuple[Any, ...] | None = None) -> Any:
    """`value` cast to a's dtype and broadcast to `shape` (leading size-1 dims dropped, as torch does).

    With `out_shape`, the value is checked against `shape` and broadcast to `out_shape`.
    """
    out_shape = shape if out_shape is None else out_shape
    if isinstance(value, TensorProxy):
        v = _drop_leading_ones(value, len(shape))
        if v.ndim > len(shape) or not all(broadcasts_to(s, d) for s, d in zip(reversed(v.shape), reversed(shape))):
            raise _fail(op, f"shape mismatch: value tensor of shape {list(value.shape)} cannot be broadcast "
                            f"to indexing result of shape {list(shape)}")
        return expand_to(to_dtype(v, a.dtype), out_shape)
    if isinstance(value, bool | int | float | complex | NumberProxy):
        return prims.full(shape, value, dtype=a.dtype, device=a.device)
    raise _fail(op, f"cannot assign a value of type {type(value).__name__}")


def _masked_update(op: str, a: TensorProxy, mask: TensorProxy, value: Any, accumulate: bool) -> TensorProxy:
    k = mask.ndim
    if k > a.ndim or not rule_same_shape(tuple(mask.shape), tuple(a.shape[:k])):
        raise _fail(op, f"the mask's shape {list(mask.shape)} does not match the indexed tensor's {list(a.shape)}")
    rest = tuple(a.shape[k:])
    full_mask = prims.broadcast_in_dim(mask, tuple(a.shape), tuple(range(k)))
    if isinstance(value, TensorProxy):
        v = _drop_leading_ones(value, len(rest))
        if v.ndim > len(rest):
            raise UnsupportedOpError(
                f"ltorch.{op}: assigning a tensor of shape {list(value.shape)} through a boolean mask{where_now()} "
                "needs as many values as the mask has True entries, which a trace cannot know; "
                "use torch.where(mask, values, x) with values of x's shape")
        fill = _value_tensor(op, a, v, rest, tuple(a.shape))
    elif isinstance(value, NumberProxy) or accumulate:
        fill = prims.full(a.shape, value, dtype=a.dtype, device=a.device)
    else:
        fill = dtype_scalar(value, a.dtype)
    return prims.where(full_mask, prims.add(a, fill) if accumulate else fill, a)


def _is_index_put(key: Any) -> bool:
    """Whether eager torch assigns through `key` with index_put (which does not cast the value)."""
    if isinstance(key, list):
        return True
    items = key if isinstance(key, tuple) else (key,)
    for item in items:
        if isinstance(item, list | tuple) or (isinstance(item, TensorProxy) and item.ndim > 0):
            return True
        if isinstance(item, bool) and len(items) > 1:
            return True
    return False


def _check_same_dtype(op: str, a: TensorProxy, value: Any) -> None:
    if isinstance(value, TensorProxy) and value.dtype != a.dtype:
        raise _fail(op, f"index put requires the source and destination dtypes match, got {a.dtype} for the "
                        f"destination and {value.dtype} for the source")


def indexed_update(op: str, a: TensorProxy, key: Any, value: Any, accumulate: bool = False) -> TensorProxy:
    """The tensor that `a[key] = value` (or `+= value` with `accumulate`) leaves in `a`, computed without writing into `a`.

    As in eager torch, a tensor value is cast to a's dtype where the assignment is a
    copy (basic indexing, a bool mask with a 0-d value) and must already have a's
    dtype where it is an index_put (index tensors, lists).
    """
    mask = _mask_key(key)
    if mask is not None:
        if isinstance(value, TensorProxy) and value.ndim > 0:
            _check_same_dtype(op, a, value)
        return _masked_update(op, a, mask, value, accumulate)
    if _is_index_put(key):
        _check_same_dtype(op, a, value)
    updated = _one_dim_update(op, a, key, value, accumulate)
    if updated is not None:
        return updated
    # Index the tensor of a's linear positions with the same key: that gives, in the
    # shape of a[key], where each element of a[key] lives in a, so one index_copy
    # (index_add, which sums repeated positions, to accumulate) into the flattened
    # tensor performs the whole assignment, whatever the key.
    numel = a.numel()
    positions = reshape_to(prims.iota(numel, start=0, step=1, dtype=torch.int64, device=a.device), a.shape)
    locations = index_with_key(op, positions, key)
    v = _value_tensor(op, a, value, tuple(locations.shape))
    n = locations.numel()
    prim = prims.index_add if accumulate else prims.index_copy
    updated = prim(reshape_to(a, (numel,)), reshape_to(locations, (n,)), reshape_to(v, (n,)), 0)
    return reshape_to(updated, a.shape)


def _is_full_slice(item: Any) -> bool:
    return isinstance(item, slice) and item.start is None and item.stop is None and item.step is None


def _one_dim_update(op: str, a: TensorProxy, key: Any, value: Any, accumulate: bool) -> TensorProxy | None:
    """`indexed_update` for keys that index at most one dim (`x[:, 3] = v`, `x[..., i] = v`), else None.

    One index_copy (index_add) along that dim, with no tensor of a's size holding positions.
    """
    raw = _key_tuple(key)
    for item in raw:
        if item is False or isinstance(item, list | tuple):
            return None
        if isinstance(item, TensorProxy) and (item.ndim > 1 or item.dtype not in _INDEX_DTYPES):
            return None
    if sum(1 for item in raw if not (item is None or item is True or item is Ellipsis or _is_full_slice(item))) > 1:
        return None
    result_shape: list[Any] = []
    dim, index, in_dim = None, None, 0
    for item in _key_items(op, a, key):
        if item is None or item is True:
            result_shape.append(1)
            continue
        size = a.shape[in_dim]
        if _is_full_slice(item):
            result_shape.append(size)
        elif isinstance(item, slice):
            _check_step(op, item.step)
            start, stop, step = slice_bounds(item, size)
            n = (stop - start + step - 1) // step
            dim, index = in_dim, prims.iota(n, start=start, step=step, dtype=torch.int64, device=a.device)
            result_shape.append(n)
        elif isinstance(item, TensorProxy):
            dim, index = in_dim, reshape_to(_nonnegative(item, size), (item.numel(),))
            result_shape.extend(item.shape)
        else:
            start = _index_start(op, item, size, in_dim)
            dim, index = in_dim, prims.iota(1, start=start, step=1, dtype=torch.int64, device=a.device)
        in_dim += 1
    v = _value_tensor(op, a, value, tuple(result_shape))
    if dim is None:  # the key selects all of a
        v = reshape_to(v, a.shape)
        return prims.add(a, v) if accumulate else v
    box = list(a.shape)
    box[dim] = index.shape[0]
    prim = prims.index_add if accumulate else prims.index_copy
    return prim(a, index, reshape_to(v, tuple(box)), dim)


@ltorch_op(torch_fns=[torch.index_put, torch.Tensor.index_put], methods=["index_put"])
def index_put(input: TensorProxy, indices: Sequence[TensorProxy | None], values: TensorProxy,  # noqa: A002
              accumulate: bool = False) -> TensorProxy:
    """torch.index_put: `input[indices] = values` (or `+= values`, summing repeats, with accumulate) on a copy."""
    if not isinstance(values, TensorProxy):
        raise _fail("index_put", f"expects a values tensor, got {type(values).__name__}")
    _check_same_dtype("index_put", input, values)
    key = tuple(slice(None) if t is None else t for t in indices)
    return indexed_update("index_put", input, key, values, accumulate)


def _strides(shape: Sequence[Any]) -> list[Any]:
    strides: list[Any] = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


@ltorch_op(torch_fns=[torch.scatter, torch.Tensor.scatter], methods=["scatter"])
def scatter(input: TensorProxy, dim: int, index: TensorProxy, src: Any = None, *, value: Any = None,  # noqa: A002
            reduce: str | None = None) -> TensorProxy:
    """torch.scatter: input with src[i][j] (or `value`) written at [index[i][j]][j] (for dim 0)."""
    if reduce is not None:
        raise UnsupportedOpError(f"ltorch.scatter: reduce={reduce!r} is not supported{where_now()}; "
                                 "use scatter_add or scatter_reduce")
    if (src is None) == (value is None):
        raise _fail("scatter", "expects exactly one of src and value")
    src = value if src is None else src
    d = canonical_dim(dim, input.ndim)
    idx = _as_index("scatter", index, ndim=None)
    idx = _gather_index("scatter", idx)
    if isinstance(src, TensorProxy):
        if src.dtype != input.dtype:
            raise _fail("scatter", f"expects src of the input's dtype {input.dtype}, got {src.dtype}")
        _check_gather_shapes("scatter", input, idx, d, src)
        if not rule_same_shape(tuple(src.shape), tuple(idx.shape)):
            src = prims.slice_prim(src, [0] * src.ndim, list(idx.shape), [1] * src.ndim)
    else:
        _check_gather_shapes("scatter", input, idx, d)
        src = prims.full(idx.shape, src, dtype=input.dtype, device=input.device)
    if input.ndim == 0:
        return reshape_to(scatter(reshape_to(input, (1,)), 0, reshape_to(idx, (1,)), reshape_to(src, (1,))), ())
    # The linear position in input of every element of index: its own coordinates,
    # with the one along `dim` replaced by the index value.
    strides = _strides(input.shape)
    linear = None
    for k in range(input.ndim):
        if k == d:
            coord = idx
        else:
            ramp = prims.iota(idx.shape[k], start=0, step=1, dtype=torch.int64, device=input.device)
            coord = prims.broadcast_in_dim(ramp, tuple(idx.shape), (k,))
        term = prims.mul(coord, strides[k]) if not (type(strides[k]) is int and strides[k] == 1) else coord
        linear = term if linear is None else prims.add(linear, term)
    numel, n = input.numel(), idx.numel()
    updated = prims.index_copy(reshape_to(input, (numel,)), reshape_to(linear, (n,)), reshape_to(src, (n,)), 0)
    return reshape_to(updated, input.shape)


# -- index ops ----------------------------------------------------------------

def _as_index(op: str, index: Any, ndim: int | None = 1) -> TensorProxy:
    """An integer index tensor; a 0-d one becomes 1-d when `ndim` is 1."""
    if not isinstance(index, TensorProxy):
        raise _fail(op, f"expects an index tensor, got {type(index).__name__}")
    if index.dtype not in _INDEX_DTYPES:
        raise _fail(op, f"expects an integer index tensor, got {index.dtype}")
    if ndim == 1:
        if index.ndim > 1:
            raise _fail(op, f"the index must be a vector, got shape {list(index.shape)}")
        return reshape_to(index, (1,)) if index.ndim == 0 else index
    return index


def _gather_index(op: str, idx: TensorProxy) -> TensorProxy:
    """An int64 or int32 index (eager's gather and scatter take both) as int64, the prims' index dtype."""
    if idx.dtype == torch.int32:
        return prims.convert_element_type(idx, torch.int64)
    if idx.dtype != torch.int64:
        raise _fail(op, f"expects an int32 or int64 index, got {idx.dtype}")
    return idx


# With out=, eager refuses any overlap of the result with an operand, the same elements included.
_GATHERS = Effects(refuses_overlap=True)


@ltorch_op(torch_fns=[torch.index_select, torch.Tensor.index_select], methods=["index_select"],
           effects=_GATHERS)
def index_select(input: TensorProxy, dim: int, index: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.index_select: the slices of `dim` at `index`, in order."""
    d = canonical_dim(dim, input.ndim)
    idx = _as_index("index_select", index)
    if input.ndim == 0:
        return reshape_to(prims.take(reshape_to(input, (1,)), idx, 0), ())
    return prims.take(input, idx, d)


@ltorch_op(torch_fns=[torch.take, torch.Tensor.take], methods=["take"],
           effects=_GATHERS)
def take(input: TensorProxy, index: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.take: elements of the flattened input at `index`, in index's shape."""
    idx = _as_index("take", index, ndim=None)
    n = input.numel()
    flat = reshape_to(input, (n,))
    taken = prims.take(flat, reshape_to(_nonnegative(idx, n), (idx.numel(),)), 0)
    return reshape_to(taken, idx.shape)


def _check_gather_shapes(op: str, input: TensorProxy, index: TensorProxy, d: int, other: TensorProxy | None = None) -> None:  # noqa: A002
    if index.ndim != input.ndim and not (index.ndim <= 1 and input.ndim <= 1):
        raise _fail(op, f"index {list(index.shape)} and input {list(input.shape)} must have the same number of dims")
    for i, (si, sx) in enumerate(zip(index.shape, input.shape)):
        if i != d and rule_compare(si, ">", sx):
            raise _fail(op, f"size {si} of index dim {i} exceeds the input's {sx} (index {list(index.shape)}, "
                            f"input {list(input.shape)})")
    if other is not None and any(rule_compare(si, ">", so) for si, so in zip(index.shape, other.shape)):
        raise _fail(op, f"index {list(index.shape)} is larger than src {list(other.shape)}")


@ltorch_op(torch_fns=[torch.gather, torch.Tensor.gather], methods=["gather"],
           effects=_GATHERS)
def gather(input: TensorProxy, dim: int, index: TensorProxy, *, sparse_grad: bool = False) -> TensorProxy:  # noqa: A002
    """torch.gather: out[i][j] = input[index[i][j]][j] (for dim 0), in index's shape."""
    if isinstance(index, TensorProxy) and isinstance(input, TensorProxy) and (
            input.ndim == 0 or any(type(s) is int and s == 0 for s in index.shape)):
        # Eager skips its checks for an empty index and treats a 0-d input as 1-d: torch runs those.
        raise UnsupportedOpError(f"ltorch.gather: an empty index or a 0-d input{where_now()}")
    d = canonical_dim(dim, input.ndim)
    idx = _as_index("gather", index, ndim=None)
    idx = _gather_index("gather", idx)
    _check_gather_shapes("gather", input, idx, d)
    return prims.take_along_axis(input, idx, d)


@ltorch_op(torch_fns=[torch.take_along_dim, torch.Tensor.take_along_dim], methods=["take_along_dim"],
           effects=_GATHERS)
def take_along_dim(input: TensorProxy, indices: TensorProxy, dim: int | None = None) -> TensorProxy:  # noqa: A002
    """torch.take_along_dim: gather with broadcasting (of the flattened tensors when dim is None)."""
    idx = _as_index("take_along_dim", indices, ndim=None)
    if dim is None:
        flat = reshape_to(input, (input.numel(),))
        return prims.take_along_axis(flat, _from_end(to_dtype(reshape_to(idx, (idx.numel(),)), torch.int64),
                                                     flat.shape[0]), 0)
    if idx.ndim != input.ndim:
        raise _fail("take_along_dim", f"input {list(input.shape)} and indices {list(idx.shape)} need the same number of dims")
    d = canonical_dim(dim, input.ndim)
    shape = list(broadcast_shapes(*(tuple(1 if i == d else s for i, s in enumerate(t.shape)) for t in (input, idx))))
    x = expand_to(input, tuple([*shape[:d], input.shape[d], *shape[d + 1:]]))
    i = expand_to(to_dtype(idx, torch.int64), tuple([*shape[:d], idx.shape[d], *shape[d + 1:]]))
    return prims.take_along_axis(x, _from_end(i, input.shape[d]), d)


def _from_end(index: TensorProxy, size: Any) -> TensorProxy:
    """`index` with negative entries counted from the end (torch.take_along_dim does; gather does not)."""
    return prims.where(prims.lt(index, 0), prims.add(index, size), index)


@ltorch_op(torch_fns=[torch.masked_fill, torch.Tensor.masked_fill], methods=["masked_fill"])
def masked_fill(input: TensorProxy, mask: TensorProxy, value: Any) -> TensorProxy:  # noqa: A002
    """torch.masked_fill: `value` where mask is True (mask and input broadcast), input's dtype."""
    if not isinstance(mask, TensorProxy) or mask.dtype != torch.bool:
        raise _fail("masked_fill", f"only supports boolean masks, got {getattr(mask, 'dtype', type(mask).__name__)}")
    shape = broadcast_shapes(input.shape, mask.shape)
    if isinstance(value, TensorProxy):
        if value.ndim != 0:
            raise _fail("masked_fill", f"only supports a 0-dimensional value tensor, got shape {list(value.shape)}")
        fill = expand_to(to_dtype(value, input.dtype), shape)
    elif isinstance(value, NumberProxy):
        fill = prims.full(shape, value, dtype=input.dtype, device=input.device)
    else:
        fill = dtype_scalar(value, input.dtype)
    return prims.where(expand_to(mask, shape), fill, expand_to(input, shape))


def _check_source(op: str, input: TensorProxy, source: TensorProxy, d: int, n: int) -> TensorProxy:  # noqa: A002
    if not isinstance(source, TensorProxy):
        raise _fail(op, f"expects a source tensor, got {type(source).__name__}")
    if source.dtype != input.dtype:
        raise _fail(op, f"self and source expected to have the same dtype, but got (self) {input.dtype} "
                        f"and (source) {source.dtype}")
    src = reshape_to(source, (1,)) if source.ndim == 0 and input.ndim <= 1 else source
    expected = list(input.shape) if input.ndim else [1]
    expected[d] = n
    if len(src.shape) != len(expected) or not rule_same_shape(src.shape, expected):
        raise _fail(op, f"source of shape {list(source.shape)} does not match the expected {expected}")
    return src


def _index_update(op: str, prim: Any, input: TensorProxy, dim: int, index: TensorProxy, source: TensorProxy) -> TensorProxy:  # noqa: A002
    d = canonical_dim(dim, input.ndim)
    idx = _as_index(op, index)
    src = _check_source(op, input, source, d, idx.shape[0])
    if input.ndim == 0:
        return reshape_to(prim(reshape_to(input, (1,)), idx, src, 0), ())
    return prim(input, idx, src, d)


@ltorch_op(torch_fns=[torch.index_copy, torch.Tensor.index_copy], methods=["index_copy"])
def index_copy(input: TensorProxy, dim: int, index: TensorProxy, source: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.index_copy: the slices of `dim` at `index` replaced by source's."""
    return _index_update("index_copy", prims.index_copy, input, dim, index, source)


@ltorch_op(torch_fns=[torch.index_add, torch.Tensor.index_add], methods=["index_add"])
def index_add(input: TensorProxy, dim: int, index: TensorProxy, source: TensorProxy, *, alpha: Any = 1) -> TensorProxy:  # noqa: A002
    """torch.index_add: alpha * source added into the slices of `dim` at `index`."""
    if isinstance(source, TensorProxy) and rule_compare(alpha, "!=", 1):
        source = prims.mul(source, dtype_scalar(alpha, source.dtype))
    return _index_update("index_add", prims.index_add, input, dim, index, source)


@ltorch_op(torch_fns=[torch.index_fill, torch.Tensor.index_fill], methods=["index_fill"])
def index_fill(input: TensorProxy, dim: int, index: TensorProxy, value: Any) -> TensorProxy:  # noqa: A002
    """torch.index_fill: the slices of `dim` at `index` filled with `value`."""
    d = canonical_dim(dim, input.ndim)
    idx = _as_index("index_fill", index)
    shape = list(input.shape) if input.ndim else [1]
    shape[d] = idx.shape[0]
    if isinstance(value, TensorProxy):
        if value.ndim != 0:
            raise _fail("index_fill", f"only supports a 0-dimensional value tensor, got shape {list(value.shape)}")
        fill = expand_to(to_dtype(value, input.dtype), tuple(shape))
    else:
        fill = prims.full(tuple(shape), value, dtype=input.dtype, device=input.device)
    flat = reshape_to(input, (1,)) if input.ndim == 0 else input
    return reshape_to(prims.index_copy(flat, _nonnegative(idx, flat.shape[d]), fill, d), input.shape)


@ltorch_op(torch_fns=[torch.scatter_add, torch.Tensor.scatter_add], methods=["scatter_add"])
def scatter_add(input: TensorProxy, dim: int, index: TensorProxy, src: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.scatter_add: src[i][j] added into input[index[i][j]][j] (for dim 0)."""
    d = canonical_dim(dim, input.ndim)
    idx = _as_index("scatter_add", index, ndim=None)
    idx = _gather_index("scatter_add", idx)
    if not isinstance(src, TensorProxy) or src.dtype != input.dtype:
        raise _fail("scatter_add", f"expects src of the input's dtype {input.dtype}, got {getattr(src, 'dtype', src)!r}")
    _check_gather_shapes("scatter_add", input, idx, d, src)
    return prims.scatter_add(input, idx, src, d)
