"""Guards: the Python values a trace specialised on, and one compiled function that re-checks them.

While interpreting user code, every global, builtin, closure cell and user-module
attribute it reads (that is not a proxy) is recorded as a `GuardEntry` saying where
the value came from and what it was. `build_guard(entries)` turns them into a single
generated function; the runtime calls it on a cache hit, so a changed constant is a
cache miss, never a wrong result (DESIGN.md invariant 7).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minijit.ir import Proxy

_CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(...))
_SKIPPED_MODULES = ("torch", "minijit")


@dataclass(frozen=True, eq=False)
class GuardEntry:
    """One value the trace read, where from, and what it was.

    `kind` is "global" (`namespace` is a globals dict or a module's `__dict__`), "builtin"
    (`namespace` is the builtins dict and `shadow` the globals dict that must still not
    define the name), "cell" (`namespace` is a closure cell; `name` is the variable's name)
    or "attribute" (`namespace` is an object or class reached from a guarded value, read
    through its `__dict__`; `shadow`, if any, is the instance dict that must not define
    the name when the value came from the class).
    """

    kind: str
    namespace: Any = field(repr=False)
    name: str
    value: Any
    shadow: dict[str, Any] | None = field(default=None, repr=False)

    def __str__(self) -> str:
        where = {"global": "global", "builtin": "builtin", "cell": "closure variable",
                 "attribute": "attribute"}[self.kind]
        return f"{where} {self.name} = {_short_repr(self.value)}"


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_constant(value: Any) -> bool:
    """True for values guarded by type and equality: numbers, strings, None and tuples of those."""
    t = type(value)
    if t in _CONSTANT_TYPES:
        return True
    if t is tuple or t is frozenset:
        return all(is_constant(v) for v in value)
    return False


def _snapshot(value: Any) -> Any:
    """A copy of a list/dict/set of constants (guarded by equality), else None."""
    t = type(value)
    if t is list and all(is_constant(v) for v in value):
        return list(value)
    if t is set and all(is_constant(v) for v in value):
        return set(value)
    if t is dict and all(is_constant(k) and is_constant(v) for k, v in value.items()):
        return dict(value)
    return None


def _skipped(namespace: Any) -> bool:
    if isinstance(namespace, dict):
        module = namespace.get("__name__")
        return isinstance(module, str) and module.split(".")[0] in _SKIPPED_MODULES
    return False


def may_have_guarded_attributes(value: Any) -> bool:
    """True for objects whose attribute reads are worth guarding: instances of user classes, classes."""
    if isinstance(value, Proxy | types.ModuleType | types.FunctionType | types.BuiltinFunctionType) or is_constant(value):
        return False
    cls = value if isinstance(value, type) else type(value)
    module = getattr(cls, "__module__", "") or ""
    return module.split(".")[0] not in _SKIPPED_MODULES and module != "builtins" and hasattr(value, "__dict__")


def attribute_source(obj: Any, name: str) -> tuple[Any, dict[str, Any] | None] | None:
    """Where `obj.name` is stored as plain data: (obj, None) for its own `__dict__`, (class, instance dict)
    for a class attribute read through an instance; None when it is computed (properties, __getattr__)."""
    own = getattr(obj, "__dict__", None)
    if own is not None and name in own:
        return obj, None
    if not isinstance(obj, type) and isinstance(own, dict):
        cls = type(obj)
        if name in vars(cls) and not hasattr(vars(cls)[name], "__set__"):
            return cls, own
    return None


def record(guards: dict[tuple[str, int, str, int], GuardEntry], kind: str, namespace: Any, name: str, value: Any,
           shadow: dict[str, Any] | None = None) -> None:
    """Add a guard entry unless the value is a proxy, lives in torch/minijit, or was already read."""
    key = (kind, id(namespace), name, id(shadow))
    if key in guards or isinstance(value, Proxy) or _skipped(namespace):
        return
    guards[key] = GuardEntry(kind, namespace, name, value, shadow)


def build_guard(entries: list[GuardEntry]) -> Callable[[], bool] | None:
    """Compile one function that returns True while every entry still holds, or None for no entries.

    Modules, functions, classes and other objects are compared by identity; numbers,
    strings, None and tuples of those by type and equality; lists/dicts/sets of constants
    by type and equality with a copy taken now.

    Example::

        check = build_guard(trace.info["guards"])
        if check is not None and not check():
            ...  # retrace
    """
    if not entries:
        return None
    env: dict[str, Any] = {"_MISSING": _MISSING}
    terms: list[str] = []
    for i, entry in enumerate(entries):
        ns, val = f"_ns{i}", f"_v{i}"
        env[ns] = entry.namespace
        if entry.kind == "cell":
            read = f"{ns}.cell_contents"
        elif entry.kind == "attribute":
            read = f"{ns}.__dict__.get({entry.name!r}, _MISSING)"
        else:
            read = f"{ns}.get({entry.name!r}, _MISSING)"
        snapshot = _snapshot(entry.value)
        if is_constant(entry.value):
            env[val] = entry.value
            term = f"(type(_x := {read}) is {_type_name(env, i, entry.value)} and _x == {val})"
        elif snapshot is not None:
            env[val] = snapshot
            term = f"(type(_x := {read}) is {_type_name(env, i, entry.value)} and _x == {val})"
        else:
            env[val] = entry.value
            term = f"{read} is {val}"
        if entry.shadow is not None:
            env[f"_g{i}"] = entry.shadow
            term = f"{entry.name!r} not in _g{i} and {term}"
        terms.append(term)
    body = "\n        and ".join(terms)
    source = (
        "def guard():\n"
        "    try:\n"
        f"        return bool({body})\n"
        "    except Exception:\n"
        "        return False\n"
    )
    exec(compile(source, "<minijit guard>", "exec"), env)
    guard = env["guard"]
    guard.__minijit_source__ = source
    guard.__doc__ = "True while the values the trace specialised on are unchanged."
    return guard


def _type_name(env: dict[str, Any], i: int, value: Any) -> str:
    env[f"_t{i}"] = type(value)
    return f"_t{i}"


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()

__all__ = ["GuardEntry", "build_guard", "is_constant", "record"]
