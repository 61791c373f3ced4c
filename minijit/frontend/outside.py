"""Outside state: what traced code reads from, and writes into, objects that exist outside the call.

A compiled trace replays tensor computations; Python state outside the call (a global,
an optimizer's `param_groups`, a module's hooks, `p.grad`) is not in it. This module
makes sure that state is never baked in silently (docs/design.md, invariant 8):

**Roots.** The objects the call reaches from outside — its non-tensor arguments,
globals and closure values, and whatever is read from those — are *roots*. Every read
of a root's attribute, item, length, keys or membership is recorded as a guard
(`minijit.frontend.guards`), in user and library code alike, so a later change is a
cache miss.

**Tensors read from outside** are not baked in either: the `Source` they were read from
is remembered, and when traced code computes with one (or returns it, or stores it), it
becomes an input of the trace that every call reads again from that source. A replaced
`p.grad`, a reassigned global tensor, a parameter of a module held in a closure: each
call sees the current one. Writes into them are functionalized like writes into inputs.

**Writes into roots** (an attribute set, `d[k] = v`, `list.append`, a global assigned,
...) are *effects*: each is logged, performed while tracing (so later traced code sees
it), undone when the capture ends, and replayed by every call after its computation —
the first call included. Values the trace created are rebuilt afresh for each call;
tensors among them are the call's results. A read of something the trace itself wrote
needs no guard; a read of a container the trace changed guards its state before the
call, so that replaying the effects is right whenever the guard passes.
"""

from __future__ import annotations

import collections
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.guards import (
    MISSING,
    NumberSlot,
    Source,
    has_snapshot,
    is_symbolic_number_value,
    is_users_module,
    may_have_guarded_attributes,
    record,
    short_repr,
    slot_names,
)
from minijit.ir import Proxy, TensorProxy
from minijit.ir.containers import contains_proxy
from minijit.ir.context import add_constraint, current_trace, where_now
from minijit.ir.proxies import number_values

Tensor = torch.Tensor

# Mutating methods of the built-in containers, as (type, method) -> whether the method also reads the
# container's contents (then its state before the call is guarded, as for any read).
_MUTATORS: dict[tuple[type, str], bool] = {
    **{(list, m): False for m in ("append", "extend", "insert", "clear", "__setitem__", "__delitem__", "__iadd__")},
    **{(list, m): True for m in ("pop", "remove", "sort", "reverse")},
    **{(dict, m): False for m in ("update", "clear", "__setitem__", "__delitem__", "__ior__")},
    **{(dict, m): True for m in ("pop", "popitem", "setdefault")},
    **{(set, m): False for m in ("add", "update", "clear", "__ior__")},
    **{(set, m): True for m in ("discard", "remove", "pop", "difference_update", "intersection_update",
                                "symmetric_difference_update", "__isub__", "__iand__", "__ixor__")},
    **{(collections.deque, m): False for m in ("append", "appendleft", "extend", "extendleft", "clear")},
    **{(collections.deque, m): True for m in ("pop", "popleft", "remove", "rotate", "reverse")},
    (collections.OrderedDict, "move_to_end"): True,
    (collections.Counter, "subtract"): False,
}


@dataclass
class Effect:
    """One write into an object outside the call, replayed after every call's computation.

    `op` is "setattr", "delattr" (plain setattr; "object setattr"/"object delattr": through
    `object.__setattr__`, where a class's own `__setattr__` was interpreted; "accumulate grad": a tensor's new
    `.grad` made by a backward, laid out as eager's AccumulateGrad lays it out), "setitem",
    "delitem", "cell" (a closure cell assigned), "call" (a container method: `key` is its
    name, `value` its arguments and keywords) or "replace" (a list or dict's new contents: an argument's, or one
    from outside that native code changed).
    `holder` is the object written (held by reference), the `Source` of a tensor (read again on
    each call) or the path to an argument (minijit.runtime.arguments.ArgumentPath).
    """

    op: str
    holder: Any
    key: Any = None
    value: Any = None

    def describe(self) -> str:
        """The effect in words, for traces and messages (one line)."""
        owner = "a tensor" if isinstance(self.holder, Source) else f"a {type(self.holder).__name__}"
        if self.op == "accumulate grad":
            return f"set the .grad a backward made of {owner}"
        if self.op.endswith(("setattr", "delattr")):
            return f"{'set' if self.op.endswith('setattr') else 'delete'} attribute {self.key!r} of {owner}"
        if self.op in ("setitem", "delitem"):
            return f"{'set' if self.op == 'setitem' else 'delete'} item [{short_repr(self.key)}] of {owner}"
        if self.op == "cell":
            return f"assign the closure variable {self.key}"
        if self.op == "function":
            return f"call {getattr(self.holder, '__name__', 'a function')}(...)"
        if self.op == "replace":
            return f"replace the contents of {self.holder}"
        return f"{owner}.{self.key}(...)"


