"""`jit`: the callable that looks up a compiled trace for each call, compiling on a miss."""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit import environment
from minijit.errors import MinijitError, ValueGuardError, ValueGuardMiss
from minijit.extend import Executor, get_executor, resolve_executors
from minijit.ir import Trace
from minijit.runtime.arguments import CALL_ARGUMENTS, flat_inputs, tensor_shapes
from minijit.runtime.cache_key import (
    POSITIONAL_TENSOR_KEYS,
    POSITIONAL_TENSOR_SYMBOLIC_KEYS,
    KeyMemo,
    cache_key,
    exact_tensor_check,
)
from minijit.runtime.dynamic import AutomaticDynamic, DynamicNumbers, current_value
from minijit.runtime.entry_limit import MAX_ENTRIES, EntryLimit
from minijit.runtime.explain import EXPLAINED_AGAINST, explain_miss
from minijit.runtime.fallback import RaisedInTry, RaisedWhileTracing, eager_after_raise
from minijit.runtime.iterators import advance, standing_in
from minijit.runtime.pipeline import CompiledEntry, compile_for
from minijit.runtime.rebind import differs_in_objects_only, held_by_bound_self, rebind
from minijit.runtime.values import value_miss_reason

Tensor = torch.Tensor
is_grad_enabled = torch.is_grad_enabled

CACHE_MODES = ("automatic", "constant values", "symbolic values", "no caching")
# The most cache entries under one key told apart by values read from tensors (`if x.sum() > 0`).
MAX_VALUE_ENTRIES = 64
# The miss reasons CacheInfo keeps: the first and the last this many (the count of those between is kept).
KEPT_REASONS = 50


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _take_out(held: dict[tuple[Any, ...], list[CompiledEntry]], key: tuple[Any, ...], entry: CompiledEntry) -> None:
    """Under the compile lock: `entry` no longer held under `key`. The list is replaced, not changed: hits read
    the lists unlocked."""
    rest = [e for e in held.get(key, ()) if e is not entry]
    if rest:
        held[key] = rest
    else:
        held.pop(key, None)


