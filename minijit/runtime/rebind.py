"""Reusing a cache entry for a new object of the same kind as one it was traced with (no re-trace).

An object passed to a jitted function (not a tensor, not a container) is specialised on by
identity, and what the trace read from it and wrote into it is held by reference: guards on its
attributes, the sources of the tensors it holds, the effects replayed into it. Hugging Face's
`generate()` makes a new cache object for every call and passes it to the jitted forward on each
step; without this module every `generate()` would trace again.

On a miss whose only difference from an entry is the identity of such objects (of the same
types), `rebind` walks the old and the new object side by side (attributes, list and dict items)
and pairs the objects found at the same places. If every object of the old one that the entry
refers to has a partner, the entry is copied with each reference moved to the partner, and its
prologue is compiled again: the new entry's guard checks the new objects afresh, and is run
before the entry is used, so a partner in another state is a miss (then a trace), never a wrong
hit. The compiled trace itself is shared.

A guard on an object's identity stands for everything the trace assumed of it without a guard of
its own, so only objects whose whole state the walk pairs are paired: plain objects (all their
state in `__dict__`), lists, tuples and dicts, closure cells, weakrefs, and functions of the same
code, globals and defaults (their cells paired). A partial, a C object, another function is
never moved. The pairing is one to one (one object at two places of the old argument must be
one in the new), and tensors are paired too where the entry uses them by identity: the keys of
an optimizer's state. What the entry keeps as it is must not hold the old argument: a tensor of it
the trace holds as a constant, a value (a lambda the trace made over it) that refers into it, refuse.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from minijit.frontend import GuardEntry
from minijit.frontend.guards import (
    MISSING,
    NumberSlot,
    Source,
    TensorSeen,
    bound_key,
    has_snapshot,
    is_constant,
    is_symbolic_number_value,
    may_have_guarded_attributes,
    own_dict,
)
from minijit.frontend.outside import Effect
from minijit.ir.containers import Constant, Mapping, Registered, Sequence, Spec
from minijit.runtime.arguments import call_checks, object_arguments
from minijit.runtime.call_plan import CallPlan
from minijit.runtime.checks import KEY_VALUE_KINDS, Check, Prologue, moved_read_check, read_check
from minijit.runtime.guards import compile_prologue
from minijit.runtime.read_groups import SEEN

_DEPTH = 8


def rebind(entry: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any],
           symbolic: bool, shared: set[int] | None = None) -> Any | None:
    """A copy of `entry` for these arguments, which differ from its own only in objects of the same types,
    when its guard holds for them; else None. `shared`: `held_by_bound_self(fn)`, where the caller has it (the same
    for each entry it tries)."""
    if entry.split is not None or not entry.arg_objects or getattr(fn, "state_checks", None) is not None:
        return None  # a jitted module's tree state is an interned object whose identity is its meaning
    params, checks = _entry_call_checks(entry, args, kwargs) or call_checks(fn, args, kwargs, symbolic)
    base = entry.prologue.reads_at  # (the call's checks come first: a model's thousand reads after them)
    old = [c for c in (entry.prologue.checks if base is None else entry.prologue.checks[:base]) if c.keyed]
    new = [c for c in checks if c.keyed]
    if params != entry.prologue.params or len(old) != len(new):
        return None
    for o, n in zip(old, new, strict=True):
        if o.aspect != n.aspect or o.subject != n.subject:
            return None
        if o.aspect == "object" and o.expected[0] is n.expected[0] and _plain(o.expected[0]):
            continue
        if o.key_values() != n.key_values():
            return None
    objects = object_arguments(params, checks, args, kwargs)
    if all(now is before for (_, before), (_, now) in zip(entry.arg_objects, objects)):
        return None  # nothing to move: the copy would be the entry, whose checks this call did not pass
    pairs = _Pairs(held_by_bound_self(fn) if shared is None else shared)
    try:
        if len(objects) != len(entry.arg_objects):
            return None
        for (_, before), (_, now) in zip(entry.arg_objects, objects, strict=True):
            pairs.walk(before, now, 0)
        if any(pairs.moves(t) for t in entry.capture.constants):
            return None  # the trace holds a tensor of the old argument as a constant (a key it iterated over)
        refs = _guard_refs(entry)
        guards = list(entry.capture.guards)
        moved = []
        for i in sorted({i for held in pairs.reached if held in refs for i in refs[held]}):
            g = guards[i]
            guards[i] = pairs.guard(g, entry.prologue.env.get(f"_v{i}"))
            if guards[i] is not g:
                if not _may_hold(guards[i]):
                    return None  # a value read from the new objects differs: no need to compile a guard to know
                moved.append(i)
        looks = _source_looks(entry)
        captured = list(entry.capture.captured_inputs)
        for k in looks[0]:
            name, source, t = captured[k]
            captured[k] = (name, pairs.source(source), t)
        capture = dataclasses.replace(entry.capture, guards=guards, captured_inputs=captured,
                                      call_plan=pairs.plan(entry.capture.call_plan, looks[1]))
    except _Unpaired:
        return None
    copy = dataclasses.replace(entry, capture=capture, arg_objects=objects)
    env, env_refs = _moved_env(entry.prologue, pairs)
    names = len(env)
    copy.prologue = _moved_prologue(entry, capture, checks, moved, env)
    if copy.prologue is None:  # (the environment the moved checks were tried in is left: it may hold more names)
        copy.prologue = compile_prologue(copy, (params, checks), tuple(kwargs), copy.constraints,
                                         (_moved_env(entry.prologue, pairs)[0], _kept(entry, guards)))
    elif len(env) == names:  # (a name the moved checks bound is in no table: it is made again where needed)
        copy.prologue.env_refs = env_refs
    copy.prologue.source_looks = looks  # (the sources are moved in place: at the same positions)
    copy.guard = copy.prologue.guard
    if not copy.prologue.holds(args, kwargs, flat):
        return None
    entry.prologue.guard_refs = None  # (its table becomes the moved entry's)
    copy.prologue.guard_refs = (guards, _moved_refs(refs, pairs))
    copy.epilogue = entry.epilogue.rebound(capture.call_plan, pairs.partner)
    copy.computation = copy.epilogue.function
    return copy


def _entry_call_checks(entry: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                       ) -> tuple[list[str], list[Check]] | None:
    """The call's checks (`call_checks`, which walks the arguments again), made from the entry's own: each check of
    an object's identity names the call's object. The caller found the call's key the entry's but for objects'
    identities (`differs_in_objects_only`), and the key is made of what the checks check; `check_call` makes them
    all on the call anyway (`Prologue.holds`). None where the prologue does not keep its call's checks apart
    (`reads_at`), or an object's subject cannot be read from the arguments."""
    prologue = entry.prologue
    if prologue.reads_at is None:
        return None
    old = prologue.checks[:prologue.reads_at - len(entry.constraints)]
    objects = iter(object_arguments(prologue.params, old, args, kwargs))
    checks = []
    for check in old:
        if check.aspect == "object":
            found = next(objects, None)
            if found is None:  # (a subject that is not a plain expression over the parameters)
                return None
            x = found[1]
            if id(x) != check.expected[1]:
                check = dataclasses.replace(check, expected=(type(x), id(x)))
        checks.append(check)
    return list(prologue.params), checks


