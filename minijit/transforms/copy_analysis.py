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
printed trace shows it. Where the producer reads an intermediate made from x
(`v.mul_(b).addcmul_(g, g)`), that intermediate may be computed in x as well, step by
step, under the same rule. `check_copies` (on by default, `MINIJIT_CHECK_COPIES=0`
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

CHECK_COPIES = os.environ.get("MINIJIT_CHECK_COPIES", "1") != "0"


def buffer_kind(t: Any) -> tuple[Any, ...] | None:
    """(shape, dtype, device) of a tensor proxy, the key two buffers are matched by; None for a non-tensor.

    Symbolic sizes compare as passes compare them (`minijit.ir.proxies.known_compare`):
    equal only when they are equal on every call, and recording nothing.
    """
    if not isinstance(t, TensorProxy):
        return None
    return (tuple(t.shape), t.dtype, t.device)


def _copies_into(bsym: BoundSymbol) -> set[int]:
    """ids of the tensors that `bsym` (a copy, or a region holding some) says hold a final value."""
    if bsym.sym.effects.copies:
        return {id(p) for p in bsym.written()}
    return {id(p) for m in bsym.subsymbols if m.sym.effects.copies for p in m.written()}


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


def alias_roots(trace: Trace, bound_symbols: Sequence[BoundSymbol] | None = None) -> dict[int, frozenset[str]]:
    """id(proxy) -> names of the inputs (storage leaders) whose old value the proxy may alias.

    `bound_symbols` (default: the trace's) are the bound symbols to follow, in order.
    """
    leaders = input_leaders(trace)
    roots: dict[int, frozenset[str]] = {id(p): frozenset({leaders[p.name]}) for p in trace.args}
    for bsym in trace.bound_symbols if bound_symbols is None else bound_symbols:
        if not bsym.written() and bsym.may_alias_input():
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
        if not bsym.sym.effects.copies:
            continue
        computed, (out,) = bsym.copied_value(), bsym.written()
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
        elif bsyms[p].may_alias_input():
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

    Where the producer updates an intermediate that an earlier producer made from
    `out` (`t1 = slice_scatter(x, ...); t2 = slice_scatter(t1, ...)`), the whole
    chain may run in place, each step into its first argument, the first into `out`.
    Each copy_to_out_ gets a note saying what was decided (shown in the printed trace).
    """
    bsyms = list(trace.bound_symbols)
    by_namespace = {ex.namespace: ex for ex in executors}
    chains = _InPlaceChains(trace, by_namespace)
    for d in analyze_copies(trace):
        note = f"copy: {d.reason}"
        if d.in_place and d.producer_index is not None:
            producer = bsyms[d.producer_index]
            ex = by_namespace.get(producer.sym.namespace)
            replacement = ex.produce_into(producer, d.out) if ex is not None else None
            if replacement is not None:
                steps = [(d.producer_index, replacement), *chains.earlier_steps(d)]
            else:
                steps = chains.find(d)
            if steps:
                for i, rep in steps:
                    bsyms[i] = rep
                via = ""
                if len(steps) > 1:
                    how = "computed in" if replacement is not None else "updated in place into"
                    via = f" (through {len(steps) - 1} intermediate(s) {how} {d.out.name})"
                note = f"in place: {bsyms[d.producer_index].sym.id} writes {d.computed.name} into {d.out.name}{via}"
            else:
                note = f"copy: no executor writes {producer.sym.id} into {d.out.name}"
        copy = bsyms[d.copy_index]
        bsyms[d.copy_index] = copy.replace(note=f"{copy.note}; {note}" if copy.note else note)
    return trace.derive(bsyms, pass_name="write copies in place")


class _InPlaceChains:
    """Chains of producers that can each update their first argument in place, the first one updating an input."""

    def __init__(self, trace: Trace, by_namespace: dict[str, Any]):
        self.trace = trace
        self.bsyms = trace.bound_symbols
        self.by_namespace = by_namespace
        self.producer: dict[int, int] = {}
        # Buffers: every input and every output of a non-view symbol is one; views share their source's.
        self.buffers: dict[int, frozenset[int]] = {id(p): frozenset({id(p)}) for p in trace.args}
        self.reads: dict[int, list[int]] = {}  # buffer -> indices of the bound symbols reading it
        for i, bsym in enumerate(self.bsyms):
            for p in read_proxies(bsym):
                for b in self.buffers.get(id(p), ()):
                    self.reads.setdefault(b, []).append(i)
            aliasing = not bsym.written() and bsym.may_alias_input()
            shared = frozenset().union(*(self.buffers.get(id(p), frozenset()) for p in bsym.proxy_args()))
            for o in bsym.proxy_outputs():
                self.producer.setdefault(id(o), i)
                self.buffers[id(o)] = shared if aliasing else frozenset({id(o)})
        for p in tree_iter(trace.output):
            for b in self.buffers.get(id(p), ()) if isinstance(p, Proxy) else ():
                self.reads.setdefault(b, []).append(len(self.bsyms))
        self.roots = alias_roots(trace)
        self.leaders = input_leaders(trace)
        self.root_reads: dict[str, list[int]] = {}  # input storage -> indices of the reads of its old value
        for i, bsym in enumerate(self.bsyms):
            for p in read_proxies(bsym):
                for r in self.roots.get(id(p), ()):
                    self.root_reads.setdefault(r, []).append(i)
        for p in tree_iter(trace.output):
            for r in self.roots.get(id(p), ()) if isinstance(p, Proxy) else ():
                self.root_reads.setdefault(r, []).append(len(self.bsyms))

    def earlier_steps(self, d: CopyDecision) -> list[tuple[int, BoundSymbol]]:
        """Producers of the intermediates that d's producer reads, each rewritten to compute into d.out too.

        `v.mul_(b).addcmul_(g, g)` is `t = mul(v, b); u = addcmul(t, g, g); v <- u`: once
        addcmul writes u into v, mul may write t into v as well, as no read of v's old value
        follows mul and nothing reads t after addcmul (DESIGN.md, invariant 2, step by step).
        """
        out, root = d.out, self.leaders.get(d.out.name, d.out.name)
        later_reads = [r for r in self.root_reads.get(root, ()) if r != d.copy_index]
        inputs = {id(a) for a in self.trace.args}
        steps: list[tuple[int, BoundSymbol]] = []
        i = d.producer_index
        while i is not None:
            bsym, step = self.bsyms[i], None
            args = [p for p in read_proxies(bsym) if isinstance(p, TensorProxy)]
            for a in args:
                q = self.producer.get(id(a))
                buffer = self.buffers.get(id(a), frozenset())
                if q is None or id(a) in inputs or buffer != {id(a)}:
                    continue  # an input, or a view: its memory is not a's alone
                if buffer_kind(a) != buffer_kind(out):
                    continue
                if any(r > i for r in self.reads.get(id(a), ())) or any(r > q for r in later_reads):
                    continue  # a is read after it is overwritten, or out's old value after a is made
                if any(p is not a and id(a) in self.buffers.get(id(p), ()) for p in args):
                    continue
                producer = self.bsyms[q]
                if producer.written() or any(
                        p is not out and root in self.roots.get(id(p), ()) for p in read_proxies(producer)):
                    continue
                ex = self.by_namespace.get(producer.sym.namespace)
                rep = ex.produce_into(producer, out) if ex is not None else None
                if rep is not None:
                    step = (q, rep)
                    break
            if step is None:
                return steps
            steps.append(step)
            i = step[0]
        return steps

    def find(self, d: CopyDecision) -> list[tuple[int, BoundSymbol]] | None:
        """(index, in-place replacement) for each producer of the chain ending in d.computed, or None."""
        steps: list[tuple[int, BoundSymbol]] = []
        i = d.producer_index
        while i is not None:
            bsym = self.bsyms[i]
            target = bsym.args[0] if bsym.args else None
            if not isinstance(target, TensorProxy) or target.name in {a.name for a in self.trace.args} - {d.out.name}:
                return None
            buffer = self.buffers.get(id(target), frozenset())
            others = [p for p in read_proxies(bsym) if p is not target]
            # The step overwrites target's buffer: no other argument may share it, and
            # nothing may read it afterwards (DESIGN.md, invariant 2, for intermediates too).
            if any(self.buffers.get(id(p), frozenset()) & buffer for p in others):
                return None
            if any(r > i for b in buffer for r in self.reads.get(b, ()) if r != d.copy_index):
                return None
            ex = self.by_namespace.get(bsym.sym.namespace)
            rep = ex.produce_into(bsym, target) if ex is not None else None
            if rep is None:
                return None
            steps.append((i, rep))
            if target is d.out:
                return steps
            if len(buffer) != 1 or next(iter(buffer)) != id(target):
                return None  # a view of something: stop rather than reason about partial buffers
            i = self.producer.get(id(target))
        return None


def check_copies(trace: Trace) -> None:
    """Raise CopyToOutError if `trace` writes into memory in a way that breaks invariants 1 and 2.

    Follows which memory each proxy lives in (an input's, or a buffer an op
    allocated; views and `out=`/in-place results share their source's). Checked: at
    most one copy_to_out_ per input storage; no read of a value after a write into
    its memory overwrote it (an input's old value, or an intermediate updated in
    place); every write into an input's memory ends with a copy_to_out_ into it.
    """
    bsyms = trace.bound_symbols
    leaders = input_leaders(trace)
    mem: dict[int, frozenset[Any]] = {id(p): frozenset({leaders[p.name]}) for p in trace.args}
    holders: dict[Any, list[Proxy]] = {}  # memory -> proxies living in it
    for p in trace.args:
        holders.setdefault(leaders[p.name], []).append(p)
    stale: dict[int, int] = {}  # id(proxy) -> index of the write that overwrote it
    copies: dict[str, list[int]] = {}
    written: dict[str, int] = {}
    problems: list[str] = []
    for i, bsym in enumerate(bsyms):
        for p in read_proxies(bsym):
            w = stale.get(id(p))
            if w is not None:
                what = f"the old value of input {p.name}" if any(p is a for a in trace.args) else p.name
                problems.append(f"{_show(trace, bsym)} reads {what} after {_show(trace, bsyms[w])} overwrote "
                                "its memory")
        targets = bsym.written()
        outs = list(bsym.proxy_outputs())
        copied = _copies_into(bsym)
        new_mem = frozenset()
        for target in targets:
            where_to = mem.get(id(target), frozenset({id(target)}))
            # What the memory holds afterwards: a copy stores `computed` (whose proxy stays valid
            # where it lives there already); any other write stores its own output.
            value = bsym.copied_value()
            kept = [value] if value is not None else outs
            no_op = value is not None and mem.get(id(value)) == where_to
            for m in () if no_op else where_to:
                for p in holders.get(m, ()):
                    if not any(p is o for o in kept):
                        stale.setdefault(id(p), i)
            for m in where_to:
                if m in leaders.values():
                    written.setdefault(m, i)
                    if id(target) in copied:
                        copies.setdefault(m, []).append(i)
            new_mem = new_mem | where_to
        if targets:
            if len(targets) > 1:
                new_mem = frozenset()  # a region: its outputs are its own values (or the inputs it wrote)
        elif bsym.may_alias_input():
            new_mem = frozenset().union(*(mem.get(id(p), frozenset()) for p in bsym.proxy_args()))
        else:
            new_mem = frozenset()
        for o in outs:
            mem[id(o)] = new_mem or frozenset({id(o)})
            for m in mem[id(o)]:
                holders.setdefault(m, []).append(o)
    for p in tree_iter(trace.output):
        if isinstance(p, Proxy) and id(p) in stale:
            problems.append(f"the trace returns {p.name}, whose memory {_show(trace, bsyms[stale[id(p)]])} overwrote")
    for m, idx in copies.items():
        if len(idx) > 1:
            problems.append(f"input {m} is written by {len(idx)} copies: " + "; ".join(_show(trace, bsyms[i]) for i in idx))
    for m, i in written.items():
        if m not in copies:
            problems.append(f"{_show(trace, bsyms[i])} writes into input {m} without a copy_to_out_ saying so")
    if problems:
        raise CopyToOutError(f"trace {trace.fn_name} ({trace.pass_name}) breaks the copy_to_out_ rules "
                             "(DESIGN.md, invariants 1 and 2):\n  " + "\n  ".join(dict.fromkeys(problems)))


def _show(trace: Trace, bsym: BoundSymbol) -> str:
    return f"`{bsym.python_lines(Constants(), '', subsymbol_depth=0)[0].split('  #')[0]}`{where(bsym.source)}"
