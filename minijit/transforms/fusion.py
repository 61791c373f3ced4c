"""Region partitioning for fusion executors.

A fusion executor claims bound symbols one by one (see `claim.py`); this pass then
groups its claimed bound symbols into regions. A region grows over consecutive
claimed bound symbols; a bound symbol that the executor did not claim and that
does not depend on the region is hoisted in front of it instead of ending it, so
unrelated work (a matmul of another branch, say) does not split a region.

Hoisting keeps the copy ordering of docs/design.md (invariant 1): a bound symbol that
writes into a tensor the region reads is never moved in front of the region (the
region would read the new value instead of the old one); and one that reads a
value the region produces, including a tensor the region copies into, stays after it.

An opaque torch op (minijit/ops/opaque.py), or any external one, is a region boundary:
it is never hoisted, so regions never move across it (what torch does inside it, its
random numbers included, stays in eager's order). Nor does a random bound symbol move
in front of a region that draws random numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minijit.ir import BoundSymbol, Effects, Proxy, Symbol, TensorProxy, tree_iter
from minijit.ops.opaque import OPAQUE
from minijit.transforms.memory import MemoryModel


@dataclass
class Region:
    """A group of bound symbols that one fusion executor runs as one callable.

    `inputs` are the proxies the members read and do not produce (in order of first
    use); `outputs` the proxies they produce that anything after the region uses,
    including tensors written in place; `name` is unique within the trace.
    `sharing`: the positions of the inputs that may share memory with another input on a call the entry's guard
    lets through (`sharing_inputs`, from the trace's memory model); an input not among them has memory of its own
    on every such call, so an executor need not look at the call's storages to know a write into it misses the
    region's other inputs. None: not known (any input may).
    """

    name: str
    members: list[BoundSymbol]
    inputs: list[Proxy]
    outputs: list[Proxy]
    sharing: frozenset[int] | None = None

    @property
    def inplace(self) -> bool:
        """Whether a member writes into an existing tensor."""
        return any(b.written() for b in self.members)

    def effects(self) -> Effects:
        """The region's effects as one bound symbol: it writes the inputs its members write into."""
        written = {p.name for b in self.members for p in b.written()}
        writes = tuple(i for i, p in enumerate(self.inputs) if p.name in written)
        return Effects(writes=writes, random=any(b.is_random() for b in self.members),
                       external=any(b.sym.effects.external for b in self.members))


def _is_boundary(bsym: BoundSymbol) -> bool:
    """Whether no region may move across `bsym`: an opaque torch op, or an external one."""
    return OPAQUE in bsym.sym.tags or bsym.sym.effects.external


def _region(name: str, members: list[BoundSymbol], used_outside: set[str]) -> Region:
    produced: dict[str, Proxy] = {}
    inputs: dict[str, Proxy] = {}
    for bsym in members:
        for p in bsym.proxy_args():
            if p.name not in produced and p.name not in inputs:
                inputs[p.name] = p
        for p in bsym.proxy_outputs():
            produced[p.name] = p
    outputs = [p for n, p in produced.items() if n in used_outside]
    return Region(name, list(members), list(inputs.values()), outputs)


def sharing_inputs(region: Region, memory: MemoryModel) -> frozenset[int]:
    """The positions of the region's tensor inputs that may share memory with another of its inputs, by `memory`
    (the model of the trace the region is cut from). The model places the trace's inputs as the entry's guard
    keeps them (each in a storage of its own, or sharing one with its alias group), views where their bases live
    and other results in new storages, so its answer holds on every call that passes the guard."""
    tensors = [(i, p) for i, p in enumerate(region.inputs) if isinstance(p, TensorProxy)]
    # (a value the walk never met, made inside a decomposition, might view anything: no answer for it)
    if any(memory.producer(p) is None and p.name not in memory.leaders for _, p in tensors):
        return frozenset(i for i, _ in tensors)
    count: dict[str, int] = {}
    for _, p in tensors:
        for s in memory.storages(p):
            count[s] = count.get(s, 0) + 1
    return frozenset(i for i, p in tensors if any(count[s] > 1 for s in memory.storages(p)))


def region_bound_symbol(region: Region, namespace: str, fn: Callable[..., Any], random_note: str = "") -> BoundSymbol:
    """The bound symbol that runs `region` with `fn` (which returns a tuple of the outputs)."""
    if len(region.outputs) == 1:
        def run_one(*args: Any, _fn: Callable[..., Any] = fn) -> Any:
            return _fn(*args)[0]
        run_one.__wrapped__ = fn  # type: ignore[attr-defined]
        output: Any = region.outputs[0]
        call = run_one
    else:
        output, call = tuple(region.outputs), fn
    sym = Symbol(region.name, None, namespace=namespace, is_prim=True, effects=region.effects(), fn=call)
    source = next((b.source for b in region.members if b.source is not None), None)
    bsym = sym.bind(*region.inputs, output=output, subsymbols=tuple(region.members), source=source)
    # An executor may say what the region runs as (its kernels' names) in the printed trace,
    # and says how it draws random numbers where the region makes draws (not as torch would).
    notes = [getattr(fn, "note", ""), random_note if any(b.is_random() for b in region.members) else ""]
    bsym.note = "; ".join(n for n in notes if n)
    return bsym


def partition(entries: Sequence[tuple[BoundSymbol, Any]], executor: Any, trace_output: Any,
              fuse: Callable[[Region], list[tuple[BoundSymbol, Any]]]) -> list[tuple[BoundSymbol, Any]]:
    """Group the entries claimed by `executor` into regions; `fuse(region)` gives their replacement.

    `entries` pairs each bound symbol with the executor that claimed it, in trace
    order; `executor.can_join(members, bsym)` may refuse to grow a region, which
    then ends and a new one starts.
    """
    used: dict[str, int] = {}
    for bsym, _ in entries:
        for p in bsym.proxy_args():
            used[p.name] = used.get(p.name, 0) + 1
    out_names = {p.name for p in tree_iter(trace_output) if isinstance(p, Proxy)}

    result: list[tuple[BoundSymbol, Any]] = []
    region: list[BoundSymbol] = []
    deferred: list[tuple[BoundSymbol, Any]] = []
    region_produced: set[str] = set()
    region_read: set[str] = set()

    def close() -> None:
        result.extend(deferred)
        deferred.clear()
        if region:
            member_reads: dict[str, int] = {}
            for b in region:
                for p in b.proxy_args():
                    member_reads[p.name] = member_reads.get(p.name, 0) + 1
            # A produced value is needed outside if something other than the members reads it.
            used_outside = {n for n in region_produced if used.get(n, 0) > member_reads.get(n, 0) or n in out_names}
            result.extend(fuse(_region("", list(region), used_outside)))
            region.clear()
            region_produced.clear()
            region_read.clear()

    for bsym, owner in entries:
        if owner is executor:
            if region and not executor.can_join(region, bsym):
                close()
            region.append(bsym)
            region_read.update(p.name for p in bsym.proxy_args())
            region_produced.update(p.name for p in bsym.proxy_outputs())
            continue
        if not region:
            result.append((bsym, owner))
            continue
        reads = {p.name for p in bsym.proxy_args()}
        depends = not reads.isdisjoint(region_produced)
        # Invariant 1: never move a write of a tensor in front of the region's reads of its old value.
        overwrites = any(p.name in region_read for p in bsym.written())
        # Random draws keep their order (a region draws only where its executor says how it does).
        draws_after = bsym.is_random() and any(b.is_random() for b in region)
        # A deferred bound symbol that a later non-member needs must keep its place relative to it:
        # deferred ones run before the region, so that always holds.
        if depends or overwrites or draws_after or _is_boundary(bsym):
            close()
            result.append((bsym, owner))
        else:
            deferred.append((bsym, owner))
    close()
    return result
