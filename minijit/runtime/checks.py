"""What a cache entry specialises on, as one list of checks: the key, the guard, the prologue and the miss reason.

A `Check` is one fact a trace relied on: what is looked at (`subject`, a Python expression
over the call's arguments or the trace's inputs), which `aspect` of it, and the `expected`
value it had when the trace was captured. Everything else is generated from the list:

- the **cache key**: `walk` below, in key mode, appends for each argument exactly the values
  its keyed checks expect (`Check.key_values`), so a call's key equals the entry's keyed
  checks' values when, and only when, every keyed check holds; the per-arity fast key
  functions (minijit.runtime.cache_key) are generated from the checks of plain tensors;
- the **guard**: the checks the key cannot make (constraints on symbolic sizes, values read
  from outside, tensors captured from outside, input aliasing) compiled into one function;
- the **prologue**: `Prologue.source` is the Python that was compiled (key checks as
  `check_call`, the rest as `guard`), so what `minijit.show(jf, "prologue")` prints is what runs;
- the **miss explanation**: each check evaluated alone, the failing ones said in words, first first.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
import string
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from minijit.frontend.guards import (
    GuardEntry,
    Source,
    TensorSeen,
    bind,
    guard_expression,
    guard_names,
    not_in_history,
    short_repr,
)
from minijit.ir.containers import flatten, is_container, is_tensor, is_tensor_or_number
from minijit.ir.layouts import tensor_row_major
from minijit.ir.proxies import zero_sign_test
from minijit.runtime.autocast import any_autocast_enabled, autocast_state
from minijit.runtime.read_groups import read_groups

if TYPE_CHECKING:
    from minijit.runtime.arguments import InputAliasing

Tensor = torch.Tensor

# The names a generated function reads besides its parameters; a parameter with one of these names is renamed.
_RESERVED = {"torch", "Tensor", "type", "len", "id", "tuple", "isinstance", "is_grad_enabled",
             "any_autocast_enabled", "autocast_state", "slice", "int", "float", "bool", "str", "complex", "dict",
             "list"}
GRAD_MODE = "is_grad_enabled()"
AUTOCAST = "any_autocast_enabled() and autocast_state()"


@dataclass(frozen=True, eq=False)
class Check:
    """One fact a cache entry relies on: `aspect` of `subject` was `expected` when the trace was captured.

    `subject` is Python source over the parameters of the function the check is compiled into;
    `label` names it in words (`arg 'x'`, `self.fc1.weight`). A `keyed` check is made by the cache
    key (its `key_values` are part of the key); the others by the entry's guard. `explain`, when
    given, words a failure from (now, expected) instead of the default `aspect now != expected`.
    """

    label: str
    aspect: str
    subject: str
    expected: Any
    keyed: bool = True
    explain: Callable[[Any, Any], str] | None = None
    # For a check of a value read from outside ("read"): the guard entry it checks, and its position among the
    # entry's guard entries (its test's names: `_ns<at>`, `_v<at>`).
    read: GuardEntry | None = None
    at: int | None = None

    def key_values(self) -> tuple[Any, ...]:
        """What the cache key holds for this check, in key order (nothing for a check the guard makes)."""
        if not self.keyed:
            return ()
        if self.aspect in ("value", "length", "keys", "object", "slice"):
            return tuple(self.expected)
        return (self.expected,)

    def test(self, env: dict[str, Any]) -> str:
        """Python source that is True while the check holds (objects it needs are bound in `env`)."""
        s, v, aspect = self.subject, self.expected, self.aspect
        if aspect == "shape":
            return f"{s}.shape == {tuple(v)!r}"
        if aspect in ("rank", "dtype", "device", "layout"):
            return f"{s}.{'ndim' if aspect == 'rank' else aspect} == {literal(env, v)}"
        if aspect in ("requires_grad", "grad mode"):
            return f"{s}{'.requires_grad' if aspect == 'requires_grad' else ''} is {v!r}"
        if aspect == "value":
            t, x = v
            if x is None:
                return f"{s} is None"
            sign = zero_sign_test(s, x)
            return f"type({s}) is {t.__name__} and {s} == {literal(env, x)}{f' and {sign}' if sign else ''}"
        if aspect == "type":
            return f"type({s}) is {v.__name__}"
        if aspect == "length":
            return f"type({s}) is {v[0].__name__} and len({s}) == {v[1]}"
        if aspect == "keys":
            return f"type({s}) is dict and tuple({s}) == {literal(env, v[1])}"
        if aspect == "slice":
            return f"type({s}) is slice and ({s}.start, {s}.stop, {s}.step) == {literal(env, v[1:])}"
        if aspect == "object":
            # The id bound in `env`, not written out: an entry rebound to a new object then compiles the same
            # source again (`compiled_code`).
            return f"type({s}) is {literal(env, v[0])} and id({s}) == {bind(env, v[1], '_id')}"
        if aspect in ("structure", "symbolic structure"):
            return f"_{aspect.replace(' ', '_')}({s}) == {literal(env, v)}"
        if aspect in ("constant", "aliases"):
            return f"{s} == {literal(env, v)}"
        if aspect == "keyword":
            return "True"  # calling the generated function with the keyword checks its name
        if aspect == "captured":
            size = f"{s}.ndim" if isinstance(v[0], int) else f"{s}.shape"
            return (f"type({s}) in _TENSOR_TYPES and ({size}, {s}.dtype, {s}.device, {s}.requires_grad) "
                    f"== _meta_{s}")
        if aspect == "autocast":
            return f"({s}) == {literal(env, v)}"
        # "constraint", "read": the subject is the test itself, kept whole among the tests joined by `and`.
        return f"({s})" if " or " in s or " if " in s else s

    def observe(self, now: Any) -> Any:
        """The value of this check's aspect for `now`, the subject's current value, shaped like `expected`."""
        aspect = self.aspect
        if aspect in ("shape", "rank", "dtype", "device", "requires_grad", "layout"):
            if not isinstance(now, Tensor):
                return f"a {type(now).__name__}, not a tensor"
            return tuple(now.shape) if aspect == "shape" else getattr(now, "ndim" if aspect == "rank" else aspect)
        if aspect == "value":
            return (type(now), now)
        if aspect == "type":
            return type(now)
        if aspect == "length":
            return (type(now), len(now)) if type(now) in (list, tuple) else (type(now), None)
        if aspect == "keys":
            return (type(now), tuple(now) if isinstance(now, dict) else None)
        if aspect == "object":
            return (type(now), id(now))
        return now

    def words(self, now: Any) -> str:
        """This check's failure in words, `now` being the subject's current value: `arg 'x': shape (8, 16) != (4, 16)`."""
        if self.explain is not None:
            return self.explain(now, self.expected)
        return f"{self.label}: {self.aspect} {_format(self.aspect, self.observe(now))} != {_format(self.aspect, self.expected)}"


def _format(aspect: str, value: Any) -> str:
    if aspect == "value":
        t, v = value
        return f"{short_repr(v)} ({t.__name__})"
    if aspect in ("dtype", "grad mode"):
        return str(value).removeprefix("torch.")
    if aspect == "type":
        return getattr(value, "__name__", str(value))
    if aspect == "shape" and isinstance(value, tuple):
        return str(tuple(value))
    if aspect == "length":
        return f"{value[0].__name__} of {value[1]}" if value[1] is not None else value[0].__name__
    if aspect == "keys":
        return str(value[1])
    if aspect == "object":
        return f"{value[0].__name__} at {value[1]:#x}"
    return str(value)


def literal(env: dict[str, Any], value: Any) -> str:
    """Python source for `value`: written out where it reads back as an equal value, else bound in `env`."""
    t = type(value)
    if value is None or t in (bool, int, str) or (t is float and math.isfinite(value)):
        return repr(value)
    if t is torch.dtype or t is torch.layout:
        return str(value)
    if t is torch.device:
        return f"torch.device({str(value)!r})"
    if t is tuple and all(type(x) in (bool, int, str) or x is None for x in value):
        return repr(value)
    return bind(env, value, "_c")


# --- the walk: one description of what a call's arguments specialise on, as key values or as checks -----


# The types key mode puts before a value, a length or keys; any other class it puts there is an object's, before its
# id (minijit.runtime.rebind.differs_in_objects_only).
KEY_VALUE_KINDS = (int, float, bool, str, complex, type(None), slice, tuple, list, dict)


def walk(x: Any, out: list[Any], symbolic: bool, where: tuple[str, str] | None = None) -> None:
    """Add to `out` what a call specialises on about the argument value `x`.

    Key mode (`where` None, the per-call path): the values, appended flat. Check mode (`where`
    is (label, subject)): a `Check` per fact, whose `key_values` are exactly what key mode appends.
    """
    t = type(x)
    if t is Tensor or isinstance(x, Tensor):
        if where is None:
            out += (x.ndim if symbolic else x.shape, x.dtype, x.device, x.requires_grad, x.layout)
        else:
            out += tensor_checks(where[0], where[1], x, symbolic)
    elif t is tuple or t is list:
        if where is None:
            out += (t, len(x))
        else:
            out.append(Check(where[0], "length", where[1], (t, len(x))))
        for i, v in enumerate(x):
            walk(v, out, symbolic, where and (f"{where[0]}[{i}]", f"{where[1]}[{i}]"))
    elif t is dict and all(map(_literal_key, x)):
        if where is None:
            out += (t, tuple(x))
        else:
            out.append(Check(where[0], "keys", where[1], (t, tuple(x))))
        for k, v in x.items():
            walk(v, out, symbolic, where and (f"{where[0]}[{k!r}]", f"{where[1]}[{k!r}]"))
    elif symbolic and (t is int or t is float):
        # The value is a symbolic input: the guard's constraints check it.
        out.append(t if where is None else Check(where[0], "type", where[1], t))
    elif t is int or t is float or t is bool or t is str or x is None or t is complex:
        if where is None:
            # (-0.0 hashes and compares as 0.0: its own key, as its own value check)
            out += (t, x) if t is not float or x != 0 or math.copysign(1.0, x) > 0 else (t, _MINUS_ZERO)
        else:
            out.append(Check(where[0], "value", where[1], (t, x)))
    elif t is torch.dtype or t is torch.device:
        out.append(x if where is None else Check(where[0], "constant", where[1], x))
    elif t is slice:  # unhashable before Python 3.12
        if where is None:
            out += (t, x.start, x.stop, x.step)
        else:
            out.append(Check(where[0], "slice", where[1], (t, x.start, x.stop, x.step)))
    elif is_container(x):
        # A dataclass, named tuple, dict subclass or pytree type: its structure and constants, then its tensors.
        spec, leaves = flatten(x, is_tensor_or_number if symbolic else is_tensor)
        if where is None:
            out.append(spec.key())
        else:
            out.append(Check(where[0], "symbolic structure" if symbolic else "structure", where[1], spec.key(),
                             explain=_fields_changed(where[0], _fields(x))))
        leaf = "_leaves_symbolic" if symbolic else "_leaves"
        for i, v in enumerate(leaves):
            walk(v, out, symbolic, where and (f"{where[0]} leaf {i}", f"{leaf}({where[1]})[{i}]"))
    elif where is None:
        # Any other object is specialised on by identity; the interpreter guards what it reads from it.
        out += (t, id(x))
    else:
        out.append(Check(where[0], "object", where[1], (t, id(x))))


def _literal_key(k: Any) -> bool:
    """A dict key whose repr reads back as itself in a check's source: a dict keyed otherwise (by objects, tensors,
    NaN) is specialised on by identity, as other objects are."""
    t = type(k)
    if t is tuple:
        return all(map(_literal_key, k))
    return t is int or t is str or t is bool or t is bytes or k is None or (t is float and math.isfinite(k))


def tensor_checks(label: str, subject: str, x: Tensor, symbolic: bool) -> list[Check]:
    """The checks on one tensor argument: its shape (its rank, with symbolic sizes), dtype, device, requires_grad
    and layout (a trace holds strided tensors: a sparse tensor where a strided one was traced misses, and is
    refused)."""
    size = Check(label, "rank", subject, x.ndim) if symbolic else Check(label, "shape", subject, x.shape)
    return [size, Check(label, "dtype", subject, x.dtype), Check(label, "device", subject, x.device),
            Check(label, "requires_grad", subject, x.requires_grad), Check(label, "layout", subject, x.layout)]


def _fields(x: Any, label: str = "") -> dict[str, str]:
    """The non-tensor fields of a container argument, by path, in words (for explaining a changed structure)."""
    out: dict[str, str] = {}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        items = [(f".{f.name}", getattr(x, f.name, None)) for f in dataclasses.fields(x)]
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        items = [(f".{name}", v) for name, v in zip(x._fields, x)]
    elif isinstance(x, dict | list | tuple):
        items = [(f"[{k!r}]", v) for k, v in (x.items() if isinstance(x, dict) else enumerate(x))]
    else:
        return {label: type(x).__name__} if not isinstance(x, Tensor) else {}
    out[label] = f"{type(x).__name__} of {len(items)}"
    for path, v in items:
        out.update(_fields(v, label + path) if is_container(v) or isinstance(v, dict | list | tuple)
                   else ({} if isinstance(v, Tensor) else {label + path: f"{short_repr(v)} ({type(v).__name__})"}))
    return out


def _fields_changed(label: str, before: dict[str, str]) -> Callable[[Any, Any], str]:
    def at(path: str) -> str:  # arg 'b' and .weight: arg 'b.weight'
        return f"{label[:-1]}{path}'" if label.endswith("'") else label + path

    def words(now: Any, expected: Any) -> str:
        after = _fields(now)
        changed = [f"{at(path)}: {after.get(path, 'missing')} != {was}" for path, was in before.items()
                   if after.get(path) != was]
        changed += [f"{at(path)}: not present before" for path in after if path not in before]
        return "; ".join(changed) or f"{label}: structure changed"
    return words


# --- the checks of a call and of an entry -----------------------------------------------------------------


def argument_label(name: str) -> str:
    """How a miss reason names an argument: `arg 'x'`, or the name itself for `self...` and `torch...`."""
    return name if name == "self" or name.startswith(("torch.", "self.")) else f"arg '{name}'"


def safe_name(name: str) -> str:
    """A parameter name for a generated function: the argument's own, unless it could hide a name the checks use."""
    return f"arg_{name}" if name in _RESERVED or name.startswith("_") or not name.isidentifier() else name


