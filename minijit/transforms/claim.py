"""Executor claiming: each bound symbol goes to the first executor that runs it.

Executors are asked in priority order. An operator executor claims a bound symbol
when it has an implementation whose checker accepts the call (or rewrites it with
an execution transform, whose calls are claimed in turn). A fusion executor claims
a fusible prim, or a composite symbol whose whole decomposition is fusible (it then
takes the decomposition); its claimed bound symbols are grouped into regions by
`minijit.transforms.fusion.partition`. Where no executor claims a composite symbol,
its decomposition is claimed instead; a prim that nobody runs is an error naming
the op and source line.

The pass builds its new list of bound symbols itself rather than through `rewrite` or
`Edits` (minijit/ir/rewrite.py): each claimed bound symbol travels with the executor that
claimed it into `partition`, which regroups and reorders them (hoisting unrelated work in
front of a region), a schedule rather than an edit by position. An execution transform's
bound symbols come from `expand` there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minijit.errors import UnsupportedOpError, where
from minijit.ir import BoundSymbol, Trace
from minijit.ir.rewrite import expand
from minijit.transforms.fusion import Region, partition, region_bound_symbol, sharing_inputs
from minijit.transforms.memory import layout_read, memory_model

Entry = tuple[BoundSymbol, Any]


def _is_fusion(ex: Any) -> bool:
    return ex.fuses_regions


def _fusible_leaves(bsym: BoundSymbol, ex: Any) -> list[BoundSymbol]:
    if ex.fusible(bsym):
        return [bsym]
    return [leaf for sub in bsym.subsymbols for leaf in _fusible_leaves(sub, ex)]


def _apply_execution_transform(trace: Trace, bsym: BoundSymbol, transform: Any) -> list[BoundSymbol]:
    """The bound symbols `transform(*args, **kwargs)` records, computing `bsym`'s outputs."""
    note = f"for {bsym.sym.id}"
    return [b.replace(source=b.source or bsym.source, note=f"{b.note}; {note}" if b.note else note)
            for b in expand(bsym, transform, trace, what="the execution transform")]


def claim_executors(trace: Trace, executors: Sequence[Any]) -> Trace:
    """Replace every bound symbol by an executable one from the highest-priority executor that claims it."""
    executors = list(executors)
    # A fused kernel lays out its results its own way: not where an op reads the layout.
    eager_laid_out = layout_read(trace)

    def visit(bsym: BoundSymbol, exs: Sequence[Any], out: list[Entry], transformed: frozenset[tuple[str, str]]) -> None:
        for ex in exs:
            if _is_fusion(ex):
                if ex.claims(bsym) and not any(id(o) in eager_laid_out for o in bsym.proxy_outputs()):
                    out.extend((leaf, ex) for leaf in _fusible_leaves(bsym, ex))
                    return
                continue
            impl = ex.implementation_for(bsym)
            if impl is None:
                continue
            key = (ex.name, bsym.sym.id)
            if impl.execution_transform is not None and key not in transformed:
                for sub in _apply_execution_transform(trace, bsym, impl.execution_transform):
                    visit(sub, exs, out, transformed | {key})
                return
            if impl.fn is None:
                continue
            out.append((bsym.replace(sym=ex.executable_symbol(bsym.sym)), ex))
            return
        if not bsym.subsymbols:
            names = ", ".join(ex.name for ex in exs)
            raise UnsupportedOpError(f"no executor ({names}) can run {bsym.sym.id}{where(bsym.source)}")
        for sub in bsym.subsymbols:
            visit(sub, exs, out, transformed)

    entries: list[Entry] = []
    for bsym in trace.bound_symbols:
        visit(bsym, executors, entries, frozenset())

    for i, ex in enumerate(executors):
        if not _is_fusion(ex) or not any(owner is ex for _, owner in entries):
            continue
        counter = [0]

        def fuse(region: Region, ex: Any = ex, rest: Sequence[Any] = executors[i + 1:],
                 counter: list[int] = counter) -> list[Entry]:
            region.name = f"fusion_{counter[0]}"
            region.sharing = sharing_inputs(region, memory_model(trace))
            fn = ex.fuse(region)
            if fn is None:
                # Declined: its members go to the executors after this one.
                out: list[Entry] = []
                for member in region.members:
                    visit(member, rest, out, frozenset())
                return out
            counter[0] += 1
            random_note = f"random numbers: {ex.random_draws}" if getattr(ex, "random_draws", None) else ""
            return [(region_bound_symbol(region, ex.namespace, fn, random_note), ex)]

        entries = partition(entries, ex, trace.output, fuse)
    return trace.derive([b for b, _ in entries], pass_name="claim executors")