def differs_in_objects_only(entry_key: tuple[Any, ...], call_key: tuple[Any, ...]) -> bool:
    """Whether cache keys `entry_key` and `call_key` (made alike, minijit.runtime.cache_key) differ only in the
    identities of objects of one type: a quick filter before `rebind`, which needs keys equal elsewhere. An object
    puts its type and then its id into a key; nothing else puts an int after another class."""
    if len(entry_key) != len(call_key):
        return False
    for i, (a, b) in enumerate(zip(entry_key, call_key)):
        if a is not b and a != b and not (
                i and type(a) is int and type(b) is int and isinstance(before := entry_key[i - 1], type)
                and before is call_key[i - 1] and before not in KEY_VALUE_KINDS):
            return False
    return True


def _refs(g: GuardEntry) -> list[int]:
    """ids of the objects guard entry `g` refers to: what it reads through (its namespace and the holders of its
    source), the value it compares with, its shadow. It moves in a rebind only where one of them does."""
    held, keys, ns = [], list(_keys(g)), g.namespace
    while isinstance(ns, Source):
        keys.append(ns.key)
        ns = ns.holder
        held.append(ns)
    held += [ns, g.value, g.shadow]
    # Only what `_Pairs.walk` can reach (a number, None or a module never moves itself; a tensor moves only where
    # it is a key: its values are read afresh through sources). What a tuple holds counts as named by the entry
    # itself: `table[(cache, 0)]` reads through the cache as much as `cache.x` does (a tuple, made anew by whoever
    # builds the key, is never part of the argument the walk pairs).
    return ([id(x) for x in _with_tuple_items(held) if _walked_kind(type(x))]
            + [id(k) for k in _with_tuple_items(keys) if isinstance(k, torch.Tensor) or _has_parts(k)])