@dataclass
class OutsideView:
    """What the caller of `interpret` has traced code see in place of what objects from outside hold, leaving the
    objects as they are (other threads may be reading them meanwhile), and the reads its cache key covers.

    `tensors`: id(tensor) -> (the tensor, the proxy traced code sees wherever it reads it or computes with
    it: a jitted module's parameters and buffers, the trace's inputs). `shown`: (id(holder), name) -> the
    value traced code reads as that attribute or global (an empty dict for backward hooks hidden under
    no_grad). `keyed`: (holder, key) slots whose values the cache key covers, and `whole`: containers whose
    contents it covers; reads of them need no guard.
    """

    tensors: dict[int, tuple[Tensor, Proxy]] = field(default_factory=dict)
    shown: dict[tuple[int, Any], Any] = field(default_factory=dict)
    keyed: list[tuple[Any, Any]] = field(default_factory=list)
    whole: list[Any] = field(default_factory=list)


@dataclass
class Outside:
    """The outside state of one interpretation: roots, tensor sources, effects and how to undo them."""

    # id -> (object, label): objects from outside whose reads are guarded and writes logged.
    roots: dict[int, tuple[Any, str]] = field(default_factory=dict)
    # id -> (tensor, where it was read): tensors read from outside, captured as inputs when used.
    tensor_sources: dict[int, tuple[Tensor, Source]] = field(default_factory=dict)
    effects: list[Effect] = field(default_factory=list)
    # Functions restoring the state before the capture, run in reverse order when it ends.
    undo: list[Callable[[], None]] = field(default_factory=list)
    # (id(holder), key) the trace wrote: reading them back needs no guard.
    written: set[tuple[int, Any]] = field(default_factory=set)
    # id -> (container, a copy of its contents before the trace changed it, with what other threads wrote into it
    # since folded in), and id -> a copy of its contents after the trace's last write into it (`settled`).
    changed: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    settled_contents: dict[int, Any] = field(default_factory=dict)
    # ids of roots whose whole contents are already guarded (lists/dicts/sets of constants), or
    # that the cache key covers (a jitted module's hook dicts).
    whole: set[int] = field(default_factory=set)
    # (id(holder), key) whose value the cache key covers (a jitted module's submodules, training flags).
    keyed: set[tuple[int, Any]] = field(default_factory=set)
    # (id(holder), key) -> what traced code reads there in place of what the holder holds (OutsideView.shown).
    shown: dict[tuple[int, Any], Any] = field(default_factory=dict)
    # id(tensor) -> (tensor, proxy): the proxies traced code sees in place of real tensors (OutsideView.tensors).
    stand_ins: dict[int, tuple[Tensor, Proxy]] = field(default_factory=dict)
    # id -> (iterator, label): native iterators and generators from outside, never advanced by the trace.
    iterators: dict[int, tuple[Any, str]] = field(default_factory=dict)
    # id -> object: instances of Python classes the traced code created; a result or stored value
    # holding traced tensors in one is rebuilt for each call from its attributes.
    created: dict[int, Any] = field(default_factory=dict)
    # Objects from outside the call that the call returns as themselves (a cache passed in and returned).
    returned: list[Any] = field(default_factory=list)
    # A backward in the traced code that goes on through the history of a tensor from outside runs that part after the
    # call's computation (minijit/frontend/backward.py). id -> (tensor, line): the leaves it accumulates into, whose
    # `.grad` the traced code may not read after it; and per such backward, (the names of the trace inputs whose
    # histories it goes on through, the names of those whose `.grad` the code read after it): the guard checks on
    # every call that the histories do not reach the latter (`history_checks`).
    accumulated_later: dict[int, tuple[Tensor, str]] = field(default_factory=dict)
    histories_later: list[tuple[tuple[str, ...], list[str]]] = field(default_factory=list)

    def note_grad_read(self, t: Tensor, capture: Callable[[Tensor], Any]) -> None:
        """Traced code reads `t.grad`: refused where a backward through a history outside the call accumulates into
        it after the computation; else noted for the guard's check that each call's histories do not reach it."""
        if not self.histories_later:
            return
        if id(t) in self.accumulated_later or (not t.is_leaf and t.retains_grad):
            line = self.accumulated_later.get(id(t), (t, ""))[1]
            raise UnsupportedSyntaxError(
                f"reading .grad{where_now()} of a tensor that the backward(){line} accumulates into through a history "
                "outside the jitted function: minijit runs that part of the backward after the call's computation, "
                "so the read would not see it. Read the gradient after the call")
        name = capture(t).name
        for _, reads in self.histories_later:
            if name not in reads:
                reads.append(name)

    def history_checks(self) -> None:
        """Record, as constraints of the capture, that each call's histories a backward goes on through after the
        computation do not reach a tensor whose `.grad` the code read after it (one walk of the graph per backward)."""
        for histories, reads in self.histories_later:
            if reads:
                add_constraint(f"_not_in_history(({', '.join(histories)},), ({', '.join(reads)},))")

    # -- roots and sources --------------------------------------------------------------------
    def take_view(self, view: OutsideView) -> None:
        """See objects from outside as the caller's `view` says."""
        self.keyed.update((id(holder), key) for holder, key in view.keyed)
        self.whole.update(id(c) for c in view.whole)
        self.shown.update(view.shown)
        self.stand_ins.update(view.tensors)

    def add_root(self, obj: Any, label: str) -> None:
        """Guard reads of `obj` and log writes into it from now on (not for an object the trace created: its
        state is the trace's own, rebuilt for each call, even once it is stored into an object from outside)."""
        if id(obj) not in self.roots and not self.is_created(obj) and may_have_guarded_attributes(obj):
            self.roots[id(obj)] = (obj, label)

    def is_root(self, obj: Any) -> bool:
        """True for objects that exist outside the call (and are not tensors). A user's class is one
        however the code reached it (`type(self).count += 1`)."""
        if id(obj) in self.roots:
            return True
        if isinstance(obj, type) and _users_class(obj):
            self.add_root(obj, obj.__qualname__)
            return True
        return False

    def note_created(self, obj: Any) -> None:
        """`obj` was instantiated by traced code (it is kept alive until the capture ends)."""
        if id(obj) not in self.roots:
            self.created[id(obj)] = obj

    def is_created(self, obj: Any) -> bool:
        """True for an object traced code instantiated (and nobody outside the call had before)."""
        return self.created.get(id(obj)) is obj

    def seen(self, value: Any) -> Any:
        """What traced code gets for `value`, read from outside or returned by native code: the proxy that
        stands for it (a jitted module's parameter), else `value` itself."""
        if self.stand_ins:
            entry = self.stand_ins.get(id(value))
            if entry is not None and entry[0] is value:
                return entry[1]
        return value

    def label_of(self, obj: Any) -> str:
        """The name of a root, for the names of the values read from it."""
        entry = self.roots.get(id(obj))
        return entry[1] if entry is not None else "captured"

    def source_of(self, t: Tensor) -> Source | None:
        """Where the outside tensor `t` was read from: as it was read, or found in a root (read natively)."""
        entry = self.tensor_sources.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        for obj, label in list(self.roots.values()):
            # Where it was before the trace's own writes: a source is read before the call's effects are replayed.
            changed = self.changed.get(id(obj))
            for access, key, value in _slots(obj if changed is None else changed[1]):
                if value is t and (access != "attribute" or (id(obj), key) not in self.written):
                    source = Source(obj, access, key, item_label(label, key))
                    self.tensor_sources[id(t)] = (t, source)
                    return source
        return None

    def note_argument(self, t: Tensor, name: str) -> None:
        """The tensor `t` was passed as the trace input `name`: its attributes are read (and guarded), and written
        as effects, through the call's own input (a backward accumulating into an argument's `.grad`)."""
        entry = self.tensor_sources.get(id(t))
        if entry is None or entry[0] is not t:
            self.tensor_sources[id(t)] = (t, Source(None, "input", name, name))

    def note_value(self, value: Any, source: Source, whole: bool = True) -> None:
        """A value just read from outside: a tensor remembers its source, an object becomes a root.

        `whole`: the read's guard compares a list, dict or set of constants whole (False when the
        cache key covered the read instead, so that its later reads are guarded one by one)."""
        if isinstance(value, Tensor):
            if id(value) not in self.tensor_sources:
                self.tensor_sources[id(value)] = (value, source)
        elif not isinstance(value, Proxy):
            self.add_root(value, source.label)
            if whole and has_snapshot(value):
                self.whole.add(id(value))
            self.note_iterator(value, source.label)

    def note_iterator(self, value: Any, label: str) -> None:
        """Remember a native iterator or generator from outside: advancing it cannot be replayed."""
        if hasattr(type(value), "__next__") and not hasattr(value, "__dict__"):
            self.iterators[id(value)] = (value, label)

    def check_not_outside_iterator(self, it: Any) -> None:
        """Refuse to advance an iterator from outside the call (it would advance once, at trace time)."""
        if id(it) in self.iterators:
            label = self.iterators[id(it)][1]
            raise UnsupportedSyntaxError(
                f"advancing the {type(it).__name__} {label}, which exists outside the jitted call{where_now()}: "
                "minijit would take its next item once, while tracing, and never again. Take the item outside "
                "and pass it as an argument")

    # -- reads ----------------------------------------------------------------------------------
    def read(self, guards: dict[Any, Any], kind: str, holder: Any, key: Any, value: Any, label: str,
             shadow: dict[str, Any] | None = None, dynamic: bool = False) -> Any:
        """Record that traced code read `value` as `key` of `holder` (a global, cell, attribute or item), and
        return what traced code sees: `value`, or where `dynamic` (the caller uses what this returns) and the
        runtime made that place a dynamic source of numbers, the number proxy the trace takes as an input."""
        key = number_values(key)  # (read again by each call's guard and sources: a key the call computed, as its value)
        if (id(holder), key) in self.written:
            return value  # the trace wrote it itself: the value is the trace's own
        access = {"global": "item", "builtin": "item", "item": "item", "cell": "cell", "referent": "call"}.get(
            kind, "attribute")
        changed = self.changed.get(id(holder))
        if changed is not None and kind == "item":
            self._guard_before_change(guards, holder)
        elif id(holder) not in self.whole and (id(holder), key) not in self.keyed:  # keyed: the cache key covers it
            owner = self.roots[id(holder)][1] if id(holder) in self.roots else ""
            number = self._symbolic_number(kind, Source(holder, access, key, label), value) if (
                dynamic and shadow is None) else None
            if number is not None:
                record(guards, kind, holder, key, NumberSlot.of(value), owner=owner)
                return number
            record(guards, kind, holder, key, value, shadow, owner)
        # A value read through a keyed slot has no guard of its own: its contents are not guarded whole.
        guarded = (id(holder), key) not in self.keyed
        if shadow is None:
            self.note_value(value, Source(holder, access, key, label), whole=guarded)
        return value

    @staticmethod
    def _symbolic_number(kind: str, source: Source, value: Any) -> Any:
        """The proxy standing for the number `value` read at `source`, where the runtime made that a dynamic
        source (the capture's `capture_number` hook, minijit.runtime.inputs.number_capturer); else None."""
        if not is_symbolic_number_value(value):
            return None
        trace = current_trace()
        hook = trace.capture.capture_number if trace is not None and trace.capture is not None else None
        return hook(kind, source, value) if hook is not None else None

    def observe(self, guards: dict[Any, Any], container: Any, how: str, key: Any = None, result: Any = None) -> None:
        """Record a structural read of the root `container`: "length", "contains" (`key in c` was `result`),
        "keys", or "iterate" (its keys, and for sequences every element)."""
        if id(container) in self.whole:
            return
        if id(container) in self.changed:
            self._guard_before_change(guards, container)
            return
        if how == "contains":
            if (id(container), key) not in self.keyed:
                record(guards, "contains", container, key, result)
        elif how == "length" or (how == "iterate" and isinstance(container, list | tuple | collections.deque)):
            record(guards, "length", container, None, len(container))
            if how == "iterate":
                label = self.label_of(container)
                for i, item in enumerate(container):
                    self.read(guards, "item", container, i, item, item_label(label, i))
        else:  # the keys of a mapping, the elements of a set
            record(guards, "keys", container, None, tuple(container))
            # The guard compares the keys by identity only: an object among them is a root, whose reads are
            # guarded in turn (else `k.n` read from a key would be baked in).
            label = self.label_of(container)
            for k in container:
                if not isinstance(k, Tensor | Proxy):
                    self.add_root(k, f"a key of {label}")

    def observe_values(self, guards: dict[Any, Any], mapping: Any) -> None:
        """Record a read of every key and value of the root mapping (`.items()`, `.values()`)."""
        self.observe(guards, mapping, "keys")
        if id(mapping) in self.changed or id(mapping) in self.whole:
            return
        label = self.label_of(mapping)
        for k in list(mapping):
            self.read(guards, "item", mapping, k, dict.get(mapping, k) if isinstance(mapping, dict) else mapping[k],
                      item_label(label, k))

    def _guard_before_change(self, guards: dict[Any, Any], container: Any) -> None:
        """Guard the whole state the trace found `container` in, before its own writes."""
        _, before = self.changed[id(container)]
        if isinstance(before, dict):
            record(guards, "keys", container, "before", tuple(before))
            for k, v in before.items():
                record(guards, "item", container, k, v)
        else:
            record(guards, "length", container, "before", len(before))
            if isinstance(container, list | tuple):
                for i, v in enumerate(before):
                    record(guards, "item", container, i, v)
            else:
                record(guards, "keys", container, "before", tuple(before))

    # -- writes ---------------------------------------------------------------------------------
    def write_attribute(self, holder: Any, name: str, value: Any, delete: bool = False,
                        native: Callable[..., Any] | None = None, op: str | None = None) -> None:
        """Log `holder.name = value` (or `del holder.name`), done natively, and how to undo it.

        `native` is the function that sets it (`object.__setattr__` where a class's own
        `__setattr__` ran in the interpreter and ended there); default: setattr/delattr.
        `op`: the effect's own op, where it is not one of those (see `Effect`).
        """
        target = self._holder(holder)
        self.written.add((id(holder), name))
        own = getattr(holder, "__dict__", None)
        descriptor = inspect.getattr_static(type(holder), name, None)
        if isinstance(own, dict) and not hasattr(descriptor, "__set__"):
            old = own.get(name, MISSING)
            self.undo.append(lambda: _restore_item(own, name, old))
        else:
            old = getattr(holder, name, MISSING)
            self.undo.append(lambda: _restore_attribute(holder, name, old))
        if op is None:
            op = "delattr" if delete else "setattr"
            if native is object.__setattr__ or native is object.__delattr__:
                op = "object " + op
        self.effects.append(Effect(op, target, name, value))

    def write_item(self, container: Any, key: Any, value: Any, delete: bool = False) -> None:
        """Log `container[key] = value` (or `del container[key]`) on a root (`before_write` keeps how to undo it)."""
        if contains_proxy(key):
            # A key the call computes (a symbolic number): replayed with each call's value of it, as a
            # method's arguments are, not with the proxy itself.
            method, args = ("__delitem__", (key,)) if delete else ("__setitem__", (key, value))
            self.effects.append(Effect("call", container, method, (args, {})))
            return
        if isinstance(container, dict):
            self.written.add((id(container), key))
        self.effects.append(Effect("delitem" if delete else "setitem", container, key, value))

    def write_global(self, namespace: dict[str, Any], name: str, value: Any, delete: bool = False) -> None:
        """Log an assignment to a module global (only that key is restored: globals dicts are shared)."""
        old = namespace.get(name, MISSING)
        self.undo.append(lambda: _restore_item(namespace, name, old))
        self.written.add((id(namespace), name))
        self.effects.append(Effect("delitem" if delete else "setitem", namespace, name, value))

    def write_cell(self, cell: types.CellType, name: str, value: Any) -> None:
        """Log an assignment to the closure variable `name`, a cell created outside the call."""
        try:
            old = cell.cell_contents
        except ValueError:
            old = MISSING
        self.undo.append(lambda: _restore_cell(cell, old))
        self.written.add((id(cell), name))
        self.effects.append(Effect("cell", cell, name, value))

    def call_mutator(self, guards: dict[Any, Any], container: Any, method: str, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> None:
        """Log a mutating method call on a root container (before it runs natively), its keywords included
        (`od.popitem(last=False)`)."""
        reads = next((r for (cls, m), r in _MUTATORS.items() if m == method and isinstance(container, cls)), False)
        if reads:
            self.observe(guards, container, "iterate")
        self.effects.append(Effect("call", container, method, (args, dict(kwargs))))

    def call_function(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Log a call made for its effect alone (`print`): not made now, made by every call after its computation."""
        self.effects.append(Effect("function", fn, None, (args, kwargs)))

    def changed_natively(self, container: Any, before: Any, by: str) -> None:
        """Native code `by` changed the root list or dict `container` (`heapq.heappush(h, 3)`: no traced opcode saw
        the write), whose contents were `before` (`contents_of`): those are put back when the capture ends, and its
        new ones are what every call puts into it (every element was guarded as native code read it, so a call
        finding others misses). A proxy among them is refused: native code's write is not replayed with each
        call's value of it."""
        self._remember_contents(container, before)
        stored = next((v for _, v in _shallow_contents(container) if isinstance(v, Proxy)), None)
        if stored is not None:
            raise UnsupportedSyntaxError(
                f"{_stored_words(stored)} was stored into a {type(container).__name__} that exists outside the jitted "
                f"call by {by}{where_now()}, which minijit runs natively; it cannot be replayed. Return the value from "
                "the jitted function and store it outside")
        self.effects.append(Effect("replace", container, None, contents_of(container)))
        self.settled(container)

    def _remember_contents(self, container: Any, before: Any) -> None:
        """Keep `container`'s contents before the trace's first write into it (`before`, copied by `contents_of`), to
        put back when the capture ends."""
        if id(container) in self.changed:
            self._fold_in_others(container, before)
            return
        self.changed[id(container)] = (container, before)
        self.undo.append(lambda: self._put_back(container))

    def before_write(self, container: Any) -> Any:
        """The trace is about to write into the root `container` natively (`write_item`, `call_mutator` logged it):
        keep its contents, to put back when the capture ends, and return them. Called right before the write, so
        that what another thread writes in between is not taken for the trace's own."""
        now = contents_of(container)
        self._remember_contents(container, now)
        return now

    def settled(self, container: Any, contents: Any = None) -> None:
        """The trace's write into `container` is done: what it holds now (or `contents`, what the write made of the
        contents `before_write` returned) is the trace's own doing."""
        if id(container) in self.changed:
            self.settled_contents[id(container)] = contents_of(container) if contents is None else contents

    def _fold_in_others(self, container: Any, now: Any) -> None:
        """Another thread may have written into `container` since the trace's last write (a server's threads sharing
        a log): what it wrote goes into the contents put back, so that it is not lost when the capture ends."""
        settled = self.settled_contents.get(id(container))
        if settled is not None and not _same(now, settled):
            _, before = self.changed[id(container)]
            self.changed[id(container)] = (container, with_others_writes(before, settled, now))
            self.settled_contents[id(container)] = now

    def _put_back(self, container: Any) -> None:
        for _ in range(64):  # until no other thread wrote while the last writes were folded in
            now = contents_of(container)
            self._fold_in_others(container, now)
            if same_contents(container, now):
                break
        _restore_contents(container, self.changed[id(container)][1])

    def _holder(self, holder: Any) -> Any:
        """What an effect on `holder` is replayed on: the object itself, or a tensor's source."""
        if isinstance(holder, Tensor):
            source = self.source_of(holder)
            if source is None:
                raise UnsupportedSyntaxError(
                    f"traced code changed an attribute of a tensor it did not receive{where_now()}; minijit cannot "
                    "repeat that on later calls. Pass the tensor as an argument")
            return source
        return holder

    def restore(self) -> None:
        """Put every object the trace changed back the way it was before the capture."""
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


def _users_class(cls: type) -> bool:
    """A class defined in the user's own code (not the standard library's or a package's)."""
    module = sys.modules.get(cls.__module__)
    return module is not None and is_users_module(module) and may_have_guarded_attributes(cls)


def item_label(container_label: str, key: Any) -> str:
    """The name of `container[key]` in traces: a string key itself, else the container's name and the key."""
    if isinstance(key, str) and key.isidentifier():
        return key
    return f"{container_label}_{key}" if isinstance(key, int) else container_label


def mutator_of(container: Any, method: str) -> bool:
    """True when `method` of the built-in container `container` changes it."""
    return any(m == method and isinstance(container, cls) for (cls, m) in _MUTATORS)


def _restore_item(mapping: dict[Any, Any], key: Any, old: Any) -> None:
    if old is MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = old


def _restore_attribute(obj: Any, name: str, old: Any) -> None:
    if old is MISSING:
        if hasattr(obj, name):
            delattr(obj, name)
    else:
        setattr(obj, name, old)


def _restore_cell(cell: types.CellType, old: Any) -> None:
    if old is MISSING:
        try:
            del cell.cell_contents
        except ValueError:
            pass
    else:
        cell.cell_contents = old


def contents_of(container: Any) -> Any:
    """A shallow copy of a list's or dict's contents, for `same_contents` and to put them back."""
    return dict(dict.items(container)) if isinstance(container, dict) else list(container)


def same_contents(container: Any, before: Any) -> bool:
    """Whether `container` holds what `contents_of` copied: items, or keys and values in order, by identity (a traced
    value's == would record into the trace)."""
    return _same(contents_of(container), before)


def _same(now: Any, was: Any) -> bool:
    """Whether two copies made by `contents_of` hold the same objects in the same order."""
    if isinstance(was, dict):
        return len(now) == len(was) and all(a[0] is b[0] and a[1] is b[1] for a, b in zip(now.items(), was.items()))
    return len(now) == len(was) and all(a is b for a, b in zip(now, was))


def with_others_writes(before: Any, settled: Any, now: Any) -> Any:
    """`before` (copied by `contents_of`) with the writes that turned `settled` into `now` applied: keys set or
    deleted; elements added (at the end) or removed, by identity."""
    if isinstance(before, dict):
        if any(isinstance(k, Proxy) for k in (*settled, *now)):
            return before  # a symbolic key: looking it up would compare it, and record that into the trace
        merged = dict(before)
        for k, v in now.items():
            if k not in settled or settled[k] is not v:
                merged[k] = v
        for k in settled:
            if k not in now:
                merged.pop(k, None)
        return merged
    unmatched = collections.Counter(map(id, settled))
    added = []
    for v in now:
        if unmatched[id(v)]:
            unmatched[id(v)] -= 1
        else:
            added.append(v)
    kept = []
    for v in before:
        if unmatched[id(v)]:
            unmatched[id(v)] -= 1  # another thread removed it
        else:
            kept.append(v)
    return kept + added


def _restore_contents(container: Any, before: Any) -> None:
    if isinstance(container, dict):
        if not same_contents(container, before):
            # OrderedDict keeps its own order list beside the dict's: only its methods keep the two in step.
            kind = collections.OrderedDict if isinstance(container, collections.OrderedDict) else dict
            kind.clear(container)
            kind.update(container, before)
    elif isinstance(container, list):
        container[:] = before
    elif isinstance(container, set):
        container.clear()
        container.update(before)
    elif isinstance(container, collections.deque):
        container.clear()
        container.extend(before)


# -- tensors read from outside ----------------------------------------------------------------------

# Attributes of a tensor that the trace specialises on by reading them (the capture checks shape,
# dtype, device and requires_grad of every captured tensor; these others are guarded by value).
_READ_NATIVELY = frozenset({"grad", "is_leaf", "grad_fn", "layout", "is_sparse", "is_quantized", "is_meta",
                            "is_nested", "_base", "names", "_version", "retains_grad", "is_mkldnn",
                            "_backward_hooks", "_post_accumulate_grad_hooks"})


def tensor_attribute(outside: Outside, guards: dict[Any, Any], t: Tensor, name: str, capture: Callable[[Tensor], Any]
                     ) -> Any:
    """`t.name` for a real tensor met by traced code: computed through its proxy, or read and guarded."""
    if name == "grad":
        outside.note_grad_read(t, capture)
    if (id(t), name) in outside.shown:
        return outside.shown[(id(t), name)]  # written by the traced code itself (a `.grad` a backward() made)
    own = t.__dict__ if type(t) is not Tensor else {}
    if name in _READ_NATIVELY or name in own:
        value = getattr(t, name)
        source = outside.source_of(t)
        if source is not None:
            record(guards, "tensor attribute", source, name, value, owner=source.label)
            outside.note_value(value, Source(source, "tensor attribute", name, f"{source.label}_{name}"))
        return value
    return getattr(capture(t), name)


def check_no_proxy_left(outside: Outside) -> None:
    """After the capture, no proxy may remain in an object from outside (docs/design.md, invariant 8)."""
    for obj, label in outside.roots.values():
        for where, value in _shallow_contents(obj):
            if isinstance(value, Proxy):
                raise UnsupportedSyntaxError(
                    f"{_stored_words(value)} was stored into {where} of a {type(obj).__name__} ({label}) that exists outside the "
                    "jitted call, by code minijit runs natively (heapq, bisect, a C method); it cannot be replayed. "
                    "Return the value from the jitted function and store it outside")
    for obj in outside.returned:
        if contains_proxy(obj):
            raise UnsupportedSyntaxError(
                f"the jitted call returns the {type(obj).__name__} it was given, and a traced tensor is still inside "
                "it where minijit cannot replay the write that put it there. Return the tensor itself")


def _stored_words(value: Proxy) -> str:
    """A proxy found stored in an object from outside, named for an error message."""
    if isinstance(value, TensorProxy):
        return f"a traced tensor ({value.name})"
    return f"a symbolic number ({value.name}, a size or number that may change from call to call)"


def _slots(obj: Any) -> list[tuple[str, Any, Any]]:
    """(access, key, value) for what `obj` holds directly: items of containers, instance attributes."""
    if isinstance(obj, dict):
        return [("item", k, v) for k, v in obj.items()]
    if isinstance(obj, list | tuple):
        return [("item", i, v) for i, v in enumerate(obj)]
    own = getattr(obj, "__dict__", None)
    return [("attribute", k, v) for k, v in [*(list(dict.items(own)) if isinstance(own, dict) else ()),
                                             *_slot_values(obj)]]


def _slot_values(obj: Any) -> list[tuple[str, Any]]:
    """(name, value) for each `__slots__` attribute `obj` has set."""
    if isinstance(obj, type):
        return []
    return [(n, v) for n in slot_names(type(obj)) if (v := getattr(obj, n, MISSING)) is not MISSING]


def _shallow_contents(obj: Any) -> list[tuple[str, Any]]:
    # Each read through one native copy: another thread may be changing the object.
    if isinstance(obj, dict):
        return [(f"item [{k!r}]", v) for k, v in list(dict.items(obj))]
    if isinstance(obj, list | tuple | collections.deque):
        return [(f"item [{i}]", v) for i, v in enumerate(list(obj))]
    return [(f"attribute {k!r}", v) for _, k, v in _slots(obj)]


__all__ = ["Effect", "Outside", "OutsideView", "check_no_proxy_left", "item_label", "mutator_of",
           "tensor_attribute"]
