"""Eager's refusal of in-place and `out=` ops whose operand overlaps, in memory, the tensor they write.

Functionalization reads every operand before any write, so it would return a result for
`u[0:4].add_(u[2:6])`, which eager refuses ("some elements of the input tensor and the
written-to tensor refer to a single memory location"). `check_overlaps` asks, for each op
the user's code called that writes a tensor, whether an operand shares memory with it, as
eager's own check does:

- not the same memory, or either empty: nothing to check. Which tensors view one base is
  functionalization's view tracking (inputs of one storage are views of their synthetic base,
  or one input where identical), not the memory model: that one answers "may share" (a
  `reshape` that copies counts as a view), where a refusal needs "does share";
- both non-overlapping and dense: eager's rule, on byte ranges. Equal ranges with equal
  strides are the same elements in the same order (allowed, `a.mul_(a)`); ranges that
  intersect otherwise are refused;
- otherwise (a strided or expanded tensor) eager checks nothing and its kernel computes in
  whatever order it visits the elements. minijit computes the elements' exact addresses:
  no shared element, or each shared element read only at the position that writes it,
  is allowed (`t[:, ::2].add_(t[:, 1::2])`); anything else is refused, since eager's result
  would depend on that order.

A few ops (`index_copy_`, `scatter_`, `index_put_`, `cat(out=)`, ...) refuse any overlap,
the same elements included (`Effects.refuses_overlap`). Layouts come from `minijit.ops.strides.eager_layout`; where one
is unknown nothing is refused. A decision that two tensors of one memory do not clash holds
for the layouts (and symbolic sizes) seen: they join the entry's guard.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.errors import InplaceError, where
from minijit.ir import BoundSymbol, NumberProxy, Tag, TensorProxy, Trace, tree_flatten, tree_map
from minijit.ir.proxies import number_value
from minijit.ops.strides import eager_layout
from minijit.transforms.memory import memory_model

__all__ = ["check_overlaps"]

# Beyond this many elements per tensor, an overlap eager does not check is refused without
# enumerating the elements (a conservative answer: the tensors' address ranges do intersect).
EXACT_LIMIT = 1 << 22

_FULL, _NO, _CLASH, _ORDER = "full", "no", "clash", "order"


@dataclass
class _Access:
    """What an op the user called writes and reads, as eager runs it."""

    op: str  # for messages: `ltorch.add_`, `ltorch.add with out=`
    refuses_any_overlap: bool = False  # eager's kernel refuses any overlap (`Effects.refuses_overlap`)
    writes: list[tuple[TensorProxy, Any]] = field(default_factory=list)  # (tensor, the key of the region written)
    operands: list[TensorProxy] = field(default_factory=list)
    copies: bool = False  # it moves values without computing (copy_, `a[key] = v`)
    broadcast_first: bool = False  # the operand is broadcast to the written shape before the check (`a[key] = v`)


def check_overlaps(bsym: BoundSymbol, trace: Trace, base_of: Callable[[TensorProxy], TensorProxy]) -> None:
    """Raise InplaceError where `bsym` (an op the user's code called, in `trace`) writes a tensor an operand overlaps.

    `base_of(p)` is the tensor whose memory `p` views (itself where it views none), with
    aliased inputs mapped to one of them: two tensors of different bases share no element.
    """
    access = _access(bsym, trace)
    any_overlap_refused = access.refuses_any_overlap
    for target, key in access.writes:
        for operand in access.operands:
            if operand is target and key is None and not any_overlap_refused:
                continue  # the same tensor: eager's FULL overlap
            if base_of(target) is not base_of(operand):
                continue
            written, read = _layout(target, trace, key), _layout(operand, trace)
            if written is None or read is None:
                continue  # unknown layout: the read-first behaviour stays
            if access.broadcast_first:
                try:
                    read = read.expand(written.shape)
                except RuntimeError:
                    continue  # eager raises its own error (shapes), as minijit does
            status = _status(written, read, access.copies, any_overlap_refused)
            if status in (_CLASH, _ORDER):
                why = ("share memory, which eager PyTorch refuses (some elements of the input and the written-to "
                       "tensor refer to a single memory location) or, for ops it does not check, computes in the "
                       "order its kernel visits the elements" if status == _CLASH else
                       "share elements in a layout eager does not check: the result would depend on the order the "
                       "kernel visits the elements")
                written_to = f"region of {_describe(target, trace)}" if key is not None else \
                    f"tensor {_describe(target, trace)}"
                raise InplaceError(f"{access.op}{where(bsym.source)}: the operand {_describe(operand, trace)} and "
                                   f"the written-to {written_to} {why}; clone() {operand.name} before the call")
            # Allowed for these layouts and sizes only: the guard checks them.
            for p in (target, operand):
                eager_layout(p, trace, sizes_matter=True)


def _describe(p: TensorProxy, trace: Trace) -> str:
    """`p`'s name, and the input it views where it views one (`t2 (a view of x)`)."""
    memory = memory_model(trace)  # who made each tensor
    inputs = {id(a) for a in trace.args}
    q = p
    while id(q) not in inputs and (i := memory.producer(q)) is not None:
        viewed = trace.bound_symbols[i].viewed_tensor()
        if viewed is None or viewed is q:
            break
        q = viewed
    return f"{p.name} (a view of {q.name})" if q is not p and id(q) in inputs else p.name


def _access(bsym: BoundSymbol, trace: Trace) -> _Access:
    out = bsym.out_of
    if out is not None:  # `torch.add(a, b, out=c)`: c against what add read
        op, operands = out
        return _Access(f"{op.id} with out=", op.effects.refuses_overlap, [(bsym.args[0], None)],
                       [p for p in operands if isinstance(p, TensorProxy)])
    if Tag.INDEXED_WRITE in bsym.sym.tags:
        return _setitem_access(bsym)
    written = bsym.written()
    effects = bsym.sym.effects
    refs = effects.writes
    # The arguments not written (by position: `u.index_copy_(0, i, u)` reads the u it writes).
    read = ([a for i, a in enumerate(bsym.args) if i not in refs], [v for k, v in bsym.kwargs.items() if k not in refs])
    operands = [p for p in tree_flatten(read) if isinstance(p, TensorProxy)
                and not (refs == () and any(p is w for w in written))
                and not (effects.reads_scalar_first and p.ndim == 0)]
    return _Access(bsym.sym.id, effects.refuses_overlap, [(w, None) for w in written], operands,
                   copies=effects.copies or effects.moves_values)


def _setitem_access(bsym: BoundSymbol) -> _Access:
    """`a[key] = value` as eager runs it: a copy into the view a[key], or an index_put_ into a."""
    a, key, value = bsym.args
    nothing = _Access(bsym.sym.id)
    if not isinstance(value, TensorProxy):
        return nothing
    items = key if isinstance(key, tuple) else (key,)
    if all(_is_basic(k) for k in items):
        # A 0-d value is filled in as a number; others are broadcast, then copied into the region.
        if value.ndim == 0:
            return nothing
        return _Access(bsym.sym.id, False, [(a, key)], [value], copies=True, broadcast_first=True)  # as copy_
    if all(isinstance(k, TensorProxy) for k in items):
        if len(items) == 1 and items[0].dtype == torch.bool and value.ndim == 0:
            return nothing  # masked_fill_ with a number
        return _Access(f"{bsym.sym.id} (an index_put_)", True, [(a, None)], [value])  # which refuses any overlap
    return nothing  # basic and advanced indexing mixed: not checked


def _is_basic(k: Any) -> bool:
    return type(k) is int or k is None or k is Ellipsis or type(k) is slice


def _layout(p: TensorProxy, trace: Trace, key: Any = None) -> torch.Tensor | None:
    """A meta tensor with `p`'s eager layout (of its region `p[key]` with a key), or None where unknown."""
    meta = eager_layout(p, trace, guard=False)
    if meta is None or key is None:
        return meta
    key = tree_map(lambda x: number_value(x) if isinstance(x, NumberProxy) else x, key)
    try:
        return meta[key]
    except Exception:
        return None


def _status(written: torch.Tensor, read: torch.Tensor, copies: bool, any_overlap_refused: bool) -> str:
    """How `read` overlaps `written` (meta tensors whose storage offsets count in one storage)."""
    if written.numel() == 0 or read.numel() == 0:
        return _NO
    w_start, w_end = _byte_range(written)
    r_start, r_end = _byte_range(read)
    if w_end <= r_start or r_end <= w_start:
        return _NO
    if _dense(written) and _dense(read):
        # Eager's rule: dense tensors cover exactly their byte ranges.
        if (w_start, w_end) == (r_start, r_end) and written.stride() == read.stride() \
                and written.dtype.itemsize == read.dtype.itemsize:
            return _CLASH if any_overlap_refused else _FULL
        return _CLASH
    if written.shape == read.shape and written.stride() == read.stride() \
            and written.dtype.itemsize == read.dtype.itemsize:
        # One layout at two offsets (`t[:, ::2]` and `t[:, 1::2]`): each element of one is read at its
        # own position from another address, so any shared element makes the order matter.
        shift = read.storage_offset() - written.storage_offset()
        if shift == 0:  # the same elements, each read where it is written
            return _ORDER if any_overlap_refused else _NO
        shared = _shifted_layouts_meet(shift, list(zip(written.stride(), written.shape)))
        if shared is not None:
            return _ORDER if shared else _NO
    if max(written.numel(), read.numel()) > EXACT_LIMIT:
        return _ORDER
    return _exact(written, read, copies, any_overlap_refused)


def _shifted_layouts_meet(shift: int, dims: list[tuple[int, int]], budget: list[int] | None = None) -> bool | None:
    """Whether a layout (`dims`: (stride, size) pairs) and itself moved by `shift` elements share an element.

    That is whether `shift` is a sum of `c * stride` with `|c| < size` per dim: a search from the
    largest stride down, trying the few `c` that leave a remainder the smaller strides can reach.
    None where the search would take too long.
    """
    budget = budget if budget is not None else [10_000]
    dims = sorted((d for d in dims if d[1] > 1), reverse=True)
    if not dims:
        return shift == 0
    (stride, size), rest = dims[0], dims[1:]
    if stride == 0:
        return _shifted_layouts_meet(shift, rest, budget)
    reach = sum((n - 1) * st for st, n in rest)
    for c in range(max(-(size - 1), -((reach - shift) // stride)), min(size - 1, (shift + reach) // stride) + 1):
        budget[0] -= 1
        if budget[0] < 0:
            return None
        found = _shifted_layouts_meet(shift - c * stride, rest, budget)
        if found is None or found:
            return found
    return False


def _dense(m: torch.Tensor) -> bool:
    """Whether `m` is non-overlapping and dense: its elements fill its byte range once (a permuted contiguous layout)."""
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(m.shape, m.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _byte_range(m: torch.Tensor) -> tuple[int, int]:
    size = m.dtype.itemsize
    start = m.storage_offset() * size
    return start, start + (1 + sum((n - 1) * s for n, s in zip(m.shape, m.stride(), strict=True))) * size


def _exact(written: torch.Tensor, read: torch.Tensor, copies: bool, any_overlap_refused: bool) -> str:
    """The overlap of tensors eager does not check, from their elements' addresses."""
    unit = math.gcd(written.dtype.itemsize, read.dtype.itemsize)
    w_units, r_units = _units(written, unit), _units(read, unit)
    if not bool(torch.isin(r_units, w_units).any()):
        return _NO
    if any_overlap_refused or written.dtype.itemsize != read.dtype.itemsize:
        return _ORDER
    try:
        read = read.expand(written.shape)  # position by position, as an elementwise op reads it
    except RuntimeError:
        return _ORDER
    w_at, r_at = _addresses(written), _addresses(read)
    moved = w_at != r_at
    if copies:
        # A copy changes only the elements it moves: order matters where another position reads one.
        clash = moved & torch.isin(w_at, r_at)
    else:
        # An elementwise op changes every element it writes: order matters where an element is read
        # at a position other than the one writing it.
        clash = moved & torch.isin(r_at, w_at)
    return _ORDER if bool(clash.any()) else _NO


def _addresses(m: torch.Tensor) -> torch.Tensor:
    """The storage address (in elements) of each element of the meta tensor `m`, flattened."""
    at = torch.tensor(m.storage_offset(), dtype=torch.int64)
    for n, s in zip(m.shape, m.stride(), strict=True):
        at = at.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
    return at.reshape(-1)


def _units(m: torch.Tensor, unit: int) -> torch.Tensor:
    """The memory units (of `unit` bytes) `m`'s elements cover, flattened."""
    per = m.dtype.itemsize // unit
    return ((_addresses(m) * per).unsqueeze(-1) + torch.arange(per, dtype=torch.int64)).reshape(-1)