def _with_tuple_items(values: list[Any]) -> list[Any]:
    """`values`, and the items of those that are tuples, and of theirs."""
    found = []
    while values:
        x = values.pop()
        found.append(x)
        if type(x) is tuple:
            values.extend(x)
    return found


def _keys(g: GuardEntry) -> tuple[Any, ...]:
    """The keys guard entry `g` names: objects and tensors among them are compared by identity."""
    if g.kind in ("item", "contains"):
        return (g.name,)
    return tuple(g.value) if g.kind == "keys" else ()


def _guard_refs(entry: Any) -> dict[int, tuple[int, ...]]:
    """For each object the entry's guard entries refer to (by id), the positions of those entries: built once per
    entry, then carried to its rebound copies (`_moved_refs`), so that a rebind visits only the guards of the
    objects it moves, not the thousand that read the model."""
    kept = entry.prologue.guard_refs
    if kept is not None and kept[0] is entry.capture.guards:
        return kept[1]
    refs: dict[int, tuple[int, ...]] = {}
    for i, g in enumerate(entry.capture.guards):
        for held in set(_refs(g)):
            refs[held] = (*refs.get(held, ()), i)
    entry.prologue.guard_refs = (entry.capture.guards, refs)
    return refs


def _source_looks(entry: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The positions of the entry's captured inputs, and of its call plan's captured tensors, whose sources a rebind
    may move or refuse (`_may_move_source`): made once per entry, then carried to its rebound copies. The others (a
    model's parameters, read through the module) are the same sources in the copy, and not looked at."""
    kept = entry.prologue.source_looks
    if kept is not None:
        return kept
    looks = (tuple(k for k, (_, s, _) in enumerate(entry.capture.captured_inputs) if _may_move_source(s)),
             tuple(k for k, (s, _) in enumerate(entry.capture.call_plan.captured) if _may_move_source(s)))
    entry.prologue.source_looks = looks
    return looks


def _may_move_source(s: Any) -> bool:
    """Whether `_Pairs.source` may change source `s`, or refuse it: where it reads through a tensor or an object with
    parts (its holder, a key of an item), which a walk may reach, or find holding part of the old argument. A module,
    a class, a number is never reached, nor looked into (`_Pairs.move`)."""
    while isinstance(s, Source):
        if s.access == "item" and _may_move(s.key):
            return True
        s = s.holder
    return _may_move(s)


def _may_move(x: Any) -> bool:
    if type(x) is tuple:
        return any(_may_move(k) for k in x)
    return not is_constant(x) and (isinstance(x, torch.Tensor) or _walked_kind(type(x)))


def _moved_refs(refs: dict[int, tuple[int, ...]], pairs: _Pairs) -> dict[int, tuple[int, ...]]:
    """`refs` for the moved guard entries, changed in place (its entry is being replaced by the moved one): the
    positions that referred to an object of the old argument refer to its partner, as each reference to it moved
    there. (A value compared with its copy keeps the copy, which no walk reaches: its position stays with the
    partner, where visiting the entry again changes nothing.)"""
    partner = pairs.partner
    for held in pairs.reached.intersection(refs):
        positions = refs.pop(held)
        if held in partner:
            now = id(partner[held])
            refs[now] = tuple(dict.fromkeys((*refs.get(now, ()), *positions)))
    return refs


def _moved_prologue(entry: Any, capture: Any, call: list[Check], moved: list[int],
                    env: dict[str, Any]) -> Prologue | None:
    """The old prologue with the checks of the `moved` values read (and the call's) made anew over `env`, where
    every test reads word for word as before (the usual case: the objects moved keep their names in `env`); None
    otherwise (then `compile_prologue` makes it). Only what moved is looked at: the checks of a model's thousand
    reads are the old ones, and the source is not generated again. Where the old prologue was itself made so, by
    moving the same checks and sources (its `_Recipe`), their words are not generated again either."""
    old = entry.prologue
    base = old.reads_at
    if (base is None or len(call) != base - len(entry.constraints)
            or not len(old.captured) == len(capture.captured_inputs) == len(entry.capture.captured_inputs)):
        return None
    checks, tests = list(old.checks), old.tests.copy()  # (`copy`: a dict its rebinds popped from copies fastest so)
    recipe = _Recipe.of(checks, call, moved, capture.captured_inputs, entry.capture.captured_inputs)
    known = recipe == old.recipe
    for position in recipe.calls:
        before, check = checks[position], call[position]
        if known and check.aspect == "object":
            test = tests.pop(id(before))  # (the id's name in `env` is bound to the call's object's id: `_moved_env`)
        elif before.keyed != check.keyed or tests.pop(id(before)) != (test := check.test(env)):
            return None
        checks[position] = check
        tests[id(check)] = test
    for i in moved:
        before, value = checks[base + i], capture.guards[i]
        if before.read is not entry.capture.guards[i]:
            return None
        if known and _bound_as_before(env, i, value):
            check, test = moved_read_check(before, value), tests.pop(id(before))
        else:
            check = read_check(env, i, value)
            if tests.pop(id(before)) != (test := check.test(env)):
                return None
        checks[base + i], tests[id(check)] = check, test
    # (a source that did not move reads through the objects it did, under the same names)
    if not known and any((name, source.expression(env)) != old.captured[k]
                         for k in recipe.sources for name, source, _ in (capture.captured_inputs[k],)):
        return None
    moved_prologue = old.moved(checks, tests, env)
    moved_prologue.recipe = recipe
    return moved_prologue


def _bound_as_before(env: dict[str, Any], i: int, value: GuardEntry) -> bool:
    """Whether `env` binds what the moved guard entry `value` (the `i`th) refers to under the names the old entry's
    test read (`guard_expression`'s): its namespace, shadow and value. The moved environment binds each object's
    partner under the object's names (`_moved_env`); a tuple of keys is the one object a move makes anew, bound here
    as `guard_expression` binds it."""
    if value.kind == "keys":
        env[f"_v{i}"] = value.value
    return ((isinstance(value.namespace, Source) or env.get(f"_ns{i}") is value.namespace)
            and env.get(f"_g{i}") is value.shadow and env.get(f"_v{i}", value.value) is value.value)


@dataclasses.dataclass(frozen=True)
class _Recipe:
    """What a rebind moved to make a prologue out of the old one, word for word: the positions of the call's checks
    made anew (an object's identity), of the guard entries moved, of the captured inputs' sources moved. A rebind of
    the moved entry that moves the same ones (new objects at the places of the old: another `DynamicCache` of the
    same layers) finds each test the same words over the same names, as the rebind before it found them."""

    calls: tuple[int, ...]
    moved: tuple[int, ...]
    sources: tuple[int, ...]

    @staticmethod
    def of(checks: list[Check], call: list[Check], moved: list[int], captured: list[tuple[str, Source, Any]],
           captured_before: list[tuple[str, Source, Any]]) -> _Recipe:
        """The recipe of a rebind making `call` the call's checks (in place of the first of `checks`), moving the
        guard entries at `moved` and the captured inputs `captured_before` to `captured`."""
        sources = zip(captured, captured_before, strict=True)
        return _Recipe(tuple(p for p, check in enumerate(call) if check is not checks[p]), tuple(moved),
                       tuple(k for k, ((_, now, _), (_, before, _)) in enumerate(sources) if now is not before))


def _moved_env(old: Prologue, pairs: _Pairs) -> tuple[dict[str, Any], dict[int, tuple[str, ...]]]:
    """The old prologue's environment with each object of the old argument replaced by its partner under the same
    name (or dropped: it must not keep a cache's tensors alive), so that the source over it is the old one; and
    the new environment's `env_refs`. Only the names of the objects the walk reached are visited: an environment
    holds a name for each of a model's thousand reads, and few of them are the argument's."""
    partner = pairs.partner
    env = old.env.copy()
    refs = _env_refs(old)
    moved_refs = refs.copy()
    # `bind`'s table of the names bound to each object (by id) and id (by value), changed where they moved: the
    # keys of the old objects' names taken out first, then their partners' put in (a partner may be an old object).
    bound = dict(old.env.get("_bound_names", {}))
    gone: list[tuple[Any, ...]] = []
    now_bound: dict[tuple[Any, ...], str] = {}
    for i in pairs.reached.intersection(refs):
        # (a name whose object changed since the table was made, one of the prologue's own, is not the object's)
        names = [name for name in moved_refs.pop(i) if id(env.get(name, _NOWHERE)) == i]
        now = partner.get(i, _NOWHERE)
        if now is not _NOWHERE:
            env.update(dict.fromkeys(names, now))
            moved_refs[id(now)] = (*moved_refs.get(id(now), ()), *names)
        else:
            for name in names:
                del env[name]
        for name in names:
            key = (i, name.rstrip("0123456789"))
            if bound.get(key) == name:
                gone.append(key)
                if now is not _NOWHERE:
                    now_bound[(id(now), key[1])] = name
    for i, now in partner.items():  # the id of a moved object, bound by value: its partner's, under the same name
        key = (i, "_id", int)
        name = bound.get(key)
        if name is not None and name in env:
            gone.append(key)
            env[name] = id(now)
            now_bound[bound_key(id(now), "_id")] = name
    for key in gone:
        bound.pop(key, None)
    bound.update(now_bound)
    for name in _MUTABLE_NAMES:
        if name in env:
            env[name] = type(env[name])(env[name])
    env["_bound_names"] = bound
    return env, moved_refs


def _env_refs(prologue: Prologue) -> dict[int, tuple[str, ...]]:
    """For each object of `prologue`'s environment that a walk may reach (by id), the names bound to it: made once
    per entry, then carried to its rebound copies (`_moved_env`)."""
    if prologue.env_refs is None:
        refs: dict[int, tuple[str, ...]] = {}
        for name, value in prologue.env.items():
            if _reachable_kind(type(value)):
                refs[id(value)] = (*refs.get(id(value), ()), name)
        prologue.env_refs = refs
    return prologue.env_refs


def _kept(entry: Any, guards: list[GuardEntry]) -> dict[int, Check]:
    """What a rebound entry's prologue keeps of the old one, made over the moved environment (`_moved_env`, so that
    the new source is the old one and compiles from `compiled_code`'s cache): the checks of the values read that
    did not move (most read the model), by position. Building a check for each of a model's thousand reads again
    cost most of a rebind, and its garbage set off the collector."""
    old_checks = {id(c.read): c for c in entry.prologue.checks if c.aspect == "read"}
    kept = {i: old_checks[id(g)] for i, (g, before) in enumerate(zip(guards, entry.capture.guards, strict=True))
            if g is before and id(g) in old_checks}
    return kept


# The containers in a prologue's environment that generating it adds to (`bind`, `guard_checks`), or that its guard
# writes into (the dict versions its groups passed with: runtime/read_groups.py).
_MUTABLE_NAMES = ("_TENSOR_TYPES", "_captured_types", SEEN)


class _Unpaired(Exception):
    """An object of the old argument that the entry refers to has no partner in the new one."""


class _Pairs:
    """The objects of an old argument (by id) and their partners at the same places in the new one."""

    def __init__(self, shared: set[int]) -> None:
        # ids of objects the function reaches otherwise (its module's config): never moved to a partner.
        self.shared = shared
        self.partner: dict[int, Any] = {}
        self.taken: dict[int, int] = {}  # id of a partner -> id of the old object it is the partner of
        self.reached: set[int] = set()
        self.tensors: set[int] = set()  # ids of the tensors of the old argument met (paired or not)
        self.refers: dict[int, bool] = {}  # ids of values outside the old argument -> whether they hold part of it
        self.keep: list[Any] = []  # what the ids are of, alive while pairing
        self.sources: dict[int, Source] = {}  # id of a source of the entry (alive in it) -> the source moved

    def walk(self, old: Any, new: Any, depth: int) -> None:
        """Pair `old` with `new`, then what they hold, where both hold the same kind of thing.

        Another module, or another object whose state is not plain data (no `__dict__`: its guards
        could not be moved), in the place of the old one is refused."""
        if id(old) in self.reached:
            if id(old) in self.partner and self.partner[id(old)] is not new:
                raise _Unpaired  # one object at two places of the old argument, two objects in the new one
            return
        if is_constant(old):  # compared by value wherever a guard reads it
            return
        if isinstance(old, torch.Tensor):  # its values are read afresh; its identity matters where it is a key
            self.reached.add(id(old))
            self.tensors.add(id(old))
            self.keep.append(old)
            if isinstance(new, torch.Tensor):
                self._pair(old, new)
            return
        if isinstance(old, torch.nn.Module) or not _has_parts(old):
            if new is not old and (isinstance(old, torch.nn.Module) or may_have_guarded_attributes(old)):
                raise _Unpaired
            return
        self.reached.add(id(old))
        self.keep.append(old)
        if type(new) is not type(old) or (new is not old and (id(old) in self.shared or not _same_make(old, new))):
            self._reach(old, depth)
            return
        self._pair(old, new)
        if depth >= _DEPTH:
            return
        for (k_old, v_old), (k_new, v_new) in _parts(old, new):
            if k_old is k_new or (type(k_old) in (int, str) and k_old == k_new):
                self.walk(v_old, v_new, depth + 1)
            else:
                self._reach(v_old, depth + 1)

    def _pair(self, old: Any, new: Any) -> None:
        """`new` is `old`'s partner, unless it is another old object's already: the trace took two objects for
        distinct (a write into one, then a read of the other) that the new argument makes one."""
        if self.taken.setdefault(id(new), id(old)) != id(old):
            raise _Unpaired
        self.partner[id(old)] = new

    def _reach(self, old: Any, depth: int) -> None:
        """Note `old` and what it holds as parts of the old argument, with no partners."""
        if isinstance(old, torch.Tensor):
            self.tensors.add(id(old))
            self.keep.append(old)
        if not _walked_kind(type(old)) or depth > _DEPTH:
            return
        self.reached.add(id(old))
        self.keep.append(old)
        for v in _held(old):
            if id(v) not in self.reached:
                self._reach(v, depth + 1)

    def moves(self, t: torch.Tensor) -> bool:
        """True where tensor `t` is part of the old argument, and not part of the new one at the same place."""
        return id(t) in self.tensors and self.partner.get(id(t)) is not t

    def move(self, value: Any) -> Any:
        """`value`'s partner if it is part of the old argument (refused without one), else `value`. A tensor used by
        identity (a key of an optimizer's state) must have a partner: it may be part of the old argument at a
        place the walk did not reach, and a tensor is read without a guard on its identity."""
        if id(value) in self.reached:
            if id(value) not in self.partner:
                raise _Unpaired
            return self.partner[id(value)]
        if isinstance(value, torch.Tensor) or self._refers_to_old(value, 0):
            raise _Unpaired  # (a function the trace made, whose closure holds the old argument: it cannot move)
        return value

    def _refers_to_old(self, value: Any, depth: int) -> bool:
        """True where `value`, not itself part of the old argument, holds a part of it (a lambda the trace made and
        stored, closing over the argument): it stays as it is in the moved entry, so it would keep the old one."""
        if id(value) in self.reached:
            return True
        if not _walked_kind(type(value)) or depth > _DEPTH:
            return False
        known = self.refers.get(id(value))
        if known is None:
            self.refers[id(value)] = False  # (a cycle back to it adds nothing)
            self.keep.append(value)
            reached = self.reached  # (a module's dict of parameters holds tensors: no call for each)
            known = self.refers[id(value)] = any(
                id(v) in reached or (_walked_kind(type(v)) and self._refers_to_old(v, depth + 1)) for v in _held(value))
        return known

    def key(self, key: Any) -> Any:
        """A key (of an item read, written, or tested): moved where it is an object or tensor of the old argument."""
        if type(key) is tuple:
            return tuple(self.key(k) for k in key)
        return key if is_constant(key) else self.move(key)

    def source(self, s: Source) -> Source:
        """`s` moved (itself where nothing it reads through moves: most of an entry's guards read the module). Once
        per source: the captured inputs and the call plan share theirs."""
        moved = self.sources.get(id(s))
        if moved is None:
            holder = self.source(s.holder) if isinstance(s.holder, Source) else self.move(s.holder)
            key = self.key(s.key) if s.access == "item" else s.key
            moved = self.sources[id(s)] = (
                s if holder is s.holder and key is s.key else _replaced(s, holder=holder, key=key))
        return moved

    def guard(self, g: GuardEntry, compared: Any) -> GuardEntry:
        """`g` moved (itself where nothing in it moves). `compared` is what the old prologue compares the value read
        with: where that is a copy (a list, dict or set of constants, copied when the trace was made), the copy is
        kept, whatever the container holds now; otherwise the value itself, moved like the rest."""
        namespace = self.source(g.namespace) if isinstance(g.namespace, Source) else self.move(g.namespace)
        if g.kind == "keys":
            value = self.key(tuple(g.value))
            value = g.value if all(a is b for a, b in zip(value, g.value, strict=True)) else value  # (keys: tensors)
        else:
            value = compared if compared is not None and compared is not g.value else self.move(g.value)
        name = self.key(g.name) if g.kind in ("item", "contains") else g.name
        shadow = None if g.shadow is None else self.move(g.shadow)
        if namespace is g.namespace and value is g.value and shadow is g.shadow and name is g.name:
            return g
        return _replaced(g, namespace=namespace, name=name, value=value, shadow=shadow)

    def plan(self, p: CallPlan, looks: tuple[int, ...]) -> CallPlan:
        """Call plan `p` moved (its captured tensors' sources at `looks` only: `_source_looks`); what it says of the
        trace (which results are inputs, whether its effects write into the call's arguments) stays."""
        effects = [(self._effect(e), self.spec(spec)) for e, spec in p.effects]
        captured = list(p.captured)
        for k in looks:
            source, t = captured[k]
            captured[k] = (self.source(source), t)
        return dataclasses.replace(p, captured=captured,
                                   result=None if p.result is None else self.spec(p.result), effects=effects,
                                   passthrough=list(p.passthrough), effect_passthrough=list(p.effect_passthrough),
                                   inputs=list(p.inputs))

    def _effect(self, e: Effect) -> Effect:
        """Effect `e` of a call plan moved (itself where nothing it writes through moves)."""
        holder = self.source(e.holder) if isinstance(e.holder, Source) else self.move(e.holder)
        key = self.key(e.key) if e.op in ("setitem", "delitem") else e.key
        return e if holder is e.holder and key is e.key else _replaced(e, holder=holder, key=key)

    def spec(self, s: Spec) -> Spec:
        """Spec `s` moved (itself where nothing in it moves: a result's specs are read, never changed)."""
        if isinstance(s, Constant):
            value = self.move(s.value)
            return s if value is s.value else Constant(value)
        if isinstance(s, Sequence):
            children = [self.spec(c) for c in s.children]
            return s if _same_items(children, s.children) else Sequence(s.kind, children)
        if isinstance(s, Mapping):
            keys, children = [self.key(k) for k in s.keys], [self.spec(c) for c in s.children]
            attributes = [self.spec(a) for a in s.attributes]
            if _same_items(keys, s.keys) and _same_items(children, s.children) and _same_items(attributes, s.attributes):
                return s
            return Mapping(s.kind, keys, children, list(s.names), attributes)
        if isinstance(s, Registered):
            children = [self.spec(c) for c in s.children]
            return s if _same_items(children, s.children) else Registered(s.kind, s.context, children)
        return s


def _same_items(now: list[Any], before: Any) -> bool:
    return all(a is b for a, b in zip(now, before, strict=True))


def _replaced(record: Any, **changes: Any) -> Any:
    """`dataclasses.replace(record, **changes)` for a record whose `__init__` only stores its fields (a `Source`, a
    `GuardEntry`, an `Effect`: no `__post_init__`, no slots): its fields copied, without running `__init__`, which
    cost most of moving a rebound entry's sources and guard entries."""
    copy = object.__new__(type(record))
    copy.__dict__.update(record.__dict__, **changes)
    return copy


def _may_hold(g: GuardEntry) -> bool:
    """False when the guard entry `g` plainly fails now (a different constant or object read, a different length);
    True otherwise, and whenever it cannot tell: a quick filter before the compiled guard, which decides."""
    ns = g.namespace
    try:
        if isinstance(ns, Source) or g.shadow is not None:
            return True
        if g.kind == "length":
            return len(ns) == g.value
        if g.kind == "attribute":
            now = vars(ns).get(g.name, MISSING)
        elif g.kind == "item" and isinstance(ns, dict):
            now = dict.get(ns, g.name, MISSING)
        else:
            return True
        if isinstance(g.value, TensorSeen):
            return isinstance(now, torch.Tensor)
        if isinstance(g.value, NumberSlot):  # a number from a dynamic source: read afresh, its type checked
            return is_symbolic_number_value(now) and NumberSlot.of(now).types == g.value.types
        if is_constant(g.value) or has_snapshot(g.value):
            return type(now) is type(g.value) and now == g.value
        return now is g.value
    except Exception:
        return True


@functools.cache  # (asked for each object a rebind walks: a class's answer does not change)
def _plain(cls: type) -> bool:
    """Instances of `cls` keep all their state in a `__dict__`: their layout is a plain class's (a type written in C,
    a function or a `functools.partial`, holds state of its own; slots hold values outside the `__dict__`), and it
    is not a module."""
    return (not issubclass(cls, torch.nn.Module) and cls.__dictoffset__ != 0 and cls.__itemsize__ == 0
            and cls.__basicsize__ <= _Plain.__basicsize__
            and not any(s not in ("__dict__", "__weakref__") for c in cls.__mro__ for s in _slots(c)))


class _Plain:
    """The layout of a class whose instances hold nothing but their `__dict__` (and weak references)."""


def _slots(cls: type) -> tuple[str, ...]:
    slots = vars(cls).get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _same_make(old: Any, new: Any) -> bool:
    """What the walk does not pair part by part is the same in `old` and `new` (of one type): a function's code,
    globals and defaults (its closure's cells are paired), a defaultdict's factory. The trace assumed these of the
    old object without a guard of their own: the guard on the object's identity stood for them."""
    if isinstance(old, types.FunctionType):
        return (old.__code__ is new.__code__ and old.__globals__ is new.__globals__
                and _same_values(old.__defaults__ or (), new.__defaults__ or ())
                and _same_values(tuple((old.__kwdefaults__ or {}).items()), tuple((new.__kwdefaults__ or {}).items())))
    return not isinstance(old, collections.defaultdict) or old.default_factory is new.default_factory


def _same_values(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    return len(old) == len(new) and all(
        a is b or (is_constant(a) and type(a) is type(b) and a == b) or
        (isinstance(a, tuple) and isinstance(b, tuple) and _same_values(a, b)) for a, b in zip(old, new))


def held_by_bound_self(fn: Any) -> set[int]:
    """ids of the objects a bound method's `self` holds (a model's config), a few levels deep, modules aside."""
    found: set[int] = set()
    owner = getattr(fn, "__self__", None)
    todo = [(vars(owner), 0)] if isinstance(getattr(owner, "__dict__", None), dict) else []
    while todo:
        x, depth = todo.pop()
        if id(x) in found:
            continue
        found.add(id(x))
        if depth < 3:  # (only what may be added is pushed: a config holds hundreds of plain values)
            todo += [(v, depth + 1) for v in _held(x) if _walked_kind(type(v)) and id(v) not in found]
    return found


def _held(x: Any) -> Any:
    """What `x` (an object `_has_parts` accepts) holds: the values `_parts` pairs, on one side."""
    # (asked of its type, as `_has_parts` does: `isinstance` reads a transformers config's `__class__` through its
    # Python `__getattribute__`, and the instance dict is read as `object` reads it, for the same reason)
    t = type(x)
    if issubclass(t, list | tuple):
        return x
    if issubclass(t, dict):
        return x.values()
    if t is types.CellType:
        return () if (held := _contents(x)) is _NOWHERE else (held,)
    if issubclass(t, weakref.ref):
        return (x(),)
    return (own_dict(x), x.__closure__) if t is types.FunctionType and x.__closure__ else (own_dict(x),)


def _has_parts(x: Any) -> bool:
    return _kind_has_parts(type(x))


@functools.cache  # (asked for each object a rebind walks, and for each guard's referents)
def _kind_has_parts(cls: type) -> bool:
    return issubclass(cls, list | tuple | dict | types.FunctionType | types.CellType) or cls is weakref.ref or _plain(cls)


@functools.cache
def _reachable_kind(cls: type) -> bool:
    """What a walk may reach (`_Pairs.reached`): objects with parts, tensors."""
    return _kind_has_parts(cls) or issubclass(cls, torch.Tensor)


@functools.cache
def _walked_kind(cls: type) -> bool:
    """Objects of `cls` have parts, and are neither tensors nor modules: what a walk of an argument (or of what the
    bound `self` holds) goes into."""
    return _kind_has_parts(cls) and not issubclass(cls, torch.Tensor | torch.nn.Module)


def _parts(old: Any, new: Any) -> list[tuple[tuple[Any, Any], tuple[Any, Any]]]:
    """(key, value) pairs of `old` and `new` side by side: items of lists, tuples and dicts; a closure cell's
    contents; a weakref's referent; a function's `__dict__` and closure; a plain object's `__dict__` (itself
    paired, for guards that read it) and then its attributes."""
    if isinstance(old, list | tuple):
        return [((i, a), (i, b)) for i, (a, b) in enumerate(zip(old, new))] if len(old) == len(new) else \
            [((i, a), (None, None)) for i, a in enumerate(old)]
    if isinstance(old, dict):
        return [((k, v), (k, new[k]) if k in new else (_NOWHERE, None)) for k, v in old.items()]
    if isinstance(old, types.CellType):
        return [(("cell_contents", held), ("cell_contents", _contents(new)))] if (held := _contents(old)) is not _NOWHERE \
            else []
    if isinstance(old, weakref.ref):
        return [(("referent", old()), ("referent", new()) if new() is not None else (_NOWHERE, None))]
    own_old, own_new = old.__dict__, getattr(new, "__dict__", {})
    parts = [(("__dict__", own_old), ("__dict__", own_new))]
    if isinstance(old, types.FunctionType) and old.__closure__:
        parts.append((("__closure__", old.__closure__), ("__closure__", new.__closure__)))
    return parts


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _NOWHERE


_NOWHERE = object()
