"""Dead-code elimination: drop bound symbols whose outputs nothing uses."""

from __future__ import annotations

from collections.abc import Iterator

from minijit.ir import BoundSymbol, Proxy, Trace, tree_iter
from minijit.ops.prims import INPLACE


def dce(trace: Trace) -> Trace:
    """Remove bound symbols whose outputs are unused and that write nothing in place."""
    needed = {x.name for x in tree_iter(trace.output) if isinstance(x, Proxy)}
    kept = []
    for bsym in reversed(trace.bound_symbols):
        if INPLACE in bsym.sym.tags or any(p.name in needed for p in bsym.proxy_outputs()):
            kept.append(bsym)
            needed.update(p.name for p in bsym.proxy_args())
            # An executor may run this op as its decomposition, whose members can read values
            # computed at the top level (symbolic sizes): keep those too.
            needed.update(_subsymbol_reads(bsym))
    return trace.derive(reversed(kept), pass_name="dce")


def _subsymbol_reads(bsym: BoundSymbol) -> Iterator[str]:
    for sub in bsym.subsymbols:
        yield from (p.name for p in sub.proxy_args())
        yield from _subsymbol_reads(sub)
