"""Compute an op into the buffer of an intermediate that nothing reads afterwards.

After functionalization every in-place op on an intermediate is out of place
(`(v.sqrt() / c).add_(1e-8)` becomes `t2 = div(t1, c); t3 = add(t2, 1e-8)`), so each
step allocates a buffer where eager reused one. `reuse_buffers` gives that reuse
back: where a bound symbol reads an intermediate `t` of its result's shape, dtype and
device, and nothing reads t's memory afterwards, the executor that runs the symbol
is asked for a version writing into t (`torch.div(t1, c, out=t1)`). Failing that, a
result goes into any buffer of its kind that nothing reads any more (the next
parameter's `sqrt` into the last one's), so a loop over same-sized tensors allocates
once. Fewer allocations also means fewer fresh pages: a 4 MB buffer allocated anew
costs about a thousand page faults.

The rules (docs/design.md, invariants 1 and 2, applied to intermediates):

- t's memory is known to belong to the trace alone: an executor said the op that
  made it returns a new tensor (`Executor.allocates_output`), or it is such a buffer
  already reused. Inputs, constants, views of either, and the results of any op
  that might return one of its arguments never qualify.
- nothing that lives in t's memory (t, its views, results already written there)
  is read after the op, nor returned;
- no other argument of the op shares t's memory (an op may read its `out` exactly,
  not through another view);
- the result is not returned: it would take t's strides, which could differ from
  the strides eager gives it; nor does an op that reads layouts (`Tag.READS_LAYOUT`:
  `as_strided`) read it or anything computed from it (elementwise kernels lay out their
  results after their inputs').
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import BoundSymbol, Proxy, TensorProxy, Trace, tree_iter
from minijit.ir.rewrite import Edits
from minijit.ops.strides import eager_layout
from minijit.transforms.memory import MemoryModel, Storage, buffer_kind, layout_read, memory_model, read_proxies


def reuse_buffers(trace: Trace, executors: Sequence[Any]) -> Trace:
    """Let ops write their results into intermediates' buffers that nothing reads any more, where safe."""
    return _BufferReuse(trace, executors).run()