def guard_checks(constraints: Sequence[str], values: Sequence[GuardEntry],
                 captured: Sequence[tuple[str, Source, TensorSeen | int | float]], aliasing: InputAliasing | None,
                 input_names: Sequence[str], env: dict[str, Any], symbolic_captured: AbstractSet[str] = frozenset(),
                 kept: Mapping[int, Check] | None = None,
                 identities: Sequence[tuple[str, str, bool]] = ()) -> list[Check]:
    """The checks the key cannot make, over the trace's inputs: constraints on symbolic values, values the
    code read from outside, tensors it read from outside (fetched in the guard), and how inputs share memory.
    A captured tensor named in `symbolic_captured` has its rank checked here, its sizes by the constraints.
    `kept`: the checks of values read, by position, that a rebound entry keeps as they are (what they read is
    bound in `env` already). `identities`: (input, input, whether one object) for each `a is b` the code asked."""
    env.update(guard_names())
    checks = [Check("constraint failed", "constraint", c, True, keyed=False, explain=_constraint_failed) for c in constraints]
    for i, value in enumerate(values):
        if kept and i in kept:
            checks.append(kept[i])
            continue
        checks.append(read_check(env, i, value))
    for name, _, t in captured:
        if not isinstance(t, TensorSeen):  # a number from a dynamic source: its read's guard checks its type
            continue
        meta = (t.ndim if name in symbolic_captured else t.shape, t.dtype, t.device, t.requires_grad)
        env[f"_meta_{name}"] = meta
        env.setdefault("_TENSOR_TYPES", set()).add(t.cls)
        env.setdefault("_captured_types", {})[name] = t.cls
        checks.append(Check(name, "captured", name, meta, keyed=False,
                            explain=lambda now, expected, name=name: _captured_changed(name, now, expected)))
    if aliasing is not None:
        checks += aliasing.checks(input_names, env)
    for a, b, same in identities:
        checks.append(Check(f"{a} is {b}", "aliases", f"({a} is {b})", same, keyed=False,
                            explain=lambda now, expected, a=a, b=b: f"`{a} is {b}` changed: {now} != {expected}"))
    return checks


