"""Dead-code elimination: drop bound symbols whose outputs nothing uses."""

from __future__ import annotations

from minijit.ir import BoundSymbol, Proxy, Trace, tree_iter
from minijit.ops.prims import INPLACE, RANDOM

# Effects that make a bound symbol worth running even when nothing reads its outputs: a write
# into a tensor, and a draw from (or a seed of) torch's generator, which later draws depend on.
_KEPT = (INPLACE, RANDOM)


def dce(trace: Trace) -> Trace:
    """Remove bound symbols whose outputs are unused and that neither write in place nor touch the RNG."""
    needed = {x.name for x in tree_iter(trace.output) if isinstance(x, Proxy)}
    kept = []
    for bsym in reversed(trace.bound_symbols):
        if any(tag in bsym.sym.tags for tag in _KEPT) or any(p.name in needed for p in bsym.proxy_outputs()):
            kept.append(bsym)
            _mark_used(bsym, needed)
    return trace.derive(reversed(kept), pass_name="dce")


def _mark_used(bsym: BoundSymbol, needed: set[str]) -> None:
    # A decomposition may be expanded later (claimed at prim level, or differentiated), so
    # what its subsymbols read is needed too: a symbolic size bound by prims.shape, say.
    needed.update(p.name for p in bsym.proxy_args())
    for sub in bsym.subsymbols:
        _mark_used(sub, needed)
