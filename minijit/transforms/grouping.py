"""Group independent calls of one op over many tensors into one multi-tensor call (`torch._foreach_*`).

An optimizer step traced from torch.optim's foreach code comes out as one call per parameter and op
(`lerp(exp_avg_i, grad_i, w, out=exp_avg_i)` for each i): each a Python call and an op dispatch, where
eager made one `torch._foreach_lerp_` call over the list. This pass gives the list back: it asks each
executor for the kind of group a bound symbol may join (`Executor.group_key`), collects calls of one
kind that do not depend on one another, and has the executor make one call of them
(`Executor.grouped`), placed where the first of them was.

Moving a later call up to the first one's place is allowed only where nothing it passes over
interacts with it (minijit.transforms.memory's storages):

- it reads no value made by the calls it passes over, nor by the group's earlier members;
- it writes no memory that they read or write, and reads no memory that they write;
- nothing it passes over has effects beyond its arguments (`Effects.external`) or is random.
- its tensors are small (`_MOVES_MOST`): moving larger ones changes which memory the caches hold.

Runs last, after buffer reuse: the calls then already write where they will (`out=`), and a group
only gathers them. Each member runs exactly as before, in the same order among the members.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from minijit.ir import BoundSymbol, Proxy, TensorProxy, Trace
from minijit.ir.rewrite import Edits
from minijit.transforms.memory import MemoryModel, Storage, memory_model, read_proxies

# How far past a group's last member a later member is looked for (bound symbols): bounds the pass's time on
# long traces, where members of one group sit close together anyway (torch.optim's foreach loops).
_REACH = 64
# A call moves up past other calls only where each of its tensors has at most this many elements: over larger
# tensors, running one op over every tensor before the next op evicts from the caches what the trace's order kept
# (torch.optim's for-loop AdamW, 40 parameters of 64K elements: 0.79x eager grouped, 0.94x as traced; of 1K
# elements: 0.96x grouped, 0.90x as traced). Calls next to each other group at any size.
_MOVES_MOST = 2048


def group_calls(trace: Trace, executors: Sequence[Any]) -> Trace:
    """`trace` with independent calls of one kind gathered into one call each, where an executor groups them."""
    by_namespace = {ex.namespace: ex for ex in executors}
    bsyms = trace.bound_symbols
    same_tensor = _SameTensor()
    keys: list[Hashable | None] = []
    for b in bsyms:
        ex = by_namespace.get(b.sym.namespace)
        into = b.sym.effects.result_into
        writes_first = into is not None and bool(b.args) and same_tensor(b.argument(into), b.args[0])
        keys.append(None if ex is None else ex.group_key(b, writes_first))
        same_tensor.follow(b)
    later: list[int | None] = [None] * len(keys)  # the position of the next call with the same key
    seen: dict[Hashable, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        if keys[i] is not None:
            later[i] = seen.get(keys[i])
            seen[keys[i]] = i
    if all(n is None for n in later):
        return Edits(trace).apply(pass_name="group calls")
    accesses = _Accesses(trace.bound_symbols, memory_model(trace))
    edits = Edits(trace)
    taken: set[int] = set()
    for i, key in enumerate(keys):
        if key is None or i in taken or later[i] is None:
            continue
        members = _members(bsyms, later, i, taken, accesses)
        if len(members) < 2:
            continue
        taken.update(members)
        edits.replace(members[0], by_namespace[bsyms[i].sym.namespace].grouped([bsyms[m] for m in members], key))
        for m in members[1:]:
            edits.drop(m)
    return edits.apply(pass_name="group calls")


class _Accesses:
    """Per bound symbol, found when first asked: the proxies it makes and reads (by id), the storages it reads and
    writes."""

    def __init__(self, bsyms: Sequence[BoundSymbol], memory: MemoryModel) -> None:
        self.bsyms, self.memory = bsyms, memory
        self._found: dict[int, tuple[frozenset[Any], ...]] = {}

    def __getitem__(self, i: int) -> tuple[frozenset[Any], ...]:
        """(made, read ids, storages read, storages written) of the i-th bound symbol."""
        found = self._found.get(i)
        if found is None:
            b, storages = self.bsyms[i], self.memory.storages
            read = list(read_proxies(b))
            found = self._found[i] = (
                frozenset(id(o) for o in b.proxy_outputs()), frozenset(id(p) for p in read),
                frozenset().union(*(storages(p) for p in read if isinstance(p, TensorProxy))),
                frozenset().union(*(storages(p) for p in b.written())))
        return found


class _Footprint:
    """What a run of bound symbols makes, reads and writes: proxies made (by id) and storages read and written."""

    def __init__(self, accesses: _Accesses) -> None:
        self.accesses = accesses
        self.made: set[int] = set()
        self.read: set[Storage] = set()
        self.written: set[Storage] = set()

    def add(self, i: int) -> None:
        made, _, read, written = self.accesses[i]
        self.made |= made
        self.read |= read
        self.written |= written

    def empty(self) -> bool:
        return not (self.made or self.read or self.written)

    def allows(self, i: int) -> bool:
        """Whether the i-th bound symbol may run before everything added here: independent of it in values and
        memory."""
        _, read_ids, read, written = self.accesses[i]
        return (self.made.isdisjoint(read_ids) and self.written.isdisjoint(read)
                and self.read.isdisjoint(written) and self.written.isdisjoint(written))


def _small(bsym: BoundSymbol) -> bool:
    """Whether each tensor `bsym` reads or makes has constant sizes and at most `_MOVES_MOST` elements."""
    for t in (*bsym.proxy_args(), *bsym.proxy_outputs()):
        if isinstance(t, TensorProxy):
            n = 1
            for d in t.shape:
                if type(d) is not int:
                    return False
                n *= d
            if n > _MOVES_MOST:
                return False
    return True


def _members(bsyms: Sequence[BoundSymbol], later: list[int | None], first: int, taken: set[int],
             accesses: _Accesses) -> list[int]:
    """The positions of the calls that join the call at `first` (itself first), in trace order. `later[i]`: the
    position of the next call with the i-th one's key."""
    group, passed = _Footprint(accesses), _Footprint(accesses)
    group.add(first)
    members = [first]
    candidate = later[first]
    j = first + 1
    while candidate is not None and candidate - members[-1] <= _REACH:
        for k in range(j, candidate):  # what the candidate would move up past
            if k in taken:  # a member of an earlier group: it runs before `first` now
                continue
            if bsyms[k].sym.effects.external or bsyms[k].sym.effects.random:
                return members
            passed.add(k)
        if candidate not in taken and group.allows(candidate) and passed.allows(candidate) and (
                passed.empty() or _small(bsyms[candidate])):
            members.append(candidate)
            group.add(candidate)
        elif candidate not in taken:
            passed.add(candidate)
        j, candidate = candidate + 1, later[candidate]
    return members


class _SameTensor:
    """Which proxies are one tensor object when the trace runs: an `out=` call's result is its `out` argument, a
    copy's the tensor it writes."""

    def __init__(self) -> None:
        self._canon: dict[int, Proxy] = {}

    def _of(self, p: Any) -> Any:
        return self._canon.get(id(p), p) if isinstance(p, Proxy) else p

    def __call__(self, a: Any, b: Any) -> bool:
        return isinstance(a, TensorProxy) and self._of(a) is self._of(b)

    def follow(self, bsym: BoundSymbol) -> None:
        """Note what `bsym`'s output is: the tensor it writes its result into (an executor's `out=` form), or the
        tensor a copy writes."""
        effects = bsym.sym.effects
        if effects.result_into is not None:
            written = [bsym.argument(effects.result_into)]
        elif effects.copies:
            written = bsym.written()
        else:
            return
        outputs = list(bsym.proxy_outputs())
        if len(written) == 1 and len(outputs) == 1 and isinstance(outputs[0], TensorProxy):
            self._canon[id(outputs[0])] = self._of(written[0])
