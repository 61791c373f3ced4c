"""The memory model of a trace: which storage each proxy lives in, and who reads and writes each storage.

Computed in one walk over the bound symbols, from the effects their symbols declare
(minijit/ir/symbol.py, `Effects`), and queried by every pass that reasons about memory
(functionalize's write-back, the copy_to_out_ analysis, buffer reuse, the checks of
docs/design.md invariants 1 and 2). The rules of the walk:

- a trace input lives in its own storage, named after the input; inputs that the
  call found to be the same memory (`trace.input_alias_groups`) share the
  storage of the group's first input;
- a view (`BoundSymbol.may_alias_input`) lives in every storage its arguments live
  in (a `reshape` may view or copy: it counts as a view), unless the model was given a
  view rule (`ViewRule`, functionalize's, which decides as eager does) and `MustShare`,
  asking it, says the view's output has memory of its own;
- a write into a tensor (`BoundSymbol.written`) puts its new outputs in that tensor's
  storage, holding the new value; a region writing several tensors gives its outputs
  storages of their own;
- every other output lives in a new storage of its own, named after it, unless the
  `allocates` predicate (an executor's knowledge) says the op may return one of its
  arguments: then it may live in its arguments' storages as well.

A storage set, not one storage, per proxy: a view of two tensors (or an op that may
return either argument) may live in either. Reads are the proxies a bound symbol reads
(`read_proxies`: an `out=` argument, declared `Effects.unread`, is written, not read);
the trace's output counts as a read at index `len(bound_symbols)`.

Which inputs a trace writes (`inputs_written`), asked before functionalizing it, is answered by
the model built with functionalize's view rule: a write into an input that stores the input's
own value (`x.copy_(x)`) changes nothing and does not count.

One model per trace: `memory_model(trace)` answers for every pass that asks about the same
trace. The model, like the view graph and `layout_read`, is cached on the trace object
(`Trace.analysis`) until the trace is edited, so a trace that several passes and checks ask
about is walked once; a pass that makes a new trace gets a new model.

Values: a write into a storage overwrites the value of every proxy living there (but
the value it stores), so each proxy also knows which storages' *old* value (the value
before any write of the trace) it may hold, and the index of the write that overwrote
it, if any.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from minijit.errors import LayoutDecidesView
from minijit.ir import BoundSymbol, Proxy, Tag, TensorProxy, Trace, tree_iter
from minijit.ir.proxies import number_value, same_shape

__all__ = ["MemoryModel", "MustShare", "Storage", "ViewGraph", "ViewRule", "ViewStep", "buffer_kind",
           "input_leaders", "inputs_written", "layout_read", "memory_model", "read_proxies", "view_graph"]

# A storage is named by the input (the first of a group of aliased inputs) or the proxy it was allocated for.
Storage = str

# (the trace, the tensor a chain of views starts from, the chain's (view op, its output) steps) -> whether
# the chain's last output shares the memory of the tensor its op views (rather than being a copy).
ViewRule = Callable[[Trace, TensorProxy, list[tuple[BoundSymbol, Proxy]]], bool]


def read_proxies(bsym: BoundSymbol) -> Iterable[Proxy]:
    """The proxies `bsym` reads (not the arguments its symbol declares `Effects.unread`: an `out=`)."""
    unread = bsym.sym.effects.unread
    if not unread:
        return bsym.proxy_args()
    args = tuple(a for i, a in enumerate(bsym.args) if i not in unread)
    kwargs = {k: v for k, v in bsym.kwargs.items() if k not in unread}
    return (x for x in tree_iter((args, kwargs)) if isinstance(x, Proxy))


def input_leaders(trace: Trace) -> dict[str, str]:
    """Input name -> the name standing for its storage (the first of each group of aliased inputs)."""
    leaders = {p.name: p.name for p in trace.args}
    for group in trace.input_alias_groups:
        for name in group:
            leaders[name] = group[0]
    return leaders


class BufferKind:
    """(shape, dtype, device) of a tensor proxy, the key two buffers are matched by (a dict key too).

    Symbolic sizes compare as passes compare them (`minijit.ir.proxies.same_shape`): equal only
    when they are equal on every call, and recording nothing.
    """

    __slots__ = ("device", "dtype", "shape")

    def __init__(self, t: TensorProxy):
        self.shape, self.dtype, self.device = tuple(t.shape), t.dtype, t.device

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BufferKind) and same_shape(self.shape, other.shape) and self.dtype == other.dtype
                and self.device == other.device)

    def __hash__(self) -> int:
        return hash((tuple(number_value(d) for d in self.shape), self.dtype, self.device))


def buffer_kind(t: Any) -> BufferKind | None:
    """The kind of buffer a tensor proxy needs (`BufferKind`); None for a non-tensor."""
    if not isinstance(t, TensorProxy):
        return None
    return BufferKind(t)


def _copies_into(bsym: BoundSymbol) -> set[int]:
    """ids of the tensors that `bsym` (a copy, or a region holding some) says hold a final value."""
    if bsym.sym.effects.copies:
        return {id(p) for p in bsym.written()}
    return {id(p) for m in bsym.subsymbols if m.sym.effects.copies for p in m.written()}


class MemoryModel:
    """Storage, readers and writers of every proxy of a trace, in trace order.

    Example::

        memory = MemoryModel(trace)
        memory.storages(t3)            # frozenset({'x'}): t3 is a view of input x
        memory.aliases(t3, x)          # True
        memory.writers('x')            # indices of the bound symbols writing into x's storage
        memory.old_value_readers('x')  # ... and of those reading its value from before any write

    `bound_symbols` (default: the trace's) are the bound symbols to walk, in order (the
    verifier passes a fusion region's members in its place). `allocates(bsym)` says
    whether an op that is not a view returns new memory (default: always; buffer reuse
    asks the executors). A pass that rewrites as it walks builds the model with
    `MemoryModel.start` and feeds it each bound symbol as rewritten (`add`). `views` (default:
    every view shares memory) decides, per output of a view op, whether it shares its argument's memory.
    """

    def __init__(self, trace: Trace, bound_symbols: Sequence[BoundSymbol] | None = None, *,
                 allocates: Callable[[BoundSymbol], bool] | None = None, views: ViewRule | None = None):
        self._start(trace, allocates)
        self._trace, self._views = trace, views
        for bsym in trace.bound_symbols if bound_symbols is None else bound_symbols:
            self.add(bsym)
        self.add_output(trace.output)

    @classmethod
    def start(cls, trace: Trace, *, allocates: Callable[[BoundSymbol], bool] | None = None) -> MemoryModel:
        """A model of `trace`'s inputs only, to be fed bound symbols one by one with `add`."""
        model = cls.__new__(cls)
        model._start(trace, allocates)
        model._trace, model._views = trace, None
        return model

    def _start(self, trace: Trace, allocates: Callable[[BoundSymbol], bool] | None) -> None:
        self.leaders = input_leaders(trace)
        self._inputs = frozenset(self.leaders.values())
        self._allocates = allocates
        self._index = 0  # the index of the next bound symbol
        self._where: dict[int, frozenset[Storage]] = {}  # id(proxy) -> the storages it may live in
        self._old: dict[int, frozenset[Storage]] = {}  # id(proxy) -> storages whose old value it may hold
        self._producer: dict[int, int] = {}
        self._fresh: set[int] = set()  # ids of the proxies their producer allocated a storage for
        self._proxy_readers: dict[int, list[int]] = {}
        self._overwritten: dict[int, int] = {}  # id(proxy) -> the index of the write that overwrote its value
        self._residents: dict[Storage, list[Proxy]] = {}
        self._home: dict[Storage, Proxy] = {}
        self._readers: dict[Storage, list[int]] = {}
        self._old_readers: dict[Storage, list[int]] = {}
        self._writers: dict[Storage, list[int]] = {}
        self._copies: dict[Storage, list[int]] = {}
        self._must_share: MustShare | None = None  # with `views`: which views share memory
        for p in trace.args:
            s = self.leaders[p.name]
            self._place(p, frozenset({s}), frozenset({s}))
            self._home.setdefault(s, p)

    # -- the walk -------------------------------------------------------------------------
    def add(self, bsym: BoundSymbol) -> None:
        """Follow the next bound symbol: its reads, its writes, where its outputs live."""
        i = self._index
        self._index += 1
        for p in read_proxies(bsym):
            self._read(p, i)
        outs = list(bsym.proxy_outputs())
        targets = bsym.written()
        if targets:
            self._write(bsym, i, targets, outs)
        for o in outs:
            self._producer.setdefault(id(o), i)
        allocated = not targets
        viewing = False
        if len(targets) == 1:
            where, old = self.storages(targets[0]), frozenset()
        elif targets:
            where = old = None  # a region: its outputs are its own values (or the inputs it wrote)
        elif bsym.may_alias_input():
            viewing = self._views is not None
            viewed = _viewed_arguments(bsym)
            where = self._union(self._where, viewed)
            old = self._union(self._old, viewed)
            if not where:  # a view of constants only: memory of its own, but not memory it allocated
                where = old = None
                allocated = False
        elif self._allocates is not None and not self._allocates(bsym):
            # It may return one of its arguments, or memory of its own.
            own = {o.name for o in outs}
            where = self._union(self._where, bsym.proxy_args()) | own
            old = self._union(self._old, bsym.proxy_args()) | own
        else:
            where = old = None
        for o in outs:
            if targets and id(o) in self._where:
                continue  # an in-place op hands back the tensor it wrote: it lives where it lived
            # Memory of its own: a view op's output that does not share is one it allocated (`allocated` holds).
            if where is None or (viewing and not self._shares(bsym, o)):
                own = frozenset({o.name})
                self._place(o, own, own)
                self._home.setdefault(o.name, o)
                if allocated:
                    self._fresh.add(id(o))
            else:
                self._place(o, where, old)

    def _shares(self, bsym: BoundSymbol, out: Proxy) -> bool:
        """Whether the view rule says `out`, an output of the view op `bsym`, shares the viewed tensor's memory."""
        parent = bsym.viewed_tensor()
        if not isinstance(out, TensorProxy) or parent is None:
            return False
        if self._must_share is None:
            assert self._views is not None
            self._must_share = MustShare(self._trace, self._views)
        return self._must_share.decide(parent, bsym, out, self._index - 1)

    def add_output(self, output: Any) -> None:
        """Count the trace's output as a read, at the index after the last bound symbol."""
        for p in tree_iter(output):
            if isinstance(p, Proxy):
                self._read(p, self._index)

    def _read(self, p: Proxy, i: int) -> None:
        """Record that index `i` reads `p`: the proxy, its storages, and the storages it held before a write."""
        self._proxy_readers.setdefault(id(p), []).append(i)
        for s in self.storages(p):
            self._readers.setdefault(s, []).append(i)
        for s in self._old.get(id(p), ()):
            self._old_readers.setdefault(s, []).append(i)

    def _write(self, bsym: BoundSymbol, i: int, targets: list[TensorProxy], outs: list[Proxy]) -> None:
        copied = _copies_into(bsym)
        value = bsym.copied_value()
        # What the storage holds afterwards: a copy stores `value` (whose proxy stays valid where it
        # lives there already); any other write stores its own outputs.
        kept = [value] if value is not None else outs
        for target in targets:
            where = self.storages(target)
            if not (value is not None and self._where.get(id(value)) == where):
                for s in where:
                    for p in self._residents.get(s, ()):
                        if not any(p is k for k in kept):
                            self._overwritten.setdefault(id(p), i)
            for s in where:
                self._writers.setdefault(s, []).append(i)
                if id(target) in copied:
                    self._copies.setdefault(s, []).append(i)

    def _place(self, p: Proxy, where: frozenset[Storage], old: frozenset[Storage]) -> None:
        self._where[id(p)] = where
        self._old[id(p)] = old
        for s in where:
            self._residents.setdefault(s, []).append(p)

    @staticmethod
    def _union(table: dict[int, frozenset[Storage]], proxies: Iterable[Proxy]) -> frozenset[Storage]:
        return frozenset().union(*(table.get(id(p), frozenset()) for p in proxies))

    # -- per proxy ------------------------------------------------------------------------
    def storages(self, p: Proxy) -> frozenset[Storage]:
        """The storages `p` may live in (a proxy the walk has not seen: one named after it)."""
        return self._where.get(id(p)) or frozenset({p.name})

    def aliases(self, a: Proxy, b: Proxy) -> bool:
        """Whether `a` and `b` may share memory at run time."""
        return bool(self.storages(a) & self.storages(b))

    def input_storages(self, p: Proxy) -> frozenset[Storage]:
        """The input storages whose old value `p` may alias: the input itself, a view of it, a view of a view..."""
        return self._old.get(id(p), frozenset()) & self._inputs

    def is_fresh(self, p: Proxy) -> bool:
        """Whether `p`'s storage was allocated for `p` by its producer (not an input, a view or a write)."""
        return id(p) in self._fresh

    def producer(self, p: Proxy) -> int | None:
        """The index of the bound symbol that first outputs `p`, or None (an input, a constant)."""
        return self._producer.get(id(p))

    def readers_of(self, p: Proxy) -> list[int]:
        """The indices of the bound symbols reading `p` itself, in order (the output: one past the last)."""
        return self._proxy_readers.get(id(p), [])

    def overwritten_at(self, p: Proxy) -> int | None:
        """The index of the first write that overwrote `p`'s value (a write into a storage it lives in), or None."""
        return self._overwritten.get(id(p))

    # -- per storage ----------------------------------------------------------------------
    def home(self, s: Storage) -> Proxy | None:
        """The proxy `s` is named after: the input, or the output it was allocated for."""
        return self._home.get(s)

    def readers(self, s: Storage) -> list[int]:
        """The indices of the bound symbols reading anything that may live in `s`, in order (with repeats)."""
        return self._readers.get(s, [])

    def old_value_readers(self, s: Storage) -> list[int]:
        """The indices of the bound symbols reading `s`'s value from before any write, in order."""
        return self._old_readers.get(s, [])

    def writers(self, s: Storage) -> list[int]:
        """The indices of the bound symbols writing into `s`, in order."""
        return self._writers.get(s, [])

    def copies_onto(self, s: Storage) -> list[int]:
        """The indices of the copies (`Effects.copies`, or regions holding one) into `s`, in order."""
        return self._copies.get(s, [])

    def written_inputs(self) -> list[Storage]:
        """The input storages something writes into, in the order of their first write."""
        first = {s: w[0] for s, w in self._writers.items() if w and s in self._inputs}
        return sorted(first, key=first.__getitem__)


# -- the analyses of a trace, cached on it (`Trace.analysis`) -----------------------------


def memory_model(trace: Trace, views: ViewRule | None = None,
                 order: Callable[[Trace], Sequence[BoundSymbol]] | None = None) -> MemoryModel:
    """The memory model of `trace`: deciding which view ops share memory by `views`, where given; walking
    the bound symbols `order(trace)` gives in place of the trace's own, where given (the verifier's: a fusion
    region's members in its place).

    Built once per trace (and rule and order) and kept on it until the trace is edited (`Trace.analysis`),
    shared by every pass and check that asks; a model is read-only to whoever gets it.
    """
    if order is None:
        return trace.analysis(("memory model", views), lambda t: MemoryModel(t, views=views))
    walked = order(trace)
    if len(walked) == len(trace.bound_symbols) and all(a is b for a, b in zip(walked, trace.bound_symbols)):
        return memory_model(trace, views)  # the order changes nothing: the trace's own model
    return trace.analysis(("memory model", views, order), lambda t: MemoryModel(t, order(t), views=views))


def layout_read(trace: Trace) -> frozenset[int]:
    """ids of the tensors an op of `trace` reads the layout of (`Tag.READS_LAYOUT`: `as_strided`), and of all
    they were computed from: passes and executors must lay these out as eager
    does (kernels lay out their results after their inputs), not in a reused buffer or a fused kernel's own.
    Cached on the trace."""
    return trace.analysis("layout read", _layout_read)


def _layout_read(trace: Trace) -> frozenset[int]:
    found: set[int] = set()
    for bsym in reversed(trace.bound_symbols):
        if Tag.READS_LAYOUT in bsym.sym.tags or any(id(o) in found for o in bsym.proxy_outputs()):
            found.update(id(p) for p in bsym.proxy_args() if isinstance(p, TensorProxy))
    return frozenset(found)


# -- what views what ----------------------------------------------------------------------
# Functionalization (which base a write lands in, the view chain a write goes back through, where a
# reshape's sizes matter) and eager's overlap check (which input an operand views) ask these.


@dataclass(frozen=True)
class ViewStep:
    """`out` is an output of the view op `bsym`, which views `parent` (`bsym.viewed_tensor()`)."""

    parent: TensorProxy
    bsym: BoundSymbol
    out: TensorProxy


class ViewGraph:
    """What views what in a trace: for each tensor made by a view op, the step that made it.

    The walk takes each op as its symbol declares, except an op that writes: what it outputs
    is made by its decomposition, so the walk goes into that (as functionalization does). A
    tensor's step is that of the first op that makes it. A step is "may share": a `reshape`
    (`Effects.may_copy`) counts as a view, though eager copies what it cannot view; whether
    two tensors *must* share memory is a step's chain where every step really views, which
    for a reshape depends on the layouts (`MustShare` decides it).

    Example::

        graph = view_graph(trace)      # t1 = ltorch.transpose(x, 0, 1); t2 = ltorch.getitem(t1, 0)
        graph.step(t2)                 # ViewStep(parent=t1, bsym=<getitem>, out=t2)
        graph.chain(t2)                # [<the transpose's step>, <the getitem's step>]
        graph.root(t2)                 # x
    """

    def __init__(self, trace: Trace):
        self.trace = trace
        self._steps: dict[int, ViewStep] = {}
        self._made: set[int] = set()  # ids of the tensors an op made (a step or not)
        self._unsure: dict[int, tuple[TensorProxy, ...]] = {}  # see `views_one_of`
        self._families: dict[tuple[tuple[int, ...], ...], dict[int, int]] = {}  # see `last_write_sharing`
        for bsym in trace.bound_symbols:
            self._visit(bsym)

    def _visit(self, bsym: BoundSymbol) -> None:
        if bsym.written():
            for sub in bsym.subsymbols:
                self._visit(sub)
            return
        is_view = bsym.is_view()
        parent = bsym.viewed_tensor() if is_view else None
        for out in tree_iter(bsym.output):
            if not isinstance(out, Proxy) or id(out) in self._made:
                continue
            self._made.add(id(out))
            viewed = bsym.viewed_argument(out) if is_view else None
            if isinstance(viewed, TensorProxy):
                if parent is not None:
                    self._steps[id(out)] = ViewStep(parent, bsym, out)
            elif viewed is not None:
                # A view of one of several tensors (`torch.meshgrid((a, b))`): which one, the symbol does not say.
                among = tuple(x for x in tree_iter(viewed) if isinstance(x, TensorProxy))
                if among:
                    self._unsure[id(out)] = among

    def step(self, p: Proxy) -> ViewStep | None:
        """The view step that made `p`, or None (an input, or made by an op that views nothing)."""
        return self._steps.get(id(p))

    def views_one_of(self, p: Proxy) -> tuple[TensorProxy, ...]:
        """The tensors `p` views one of, where its view op takes them in one argument and does not say which
        (`torch.meshgrid((a, b))`); empty for any other tensor. `p` has no step: it may share memory with each."""
        return self._unsure.get(id(p), ())

    def chain(self, p: Proxy) -> list[ViewStep]:
        """The view steps from the tensor `p` views (its root) out to `p`; empty where `p` is no view."""
        steps = []
        while (step := self._steps.get(id(p))) is not None:
            steps.append(step)
            p = step.parent
        return steps[::-1]

    def root(self, p: Proxy) -> Proxy:
        """The tensor at the start of `p`'s view chain: `p` itself where it is no view."""
        chain = self.chain(p)
        return chain[0].parent if chain else p

    def last_write_sharing(self, p: Proxy, same_memory: Sequence[Sequence[Proxy]] = ()) -> int:
        """The position (in the trace's bound symbols) of the last op writing memory `p` may share, or -1.

        Tensors are joined into families by every op that may return memory of an argument
        (a view, or a `reshape`: counted as sharing, so the families are a superset) and by
        every write (its output is what it wrote), at any depth of the decompositions, and by
        the groups of `same_memory` (inputs the call passed sharing memory). Computed once per
        trace and grouping, on the first question.
        """
        key = tuple(tuple(map(id, g)) for g in same_memory)
        last = self._families.get(key)
        if last is None:
            last = self._families[key] = self._last_writes(same_memory)
        return last.get(id(p), -1)

    def _last_writes(self, same_memory: Sequence[Sequence[Proxy]]) -> dict[int, int]:
        parent: dict[int, int] = {}

        def find(i: int) -> int:
            while parent.setdefault(i, i) != i:
                i = parent[i]
            return i

        def join(tensors: Iterable[Any]) -> None:
            ids = [find(id(t)) for t in tensors if isinstance(t, TensorProxy)]
            for i in ids[1:]:
                parent[i] = ids[0]

        written: list[tuple[int, TensorProxy]] = []
        for position, top in enumerate(self.trace.bound_symbols):
            stack = [top]
            while stack:
                bsym = stack.pop()
                stack.extend(bsym.subsymbols)
                targets = bsym.written()
                written += [(position, t) for t in targets]
                views = bsym.sym.effects.views
                if targets or views is not None:
                    refs = () if views is None else views if type(views) is tuple else (views,)
                    viewed = [x for ref in refs if ref is not None for x in tree_iter(bsym.argument(ref))]
                    join([*tree_iter(bsym.output), *targets, *viewed])
        for group in same_memory:
            join(group)
        last: dict[int, int] = {}
        for position, t in written:
            last[find(id(t))] = position  # (in order: the last one stays)
        return {i: last[find(i)] for i in list(parent) if find(i) in last}


def _viewed_arguments(bsym: BoundSymbol) -> list[Proxy]:
    """The arguments a view op's outputs may share memory with: those its symbol's `views` names (`expand_as(b, a)`
    views b, never a, whose shape only it reads); all its arguments where that names none."""
    views = bsym.sym.effects.views
    refs = views if type(views) is tuple else (views,)
    found = [x for ref in refs if ref is not None for x in tree_iter(bsym.argument(ref)) if isinstance(x, Proxy)]
    return found or list(bsym.proxy_args())


def view_graph(trace: Trace) -> ViewGraph:
    """What views what in `trace` (see `ViewGraph`); built once per trace and kept on it (`Trace.analysis`)."""
    return trace.analysis("view graph", ViewGraph)


class MustShare:
    """Which tensors of a trace must share memory in eager: the view steps of its view graph that eager really
    makes views (a `reshape` copies what it cannot view), and the base each tensor's memory is.

    The one answer to "must share" for the passes that need it: functionalization (which base a write lands
    in, the chain it goes back through) and the memory model built with a view rule (`inputs_written`).
    Decided step by step as the asking walk reaches each view op (`decide`), in trace order: deciding asks the
    layouts, which for symbolic sizes may guard them. `rule` decides a step that may copy from its chain of
    decided views (functionalization's is `view_shares_memory`, from eager's layouts). Where nothing that may
    share memory with the viewed tensor is written at or after the step's position and its base has symbolic
    sizes, the step counts as a view without asking: a view and a copy then hold the same values, and asking
    would guard the sizes. `same_memory` are groups of inputs the call passed sharing memory; `same_as` maps an
    aliased input to the input standing for its memory. A pass adds the views it makes in a trace of its own
    (`add_view`: a synthetic base's members, a setitem's region), which the graph cannot know.

    Example::

        shares = MustShare(trace, view_shares_memory)  # t1 = ltorch.reshape(x, (6,)); t2 = ltorch.getitem(t1, 0)
        shares.decide(x, <the reshape>, t1, 0)         # True: x is contiguous, so eager views it
        shares.base_of(t2)                             # x, once the getitem was decided too
    """

    def __init__(self, trace: Trace, rule: ViewRule, same_memory: Sequence[Sequence[Proxy]] = (),
                 same_as: dict[int, TensorProxy] | None = None):
        self.trace, self.rule = trace, rule
        self.graph = view_graph(trace)
        self.same_memory = same_memory
        self.same_as = same_as if same_as is not None else {}
        self._steps: dict[int, ViewStep] = {}  # id(view) -> its step: the graph's decided ones, and those added
        self._added: list[ViewStep] = []

    def canon(self, p: Any) -> Any:
        """The input standing for `p`'s memory where `p` is an aliased input, else `p`."""
        return self.same_as.get(id(p), p)

    def step(self, p: Any) -> ViewStep | None:
        """The step that makes `p` share the memory of its parent, or None: `p` is a base."""
        return self._steps.get(id(p))

    def base_of(self, p: TensorProxy) -> TensorProxy:
        """The tensor whose memory `p` is: the start of its chain of views (`p` itself if none)."""
        while (view := self.step(p)) is not None:
            p = self.canon(view.parent)
        return p

    def chain(self, p: TensorProxy) -> list[tuple[BoundSymbol, Proxy]]:
        """The (view op, output) steps from `p`'s base out to `p`."""
        steps = []
        while (view := self.step(p)) is not None:
            steps.append((view.bsym, view.out))
            p = self.canon(view.parent)
        return steps[::-1]

    def decide(self, parent: TensorProxy, bsym: BoundSymbol, out: TensorProxy, position: int) -> bool:
        """Whether `out`, made by the view op `bsym` (viewing `parent`) at top-level `position`, shares `parent`'s
        memory in eager; where it does, `out` is a view from now on."""
        viewed = self.canon(parent)
        base = self.base_of(viewed)
        moot = bsym.sym.effects.may_copy and not bsym.sym.is_prim and \
            self.graph.last_write_sharing(viewed, self.same_memory) < position and \
            any(isinstance(d, Proxy) for d in base.shape)
        try:
            shares = moot or self.rule(self.trace, base, [*self.chain(viewed), (bsym, out)])
        except LayoutDecidesView:
            if self.graph.last_write_sharing(viewed, self.same_memory) >= position:
                raise
            shares = True  # (nothing writes that memory from here on: a view and a copy hold the same values)
        if not shares:
            return False
        step = self.graph.step(out)
        if step is None or step.bsym is not bsym:  # (not expected: the graph follows the ops the walk visits)
            step = ViewStep(parent, bsym, out)
        self._steps[id(out)] = step
        return True

    def add_view(self, p: TensorProxy, step: ViewStep) -> None:
        """`p` is the view `step` makes of `step.parent`, a view the asking pass made in a trace of its own (`p`
        is `step.out`, or an input of the trace that `step.out` stands for: a member of a synthetic base)."""
        self._steps[id(p)] = step
        self._added.append(step)

    def added(self) -> list[ViewStep]:
        """The views `add_view` was told of."""
        return list(self._added)


def inputs_written(trace: Trace, views: ViewRule) -> tuple[str, ...]:
    """The names of the inputs of `trace` (the first of each group of aliased inputs) whose value it changes, in
    the order of the inputs: those it writes into, directly or through views (as `views` decides them), `out=`
    or opaque in-place ops, with a value other than their own (`x.copy_(x)` changes nothing).

    What functionalizing `trace` finds (`FunctionalizeResult.mutated_inputs`), known without functionalizing it.
    """
    model = memory_model(trace, views=views)
    bsyms = trace.bound_symbols
    written = []
    for p in trace.args:
        s = model.leaders[p.name]
        if model.home(s) is p and any(not _stores_own_value(bsyms[i], p) for i in model.writers(s)):
            written.append(p.name)
    return tuple(written)


def _stores_own_value(bsym: BoundSymbol, p: Proxy) -> bool:
    """Whether every write of `bsym` (with its decomposition's) is a copy of the input `p` into itself."""
    if bsym.sym.effects.copies:
        return bsym.copied_value() is p and all(t is p for t in bsym.written())
    writes = [sub for sub in bsym.subsymbols if sub.written()]
    return bool(writes) and all(_stores_own_value(sub, p) for sub in writes)
