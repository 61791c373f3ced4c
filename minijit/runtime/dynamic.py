"""Automatic dynamic sizes and numbers: the default cache mode, "automatic", as torch.compile's `dynamic=None`.

A jitted function starts by tracing with constant sizes and numbers ("constant values"): the fastest
trace for a function that is always called alike. When a call misses only because a size, or a Python
int or float among its arguments, differs from those of a call it already traced (the two calls have the
same key once sizes and numbers are left out), the function switches to "symbolic values" for good: that
call is traced again with its numbers symbolic, and with symbolic sizes where its tensor arguments' sizes differ from
the call traced before (the others stay constants of the trace, checked by its guard, as torch.compile's automatic
dynamic marks only the dims that changed): the one entry serves all their values (each constraint the trace relied
on checked by its guard). A later call that differs in a size kept constant makes that size symbolic too, and is
traced again (`AutomaticDynamic.widen`). So does a call that fails an entry's guard only by the sizes
of tensors it reads from outside, each of the same rank, dtype and device (an encoder-decoder's decoder, called
with one new token each time, and a cache that grows: `Prologue.differs_in_captured_sizes`). The state tensors read
from objects (a cache layer's `keys`) are treated alike, by input name (minijit.runtime.inputs): each symbolic trace
makes symbolic the sizes that differ from those of the trace before under its key (`AutomaticDynamic.state_sizes`),
the others constant; a tensor first met in a symbolic trace keeps all its sizes constant until a call differs in
one. Such a call fails the guard by those sizes alone, and its trace replaces the entry it failed (a decode loop:
the prompt, the first step with the cache's length constant, then one entry for every length).
`cache_info().dynamic` says when and why. The entries
traced before the switch still serve the calls they match (`JitFunction._find_kept`): a generation's
prompt, traced with constant sizes, is not traced again for the next generation.

A trace with symbolic sizes may be refused where one with constant sizes is not (an op whose output
size minijit cannot follow): the function then stays with constant values, and `cache_info().dynamic`
says that too.

Numbers read from outside the call (`DynamicNumbers`). A Python int or float the code reads from an object
that outlives the call (an optimizer's `param_groups[0]["lr"]`, a counter attribute, a global, a closure
variable; a tuple of them, Adam's `betas`) is guarded by its value, so a value that changes every step would
trace every step. Under "automatic" and "symbolic values", a call that fails an entry's guard (under its own
key) by such values that changed makes the places they were read from *dynamic sources*, and is traced again:
there a number is an input of the trace, read afresh from its place on every call as tensors read from outside
are; its guard checks only its type, and the branches and sizes the trace took on it are constraints, as for a
symbolic number argument. Where those numbers were all the call failed, the entry it failed is dropped: the new
one serves its calls. A place is known by its holder's identity and the key read (a holder freed and another
made at its address may find its number symbolic at once: a trace that serves every value, never a wrong one).
"constant values" never makes numbers symbolic. Bools never are; nor are numbers inside a list or dict of
constants, which the guard compares whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minijit.errors import MinijitError
from minijit.frontend.guards import MISSING, GuardEntry, NumberSlot, is_symbolic_number_value, short_repr, slot_attribute
from minijit.runtime.cache_key import cache_key

# The sizes-free keys of constant traces kept (a call matching a forgotten one traces constant once more).
MAX_KEYS = 256
# The dynamic sources of numbers a function remembers (the oldest forgotten first: it is traced constant again).
MAX_SOURCES = 256
# The decisions about numbers kept for cache_info (the first ones: a function forgetting and making sources
# dynamic again and again says so that many times at most).
MAX_DECISIONS = 50
# The kinds of read (minijit.frontend.guards.GuardEntry) whose number may be made symbolic.
_NUMBER_READS = frozenset({"global", "cell", "attribute", "item"})
# (a label naming each tensor argument, its shape), in the order of the arguments' tensors (`tensor_shapes`)
ArgumentShapes = list[tuple[str, tuple[int, ...]]]
# The sizes of a state tensor read from an object as a trace took them: a constant size as an int, a symbolic one
# as None.
StateSizes = tuple[int | None, ...]


@dataclass
class AutomaticDynamic:
    """The state of one jitted function's automatic mode: the sizes-free keys of the calls it traced with
    constant values, and whether (and why) it switched."""

    # cache_key(..., symbolic=True) of each call traced with constant values (the last MAX_KEYS, oldest first:
    # a key holding an argument object's id is new on every call that passes a new object) -> the shapes of its
    # tensor arguments, in order
    keys: dict[tuple[Any, ...], ArgumentShapes] = field(default_factory=dict)
    # After the switch, per sizes-free key: each tensor argument's sizes, a size kept constant as an int, a symbolic
    # one as None (a key switched to without a call traced before it, none: all its sizes are symbolic)
    sizes: dict[tuple[Any, ...], list[tuple[int | None, ...]]] = field(default_factory=dict)
    switched: bool = False
    # Per sizes-free key: the sizes of each state tensor read from an object (by its input name) in the trace made
    # last under the key (those of the constant traces before the switch, evicted with `keys`)
    state: dict[tuple[Any, ...], dict[str, StateSizes]] = field(default_factory=dict)
    # Whether two keys differ only in the identities of argument objects (minijit.runtime.rebind): a call under a
    # key not traced yet, because it passes a new cache object, compares its state tensors with those of the
    # latest such key
    objects_only: Callable[[tuple[Any, ...], tuple[Any, ...]], bool] | None = None
    # The decisions, in words, for cache_info
    decisions: list[str] = field(default_factory=list)
    # Set when a symbolic trace was refused: the function keeps constant values from then on.
    refused: bool = False

    def traced_constant(self, args: tuple[Any, ...], kwargs: dict[str, Any], shapes: ArgumentShapes,
                        state: dict[str, StateSizes]) -> None:
        """Note a call traced with constant values, whose tensor arguments have `shapes`, and the state tensors it
        read from objects `state`."""
        if not self.switched and not self.refused:
            key = _sizes_free_key(args, kwargs)
            self.keys[key], self.state[key] = shapes, state
            if len(self.keys) > MAX_KEYS:
                self.state.pop(next(iter(self.keys)), None)
                del self.keys[next(iter(self.keys))]

    def state_sizes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, StateSizes]:
        """The sizes of the state tensors read from objects in the trace made last under the call's key, by input
        name (`tensor_capturer`'s `noted`: those the call's trace differs in become symbolic)."""
        return self._noted_state(_sizes_free_key(args, kwargs))

    def traced_symbolic(self, args: tuple[Any, ...], kwargs: dict[str, Any], state: dict[str, StateSizes]) -> None:
        """Note the sizes of the state tensors a trace with symbolic values read from objects (`state`), the
        decision in words where some went symbolic that the trace before under the key kept constant."""
        key = _sizes_free_key(args, kwargs)
        before = self._noted_state(key)
        went = [f"{name} {_dims(dims)}" for name, sizes in state.items()
                if (dims := [d for d, k in enumerate(sizes) if k is None and _was_constant(before.get(name), d)])]
        self.state[key] = {**before, **state}
        if len(self.state) > MAX_KEYS:
            del self.state[next(iter(self.state))]
        if went:
            self.decisions.append("sizes of tensors read from objects made symbolic: " + "; ".join(went))

    def should_switch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this missing call differs from a traced one only in sizes and numbers."""
        return not self.switched and not self.refused and _sizes_free_key(args, kwargs) in self.keys

    def switch(self, reason: str, args: tuple[Any, ...], kwargs: dict[str, Any], shapes: ArgumentShapes) -> None:
        """Note the switch to symbolic values, for `reason` (the miss explained): the sizes of the call's tensor
        arguments (`shapes`) that differ from the call traced under its key become symbolic, the others stay."""
        self.switched = True
        key = _sizes_free_key(args, kwargs)
        noted = [sizes for _, sizes in self.keys.get(key, ())]
        kept = None
        if noted and _alike(noted, shapes):
            kept = self.sizes[key] = [tuple(a if a == b else None for a, b in zip(was, now))
                                      for was, (_, now) in zip(noted, shapes)]
        self.decisions.append(f"sizes and numbers made symbolic: {reason}" + _sizes_words(shapes, kept))

    def undo(self) -> None:
        """Take the last switch back (the call's code raised while traced: it is run eagerly, nothing is traced)."""
        self.switched = False
        self.sizes.clear()
        self.decisions.pop()

    def constant_sizes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[int | None, ...]] | None:
        """Once switched: the sizes the call's trace keeps constant, per tensor argument (None: symbolic); None where
        all are symbolic."""
        return self.sizes.get(_sizes_free_key(args, kwargs)) if self.switched else None

    def widen(self, args: tuple[Any, ...], kwargs: dict[str, Any], shapes: ArgumentShapes) -> bool:
        """Once switched, for a missing call: the sizes kept constant under its key that its tensor arguments
        (`shapes`) differ in become symbolic, for the call's trace and those after it. Whether there were any."""
        key = _sizes_free_key(args, kwargs)
        kept = self.sizes.get(key) if self.switched else None
        if kept is None or not _alike(kept, shapes):
            return False
        wider = [tuple(None if k is not None and k != n else k for k, n in zip(was, now[1], strict=True))
                 for was, now in zip(kept, shapes, strict=True)]
        if wider == kept:
            return False
        changed = [(label, [d for d, (a, b) in enumerate(zip(was, now, strict=True)) if a != b], shape)
                   for was, now, (label, shape) in zip(kept, wider, shapes, strict=True)]
        self.sizes[key] = wider
        self.decisions.append("sizes made symbolic: " + "; ".join(
            f"{label} {_dims(dims)} (shape {shape})" for label, dims, shape in changed if dims))
        return True

    def _noted_state(self, key: tuple[Any, ...]) -> dict[str, StateSizes]:
        found = self.state.get(key)
        if found is None and self.objects_only is not None:
            found = next((sizes for k, sizes in reversed(self.state.items()) if self.objects_only(k, key)), None)
        return found or {}

    def refuse(self, error: MinijitError) -> None:
        """Note that the symbolic trace was refused: back to constant values, for good."""
        self.switched, self.refused = False, True
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self.decisions.append(f"kept constant values: the trace with symbolic sizes was refused ({first})")