def _users_stacklevel() -> int:
    """The `stacklevel` of a warning issued by the caller that names the innermost frame outside minijit."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class RetraceWarning(UserWarning):
    """A jitted function traced again; the message says which input changed."""


class CacheLimitWarning(UserWarning):
    """A jitted function reached its bound on cache entries (`jit(max_entries=)`) and drops the least recently used."""


@dataclass
class CacheInfo:
    """What the cache of a jitted function holds and how it has been used.

    `miss_reasons` has one line per miss, in order: why that call could not reuse a trace; past
    2 * KEPT_REASONS misses only the first and the last KEPT_REASONS are kept, and `dropped_reasons`
    counts those left out between them (a function that misses on every call holds no more).
    `evictions` counts the entries dropped, the least recently used first, to keep at most
    `max_entries` (None: no bound; `jit(max_entries=)`); a call that needs one again traces it again.
    `value_guards` lists, per entry held that read values from its tensors (`if x.sum() > 0`), the
    values it was traced for; `value_switches` counts the calls that failed such a check and ran
    again with another entry: each ran its first entry's trace up to the failing check in vain.
    `rebound` counts the calls that reused a trace for new objects passed in place of those it was
    traced with (a Hugging Face cache made by each `generate()`): neither hits nor misses.
    """

    hits: int = 0
    misses: int = 0
    entries: int = 0
    # Calls that reused a trace for new objects of the kinds it was traced with (minijit.runtime.rebind).
    rebound: int = 0
    miss_reasons: list[str] = field(default_factory=list)
    dropped_reasons: int = 0
    evictions: int = 0
    max_entries: int | None = MAX_ENTRIES
    value_switches: int = 0
    value_guards: list[str] = field(default_factory=list)
    # Calls run eagerly instead (minijit.runtime.fallback): their compiled trace raised where the user's
    # `except` may catch it, or their code raised while it was traced; each distinct reason once.
    eager_calls: int = 0
    eager_reasons: list[str] = field(default_factory=list)
    # With jit(cuda_graphs=True): per compiled forward, backward or computation, how its calls ran
    # (replayed, captured, or with ordinary launches and why: minijit.runtime.cuda_graphs).
    cuda_graphs: list[str] = field(default_factory=list)
    # With cache="automatic": when the sizes and numbers went symbolic, and why; with "symbolic values" too: which
    # numbers read from outside the call went symbolic, and why (minijit.runtime.dynamic).
    dynamic: list[str] = field(default_factory=list)
    # How often `JitFunction._dispatch` chose each path (HIT, REBIND, VALUE_SWITCH, MISS, EAGER): a call may take
    # more than one (a hit whose run fails a value check goes on to a value switch or a miss, a run raising in a
    # user's `try` to an eager run), so these count decisions, not calls. A miss whose trace raised is decided an
    # eager run (counted in `misses` too).
    decisions: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{self.hits} hit(s), {self.misses} miss(es), {self.entries} cache entr{'y' if self.entries == 1 else 'ies'}"
                 + (f", {self.rebound} rebound to new objects" if self.rebound else "")
                 + (f", {self.evictions} evicted (max_entries={self.max_entries})" if self.evictions else "")]
        first = self.miss_reasons[:KEPT_REASONS] if self.dropped_reasons else self.miss_reasons
        lines += [f"  miss {i}: {reason}" for i, reason in enumerate(first, start=1)]
        if self.dropped_reasons:
            lines.append(f"  ... {self.dropped_reasons} miss reason(s) not kept")
            start = KEPT_REASONS + self.dropped_reasons + 1
            lines += [f"  miss {i}: {reason}" for i, reason in enumerate(self.miss_reasons[KEPT_REASONS:], start=start)]
        if self.value_guards:
            lines.append(f"  value guards ({len(self.value_guards)} entr{'y' if len(self.value_guards) == 1 else 'ies'} "
                         f"told apart by values read from tensors; {self.value_switches} call(s) failed a value check "
                         "and ran again, each after a partial run of the trace):")
            lines += [f"    {guards}" for guards in self.value_guards]
        if self.eager_calls:
            lines.append(f"{self.eager_calls} call(s) ran eagerly")
            lines += [f"  eager: {reason}" for reason in self.eager_reasons]
        lines += [f"  {decision}" for decision in self.dynamic]
        if self.cuda_graphs:
            lines.append("CUDA graphs:")
            lines += [f"  {part}" for part in self.cuda_graphs]
        return "\n".join(lines)


# The paths a call may take (`JitFunction._dispatch`).
HIT, REBIND, VALUE_SWITCH, MISS, EAGER = "hit", "rebind", "value switch", "miss", "eager"


@dataclass(slots=True)
class Decision:
    """What `JitFunction._dispatch` decided for a call: run `entry` on `flat` (a hit, a rebind, a value switch, a
    miss), or run eagerly because of `raised`."""

    kind: str
    entry: CompiledEntry | None = None
    key: tuple[Any, ...] = ()
    flat: list[Any] = field(default_factory=list)
    raised: RaisedInTry | RaisedWhileTracing | None = None
    # An entry traced with constant values before cache="automatic" went symbolic (`JitFunction._find_kept`).
    kept: bool = False


def _by_name(executor: Executor | str) -> Executor | str:
    """An executor's name where that name finds it, else the executor itself."""
    if isinstance(executor, Executor):
        try:
            if get_executor(executor.name) is executor:
                return executor.name
        except MinijitError:
            pass
    return executor


def _take_names(wrapper: JitFunction, fn: Callable[..., Any]) -> None:
    """What `functools.update_wrapper` does (name, doc, module, `__wrapped__`, the function's attributes).

    One attribute at a time: `update_wrapper` writes through the instance's `__dict__`, which
    makes CPython store the attributes in a dict and slows every attribute read and write on
    the hit path (measured: about 0.1 µs a call, a tenth of eager's `a + b`).
    """
    for name in functools.WRAPPER_ASSIGNMENTS:
        if hasattr(fn, name):
            setattr(wrapper, name, getattr(fn, name))
    for name, value in getattr(fn, "__dict__", {}).items():
        setattr(wrapper, name, value)
    wrapper.__wrapped__ = fn


