"""Dead-code elimination: drop bound symbols whose outputs nothing uses."""

from __future__ import annotations

from minijit.ir import BoundSymbol, NumberProxy, Proxy, TensorProxy, Trace, tree_iter
from minijit.ir.rewrite import Edits


def dce(trace: Trace, *, keep_sizes: bool = False) -> Trace:
    """Remove bound symbols whose outputs are unused and that have no side effect (a write, a draw from the RNG, ...).

    With `keep_sizes`, the symbolic sizes in the shapes of the tensors it keeps (and of those
    inside their decompositions) are kept too (before the grad pass, which may save them for
    the backward: `t56: f32[i12, 32]` needs `i12 = prims.num_sub(i11, 1)` there).
    """
    needed = {x.name for x in tree_iter(trace.output) if isinstance(x, Proxy)}
    edits = Edits(trace)
    for i in reversed(range(len(trace.bound_symbols))):
        bsym = trace.bound_symbols[i]
        if (bsym.sym.effects.has_side_effects or bsym.written() or bsym.is_random()
                or any(p.name in needed for p in bsym.proxy_outputs()) or _may_raise(bsym)):
            _mark_used(bsym, needed)
            if keep_sizes:
                _mark_sizes(bsym, needed)
        else:
            edits.drop(i)
    return edits.apply(pass_name="dce")


def _may_raise(bsym: BoundSymbol) -> bool:
    """A number prim on a symbolic number that raises for some values (`n / m` with m 0): eager raises there even where
    nothing uses the result."""
    return bsym.sym.effects.raises and any(isinstance(p, NumberProxy) for p in bsym.proxy_args())


def _mark_sizes(bsym: BoundSymbol, needed: set[str]) -> None:
    # The tensors inside a decomposition count too: the grad pass differentiates through it,
    # and a rule may save their sizes (`t1: f32[i5, i1]` of the slice under `w[pos]`).
    for p in bsym.proxy_outputs():
        if isinstance(p, TensorProxy):
            needed.update(s.name for s in p.shape if isinstance(s, NumberProxy))
    for sub in bsym.subsymbols:
        _mark_sizes(sub, needed)


def _mark_used(bsym: BoundSymbol, needed: set[str]) -> None:
    # A decomposition may be expanded later (claimed at prim level, or differentiated), so
    # what its subsymbols read is needed too: a symbolic size bound by prims.shape, say.
    needed.update(p.name for p in bsym.proxy_args())
    for sub in bsym.subsymbols:
        _mark_used(sub, needed)
