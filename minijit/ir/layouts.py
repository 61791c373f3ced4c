"""The eager layouts known for a compile's tensors: a table held by its traces, not by the proxies.

A layout is what eager torch gives a tensor: its strides and storage offset. Most of a trace does not
depend on it, so it is known only where something asked (`minijit.ops.strides`): a trace input's from
the real tensor, a computed tensor's worked out from the ops that made it. The table belongs to the
capture's trace and is handed on with its names to the traces made from it (`Trace.derive`, the
backward, a custom function's trace), so a pass asking about a tensor of the capture finds what the
capture found, and nothing is ever written onto a proxy, which several traces share. The checks that keep an
input's layout on later calls (`guard_layout`, `guard_row_major`) are made here, for `minijit.ops.strides` and
`minijit.ops.symbolic_strides` alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minijit.ir.context import add_layout_check
from minijit.ir.proxies import NumberProxy, TensorProxy, number_value

if TYPE_CHECKING:
    from minijit.ir.trace import Trace

__all__ = ["Layout", "LayoutTable", "contiguous_strides", "guard_layout", "guard_row_major", "outside_inference_mode",
           "row_major", "same_memory", "tensor_row_major"]


@dataclass(frozen=True)
class Layout:
    """A tensor's eager `strides` and storage `offset`; `sources`: the trace inputs it was worked out from
    (empty for an input, whose layout is its own). `order_only`: the trace inputs it was worked out from
    whose exact strides it does not depend on, as long as they stay `row_major` (`minijit.ops.strides`:
    they reach it only through ops that lay out a fresh output the same way for any such input). `conj`
    and `neg`: the view flags of a lazily conjugated or negated view (`x.conj()`, `x.conj().imag`).
    `address`: a trace input's `data_ptr()` (None for a computed tensor, whose memory is only known when
    the trace runs)."""

    strides: tuple[int, ...]
    offset: int
    sources: tuple[TensorProxy, ...] = ()
    order_only: tuple[TensorProxy, ...] = ()
    conj: bool = False
    neg: bool = False
    address: int | None = field(default=None, compare=False)


class LayoutTable:
    """Tensor proxy -> its eager layout, once known; a layout, once set, never changes."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[TensorProxy, Layout]] = {}  # by id, the proxy kept alive with it

    def get(self, p: TensorProxy) -> Layout | None:
        """`p`'s layout, or None where it is not known (yet)."""
        found = self._known.get(id(p))
        return found[1] if found is not None else None

    def set(self, p: TensorProxy, layout: Layout) -> None:
        """Note `p`'s layout (the first one noted stays)."""
        self._known.setdefault(id(p), (p, layout))


def row_major(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether `strides` lay out a tensor of `sizes` in row-major order, maybe with gaps: each dim's stride
    at least the next dim's extent (size-1 dims included), the last at least 1.

    A contiguous layout is one; so is a slice along any dim of one (`keys[..., :-2, :]`). None of them is
    read as channels-last by torch's `suggest_memory_format`, which size-1 dims' strides alone can decide.
    """
    if not strides:
        return True
    if strides[-1] < 1:
        return False
    return all(strides[k] >= strides[k + 1] * sizes[k + 1] for k in range(len(strides) - 1))


def tensor_row_major(t: torch.Tensor) -> bool:
    """`row_major` of a tensor's sizes and strides: what a guard's `_row_major(x)` asks on every call.

    A contiguous tensor with no dim of size 0 or 1 has exactly the contiguous strides, which are row-major: the
    usual case, answered by torch without building the tuples."""
    shape = t.shape
    if 1 not in shape and 0 not in shape and t.is_contiguous():
        return True
    return row_major(tuple(shape), t.stride())


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous (row-major) tensor of `shape`."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * max(shape[k + 1], 1)
    return tuple(strides)


def guard_row_major(p: TensorProxy) -> None:
    """Make the cache entry's guard check that input `p` is laid out `row_major` (above): all a
    layout worked out from `p` only as an order-only source relies on."""
    add_layout_check(f"_row_major({p.name})")


def guard_layout(p: TensorProxy, trace: Trace, offset_matters: bool, sizes_matter: bool = False,
                 flags_matter: bool = False, strides_matter: bool = False) -> None:
    """Make the cache entry's guard check that input `p` keeps its layout (and its sizes, with `sizes_matter`;
    its view flags, with `flags_matter`). With `strides_matter` the strides themselves are read (`Tensor.stride()`,
    `dim_order()`): they are checked exactly, those of dims of size 1 too, where a contiguous layout is otherwise
    checked as torch tells contiguity."""
    layout = trace.layouts.get(p)
    assert layout is not None
    strides, offset = layout.strides, layout.offset
    sizes = tuple(int(number_value(d)) for d in p.shape)
    if sizes_matter and any(isinstance(d, NumberProxy) for d in p.shape):
        add_layout_check(f"tuple({p.name}.shape) == {sizes!r}")
    if strides_matter:
        add_layout_check(f"{p.name}.stride() == {strides!r}")
    elif strides == contiguous_strides(sizes) or math.prod(sizes) <= 1:
        add_layout_check(f"{p.name}.is_contiguous()")
    else:
        add_layout_check(f"{p.name}.stride() == {strides!r}")
    if offset_matters:
        add_layout_check(f"{p.name}.storage_offset() == {offset}")
    if flags_matter:
        add_layout_check(f"{p.name}.is_conj() is {layout.conj}")
        add_layout_check(f"{p.name}.is_neg() is {layout.neg}")


def same_memory(result: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether an op's `result` is `source` or a view of its memory (both eager tensors made outside inference mode,
    meta ones included): the same root of views. `_is_view()` alone says no such thing: `ravel` and `flatten` of a
    tensor they cannot view copy it contiguously and return a view of the copy."""
    def root(t: torch.Tensor) -> torch.Tensor:
        return t._base if t._base is not None else t

    return result is source or root(result) is root(source)


@contextmanager
def outside_inference_mode() -> Iterator[None]:
    """Leave `torch.inference_mode()` (keeping the grad mode) while minijit works on meta tensors.

    Tensors made under inference mode are *inference tensors*: their views do not say
    they are views (`_is_view()` is False) and they keep no version counter, so a
    decision read from them (does this op view or copy? which argument does it
    write?) would depend on the mode the first call happened to run under. Meta
    tensors made here are ordinary ones whatever the user's mode.
    """
    if not torch.is_inference_mode_enabled():
        yield
        return
    grad = torch.is_grad_enabled()
    with torch.inference_mode(False), torch.set_grad_enabled(grad):
        yield