def read_check(env: dict[str, Any], i: int, value: GuardEntry) -> Check:
    """The check of the `i`th value read from outside (what it reads bound in `env`)."""
    # Labelled lazily: the value read may be a big object (a model's config), worded only for a miss.
    return Check("a value read from outside", "read", guard_expression(env, i, value), True, keyed=False,
                 explain=_read_changed(value), read=value, at=i)


def moved_read_check(check: Check, value: GuardEntry) -> Check:
    """`check`, of a value read from outside, for guard entry `value`: its entry moved to new objects, which the
    environment binds under the names `check`'s test reads (runtime/rebind.py), so the test is the same words."""
    moved = object.__new__(Check)  # (its fields copied: a rebind makes one per moved value, `__init__` costs more)
    moved.__dict__.update(check.__dict__, explain=_read_changed(value), read=value)
    return moved


def _read_changed(value: GuardEntry) -> Callable[[Any, Any], str]:
    return lambda now, expected: f"{value} changed"


def _constraint_failed(now: Any, expected: Any) -> str:
    return "constraint failed"  # Prologue.explain writes the constraints themselves, joined


def _captured_changed(name: str, now: Any, expected: tuple[Any, ...]) -> str:
    if now is _GONE:
        return f"the tensor {name} read from outside the call is gone"
    if not isinstance(now, Tensor):
        return f"{name}, read from outside the call, is no longer a tensor (a {type(now).__name__})"
    shape, dtype, _, requires_grad = expected
    if isinstance(shape, int):  # symbolic sizes: the rank is checked here, the sizes by the constraints
        return (f"the tensor {name} read from outside the call changed: rank {now.ndim}, {now.dtype}, "
                f"requires_grad={now.requires_grad} (was {shape}, {dtype}, requires_grad={requires_grad})")
    return (f"the tensor {name} read from outside the call changed: shape {tuple(now.shape)}, {now.dtype}, "
            f"requires_grad={now.requires_grad} (was {tuple(shape)}, {dtype}, requires_grad={requires_grad})")