class JitFunction:
    """A jitted function: call it like the original."""

    def __init__(self, fn: Callable[..., Any], executors: Sequence[Executor | str] | None, cache: str,
                 warn_retraces_after: int | None = None, cuda_graphs: bool = False,
                 max_entries: int | None = MAX_ENTRIES):
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
        if warn_retraces_after is None:
            warn_retraces_after = environment.warn_retraces()
        self._given_executors = None if executors is None else list(executors)
        self.warn_retraces_after = warn_retraces_after
        self.fn = fn
        self.executors = resolve_executors(list(executors) if executors is not None else None)
        self.cache_mode = cache
        self.cuda_graphs = cuda_graphs
        self._symbolic = cache == "symbolic values"
        self._keys = POSITIONAL_TENSOR_SYMBOLIC_KEYS if self._symbolic else POSITIONAL_TENSOR_KEYS
        self._key_memo = KeyMemo()  # (a jitted module's parameters: their part of the key, from call to call)
        # cache="automatic": constant values until a call misses only by its sizes or numbers.
        self._automatic = AutomaticDynamic(objects_only=differs_in_objects_only) if cache == "automatic" else None
        # Not with constant values: numbers read from outside that changed between calls, made symbolic.
        self._numbers = DynamicNumbers() if cache in ("automatic", "symbolic values") else None
        # key -> the entries compiled for calls with that key, told apart by their guards.
        self._entries: dict[tuple[Any, ...], list[CompiledEntry]] = {}
        # cache="automatic", once switched to symbolic values: the entries traced with constant values before the
        # switch, by their constant keys. They serve the calls they were made for (a generate()'s prompt), as
        # torch.compile keeps its static graphs; a call none serves goes on to the symbolic entries.
        self._kept_constant: dict[tuple[Any, ...], list[CompiledEntry]] = {}
        # A new entry -> the entry it supersedes, which `_add` puts right behind it (`_compile_with_dynamic_numbers`).
        self._behind: dict[int, CompiledEntry] = {}
        # The entries by last use, and the bound on their number (minijit.runtime.entry_limit).
        self._limit = EntryLimit(max_entries)
        self._info = CacheInfo(max_entries=max_entries)
        self._hits = 0  # kept apart from _info: the hit path updates one attribute
        # Hits whose run then failed a value check and traced (a miss after all), and the other decisions counted.
        self._hits_undone = 0
        self._decided = dict.fromkeys((REBIND, VALUE_SWITCH, MISS, EAGER), 0)
        self._last: CompiledEntry | None = None
        # The most entries one key may have that differ by the values read from tensors (then an error).
        self.max_value_entries = MAX_VALUE_ENTRIES
        # The hit path's first try, from the last call's entry: (arity, grad mode, exact check, its guard,
        # computation, the entry), or None where that entry has no exact check. One tuple, replaced whole:
        # a thread reads it once, whatever other threads' calls make the last entry meanwhile.
        self._fast: tuple[Any, ...] | None = None
        # The hit path's try for a call passing no tensor (`jit(opt.step)`, `jf(opt)`: its objects checked by
        # identity), from the last such call's entry: (arity, the entry's `check_call`, its guard, computation, the
        # entry), or None. `check_call` makes every check the key makes, and such a call has no flat inputs.
        self._objects: tuple[Any, ...] | None = None
        # Held by a miss while it looks again, compiles and adds the entry, so that threads missing on one
        # signature at once trace it once; hits never take it (docs/design.md, "Threads"). Re-entrant: code run
        # under it (a lazy module's eager first call) may call this function again on the same thread.
        self._compile_lock = threading.RLock()
        _take_names(self, fn)

    def __reduce__(self) -> str | tuple[Any, ...]:
        # Pickled as the function (by reference) and the options; the cache is rebuilt on the first calls.
        # A jitted function bound to its own name in its module (`@minijit.jit`) is pickled by that name.
        module = sys.modules.get(getattr(self, "__module__", None) or "")
        name = getattr(self, "__qualname__", None)
        if isinstance(name, str) and getattr(module, name, None) is self:
            return name
        options = self.options()
        return (JitFunction, (self.fn, options["executors"], options["cache"], options["warn_retraces_after"],
                              options["cuda_graphs"], options["max_entries"]))

    def minijit_traced_callable(self) -> Callable[..., Any]:
        """What code traced by minijit calls in place of this jitted function: the function, traced inline."""
        return self.fn

    def options(self) -> dict[str, Any]:
        """The `jit` options this function was made with (executors by name where that name finds them)."""
        executors = None if self._given_executors is None else [_by_name(e) for e in self._given_executors]
        return {"executors": executors, "cache": self.cache_mode, "warn_retraces_after": self.warn_retraces_after,
                "cuda_graphs": self.cuda_graphs, "max_entries": self._limit.max_entries}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # `_dispatch`'s first question, asked here for the common call (plain tensors passed positionally): is it
        # a hit? First the last entry's exact check (one C call over the tensors' metadata, which implies the key)
        # with grad mode; else one compiled key function and one dict lookup. Then the entry's guard if it has
        # one, and the compiled trace, which takes the arguments as they are. A run that fails a value check or
        # raises in a user's `try` goes on to `_serve`, with that outcome.
        fast = self._fast
        if (fast is not None and not kwargs and len(args) == fast[0] and is_grad_enabled() is fast[1]
                and fast[2](*args) and (fast[3] is None or fast[3](*args))):
            self._hits += 1
            try:
                return fast[4](*args)
            except (ValueGuardMiss, RaisedInTry) as failed:
                return self._serve(args, kwargs, (args, kwargs), (Decision(HIT, fast[5]), failed))[0]
        if not kwargs and len(args) < 16:
            key = self._keys[len(args)](*args)
            if key is not None:
                entries = self._entries.get(key)
                if entries is not None:
                    entry = entries[0]  # other entries under this key: `_dispatch` tries them
                    if entry.guard is None or entry.guard(*args):
                        self._hits += 1
                        if entry is not self._last:  # (the same entry: the same key, so the same grad mode)
                            self._remember(entry, key[0])
                        try:
                            return entry.computation(*args)
                        except (ValueGuardMiss, RaisedInTry) as failed:
                            return self._serve(args, kwargs, (args, kwargs), (Decision(HIT, entry), failed))[0]
        objects = self._objects
        if objects is not None and not kwargs and len(args) == objects[0] and objects[1](*args) and (
                objects[2] is None or objects[2]()):
            self._hits += 1
            try:
                return objects[3]()
            except (ValueGuardMiss, RaisedInTry) as failed:
                return self._serve(args, kwargs, (args, kwargs), (Decision(HIT, objects[4]), failed))[0]
        return self._call_general(args, kwargs)

    def _call_general(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        stand_in = standing_in(args, kwargs)
        if stand_in is None:
            return self._serve(args, kwargs, (args, kwargs))[0]
        # An iterator argument: the trace takes the items it has left; an eager run takes the iterator itself.
        given = args, kwargs
        args, kwargs, originals = stand_in
        result, ran = self._serve(args, kwargs, given)
        if ran is not None:
            advance(originals, ran.capture.iterators_consumed)
        return result

    def _serve(self, args: tuple[Any, ...], kwargs: dict[str, Any], given: tuple[tuple[Any, ...], dict[str, Any]],
               after: tuple[Decision, Exception] | None = None) -> tuple[Any, CompiledEntry | None]:
        """Serve a call: what `_dispatch` decides, run here; (the result, the entry that computed it, None where the
        call ran eagerly on the `given` arguments).

        The one loop: a run that fails a value check, or raises inside a user's `try`, tells only by running, so
        its outcome goes back to `_dispatch`, which decides again (a value switch, a miss, an eager run). Nothing
        of such a run landed (see `_switch_value`, minijit.runtime.fallback)."""
        while True:
            decision = self._dispatch(args, kwargs, after)
            if decision.kind is HIT:
                self._hits += 1
            else:
                self._decided[decision.kind] += 1
            entry = decision.entry
            if entry is None:
                return self._run_eagerly(decision.raised, *given), None
            if decision.kept:  # not in the bound's order, nor the hit path's first try
                self._last = entry
            else:
                self._remember(entry, decision.key[0])
                self._objects = (len(args), entry.prologue.check_call, entry.guard, entry.computation, entry) if (
                    not decision.flat and not kwargs and given[0] is args and entry.prologue is not None
                    and not entry.capture.call_plan.writes_arguments and self.cache_mode != "no caching") else None
            # A trace that writes into a list or dict argument finds the caller's through CALL_ARGUMENTS.
            token = CALL_ARGUMENTS.set((*args, *kwargs.values())) if entry.capture.call_plan.writes_arguments else None
            try:
                return entry.computation(*decision.flat), entry
            except (ValueGuardMiss, RaisedInTry) as failed:
                after = decision, failed.with_traceback(None)  # its traceback would hold this frame: a cycle
            finally:
                if token is not None:
                    CALL_ARGUMENTS.reset(token)

    def _dispatch(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                  after: tuple[Decision, Exception] | None) -> Decision:
        """What to do with the call, from its key, the entries held and their guards, and `after` (the decision
        last run for this call and what its run raised): a hit, a rebind, a value switch, a miss (traced here) or
        an eager run. Entries are tried in this order: those under the call's key (`_find`); with cache="automatic"
        gone symbolic, those traced with constant values before (`_find_kept`); then, under the compile lock, those
        under the key again (another thread may have added one), an entry moved to the call's objects, a trace."""
        if after is not None:
            ran, failed = after
            if isinstance(failed, RaisedInTry):
                return Decision(EAGER, raised=failed)
            if not ran.kept:
                return self._switch_value(ran, failed, args, kwargs)
            # An entry kept from constant values failed a value check: the symbolic entries take the call.
        symbolic = self._symbolic
        key = cache_key(args, kwargs, symbolic=symbolic, memo=self._key_memo)
        flat = flat_inputs(args, kwargs, symbolic=symbolic)
        if after is None:
            entry = self._find(key, flat)
            if entry is not None:
                return Decision(HIT, entry, key, flat)
            kept = self._find_kept(args, kwargs) if self._kept_constant else None
            if kept is not None:
                return kept
        with self._compile_lock:
            # Went symbolic meanwhile (cache="automatic", in another thread's miss): the key and inputs are read anew.
            if self._symbolic is not symbolic:
                symbolic = self._symbolic
                key, flat = cache_key(args, kwargs, symbolic=symbolic), flat_inputs(args, kwargs, symbolic=symbolic)
            entry = self._find(key, flat)
            if entry is not None:
                return Decision(HIT, entry, key, flat)
            return self._rebind_or_miss(key, args, kwargs, flat)

    def _find(self, key: tuple[Any, ...], flat: list[Any]) -> CompiledEntry | None:
        """The first entry under `key` whose guard `flat` passes, or None. The entry used last is tried first where
        it is under `key`: a decode loop past a branch (a sliding window filled) stays with the entry of its side,
        not trying the guards of the entries before it on every call."""
        entries = self._entries.get(key, ())
        last = self._last
        if len(entries) > 1 and any(e is last for e in entries):
            entries = [last, *(e for e in entries if e is not last)]
        return next((e for e in entries if e.guard is None or e.guard(*flat)), None)

    def _find_kept(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Decision | None:
        """An entry traced with constant values before the switch to symbolic values that serves the call, found (a
        hit) or moved to the call's objects (a rebind); None where none does."""
        key, flat = cache_key(args, kwargs, symbolic=False), flat_inputs(args, kwargs, symbolic=False)
        kept = self._kept_constant
        entry = next((e for e in kept.get(key, ()) if e.guard is None or e.guard(*flat)), None)
        if entry is not None:
            return Decision(HIT, entry, key, flat, kept=True)
        with self._compile_lock:
            moved = self._rebind_in(kept, key, args, kwargs, flat, symbolic=False)
            if moved is None:
                return None
            kept[key] = [moved[0], *kept.get(key, ())]
        return Decision(REBIND, moved[0], key, flat, kept=True)

    def _rebind_or_miss(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
                        flat: list[Any]) -> Decision:
        """Under the compile lock, for a call no entry serves: an entry moved from other objects to the call's (a
        rebind, minijit.runtime.rebind) in place of that one, else one traced (a miss), put into the cache; an
        eager run where the code raised while traced."""
        if self.cache_mode != "no caching":
            found = self._rebind_in(self._entries, key, args, kwargs, flat, self._symbolic)
            if found is not None:
                self._limit.remove(found[1])
                self._add(key, found[0])
                return Decision(REBIND, found[0], key, flat)
        symbolic = self._symbolic
        entry = self._miss(key, args, kwargs, flat, self._entries.get(key, []))
        if isinstance(entry, RaisedWhileTracing):  # nothing to cache
            return Decision(EAGER, raised=entry)
        if self._symbolic is not symbolic:  # went symbolic (cache="automatic"): the key and the inputs change
            key, flat = cache_key(args, kwargs, symbolic=True), flat_inputs(args, kwargs, symbolic=True)
        if self.cache_mode != "no caching":
            check = exact_tensor_check(args) if not kwargs and not key[1] else None  # autocast off: see it
            if check is not None:
                entry.exact_check, entry.exact_arity = check, len(args)
                entry.exact_guard = entry.prologue.exact_guard if entry.prologue is not None else entry.guard
            self._add(key, entry)  # complete before other threads can find it
        return Decision(MISS, entry, key, flat)

    def _switch_value(self, ran: Decision, miss: ValueGuardMiss, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Decision:
        """After `ran`'s entry failed a value check: the entry made first under the call's key for the value the
        check saw (a value switch), else one traced (a miss); an eager run where that trace raised.

        Nothing of the failed run landed: its checks come before any write into an input, the outside
        state is replayed after the trace, and the random generators were put back. An entry traced
        for this very call that fails is an error: the value is not what the capture read.
        """
        key = cache_key(args, kwargs, symbolic=self._symbolic)
        flat = flat_inputs(args, kwargs, symbolic=self._symbolic)
        with self._compile_lock:
            self._info.value_switches += 1
            if ran.kind is MISS:
                raise ValueGuardError(value_miss_reason(ran.entry, miss, fresh=True))
            path = (*ran.entry.value_path[:miss.ordinal], miss.observed)
            entries = self._entries.get(key, [])
            kind, entry = VALUE_SWITCH, next((e for e in entries if e.value_path[:len(path)] == path
                                              and (e.guard is None or e.guard(*flat))), None)
            if entry is None:
                reason = value_miss_reason(ran.entry, miss)
                if sum(1 for e in entries if e.value_path) >= self.max_value_entries:
                    raise ValueGuardError(f"{reason}; {self.max_value_entries} entries were traced for the values "
                                          "this function reads from its tensors, the most allowed: compute with "
                                          "tensors (torch.where, masks) instead of reading so many different values")
                self._hits_undone += 1  # the call missed: the hit that ran `ran` is not one
                self._note_miss(reason)
                kind, entry = MISS, self._compile(args, kwargs)
                if isinstance(entry, RaisedWhileTracing):
                    return Decision(EAGER, raised=entry)
                if self.cache_mode != "no caching":
                    self._add(key, entry)
                    entries = self._entries.get(key, [])  # (the bound may have dropped one of them)
            if self.cache_mode != "no caching":
                # The most recent first, so that the hit path tries it first; a new list, so that a thread
                # reading the old one meanwhile reads it whole.
                self._entries[key] = [entry, *(e for e in entries if e is not entry)]
        return Decision(kind, entry, key, flat)

    def _add(self, key: tuple[Any, ...], entry: CompiledEntry) -> None:
        """Under the compile lock: hold `entry` under `key`, dropping the least recently used entries past the bound
        (minijit.runtime.entry_limit). Lists are replaced, not changed, as everywhere: hits read them unlocked."""
        behind = self._behind.pop(id(entry), None)
        kept = [e for e in self._entries.get(key, ()) if e is not behind]
        self._entries[key] = [*kept, entry] if behind is None else [*kept, entry, behind]
        for old_key, old in self._limit.add(key, entry):
            _take_out(self._entries, old_key, old)
            if self._limit.evictions == 1:
                name = getattr(self.fn, "__qualname__", repr(self.fn))
                warnings.warn(f"minijit: {name} has {self._limit.max_entries} cache entries, the most allowed: each new "
                              "one now drops the least recently used (traced again if called again). Many different "
                              "shapes? jit(..., cache='symbolic values') traces one entry for all sizes; or raise "
                              "jit(..., max_entries=N)", CacheLimitWarning, stacklevel=_users_stacklevel())
        self._info.entries = len(self._limit)
        self._info.evictions = self._limit.evictions

    def _note_miss(self, reason: str) -> None:
        """Count a miss and keep its reason: the first and the last KEPT_REASONS (CacheInfo)."""
        self._info.misses += 1
        reasons = self._info.miss_reasons
        reasons.append(reason)
        if len(reasons) > 2 * KEPT_REASONS:
            del reasons[KEPT_REASONS]
            self._info.dropped_reasons += 1
        self._warn_retrace(reason)

    def _remember(self, entry: CompiledEntry, grad: bool) -> None:
        """Make `entry` the last one, which the next call's hit path tries first (with the grad mode of its key)."""
        self._limit.used(entry)
        self._last = entry
        self._fast = None if entry.exact_check is None else (
            entry.exact_arity, grad, entry.exact_check, entry.exact_guard, entry.computation, entry)

    def _run_eagerly(self, raised: RaisedInTry | RaisedWhileTracing, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        """The call whose compiled trace raised inside a user's `try`, or whose code raised while it was traced,
        run as eager runs it (minijit.runtime.fallback)."""
        self._info.eager_calls += 1
        if raised.reason not in self._info.eager_reasons and len(self._info.eager_reasons) < 20:
            self._info.eager_reasons.append(raised.reason)
        eager = getattr(self.fn, "run_eagerly", self.fn)
        if isinstance(raised, RaisedWhileTracing):
            name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
            return eager_after_raise(raised, lambda: eager(*args, **kwargs), name)
        return eager(*args, **kwargs)

    def _rebind_in(self, held: dict[tuple[Any, ...], list[CompiledEntry]], call_key: tuple[Any, ...],
                   args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any], symbolic: bool
                   ) -> tuple[CompiledEntry, CompiledEntry] | None:
        """An entry of `held` (traced with symbolic values or not) moved to this call's objects of the same types
        (minijit.runtime.rebind): (the new entry, the one it was moved from, taken out of `held`), or None.
        `call_key`: the call's key, made as `held`'s keys were."""
        # Only entries specialised on argument objects, under a key that differs from the call's in those objects
        # alone, can be moved: the others are passed over cheaply (a decode step tried the prefill's entry).
        found = [(key, e) for key, entries in held.items() for e in entries
                 if e.arg_objects and differs_in_objects_only(key, call_key)]
        if not found:
            return None
        shared = held_by_bound_self(self.fn)  # (the same for every entry tried)
        for key, entry in reversed(found):
            moved = rebind(entry, self.fn, args, kwargs, flat, symbolic, shared)
            if moved is not None:
                _take_out(held, key, entry)  # its objects are the previous call's: the entries stay as many
                self._info.rebound += 1
                return moved, entry
        return None

    def _miss(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any],
              same_key: list[CompiledEntry]) -> CompiledEntry | RaisedWhileTracing:
        # The entry used last where it is under the key, else the newest.
        last = next((e for e in same_key if e is self._last), same_key[-1] if same_key else None)
        if self.cache_mode == "no caching":
            reason = "caching is off (cache='no caching')"
        else:
            # Against the most recently used entries only: a miss costs the same however many entries there are.
            previous = [e.prologue for e in self._limit.recent(EXPLAINED_AGAINST)]
            reason = explain_miss(previous, [last.prologue] if last is not None else [], args, kwargs, flat)
        self._note_miss(reason)
        if same_key and self._numbers is not None:
            entry = self._compile_with_dynamic_numbers(key, args, kwargs, flat, same_key)
            if entry is not None:
                return entry
        # A call failing only the checks of tensors read from outside, and those by their sizes alone (the cache an
        # encoder-decoder's decoder grows, called with one new token each time), misses by its sizes as one whose
        # arguments' sizes differ does: with cache="automatic" it goes symbolic. Once symbolic, the entry it failed
        # kept those sizes constant: the new trace, with them symbolic, serves its calls too and replaces it (kept,
        # it would be one more entry to rebind to the next generate()'s cache).
        failed = (None if not same_key or self._automatic is None
                  else same_key[-1] if not self._symbolic else last)
        sizes_only = (failed is not None and failed.prologue is not None
                      and failed.prologue.differs_in_captured_sizes(args, kwargs, flat))
        entry = self._compile_miss(args, kwargs, reason, flat, guard_failed=bool(same_key) and not sizes_only)
        if sizes_only and self._symbolic and failed in same_key and isinstance(entry, CompiledEntry):
            _take_out(self._entries, key, failed)
            self._limit.remove(failed)
        return entry

    def _compile_with_dynamic_numbers(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
                                      flat: list[Any], same_key: list[CompiledEntry]
                                      ) -> CompiledEntry | RaisedWhileTracing | None:
        """Where the call failed the guard of an entry under its key by numbers read from outside that changed (not
        yet dynamic sources), the entry traced with them symbolic (minijit.runtime.dynamic), in place of that one
        where they were all it failed; None where it did not, or where that trace was refused (they then stay
        constant)."""
        assert self._numbers is not None
        for old in reversed(same_key[-EXPLAINED_AGAINST:]):  # a miss costs the same however many entries
            failed = old.prologue.failed_checks(args, kwargs, flat) if old.prologue is not None else None
            reads = [(c.read, current_value(c.read)) for c in failed or () if c.read is not None]
            keys = self._numbers.made_dynamic(reads)
            if keys:
                break
        else:
            return None
        try:
            entry = self._compile(args, kwargs)
        except MinijitError as refused:
            self._numbers.refuse(keys, refused)
            return None
        if isinstance(entry, RaisedWhileTracing):
            self._numbers.undo(keys)
            return entry
        if failed is not None and len(reads) == len(failed):
            # It differed by nothing else: the new entry serves such calls, and is tried before it. It stays behind
            # the new one, for the calls of its values where the new trace's branches go another way (a sliding
            # window's steps before it fills: traced at length 7, the new entry branches on `length + 1 >= 8`).
            self._behind[id(entry)] = old
        return entry

    def _compile_miss(self, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str, flat: list[Any],
                      guard_failed: bool = False) -> CompiledEntry | RaisedWhileTracing:
        """The entry for a missing call; with cache="automatic", traced with symbolic sizes and numbers from the
        first call that misses only by those (minijit.runtime.dynamic). A call that failed the guard of an entry
        under its own key (strides, aliasing, a value read from outside) differs by more than its sizes."""
        auto = self._automatic
        shapes = tensor_shapes(self.fn, args, kwargs) if auto is not None else []
        if auto is None or guard_failed or not auto.should_switch(args, kwargs):
            if auto is not None and auto.switched:  # a size kept constant that this call differs in goes symbolic
                auto.widen(args, kwargs, shapes)
            entry = self._compile(args, kwargs)
            if auto is not None and not self._symbolic and isinstance(entry, CompiledEntry):
                auto.traced_constant(args, kwargs, shapes, entry.capture.state_sizes)
            return entry
        auto.switch(reason, args, kwargs, shapes)
        self._set_symbolic(True)
        # The numbers read from outside that changed since the entry used last go symbolic with the sizes, in the
        # same trace, as torch.compile's automatic dynamic does (a cache's length counter: prefill, then decode).
        last = self._last.prologue if self._last is not None else None
        changed = last.changed_reads(args, kwargs, flat) if last is not None and self._numbers is not None else []
        numbers = self._numbers.made_dynamic([(c.read, current_value(c.read)) for c in changed]) if changed else []
        try:
            entry = self._compile(args, kwargs)
        except MinijitError as refused:
            auto.refuse(refused)
            self._set_symbolic(False)
            if numbers:
                self._numbers.undo(numbers)
            return self._compile(args, kwargs)  # constant values from now on: nothing to note
        if isinstance(entry, RaisedWhileTracing):  # the code raised: no reason to switch yet
            auto.undo()
            self._set_symbolic(False)
            if numbers:
                self._numbers.undo(numbers)
            return entry
        # The entries traced with constant values are keyed as this mode no longer keys a call: kept apart.
        self._kept_constant = self._entries
        self._entries = {}
        self._limit.clear()
        self._info.entries = 0
        self._fast = self._objects = None
        return entry

    def _set_symbolic(self, symbolic: bool) -> None:
        self._symbolic = symbolic
        self._keys = POSITIONAL_TENSOR_SYMBOLIC_KEYS if symbolic else POSITIONAL_TENSOR_KEYS

    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompiledEntry | RaisedWhileTracing:
        """The entry compiled for the call, or, where its code raised while traced, the `RaisedWhileTracing` to
        run it eagerly with (returned, not raised: the eager run must not see it as the exception being handled)."""
        auto = self._automatic if self._symbolic else None
        constant_sizes = auto.constant_sizes(args, kwargs) if auto is not None else None
        try:
            entry = compile_for(self.fn, args, kwargs, self.executors, symbolic=self._symbolic,
                                cuda_graphs=self.cuda_graphs, numbers=self._numbers, constant_sizes=constant_sizes,
                                state_sizes=auto.state_sizes(args, kwargs) if auto is not None else None)
        except RaisedWhileTracing as raised:
            return raised
        if auto is not None:
            auto.traced_symbolic(args, kwargs, entry.capture.state_sizes)
        return entry

    def _warn_retrace(self, reason: str) -> None:
        if self.warn_retraces_after is not None and self._info.misses > self.warn_retraces_after:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            warnings.warn(f"minijit traced {name} again (miss {self._info.misses}): {reason}", RetraceWarning,
                          stacklevel=_users_stacklevel())

    def last_traces(self) -> list[Trace]:
        """The traces of the last call, one per pass."""
        if self._last is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last.traces

    def last_backward_traces(self) -> list[Trace]:
        """The backward traces of the last call, one per pass (empty when it did not differentiate)."""
        if self._last is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last.backward_traces

    def last_entry(self) -> CompiledEntry:
        """The last call's cache entry: its traces, and what capture and the passes found (`capture`, `split`, ...)."""
        if self._last is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last

    def last_prologue(self) -> str:
        """The checks the last call's cache entry makes: the Python source that was compiled and runs."""
        if self._last is None or self._last.prologue is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last.prologue.source

    def last_epilogue(self) -> str:
        """What the last call's cache entry runs around its compiled trace: the Python source that was compiled."""
        if self._last is None or self._last.epilogue is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last.epilogue.source

    def cache_info(self) -> CacheInfo:
        """Hits, misses and entries of this function's cache."""
        self._info.hits = self._hits - self._hits_undone
        self._info.decisions = {HIT: self._hits, **self._decided}
        self._info.dynamic = ((list(self._automatic.decisions) if self._automatic is not None else [])
                              + (list(self._numbers.decisions) if self._numbers is not None else []))
        # A copy of the cache's lists (one C call each): other threads may be adding entries.
        held = list(self._entries.values())
        # Of the entries held (those evicted are gone): what each that reads values from its tensors checks.
        self._info.value_guards = ["; ".join(c.describe() for c in e.capture.value_checks)
                                   for entries in held for e in entries if e.value_path]
        self._info.cuda_graphs = [part.describe() for entries in held for e in entries
                                  if e.graphs is not None for part in e.graphs.parts
                                  if part.replays or part.ordinary]
        return self._info
