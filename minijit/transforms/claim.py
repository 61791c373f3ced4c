"""Executor claiming: each bound symbol goes to the first executor that runs it.

Where no executor claims a composite symbol, its decomposition (subsymbols) is
claimed instead; a prim that nobody runs is an error naming the op and source line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minijit.errors import UnsupportedOpError, where
from minijit.ir import BoundSymbol, Trace


def claim_executors(trace: Trace, executors: Sequence[Any]) -> Trace:
    """Replace every bound symbol by an executable one from the highest-priority executor that claims it."""
    claimed: list[BoundSymbol] = []

    def visit(bsym: BoundSymbol) -> None:
        for ex in executors:
            impl = ex.implementation_for(bsym)
            if impl is not None:
                claimed.append(bsym.replace(sym=ex.executable_symbol(bsym.sym)))
                return
        if not bsym.subsymbols:
            names = ", ".join(ex.name for ex in executors)
            raise UnsupportedOpError(f"no executor ({names}) can run {bsym.sym.id}{where(bsym.source)}")
        for sub in bsym.subsymbols:
            visit(sub)

    for bsym in trace.bound_symbols:
        visit(bsym)
    return trace.derive(claimed, pass_name="claim executors")
