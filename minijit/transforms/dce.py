"""Dead-code elimination: drop bound symbols whose outputs nothing uses."""

from __future__ import annotations

from minijit.ir import Proxy, Trace, tree_iter
from minijit.ops.prims import INPLACE


def dce(trace: Trace) -> Trace:
    """Remove bound symbols whose outputs are unused and that write nothing in place."""
    needed = {x.name for x in tree_iter(trace.output) if isinstance(x, Proxy)}
    kept = []
    for bsym in reversed(trace.bound_symbols):
        if INPLACE in bsym.sym.tags or any(p.name in needed for p in bsym.proxy_outputs()):
            kept.append(bsym)
            needed.update(p.name for p in bsym.proxy_args())
    return trace.derive(reversed(kept), pass_name="dce")