def _alike(noted: list[tuple[Any, ...]], shapes: ArgumentShapes) -> bool:
    """Whether the sizes `noted` under the call's key are of as many tensors of the same ranks as `shapes`: the key
    says so; anything else (never seen) leaves every size symbolic rather than fail the call."""
    return len(noted) == len(shapes) and all(len(a) == len(b) for a, (_, b) in zip(noted, shapes))


def _sizes_words(shapes: ArgumentShapes, kept: list[tuple[int | None, ...]] | None) -> str:
    """Which sizes went symbolic, in words (for cache_info)."""
    if kept is None:
        return " (symbolic: every size; no call under this key was traced before)"
    changed = [f"{label} {_dims([d for d, k in enumerate(sizes) if k is None])}"
               for (label, _), sizes in zip(shapes, kept, strict=True) if None in sizes]
    return (f" (symbolic: {', '.join(changed) or 'no size of an argument'}; the arguments' other sizes stay "
            "constants of the trace)")


def _was_constant(sizes: StateSizes | None, dim: int) -> bool:
    """Whether a state tensor's size `dim` was a constant of the trace before (or the tensor was not in it)."""
    return sizes is None or dim >= len(sizes) or sizes[dim] is not None


def _dims(dims: list[int]) -> str:
    return f"dim {dims[0]}" if len(dims) == 1 else f"dims {', '.join(map(str, dims))}"