class _BufferReuse:
    """One walk over the trace, following which memory each proxy lives in (as rewritten so far)."""

    def __init__(self, trace: Trace, executors: Sequence[Any]):
        self.trace = trace
        self.by_namespace = {ex.namespace: ex for ex in executors}
        self.reads = memory_model(trace)  # who reads each proxy, in the trace as it comes
        self.returned = self._returned()
        self.layout_read = layout_read(trace)
        # Where each proxy lives in the trace as rewritten: an op allocates memory of its own only
        # where its executor says so; any other op may return one of its arguments.
        self.memory = MemoryModel.start(trace, allocates=self._allocates)
        self.owned: set[Storage] = set()  # storages the trace allocated itself
        # Storage -> the index of the last bound symbol reading something that lives in it (inf: returned).
        self.busy_until: dict[Storage, float] = {}
        # (shape, dtype, device) -> a heap of (busy_until, allocation order, storage); entries go stale.
        self.pool: dict[tuple[Any, ...], list[tuple[float, int, Storage]]] = {}
        self.allocations = 0

    def run(self) -> Trace:
        edits = Edits(self.trace)
        for i, bsym in enumerate(self.trace.bound_symbols):
            ex = self.by_namespace.get(bsym.sym.namespace)
            if ex is not None and self._may_take_a_buffer(bsym, ex):
                rewritten = self._rewrite(bsym, i, ex)
                if rewritten is not bsym:
                    edits.replace(i, rewritten)
                    bsym = rewritten
            self._place_outputs(bsym)
        return edits.apply(pass_name="reuse buffers")

    def _returned(self) -> set[int]:
        """ids of the proxies that are returned or may share memory with a returned value (through views)."""
        returned = {id(p) for p in tree_iter(self.trace.output) if isinstance(p, Proxy)}
        for bsym in reversed(self.trace.bound_symbols):
            ex = self.by_namespace.get(bsym.sym.namespace)
            if any(id(o) in returned for o in bsym.proxy_outputs()):
                if bsym.written() or ex is None or not ex.allocates_output(bsym):
                    returned.update(id(p) for p in bsym.proxy_args())
        return returned

    def _allocates(self, bsym: BoundSymbol) -> bool:
        ex = self.by_namespace.get(bsym.sym.namespace)
        return ex is not None and len(list(bsym.proxy_outputs())) == 1 and ex.allocates_output(bsym)

    def _may_take_a_buffer(self, bsym: BoundSymbol, ex: Any) -> bool:
        outs = list(bsym.proxy_outputs())
        return (len(outs) == 1 and isinstance(outs[0], TensorProxy) and id(outs[0]) not in self.returned
                and id(outs[0]) not in self.layout_read and ex.allocates_output(bsym))

    def _repeats_elements(self, t: TensorProxy) -> bool:
        """Whether `t`, made by a view op, may show an element of its memory more than once (eager's layout;
        unknown: it may). A result written into a buffer (`out=`) is that whole buffer."""
        i = self.reads.producer(t)
        if i is None or self.trace.bound_symbols[i].viewed_argument(t) is None:
            return False
        meta = eager_layout(t, self.trace, guard=False)
        return meta is None or torch._debug_has_internal_overlap(meta) != 0

    def _dead(self, m: Storage, i: int) -> bool:
        """Whether nothing living in memory m is read after the i-th bound symbol, nor returned."""
        return self.busy_until.get(m, math.inf) <= i

    def _free_buffer(self, kind: tuple[Any, ...], i: int) -> Storage | None:
        """An owned memory of this kind that nothing reads from the i-th bound symbol on, or None."""
        heap = self.pool.get(kind, [])
        while heap and heap[0][0] < i:
            until, order, m = heapq.heappop(heap)
            if self.busy_until[m] == until:
                return m
            heapq.heappush(heap, (self.busy_until[m], order, m))  # it got a new reader since
        return None

    def _rewrite(self, bsym: BoundSymbol, i: int, ex: Any) -> BoundSymbol:
        """bsym computing into an argument's buffer, else into a dead buffer of the same kind, else unchanged."""
        kind = buffer_kind(next(iter(bsym.proxy_outputs())))
        args = [p for p in read_proxies(bsym) if isinstance(p, TensorProxy)]
        for t in args:
            where = self.memory.storages(t)
            if len(where) != 1 or not where <= self.owned or buffer_kind(t) != kind:
                continue
            (m,) = where
            home = self.memory.home(m)
            if t is not home and (buffer_kind(home) != kind or self._repeats_elements(t)):
                continue  # a view showing some elements twice (`s.expand(2, 2)`, `y[:, :1].expand(3, 3)`) or not all
            # An op may read its `out` exactly, never through another view of it (docs/design.md, invariant 2).
            if self._dead(m, i) and not any(p is not t and m in self.memory.storages(p) for p in args):
                rep = ex.produce_into(bsym, t)
                if rep is not None:
                    return rep
        m = self._free_buffer(kind, i)
        if m is not None:
            home = self.memory.home(m)
            rep = ex.produce_into(bsym, home)
            if rep is not None:
                note = f"in the buffer of {home.name}, which nothing reads any more"
                return rep.replace(note=f"{rep.note}; {note}" if rep.note else note)
            heapq.heappush(self.pool[kind], (self.busy_until[m], -1, m))
        return bsym

    def _place_outputs(self, bsym: BoundSymbol) -> None:
        """Record which memory bsym's outputs live in, and until when something living there is read."""
        self.memory.add(bsym)
        where: frozenset[Storage] = frozenset()
        for o in bsym.proxy_outputs():
            where = self.memory.storages(o)
            if self.memory.is_fresh(o):
                self.owned |= where
                self.allocations += 1
            reads = self.reads.readers_of(o)
            until = math.inf if id(o) in self.returned else (reads[-1] if reads else -1)
            for m in where:
                self.busy_until[m] = max(self.busy_until.get(m, -1), until)
        if len(where) == 1 and where <= self.owned:
            (m,) = where
            kind = buffer_kind(self.memory.home(m))
            if kind is not None and self.busy_until[m] != math.inf:
                heapq.heappush(self.pool.setdefault(kind, []), (self.busy_until[m], self.allocations, m))
