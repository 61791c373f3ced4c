"""Where `copy_to_out_` may write in place, and the check that no write into an input comes too early.

`prims.copy_to_out_(computed, out=x)` says "x now holds computed" (docs/design.md,
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
step, under the same rule. Whether a trace's writes keep the rules is the verifier's
to say (minijit/transforms/verify.py: `check_copies`, invariants 1 and 2).

Which memory each proxy lives in, and who reads and writes it, comes from the
trace's memory model (minijit/transforms/memory.py, `memory_model`), computed once per trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minijit.ir import BoundSymbol, TensorProxy, Trace
from minijit.ir.rewrite import Edits
from minijit.ops.aten_prims import is_value_check
from minijit.transforms.memory import MemoryModel, buffer_kind, memory_model, read_proxies


@dataclass
class CopyDecision:
    """Whether the producer of a copy's `computed` may write straight into `out`, and why."""

    copy_index: int
    producer_index: int | None
    computed: TensorProxy
    out: TensorProxy
    in_place: bool
    reason: str


def analyze_copies(trace: Trace, memory: MemoryModel | None = None) -> list[CopyDecision]:
    """Decide, for each `copy_to_out_` of `trace`, whether computed may be produced in out's memory.

    `memory` is the trace's memory model, where the caller has it already.
    """
    bsyms = trace.bound_symbols
    memory = memory if memory is not None else memory_model(trace)
    decisions: list[CopyDecision] = []
    taken: set[int] = set()
    for k, bsym in enumerate(bsyms):
        if not bsym.sym.effects.copies:
            continue
        computed, (out,) = bsym.copied_value(), bsym.written()
        p = memory.producer(computed)
        root = memory.leaders.get(out.name, out.name)

        def decide(ok: bool, reason: str, computed: Any = computed, out: Any = out, k: int = k, p: Any = p) -> None:
            decisions.append(CopyDecision(k, p, computed, out, ok, reason))

        if any(computed is a for a in trace.args):
            decide(False, f"{computed.name} is a trace input")
        elif memory.input_storages(computed):
            decide(False, f"{computed.name} may alias input(s) {', '.join(sorted(memory.input_storages(computed)))}")
        elif p is None:
            decide(False, f"{computed.name} is not computed by the trace")
        elif bsyms[p].may_alias_input():
            decide(False, f"{computed.name} is a view made by {bsyms[p].sym.id}")
        elif id(computed) in taken:
            decide(False, f"{computed.name} is already written into another input")
        elif any(r is not out and root in memory.input_storages(r) for r in read_proxies(bsyms[p])):
            decide(False, f"its producer {bsyms[p].sym.id} reads a view of {out.name}")
        else:
            later = sorted({i for i in memory.old_value_readers(root) if i > p and i != k})
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
    bsyms = trace.bound_symbols
    edits = Edits(trace)
    by_namespace = {ex.namespace: ex for ex in executors}
    memory = memory_model(trace)
    chains = _InPlaceChains(trace, by_namespace, memory)
    # A failing value check must find the inputs unwritten (the call runs again): no write into one before it.
    last_check = max((i for i, b in enumerate(bsyms) if is_value_check(b)), default=-1)
    for d in analyze_copies(trace, memory):
        note = f"copy: {d.reason}"
        if d.in_place and d.producer_index is not None and d.producer_index < last_check:
            note = f"copy: {d.computed.name} is computed before a value check (prims.check_value), which must run first"
        elif d.in_place and d.producer_index is not None:
            producer = edits[d.producer_index]
            ex = by_namespace.get(producer.sym.namespace)
            replacement = ex.produce_into(producer, d.out) if ex is not None else None
            if replacement is not None:
                steps = [(d.producer_index, replacement), *chains.earlier_steps(d)]
            else:
                steps = chains.find(d)
            if steps and min(i for i, _ in steps) < last_check:
                note = f"copy: {d.out.name} would be written before a value check (prims.check_value)"
            elif steps:
                for i, rep in steps:
                    edits.replace(i, rep)
                via = ""
                if len(steps) > 1:
                    how = "computed in" if replacement is not None else "updated in place into"
                    via = f" (through {len(steps) - 1} intermediate(s) {how} {d.out.name})"
                note = f"in place: {edits[d.producer_index].sym.id} writes {d.computed.name} into {d.out.name}{via}"
            else:
                note = f"copy: no executor writes {producer.sym.id} into {d.out.name}"
        copy = edits[d.copy_index]
        edits.replace(d.copy_index, copy.replace(note=f"{copy.note}; {note}" if copy.note else note))
    return edits.apply(pass_name="write copies in place")


class _InPlaceChains:
    """Chains of producers that can each update their first argument in place, the first one updating an input."""

    def __init__(self, trace: Trace, by_namespace: dict[str, Any], memory: MemoryModel):
        self.trace = trace
        self.bsyms = trace.bound_symbols
        self.by_namespace = by_namespace
        self.memory = memory

    def earlier_steps(self, d: CopyDecision) -> list[tuple[int, BoundSymbol]]:
        """Producers of the intermediates that d's producer reads, each rewritten to compute into d.out too.

        `v.mul_(b).addcmul_(g, g)` is `t = mul(v, b); u = addcmul(t, g, g); v <- u`: once
        addcmul writes u into v, mul may write t into v as well, as no read of v's old value
        follows mul and nothing reads t after addcmul (docs/design.md, invariant 2, step by step).
        """
        memory = self.memory
        out, root = d.out, memory.leaders.get(d.out.name, d.out.name)
        later_reads = [r for r in memory.old_value_readers(root) if r != d.copy_index]
        inputs = {id(a) for a in self.trace.args}
        steps: list[tuple[int, BoundSymbol]] = []
        i = d.producer_index
        while i is not None:
            bsym, step = self.bsyms[i], None
            args = [p for p in read_proxies(bsym) if isinstance(p, TensorProxy)]
            for a in args:
                q = memory.producer(a)
                if q is None or id(a) in inputs or not memory.is_fresh(a):
                    continue  # an input, or a view: its memory is not a's alone
                if buffer_kind(a) != buffer_kind(out):
                    continue
                if any(r > i for r in memory.readers(a.name)) or any(r > q for r in later_reads):
                    continue  # a is read after it is overwritten, or out's old value after a is made
                if any(p is not a and a.name in memory.storages(p) for p in args):
                    continue
                producer = self.bsyms[q]
                if producer.written() or any(
                        p is not out and root in memory.input_storages(p) for p in read_proxies(producer)):
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
        memory = self.memory
        steps: list[tuple[int, BoundSymbol]] = []
        i = d.producer_index
        while i is not None:
            bsym = self.bsyms[i]
            target = bsym.args[0] if bsym.args else None
            if not isinstance(target, TensorProxy) or target.name in {a.name for a in self.trace.args} - {d.out.name}:
                return None
            buffer = memory.storages(target)
            others = [p for p in read_proxies(bsym) if p is not target]
            # The step overwrites target's buffer: no other argument may share it, and
            # nothing may read it afterwards (docs/design.md, invariant 2, for intermediates too).
            if any(memory.storages(p) & buffer for p in others):
                return None
            if any(r > i for b in buffer for r in memory.readers(b) if r != d.copy_index):
                return None
            ex = self.by_namespace.get(bsym.sym.namespace)
            rep = ex.produce_into(bsym, target) if ex is not None else None
            if rep is None:
                return None
            steps.append((i, rep))
            if target is d.out:
                return steps
            if not memory.is_fresh(target):
                return None  # a view of something: stop rather than reason about partial buffers
            i = memory.producer(target)
        return None