def _sizes_free_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    try:
        return cache_key(args, kwargs, symbolic=True)
    except TypeError:  # an unhashable part: never the same
        return (object(),)


def slot_key(kind: str, holder: Any, key: Any) -> tuple[Any, ...] | None:
    """How a dynamic source is known: the kind of read, its holder's identity and the key read (None where the
    key cannot be hashed: such a place stays constant)."""
    found = (kind, id(holder), key)
    try:
        hash(found)
    except TypeError:
        return None
    return found


def number_read(entry: GuardEntry) -> bool:
    """Whether the guard entry is a number read from outside that a dynamic source could make symbolic: an int or
    float (not a bool) or a short tuple of them, read as a global, closure variable, attribute or item (not
    through an instance from its class)."""
    return (entry.kind in _NUMBER_READS and entry.shadow is None and slot_key(entry.kind, entry.namespace,
                                                                                entry.name) is not None
            and (is_symbolic_number_value(entry.value) or isinstance(entry.value, NumberSlot)))


@dataclass
class DynamicNumbers:
    """The places a jitted function reads numbers from that changed between calls (made symbolic), and those whose
    symbolic trace was refused (kept constant for good)."""

    # slot_key -> the decision in words, the oldest first (at most MAX_SOURCES)
    sources: dict[tuple[Any, ...], str] = field(default_factory=dict)
    refused: set[tuple[Any, ...]] = field(default_factory=set)
    decisions: list[str] = field(default_factory=list)
    # How many decisions the last `made_dynamic` added (for `undo`).
    _added: int = 0

    def covers(self, kind: str, holder: Any, key: Any) -> bool:
        """Whether the number read as `key` of `holder` is symbolic (an input of the trace)."""
        found = slot_key(kind, holder, key)
        return found is not None and found in self.sources

    def made_dynamic(self, failed: list[tuple[GuardEntry, Any]]) -> list[tuple[Any, ...]]:
        """Given guard entries a call failed, each with the value its place holds now: the places of those that are
        number reads (`number_read`) whose number changed, made dynamic sources unless they are (or were refused)
        already; their keys, to `refuse` if the trace is refused (empty where there is none)."""
        new: dict[tuple[Any, ...], str] = {}
        for entry, now in failed:
            was = entry.value.was if isinstance(entry.value, NumberSlot) else entry.value
            key = slot_key(entry.kind, entry.namespace, entry.name)
            if (number_read(entry) and is_symbolic_number_value(now) and (type(now) is not type(was) or now != was)
                    and key not in self.sources and key not in self.refused):
                new[key] = f"{_where(entry)} changed {short_repr(was)} -> {short_repr(now)}"
        before = len(self.decisions)
        for key, words in new.items():
            self.sources[key] = words
            if len(self.sources) > MAX_SOURCES:
                del self.sources[next(iter(self.sources))]
            self._decide(f"number made symbolic: {words}")
        self._added = len(self.decisions) - before
        return list(new)

    def refuse(self, keys: list[tuple[Any, ...]], error: MinijitError) -> None:
        """The trace with the numbers at `keys` symbolic was refused: they stay constant, for good."""
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        for k in keys:
            self.sources.pop(k, None)
            self.refused.add(k)
        if len(self.refused) > MAX_SOURCES:
            self.refused.clear()  # forgotten: such a place is tried once more
        self._decide(f"kept constant numbers: the trace with them symbolic was refused ({first})")

    def undo(self, keys: list[tuple[Any, ...]]) -> None:
        """Take back the last decision (the code raised while traced: nothing was traced)."""
        for k in keys:
            self.sources.pop(k, None)
        if self._added:
            del self.decisions[-self._added:]
        self._added = 0

    def _decide(self, decision: str) -> None:
        if len(self.decisions) < MAX_DECISIONS:
            self.decisions.append(decision)


def current_value(entry: GuardEntry) -> Any:
    """What the place a guard entry read holds now (MISSING where nothing is there)."""
    try:
        if entry.kind == "cell":
            return entry.namespace.cell_contents
        if entry.kind == "attribute" and slot_attribute(entry.namespace, entry.name):
            return getattr(entry.namespace, entry.name, MISSING)
        if entry.kind == "attribute":
            return entry.namespace.__dict__.get(entry.name, MISSING)
        if isinstance(entry.namespace, dict):
            return dict.get(entry.namespace, entry.name, MISSING)
        return entry.namespace[entry.name]
    except Exception:
        return MISSING


def _where(entry: GuardEntry) -> str:
    """Where a number was read, in words: `item ['lr'] of param_groups_0`, `attribute n`, `global SCALE`."""
    if entry.kind == "item":
        return f"item [{entry.name!r}] of {entry.owner or 'a ' + type(entry.namespace).__name__}"
    what = {"cell": "closure variable", "global": "global"}.get(entry.kind, entry.kind)
    return f"{what} {entry.name}" + (f" of {entry.owner}" if entry.owner and entry.kind == "attribute" else "")
