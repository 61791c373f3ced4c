"""Dead-code elimination: drop bound symbols whose outputs nothing uses."""

from __future__ import annotations

from minijit.ir import BoundSymbol, Proxy, Trace, tree_iter


def dce(trace: Trace) -> Trace:
    """Remove bound symbols whose outputs are unused and that have no side effect (a write, a draw from the RNG, ...)."""
    needed = {x.name for x in tree_iter(trace.output) if isinstance(x, Proxy)}
    kept = []
    for bsym in reversed(trace.bound_symbols):
        if (bsym.sym.effects.has_side_effects or bsym.written() or bsym.is_random()
                or any(p.name in needed for p in bsym.proxy_outputs())):
            kept.append(bsym)
            _mark_used(bsym, needed)
    return trace.derive(reversed(kept), pass_name="dce")


def _mark_used(bsym: BoundSymbol, needed: set[str]) -> None:
    # A decomposition may be expanded later (claimed at prim level, or differentiated), so
    # what its subsymbols read is needed too: a symbolic size bound by prims.shape, say.
    needed.update(p.name for p in bsym.proxy_args())
    for sub in bsym.subsymbols:
        _mark_used(sub, needed)
