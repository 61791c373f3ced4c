"""Where `copy_to_out_` may write in place, and the check that no write into an input comes too early.

`prims.copy_to_out_(computed, out=x)` says "x now holds computed" (DESIGN.md,
invariant 2). An executor may produce `computed` straight into x's memory, saving
a buffer and a copy, only when

- no reader of x's old value (x itself, or any view of it) runs after computed's
  producer, and
- computed is not a trace input, nor a view of one.

`analyze_copies` decides that per copy; `write_copies_in_place` asks the executor
that runs each safe producer for a version writing into x (the torch executor
uses `out=` or an in-place method) and notes every decision on the copy, so the
printed trace shows it. `check_copies` (on by default, `MINIJIT_CHECK_COPIES=0`
turns it off) reads a final trace and reports any write into an input that some
read of the old value follows, naming both bound symbols.

Aliasing is tracked by "roots": the inputs whose old value a proxy may share memory
with at run time, following view-like symbols (torch returns views for
transpose, reshape, slicing, expand, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from minijit.errors import CopyToOutError, where
from minijit.ir import BoundSymbol, Proxy, TensorProxy, Trace, tree_iter
from minijit.ir.printing import Constants
from minijit.ops.prims import INPLACE

CHECK_COPIES = os.environ.get("MINIJIT_CHECK_COPIES", "1") != "0"

# Symbols whose output may be a view of an argument when run by torch (matched by name,
# whatever the namespace, so claimed `torchex.reshape` counts like `prims.reshape`).
_VIEW_LIKE = {"reshape", "transpose", "slice", "squeeze", "broadcast_in_dim", "real", "imag"}
# These return their argument itself when nothing changes (x.to(x.dtype)).
_MAYBE_SELF = {"convert_element_type", "device_put"}
VIEW_TAG = "view"


def may_alias_input(bsym: BoundSymbol) -> bool:
    """Whether an output of `bsym` may share memory with one of its tensor arguments at run time."""
    name = bsym.sym.name.removeprefix("prims_")
    if VIEW_TAG in bsym.sym.tags or name in _VIEW_LIKE:
        return True
    if name in _MAYBE_SELF:
        ins = [a for a in bsym.args if isinstance(a, TensorProxy)]
        outs = [o for o in bsym.proxy_outputs() if isinstance(o, TensorProxy)]
        return bool(ins and outs) and (ins[0].dtype, ins[0].device) == (outs[0].dtype, outs[0].device)
    return False


def written_tensor(bsym: BoundSymbol) -> TensorProxy | None:
    """The tensor whose memory `bsym` writes into: its `out=` argument, or the target of an in-place op."""
    out = bsym.kwargs.get("out")
    if isinstance(out, TensorProxy):
        return out
    if INPLACE in bsym.sym.tags:
        if bsym.sym.name == "copy_":
            return bsym.args[1]
        first = bsym.args[0] if bsym.args else None
        return first if isinstance(first, TensorProxy) else None
    return None


def read_proxies(bsym: BoundSymbol) -> Iterable[Proxy]:
    """The proxies `bsym` reads (its `out=` argument is written, not read)."""
    kwargs = {k: v for k, v in bsym.kwargs.items() if k != "out"}
    for x in tree_iter((bsym.args, kwargs)):
        if isinstance(x, Proxy):
            yield x


def input_leaders(trace: Trace) -> dict[str, str]:
    """Input name -> the name standing for its storage (the first of each group of aliased inputs)."""
    leaders = {p.name: p.name for p in trace.args}
    for group in trace.info.get("input_alias_groups", ()):
        for name in group:
            leaders[name] = group[0]
    return leaders


def alias_roots(trace: Trace) -> dict[int, frozenset[str]]:
    """id(proxy) -> names of the inputs (storage leaders) whose old value the proxy may alias."""
    leaders = input_leaders(trace)
    roots: dict[int, frozenset[str]] = {id(p): frozenset({leaders[p.name]}) for p in trace.args}
    for bsym in trace.bound_symbols:
        if written_tensor(bsym) is None and may_alias_input(bsym):
            shared = frozenset().union(*(roots.get(id(p), frozenset()) for p in bsym.proxy_args()))
            if shared:
                for o in bsym.proxy_outputs():
                    roots[id(o)] = shared
    return roots


@dataclass
class CopyDecision:
    """Whether the producer of a copy's `computed` may write straight into `out`, and why."""

    copy_index: int
    producer_index: int | None
    computed: TensorProxy
    out: TensorProxy
    in_place: bool
    reason: str


