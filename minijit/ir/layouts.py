"""The eager layouts known for a compile's tensors: a table held by its traces, not by the proxies.

A layout is what eager torch gives a tensor: its strides and storage offset. Most of a trace does not
depend on it, so it is known only where something asked (`minijit.ops.strides`): a trace input's from
the real tensor, a computed tensor's worked out from the ops that made it. The table belongs to the
capture's trace and is handed on with its names to the traces made from it (`Trace.derive`, the
backward, a custom function's trace), so a pass asking about a tensor of the capture finds what the
capture found, and nothing is ever written onto a proxy, which several traces share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minijit.ir.proxies import TensorProxy

__all__ = ["Layout", "LayoutTable", "row_major"]


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