_GONE = object()
# A layout check a decision on a tensor's strides recorded (`k.stride() == (16, 1, 1)`): the tensor's name.
_LAYOUT_CHECK = re.compile(r"(\w+)\.(?:stride\(\)|storage_offset\(\)) == ")
# A layout check that a tensor is row-major (minijit.ir.layouts.tensor_row_major): the tensor's name.
_ROW_MAJOR = re.compile(r"_row_major\((\w+)\)")
# A size kept constant by a trace with symbolic sizes (`keys.shape[2] == 8`): the tensor's name.
_KEPT_SIZE = re.compile(r"(\w+)\.shape\[\d+\] == \d+")
_MINUS_ZERO = "-0.0"  # what a cache key holds for the float -0.0


# --- the prologue: the checks compiled, printed, and explained --------------------------------------------


@functools.lru_cache(maxsize=256)
def compiled_code(source: str, filename: str) -> types.CodeType:
    """`source` compiled. An entry rebound to new argument objects (`runtime/rebind.py`: each `generate()`
    makes a new cache object) has the same prologue and epilogue sources with another `env`: compiling them
    again cost more than the rest of the rebind."""
    return compile(source, filename, "exec")


class Prologue:
    """An entry's checks compiled from one source: `check_call`, the checks the cache key makes, over the call's
    arguments, and `guard`, the rest, over the trace's inputs (None when the key makes every check).

    `source` is exactly what was compiled. On the hit path the key (a dict lookup) stands for
    `check_call`, and `guard` runs; a miss is explained by running each check alone.
    """

    def __init__(self, name: str, params: list[str], keywords: tuple[str, ...], checks: list[Check],
                 inputs: list[str], captured: list[tuple[str, str]], env: dict[str, Any],
                 value_guards: list[str] | None = None, previous: Prologue | None = None):
        self.params, self.keywords, self.checks = params, keywords, checks
        self.inputs, self.captured, self.env = inputs, captured, env
        # (the entry's guard entries, which positions refer to which objects), and the names `env` binds each object
        # an argument may hold to (by id): built by runtime/rebind.py.
        self.guard_refs: tuple[list[Any], dict[int, tuple[int, ...]]] | None = None
        self.env_refs: dict[int, tuple[str, ...]] | None = None
        # Which checks and sources a rebind moved to make this prologue, where their tests read word for word as
        # the ones they replaced (runtime/rebind.py `_Recipe`): the next rebind moving the same ones need not
        # generate their words again.
        self.recipe: Any = None
        # The positions of the captured inputs' and the call plan's sources a rebind looks at (runtime/rebind.py).
        self.source_looks: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        # Where the checks of the values read begin in `checks` (a rebind replaces some in place): set by
        # runtime/guards.py, which puts the call's checks and the constraints before them.
        self.reads_at: int | None = None
        env.update(_ENV)
        captured_at_once = _captured_at_once(checks, env)
        # `previous`: the prologue of the entry this one was rebound from, whose checks it shares where nothing they
        # read moved (runtime/rebind.py): their tests are the same words over the same names in `env`.
        known = previous.tests if previous is not None else {}
        # Each check's test, by the check's id (a rebind compares the words of the checks it makes anew with them).
        pinned = _pinned_shapes(checks)
        self.tests = tests = {id(c): known.get(id(c)) or _test(c, env, pinned) for c in checks}
        at_once = [captured_at_once, *read_groups(checks, tests, env)]
        # A keyword's name is checked by calling `check_call` with it: its test is "True", left out.
        key_tests = [t for c in checks if c.keyed and (t := tests[id(c)]) != "True"]
        guard_tests = _tests(tests, [c for c in checks if not c.keyed], at_once)
        # A call with exactly the sizes and strides of the call that made the entry meets its constraints on
        # those: `exact_guard` leaves them out (the hit path's exact check, minijit.runtime.cache_key). Any
        # other constraint (a storage offset, a tensor read from outside, a state read) stays.
        exact_tests = _tests(tests, [c for c in checks if not c.keyed and not (
            c.aspect == "constraint" and implied_by_exact_check(c.subject, inputs))], at_once)
        source = _function("check_call", params, key_tests, "# The checks the cache key makes (a dict lookup on a hit).")
        if guard_tests:
            source += "\n\n" + self._guard_source(guard_tests)
        if exact_tests and exact_tests != guard_tests:
            source += "\n\n" + self._guard_source(exact_tests, "exact_guard", "the call that made the entry's sizes")
        if value_guards:
            source += ("\n\n# Checked by the trace itself, where the code read them (prims.check_value); another value\n"
                       "# runs the call again with its own entry:\n" + "\n".join(f"#   {g}" for g in value_guards) + "\n")
        self.source, self.filename = source, f"<minijit prologue {name}>"
        self._define(exact_tests != guard_tests)

    def _define(self, exact_apart: bool) -> None:
        """Run the source in `env`: the functions it defines become this prologue's."""
        env = self.env
        exec(compiled_code(self.source, self.filename), env)
        self.check_call: Callable[..., bool] = env["check_call"]
        self.guard: Callable[..., bool] | None = env.get("guard")
        self.exact_guard: Callable[..., bool] | None = env.get("exact_guard") if exact_apart else self.guard
        if self.guard is not None:
            self.guard.__minijit_source__ = self.source  # type: ignore[attr-defined]

    def moved(self, checks: list[Check], tests: dict[int, str], env: dict[str, Any]) -> Prologue:
        """This prologue's source over another environment, for the checks of an entry moved to new objects whose
        tests are this one's word for word (runtime/rebind.py): nothing is generated or compiled again."""
        copy = object.__new__(Prologue)
        copy.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_probes"})  # probes run in `env`
        copy.checks, copy.tests, copy.env, copy.guard_refs, copy.env_refs = checks, tests, env, None, None
        copy.recipe = copy.source_looks = None
        copy._define(self.exact_guard is not self.guard)
        return copy

    def _guard_source(self, tests: list[str], name: str = "guard", sizes: str = "") -> str:
        """`def guard(inputs)`: fetch the tensors captured from outside, then `tests`."""
        body = "\n            and ".join(tests)
        # Read each tensor's shape once: `x.shape` costs more than indexing the tuple it gives. (A tensor read from
        # outside that is no tensor any more fails the guard there, as its first size read would.)
        pieces = body.split(".shape[")  # (a guard reads hundreds of sizes: no regular expression over it)
        read = {_name_before(piece) for piece in pieces[:-1]}
        shaped = [n for n in self.inputs if n in read]
        shaped_captured = [n for n, _ in self.captured if n in read]
        local = _shape_names(shaped + shaped_captured, {*self.inputs, *(n for n, _ in self.captured), *self.env},
                             body)
        body = "".join([*(_shape_read(piece, local) for piece in pieces[:-1]), pieces[-1]])
        lines = [f"def {name}({', '.join(self.inputs)}):",
                 "    # The checks the cache key cannot make, run on a hit after the key matched"
                 + (f", for {sizes}." if sizes else ".")]
        lines += [f"    {local[n]} = {n}.shape" for n in shaped]
        if self.captured:
            lines.append("    try:")
            names = ", ".join(n for n, _ in self.captured)
            lines.append(f"        ({names},) = ({', '.join(read for _, read in self.captured)},)")
            lines += [f"        {local[n]} = {n}.shape" for n in shaped_captured]
            lines += [f"        return ({body})", "    except Exception:", "        return False"]
        else:
            lines.append(f"    return ({body})")
        return "\n".join(lines) + "\n"

    def holds(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> bool:
        """The general check: True when a call with these arguments (and flat inputs) may use the entry."""
        return (len(args) + len(kwargs) == len(self.params) and tuple(kwargs) == self.keywords
                and self.check_call(*args, *kwargs.values()) and (self.guard is None or self.guard(*flat)))

    def failures(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any] | None) -> list[str]:
        """The checks a call fails, in words, in the order of the list: those of the key, then (given `flat`
        and when the key's all hold) those of the guard. A check whose subject cannot be read is implied
        by an earlier one (a shorter list, a missing field) and is left out."""
        reasons: list[str] = []
        values = [*args, *kwargs.values()]
        if len(values) != len(self.params) or tuple(kwargs) != self.keywords:
            reasons.append(f"arguments ({', '.join(self.params)}) were passed as ({len(args)} positional, keywords "
                           f"{tuple(kwargs)})" if len(values) != len(self.params) else
                           f"keywords {tuple(kwargs)} != {self.keywords}")
            return reasons
        for check in self.checks:
            if not check.keyed:
                continue
            holds, now = self._run(check, self.params, values)
            if holds is False and (words := check.words(now)):  # "": said by an earlier check's words
                reasons.append(words)
        if reasons or flat is None:
            return reasons
        constraints = []
        for check in self.checks:
            if check.keyed:
                continue
            holds, now = self._run(check, self.inputs, flat, guard=True)
            if holds is False and check.aspect == "constraint":
                constraints.append(check.subject)
                if len(constraints) == 1:
                    reasons.append("")  # where the constraints go, in the order of the list
            elif holds is False:
                reasons.append(check.words(now))
        if constraints:
            reasons[reasons.index("")] = "constraint failed: " + "; ".join(constraints)
        return reasons

    def failed_checks(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> list[Check] | None:
        """The guard's checks a call fails, whose key checks all hold (None where one does not, or a check cannot
        be read: the call differs by more than its guard)."""
        values = [*args, *kwargs.values()]
        if len(values) != len(self.params) or tuple(kwargs) != self.keywords:
            return None
        failed = []
        for check in self.checks:
            holds, _ = (self._run(check, self.params, values) if check.keyed
                        else self._run(check, self.inputs, flat, guard=True))
            if holds is None or (holds is False and check.keyed):
                return None
            if holds is False:
                failed.append(check)
        return failed

    def differs_in_captured_sizes(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> bool:
        """Whether the checks this call fails are all of tensors read from outside with constant sizes, each of the
        rank, dtype, device and requires_grad it had, or of sizes such a tensor traced with symbolic ones kept
        constant (`keys.shape[0] == 2`; and, of those tensors, the exact strides or offset a layout decision
        checked: a tensor that grows is laid out anew): a call that differs from the entry's in those sizes alone."""
        failed = self.failed_checks(args, kwargs, flat)
        if not failed:
            return False
        captured = {name for name, _ in self.captured}
        resized, relaid = set(), set()
        for check in failed:
            laid_out = _LAYOUT_CHECK.match(check.subject) if check.aspect == "constraint" else None
            if laid_out is not None:
                relaid.add(laid_out[1])
                continue
            kept = _KEPT_SIZE.fullmatch(check.subject) if check.aspect == "constraint" else None
            if kept is not None and kept[1] in captured:
                resized.add(kept[1])
                continue
            if check.aspect != "captured" or isinstance(check.expected[0], int):
                return False
            now = self._run(check, self.inputs, flat, guard=True)[1]
            shape, dtype, device, requires_grad = check.expected
            if not (isinstance(now, Tensor) and now.ndim == len(shape)
                    and (now.dtype, now.device, now.requires_grad) == (dtype, device, requires_grad)):
                return False
            resized.add(check.subject)
        return bool(resized) and relaid <= resized

    def changed_reads(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> list[Check]:
        """The checks of numbers read from outside that this call fails, whatever its key checks say (its sizes
        may differ too); those that cannot be read for it are left out."""
        values = [*args, *kwargs.values()]
        if len(values) != len(self.params) or tuple(kwargs) != self.keywords:
            return []
        return [c for c in self.checks if c.read is not None and not c.keyed
                and self._run(c, self.inputs, flat, guard=True)[0] is False]

    def _run(self, check: Check, params: list[str], values: list[Any], guard: bool = False) -> tuple[bool | None, Any]:
        """(whether `check` holds, its subject's value) for these values; (None, None) when it cannot be read."""
        try:
            with warnings.catch_warnings():  # a check read alone (`x.grad` of a non-leaf) warns nobody
                warnings.simplefilter("ignore")
                return self._probe(check, params, guard)(*values)
        except Exception:
            return None, None

    def _probe(self, check: Check, params: list[str], guard: bool) -> Callable[..., tuple[bool, Any]]:
        """The function `_run` calls for `check`, compiled once per entry (a miss is explained against the
        entries used last, which are mostly the same from one miss to the next)."""
        probes = self.__dict__.setdefault("_probes", {})
        probe = probes.get((id(check), guard))
        if probe is not None:
            return probe
        env = self.env
        test = check.test(env)
        lines = [f"def _probe({', '.join(params)}):"]
        if guard and self.captured:  # the guard's own fetch of the tensors read from outside
            lines += ["    try:", f"        ({', '.join(n for n, _ in self.captured)},) = "
                      f"({', '.join(read for _, read in self.captured)},)",
                      "    except Exception:", "        return False, _GONE"]
        subject = check.subject if not guard or check.aspect in ("captured", "aliases") else "None"
        lines.append(f"    return bool({test}), {subject}")
        exec("\n".join(lines) + "\n", env)  # our own generated source, as the prologue's
        probe = probes[(id(check), guard)] = env.pop("_probe")
        return probe


def _captured_at_once(checks: Sequence[Check], env: dict[str, Any]) -> tuple[str, set[int]]:
    """(one test of the "captured" checks of plain tensors with constant sizes, run in C; the ids of the checks it
    makes), or ("", set()) where there are few. The test is torch's tensor check for Dynamo's guards over the
    tensors' type, sizes, dtype, device, requires_grad and dispatch keys (strides left free, as the checks leave
    them), made from stand-ins with the metadata seen. Where it fails (another thread-local dispatch state, as
    under inference mode, or a tensor that changed) the checks run one by one and say which, so it only saves
    time: checked in Python, a guard reading a hundred parameters spent over a microsecond on each."""
    types_seen = env.get("_captured_types", {})
    chosen = [c for c in checks if c.aspect == "captured" and not isinstance(c.expected[0], int)
              and types_seen.get(c.subject) in (Tensor, torch.nn.Parameter)]
    if len(chosen) < 4:
        return "", set()
    check = _tensor_check(tuple((types_seen[c.subject], *c.expected) for c in chosen))
    if check is None:
        return "", set()
    env["_captured_check"] = check
    one_by_one = " and ".join(c.test(env) for c in chosen)
    return f"(_captured_check({', '.join(c.subject for c in chosen)}) or ({one_by_one}))", {id(c) for c in chosen}


@functools.lru_cache(maxsize=64)  # an entry rebound to new objects checks the same parameters again
def _tensor_check(metadata: tuple[tuple[Any, ...], ...]) -> Callable[..., bool] | None:
    """Torch's C check of tensors with these (type, shape, dtype, device, requires_grad), strides left free, or
    None where there is none."""
    return torch_tensor_check([_stand_in(*m) for m in metadata], strides=False)


def torch_tensor_check(tensors: Sequence[Tensor], *, strides: bool = True) -> Callable[..., bool] | None:
    """A check, run in C, that tensors have exactly the types, sizes, dtypes, devices, requires_grad and dispatch
    keys of `tensors` (these include autocast's thread-local keys), and their strides where `strides`; None where
    torch lacks it. It is torch's tensor check for Dynamo's guards (`torch._C._dynamo.guards`, a C module that does
    not import torch._dynamo)."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                            dynamic_dims_strides=[list(t.stride()) if strides else [None] * t.ndim
                                                  for t in tensors]).check
    except (ImportError, TypeError, RuntimeError):
        return None


def _stand_in(cls: type, shape: torch.Size, dtype: torch.dtype, device: torch.device, requires_grad: bool) -> Tensor:
    """A tensor of this type and metadata holding one element (every stride 0): the C check compares Python
    types exactly."""
    t = torch.empty_strided(shape, (0,) * len(shape), dtype=dtype, device=device, requires_grad=requires_grad)
    return torch.nn.Parameter(t, requires_grad=requires_grad) if cls is torch.nn.Parameter else t


def _pinned_shapes(checks: Sequence[Check]) -> frozenset[str]:
    """The names of the tensors read from outside whose guard checks their whole shape, one with no size 0 or 1."""
    return frozenset(c.subject for c in checks if c.aspect == "captured" and not isinstance(c.expected[0], int)
                     and 0 not in c.expected[0] and 1 not in c.expected[0])


def _test(check: Check, env: dict[str, Any], pinned: frozenset[str]) -> str:
    """`check.test(env)`; for `_row_major(w)` of a tensor of a `pinned` shape (a module's weight), torch's
    `is_contiguous()` first: with no size 0 or 1 a contiguous tensor is row-major, and the guard checks that shape
    too, so the answer is the same at a third of the cost on the hit path."""
    found = _ROW_MAJOR.fullmatch(check.subject) if check.aspect == "constraint" else None
    if found is not None and found[1] in pinned:
        return f"({found[1]}.is_contiguous() or {check.subject})"
    return check.test(env)


def _tests(tests: dict[int, str], checks: Sequence[Check], at_once: Sequence[tuple[str, set[int]]]) -> list[str]:
    """The tests of `checks` (by id in `tests`), those that a group of `at_once` makes together replaced by its one
    test (none where it is ""), where the first of them was."""
    group = {i: k for k, (_, covered) in enumerate(at_once) for i in covered}
    done: set[int] = set()
    found: list[str] = []
    for c in checks:
        k = group.get(id(c))
        if k is None:
            found.append(tests[id(c)])
        elif k not in done:
            done.add(k)
            if at_once[k][0]:
                found.append(at_once[k][0])
    return found


# What the hit path's exact check (torch's TensorGuards: sizes, strides, dtype, device, dispatch keys) fixes
# of a call's tensors, and the builtins a constraint on those may apply.
_EXACT_ATTRIBUTES = frozenset({"shape", "stride", "is_contiguous", "ndim", "dim", "size"})
_PURE_BUILTINS = frozenset({"tuple", "len", "min", "max", "abs", "int", "_row_major"})


def implied_by_exact_check(constraint: str, inputs: Sequence[str]) -> bool:
    """Whether a call that passes the exact check of the call that made the entry meets `constraint` for sure:
    it reads nothing but the sizes and strides of the trace's own `inputs` (not `storage_offset()`, not a
    tensor read from outside, not the state of torch)."""
    return _implied_by_exact_check(constraint, frozenset(inputs))


@functools.lru_cache(maxsize=4096)  # a prologue compiled again (rebinding an entry) asks the same questions
def _implied_by_exact_check(constraint: str, inputs: frozenset[str]) -> bool:
    try:
        tree = ast.parse(constraint, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr not in _EXACT_ATTRIBUTES:
            return False
        if isinstance(node, ast.Name) and node.id not in inputs and node.id not in _PURE_BUILTINS:
            return False
        if isinstance(node, ast.Attribute) and not isinstance(node.value, ast.Name):
            return False
    return True


def _name_before(text: str) -> str:
    """The whole name `text` ends with (`x` in `... and x`), "" where it ends otherwise or with an attribute
    (`y.x`: not the tensor `x`)."""
    rest = text.rstrip(_WORD_CHARACTERS)
    name = text[len(rest):]
    return "" if rest.endswith(".") or name[:1].isdigit() else name


_WORD_CHARACTERS = string.ascii_letters + string.digits + "_"


def _shape_read(piece: str, local: dict[str, str]) -> str:
    """`piece` of a guard's tests split at `.shape[`, joined back: `x.shape[` as `x_shape[` where `x` has a local."""
    name = _name_before(piece)
    return f"{piece[:len(piece) - len(name)]}{local[name]}[" if name in local else f"{piece}.shape["


def _shape_names(names: list[str], taken: set[str], body: str) -> dict[str, str]:
    """A local name for each tensor's shape, `x_shape`, that no parameter, value bound or text of the tests has (a
    parameter may be called `x_shape`)."""
    used = set(taken)
    chosen: dict[str, str] = {}
    for n in names:
        local, k = f"{n}_shape", 0
        while local in used or local in body:
            k += 1
            local = f"{n}_shape{k}"
        used.add(local)
        chosen[n] = local
    return chosen


def _function(name: str, params: list[str], tests: list[str], comment: str) -> str:
    """`def name(params): return (t1 and t2 ...)`, False where reading a subject fails."""
    body = "\n            and ".join(tests) or "True"
    return (f"def {name}({', '.join(params)}):\n    {comment}\n    try:\n        return ({body})\n"
            "    except Exception:\n        return False\n")


# The names the generated checks read besides their parameters and the values they bind.
_ENV: dict[str, Any] = {
    "torch": torch, "Tensor": Tensor, "_GONE": _GONE, "is_grad_enabled": torch.is_grad_enabled,
    "any_autocast_enabled": any_autocast_enabled, "autocast_state": autocast_state,
    "_structure": lambda x: flatten(x, is_tensor)[0].key(),
    "_symbolic_structure": lambda x: flatten(x, is_tensor_or_number)[0].key(),
    "_leaves": lambda x: flatten(x, is_tensor)[1],
    "_leaves_symbolic": lambda x: flatten(x, is_tensor_or_number)[1],
    "_not_in_history": not_in_history,
    "_row_major": tensor_row_major,
    "_copysign": math.copysign,
    "math": math,  # number prims' expressions (`math.cos(epoch)`) in constraints
}