def analyze_copies(trace: Trace) -> list[CopyDecision]:
    """Decide, for each `copy_to_out_` of `trace`, whether computed may be produced in out's memory."""
    bsyms = trace.bound_symbols
    roots = alias_roots(trace)
    leaders = input_leaders(trace)
    producer: dict[int, int] = {}
    reads: dict[str, list[int]] = {}
    for i, bsym in enumerate(bsyms):
        for o in bsym.proxy_outputs():
            producer.setdefault(id(o), i)
        for p in read_proxies(bsym):
            for r in roots.get(id(p), ()):
                reads.setdefault(r, []).append(i)
    for p in tree_iter(trace.output):
        for r in roots.get(id(p), ()) if isinstance(p, Proxy) else ():
            reads.setdefault(r, []).append(len(bsyms))

    decisions: list[CopyDecision] = []
    taken: set[int] = set()
    for k, bsym in enumerate(bsyms):
        if bsym.sym.name != "copy_to_out_":
            continue
        computed, out = bsym.args[0], bsym.kwargs["out"]
        p = producer.get(id(computed))
        root = leaders.get(out.name, out.name)

        def decide(ok: bool, reason: str, computed: Any = computed, out: Any = out, k: int = k, p: Any = p) -> None:
            decisions.append(CopyDecision(k, p, computed, out, ok, reason))

        if any(computed is a for a in trace.args):
            decide(False, f"{computed.name} is a trace input")
        elif roots.get(id(computed)):
            decide(False, f"{computed.name} may alias input(s) {', '.join(sorted(roots[id(computed)]))}")
        elif p is None:
            decide(False, f"{computed.name} is not computed by the trace")
        elif may_alias_input(bsyms[p]):
            decide(False, f"{computed.name} is a view made by {bsyms[p].sym.id}")
        elif id(computed) in taken:
            decide(False, f"{computed.name} is already written into another input")
        elif any(r is not out and root in roots.get(id(r), ()) for r in read_proxies(bsyms[p])):
            decide(False, f"its producer {bsyms[p].sym.id} reads a view of {out.name}")
        else:
            later = sorted({i for i in reads.get(root, ()) if i > p and i != k})
            if later:
                names = ", ".join(bsyms[i].sym.id if i < len(bsyms) else "the trace output" for i in later[:3])
                decide(False, f"{out.name}'s old value is read after {computed.name}'s producer (by {names})")
            else:
                taken.add(id(computed))
                decide(True, f"no read of {out.name}'s old value follows {bsyms[p].sym.id}")
    return decisions


def write_copies_in_place(trace: Trace, executors: Sequence[Any]) -> Trace:
    """Let each safe copy's producer write straight into the copy's `out`, where its executor can.

    Each copy_to_out_ gets a note saying what was decided (shown in the printed trace).
    """
    bsyms = list(trace.bound_symbols)
    by_namespace = {ex.namespace: ex for ex in executors}
    for d in analyze_copies(trace):
        note = f"copy: {d.reason}"
        if d.in_place and d.producer_index is not None:
            producer = bsyms[d.producer_index]
            ex = by_namespace.get(producer.sym.namespace)
            replacement = ex.produce_into(producer, d.out) if ex is not None else None
            if replacement is not None:
                bsyms[d.producer_index] = replacement
                note = f"in place: {replacement.sym.id} writes {d.computed.name} into {d.out.name}"
            else:
                note = f"copy: no executor writes {producer.sym.id} into {d.out.name}"
        copy = bsyms[d.copy_index]
        bsyms[d.copy_index] = copy.replace(note=f"{copy.note}; {note}" if copy.note else note)
    return trace.derive(bsyms, pass_name="write copies in place")


def check_copies(trace: Trace) -> None:
    """Raise CopyToOutError if `trace` writes into an input in a way that breaks invariants 1 and 2.

    Checked: at most one copy_to_out_ per input storage; no read of an input's old
    value (the input or a view of it) after the first write into its memory; a
    write into an input other than the copy stores the copy's `computed`.
    """
    bsyms = trace.bound_symbols
    roots = alias_roots(trace)
    leaders = input_leaders(trace)
    copies: dict[str, list[int]] = {}
    first_write: dict[str, int] = {}
    for i, bsym in enumerate(bsyms):
        target = written_tensor(bsym)
        if target is None:
            continue
        for r in roots.get(id(target), ()):
            first_write.setdefault(r, i)
            if bsym.sym.name == "copy_to_out_":
                copies.setdefault(r, []).append(i)
    problems: list[str] = []
    for r, idx in copies.items():
        if len(idx) > 1:
            problems.append(f"input {r} is written by {len(idx)} copies: " + "; ".join(_show(trace, bsyms[i]) for i in idx))
    for i, bsym in enumerate(bsyms):
        for p in read_proxies(bsym):
            for r in roots.get(id(p), ()):
                w = first_write.get(r)
                if w is not None and i > w:
                    problems.append(f"{_show(trace, bsym)} reads {p.name}, the old value of input {r} "
                                    f"(or a view of it), after {_show(trace, bsyms[w])} wrote into {r}")
    for p in tree_iter(trace.output):
        for r in roots.get(id(p), ()) if isinstance(p, Proxy) else ():
            if r in first_write:
                problems.append(f"the trace returns {p.name}, the old value of input {r}, which "
                                f"{_show(trace, bsyms[first_write[r]])} overwrites")
    for r, w in first_write.items():
        writer = bsyms[w]
        if writer.sym.name != "copy_to_out_" and copies.get(r):
            final = bsyms[copies[r][0]].args[0]
            if not any(o is final for o in writer.proxy_outputs()):
                problems.append(f"{_show(trace, writer)} writes into input {r}, which must end up holding "
                                f"{final.name}")
        elif writer.sym.name != "copy_to_out_" and r in leaders.values():
            problems.append(f"{_show(trace, writer)} writes into input {r} without a copy_to_out_ saying so")
    if problems:
        raise CopyToOutError(f"trace {trace.fn_name} ({trace.pass_name}) breaks the copy_to_out_ rules "
                             "(DESIGN.md, invariants 1 and 2):\n  " + "\n  ".join(dict.fromkeys(problems)))


def _show(trace: Trace, bsym: BoundSymbol) -> str:
    return f"`{bsym.python_lines(Constants(), '', subsymbol_depth=0)[0].split('  #')[0]}`{where(bsym.source)}"
