"""Guards: the Python values a trace specialised on, and one compiled function that re-checks them.

While interpreting, every value the traced code reads from outside the call (a global, a
builtin, a closure cell, an attribute or item of an object that exists outside the call,
the length, keys or membership of such a container) is recorded as a `GuardEntry`
saying where it came from and what it was. `build_guard(entries)` turns them into a
single generated function; the runtime calls it on a cache hit, so a changed value is a
cache miss, never a wrong result (docs/design.md, invariant 7).

Where a value lives is a `Source`: an object held by reference (a globals dict, a cell,
a container or object whose own identity is guarded) and how to read the value from it.
Tensors are never held: a tensor read from outside is read again from its source on
every call (minijit.frontend.outside), so a source may also start from a tensor's source
(`p.grad` where `p` is itself read from a list), and a guard entry keeps of a tensor only
its metadata (`TensorSeen`): a global rebound to a new tensor frees the old one, as in eager.
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.frontend.code import is_library_file
from minijit.ir import Proxy
from minijit.ir.proxies import number_values, zero_sign_test

_CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(...), torch.dtype, torch.device)
_SKIPPED_MODULES = ("torch", "minijit")
MISSING_ATTRIBUTE = object()


@dataclass(frozen=True, eq=False)
class Source:
    """Where a value read from outside the call lives: `access` applied to `holder`.

    `holder` is an object held by reference, or another `Source` (then the holder, a
    tensor, is read afresh on each call). `access` is "item" (`holder[key]`), "attribute"
    (`holder.__dict__[key]`), "cell" (`holder.cell_contents`) or "tensor attribute"
    (`getattr(holder, key)`, e.g. `.grad`) or "call" (`holder()`, the referent of a weakref); or "input": the
    tensor the call passed as the trace input named `key` (no holder; read where the inputs are parameters:
    the entry's guard, its fetch of captured tensors, its effects). `label` names the value in traces and messages.
    """

    holder: Any = field(repr=False)
    access: str
    key: Any = None
    label: str = "captured"

    def expression(self, env: dict[str, Any]) -> str:
        """Python source reading the value, with the objects it needs bound in `env`."""
        if self.access == "input":
            return self.key
        holder = self.holder.expression(env) if isinstance(self.holder, Source) else bind(env, self.holder, "_h")
        if self.access == "cell":
            return f"{holder}.cell_contents"
        if self.access == "attribute" and slot_attribute(self.holder, self.key):
            return f"{holder}.{self.key}"
        if self.access == "attribute":
            return f"{holder}.__dict__[{_literal(env, self.key)}]"
        if self.access == "tensor attribute":
            return f"{holder}.{self.key}"
        if self.access == "call":
            return f"{holder}()"
        return f"{holder}[{_literal(env, self.key)}]"


def bind(env: dict[str, Any], value: Any, prefix: str) -> str:
    """A name for `value` in the generated source whose globals are `env`: the one it is bound to already under
    `prefix`, else a new one."""
    # The names already bound, by `bound_key`, kept in `env` itself: a guard may bind hundreds of objects.
    bound: dict[tuple[Any, ...], str] = env.setdefault("_bound_names", {})
    key = bound_key(value, prefix)
    name = bound.get(key)
    if name is not None and (env.get(name) is value or (len(key) == 3 and env.get(name) == value)):
        return name
    n = len(env)
    while f"{prefix}{n}" in env:  # (a rebind's environment drops names, so its size may name a bound one)
        n += 1
    name = f"{prefix}{n}"
    env[name] = value
    bound[key] = name
    return name


def bound_key(value: Any, prefix: str) -> tuple[Any, ...]:
    """How `bind` finds a value's name: an object by its id; an int (an object's id, `_id`) by its value, so that
    an entry rebound to a new object binds the new id under the old name."""
    return (value, prefix, int) if type(value) is int else (id(value), prefix)


def _literal(env: dict[str, Any], key: Any) -> str:
    if type(key) in (int, str, bool, float) or key is None:
        return repr(key)
    return bind(env, key, "_k")


@dataclass(frozen=True)
class TensorSeen:
    """What the cache keeps of a tensor read from outside the call: its type and metadata, never the tensor.

    The trace reads such a tensor again from its source on every call, so nothing of the cache
    needs the object itself, and holding it would keep it alive after the user let it go.
    """

    cls: type
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> TensorSeen:
        """The metadata of `t`."""
        return TensorSeen(type(t), t.shape, t.dtype, t.device, t.requires_grad)

    @property
    def ndim(self) -> int:
        """The tensor's rank."""
        return len(self.shape)


@dataclass(frozen=True)
class NumberSlot:
    """What a guard keeps of a number read from a dynamic source (minijit.runtime.dynamic): the trace takes it
    as an input, read afresh on every call, so only its type is checked (a tuple of numbers: the tuple's length
    and each item's type). `was` is the value seen while tracing, for messages."""

    types: type | tuple[type, ...]
    was: Any

    @staticmethod
    def of(value: Any) -> NumberSlot:
        """The slot of `value`, an int, a float or a tuple of those."""
        types = tuple(type(v) for v in value) if type(value) is tuple else type(value)
        return NumberSlot(types, value)

    def __repr__(self) -> str:
        return f"a symbolic number (was {short_repr(self.was)})"


def is_symbolic_number_value(value: Any) -> bool:
    """An int or float (not a bool), or a short tuple of those: what a dynamic source may make symbolic."""
    if type(value) is tuple:
        return 0 < len(value) <= MAX_NUMBER_TUPLE and all(type(v) is int or type(v) is float for v in value)
    return type(value) is int or type(value) is float


# The longest tuple of numbers a dynamic source makes symbolic item by item (Adam's betas: 2).
MAX_NUMBER_TUPLE = 8


@dataclass(frozen=True, eq=False)
class GuardEntry:
    """One fact about the outside world the trace relied on, where from, and what it was.

    `kind` says where the value was read and how it is checked:

    - "global" (`namespace` is a globals dict or a module's `__dict__`), "builtin" (the builtins
      dict; `shadow` is the globals dict that must still not define the name), "cell" (a closure
      cell), "attribute" (read through `namespace.__dict__`; `shadow`, if any, is the instance dict
      that must not define the name when the value came from the class), "item" (`namespace[name]`),
      "tensor attribute" (`getattr(tensor, name)` where `namespace` is the tensor's `Source`), "referent"
      (`namespace()`, what the weakref `namespace` refers to):
      the value itself, by equality for constants, by identity for other objects, and only
      "still a tensor" for tensors (they are read again on each call; `value` is then a `TensorSeen`),
      and only the type for a number the trace takes as an input (`value` is then a `NumberSlot`);
    - "contains" (`name in namespace` was `value`), "length" (`len(namespace) == value`),
      "keys" (the keys of `namespace`, in order, were `value`).
    """

    kind: str
    namespace: Any = field(repr=False)
    name: Any
    value: Any
    shadow: dict[str, Any] | None = field(default=None, repr=False)
    # The name of the object read from, where it has one (`param_groups_0`), for messages.
    owner: str = ""
    # Of a list, dict or set of constants: its contents when the trace read it, which the guard compares with (another
    # thread may change the container before the guard is made).
    contents: Any = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        where = {"global": "global", "builtin": "builtin", "cell": "closure variable", "attribute": "attribute",
                 "tensor attribute": "tensor attribute", "referent": "referent of a weakref"}.get(self.kind)
        owner = self.owner or f"a {type(self.namespace).__name__}"
        if self.kind == "item":
            return f"item [{short_repr(self.name)}] of {owner} = {short_repr(self.value)}"
        if self.kind == "contains":  # (a key may be a tensor: an optimizer's state is keyed by parameters)
            return f"{short_repr(self.name)} {'in' if self.value else 'not in'} {owner}"
        if self.kind == "length":
            return f"len of {owner} = {self.value}"
        if self.kind == "keys":
            return f"keys of {owner} = {short_repr(self.value)}"
        if self.kind == "tensor attribute" and self.owner:
            return f"{self.owner}.{self.name} = {short_repr(self.value)}"
        return f"{where} {self.name} = {short_repr(self.value)}"


def short_repr(value: Any) -> str:
    """A one-line, short repr of a value for messages and trace comments."""
    text = " ".join(_bounded_repr(value, 60).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _bounded_repr(value: Any, limit: int) -> str:
    """repr(value), but tensors as their shapes and lists, tuples and dicts cut off past about `limit`
    characters (a list of tensors is never printed whole)."""
    if isinstance(value, torch.Tensor | TensorSeen):
        return f"a tensor of shape {tuple(value.shape)}"
    if type(value) in (list, tuple, dict):
        items = value.items() if isinstance(value, dict) else value
        parts: list[str] = []
        length = 0
        for item in items:
            part = (f"{_bounded_repr(item[0], limit)}: {_bounded_repr(item[1], limit)}" if isinstance(value, dict)
                    else _bounded_repr(item, limit))
            parts.append(part)
            length += len(part) + 2
            if length > limit:
                parts.append("...")
                break
        open_, close = {list: "[]", tuple: "()", dict: "{}"}[type(value)]
        return open_ + ", ".join(parts) + ("," if type(value) is tuple and len(parts) == 1 else "") + close
    return repr(value)


def is_constant(value: Any) -> bool:
    """True for values guarded by type and equality: numbers, strings, None, dtypes and tuples of those."""
    t = type(value)
    if t in _CONSTANT_TYPES:
        return True
    if t is tuple or t is frozenset:
        return all(is_constant(v) for v in value)
    return False


def _snapshot(value: Any) -> Any:
    """A copy of a list/dict/set of constants (guarded by equality), else None. The copy is made first, natively, in
    one step: another thread may be changing the container."""
    t = type(value)
    if t is list or t is set:
        copy = t(value)
        return copy if all(is_constant(v) for v in copy) else None
    if t is dict:
        copy = dict(value)
        return copy if all(is_constant(k) and is_constant(v) for k, v in copy.items()) else None
    return None


def has_snapshot(value: Any) -> bool:
    """True when `value` is a list, dict or set of constants, which a guard compares whole."""
    return _snapshot(value) is not None


def skipped(namespace: Any) -> bool:
    """True for the globals of torch and minijit themselves, never guarded (their values are fixed)."""
    if isinstance(namespace, dict):
        module = namespace.get("__name__")
        return isinstance(module, str) and module.split(".")[0] in _SKIPPED_MODULES
    return False


def slot_attribute(obj: Any, name: Any) -> bool:
    """Whether `obj.name` is stored in one of the `__slots__` of its class (not in an instance `__dict__`)."""
    return (isinstance(name, str) and not isinstance(obj, type)
            and isinstance(inspect.getattr_static(type(obj), name, None), types.MemberDescriptorType))


@functools.cache
def slot_names(cls: type) -> tuple[str, ...]:
    """The attributes instances of `cls` store in `__slots__` of classes written in Python, sorted."""
    return tuple(sorted({n for k in cls.__mro__ if "__slots__" in vars(k) for n, v in vars(k).items()
                         if isinstance(v, types.MemberDescriptorType)}))


def may_have_guarded_attributes(value: Any) -> bool:
    """True for objects whose attribute and item reads are worth guarding: containers, instances, user classes."""
    if isinstance(value, types.ModuleType):
        return is_users_module(value)
    if isinstance(value, Proxy | torch.Tensor | types.FunctionType | types.BuiltinFunctionType
                  | types.MethodType) or is_constant(value):
        return False
    if isinstance(value, type):
        module = getattr(value, "__module__", "") or ""
        return module.split(".")[0] not in _SKIPPED_MODULES and module != "builtins"
    return (hasattr(value, "__dict__") or isinstance(value, list | dict | set | tuple | collections.deque | weakref.ref)
            or bool(slot_names(type(value))))


def is_users_module(module: types.ModuleType) -> bool:
    """A module of the user's own code (a config module, say): not the standard library, an installed
    package, torch or minijit. Its attributes are guarded like globals."""
    name = module.__name__
    known = _USER_MODULES.get(id(module))
    if known is not None:
        return known[1]
    file = getattr(module, "__file__", None)
    if name.split(".")[0] in _SKIPPED_MODULES or name in sys.builtin_module_names:
        decision = False
    elif isinstance(file, str):
        decision = not is_library_file(file)
    else:
        decision = getattr(module, "__spec__", None) is None  # made at run time (types.ModuleType("cfg"))
        _USER_MODULES[id(module)] = (module, decision)  # the module is kept alive: its id stays its own
    return decision


_USER_MODULES: dict[int, tuple[types.ModuleType, bool]] = {}


def attribute_source(obj: Any, name: str) -> tuple[Any, dict[str, Any] | None] | None:
    """Where `obj.name` is stored as plain data: (obj, None) for its own `__dict__`, (class, instance dict)
    for a class attribute read through an instance; None when it is computed (properties, __getattr__)."""
    own = getattr(obj, "__dict__", None)
    if (isinstance(own, dict) and name in own) or slot_attribute(obj, name):
        return obj, None
    if isinstance(obj, type):
        # A class's own attribute (a counter, a setting), stored as data rather than computed.
        stored = vars(obj).get(name, MISSING_ATTRIBUTE)
        if stored is not MISSING_ATTRIBUTE and not hasattr(stored, "__get__"):
            return obj, None
        return None
    if not isinstance(obj, type) and isinstance(own, dict):
        cls = type(obj)
        if name in vars(cls) and not hasattr(vars(cls)[name], "__set__") and cls.__module__.split(".")[0] not in _FIXED_CLASSES:
            return cls, own
    return None


# Modules whose classes' attributes are taken as fixed (methods of dict, torch.optim.SGD, ...).
_FIXED_CLASSES = ("builtins", "collections", "torch", "minijit")


def record(guards: dict[tuple[Any, ...], GuardEntry], kind: str, namespace: Any, name: Any, value: Any,
           shadow: dict[str, Any] | None = None, owner: str = "") -> None:
    """Add a guard entry unless the value is a proxy or the same read was recorded already (first read wins)."""
    name = number_values(name)
    if kind == "keys":
        value = number_values(value)
    try:
        key = (kind, id(namespace), name, id(shadow))
        hash(key)
    except TypeError:  # an unhashable key: guard it by identity
        key = (kind, id(namespace), id(name), id(shadow))
    if key in guards or isinstance(value, Proxy):
        return
    if isinstance(value, torch.Tensor):
        value = TensorSeen.of(value)  # read again on each call: the guard checks only that it is still a tensor
    guards[key] = GuardEntry(kind, namespace, name, value, shadow, owner, _snapshot(value))


def build_guard(entries: list[GuardEntry]) -> Callable[[], bool] | None:
    """Compile one function that returns True while every entry still holds, or None for no entries.

    Modules, functions, classes and other objects are compared by identity; numbers,
    strings, None and tuples of those by type and equality; lists/dicts/sets of constants
    by type and equality with a copy taken now; tensors only by being tensors.

    Example::

        check = build_guard(entries)  # the entries `interpret(..., guards=entries)` gathered
        if check is not None and not check():
            ...  # retrace
    """
    if not entries:
        return None
    env = guard_names()
    terms = [guard_expression(env, i, entry) for i, entry in enumerate(entries)]
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


def guard_names() -> dict[str, Any]:
    """The names `guard_expression`'s source reads besides those it binds: the start of a guard's environment."""
    return {"_MISSING": _MISSING, "_Tensor": torch.Tensor, "_same_keys": same_keys, "_dict_get": dict.get,
            "_own_dict": own_dict, "_copysign": math.copysign, "math": math}


def guard_expression(env: dict[str, Any], i: int, entry: GuardEntry) -> str:
    """The Python expression that is True while `entry` (the `i`th of a guard) holds; what it reads is bound in `env`."""
    if isinstance(entry.namespace, Source):
        ns = entry.namespace.expression(env)
    else:
        ns = f"_ns{i}"
        env[ns] = entry.namespace
    key = _literal(env, entry.name)
    kind = entry.kind
    if kind == "contains":
        return f"(({key} in {ns}) is {entry.value!r})"
    if kind == "length" and entry.value == 0 and type(entry.namespace) in _SIZED_BY_TRUTH:
        return f"not {ns}"  # (an empty hook dict of each module: a hit's guard asks a hundred of them)
    if kind == "length":
        return f"len({ns}) == {entry.value!r}"
    if kind == "keys":
        env[f"_v{i}"] = entry.value
        return f"_same_keys({ns}, _v{i})"
    read = _READS[read_form(entry)].format(ns=ns, key=key)
    value = entry.value
    snapshot = entry.contents if entry.contents is not None else _snapshot(value)
    if isinstance(value, TensorSeen):
        term = f"isinstance({read}, _Tensor)"
    elif isinstance(value, NumberSlot):
        env[f"_t{i}"] = value.types
        term = (f"type({read}) is _t{i}" if isinstance(value.types, type)
                else f"type({_READ} := {read}) is tuple and tuple(map(type, {_READ})) == _t{i}")
    elif is_constant(value) or snapshot is not None:
        env[f"_v{i}"] = snapshot if snapshot is not None else value
        env[f"_t{i}"] = type(value)
        sign = zero_sign_test(_READ, value)
        term = f"(type({_READ} := {read}) is _t{i} and {_READ} == _v{i}{f' and {sign}' if sign else ''})"
    else:
        env[f"_v{i}"] = value
        term = f"{read} is _v{i}"
    if entry.shadow is not None:
        env[f"_g{i}"] = entry.shadow
        term = f"{entry.name!r} not in _g{i} and {term}"
    return term


def read_form(entry: GuardEntry) -> str:
    """How the guard of a value read (not of a container's length, keys or membership) reads it again: a key of
    `_READS`."""
    kind = entry.kind
    if kind == "attribute" and _reads_through_python(entry.namespace):
        return "own dict"  # (skips the class's own `__getattribute__`: see `_reads_through_python`)
    if kind == "attribute" and slot_attribute(entry.namespace, entry.name):
        return "getattr"
    if kind in ("cell", "referent", "attribute"):
        return kind
    if kind == "tensor attribute":
        return "getattr"
    if kind == "item" and not isinstance(entry.namespace, dict):
        return "subscript"
    # globals, builtins and dict items: dict's own `get` (it never runs a defaultdict's factory, nor a subclass's
    # `get`, which may mean something else: transformers' _CanRecordRegistry.get(model))
    return "dict get"


_READS = {"own dict": "_own_dict({ns}).get({key}, _MISSING)", "getattr": "getattr({ns}, {key}, _MISSING)",
          "cell": "{ns}.cell_contents", "referent": "{ns}()", "attribute": "{ns}.__dict__.get({key}, _MISSING)",
          "subscript": "{ns}[{key}]", "dict get": "_dict_get({ns}, {key}, _MISSING)"}


# Built-in containers whose truth is their length: `not x` tests emptiness at less cost than `len(x) == 0`.
_SIZED_BY_TRUTH = frozenset({dict, list, tuple, collections.OrderedDict})
# The local a test reads a value into, to check its type and then its value: a name no trace input or tensor
# read from outside takes (those are named after the user's variables and attributes, `_x` among them).
_READ = "_minijit_read"


def _reads_through_python(namespace: Any) -> bool:
    """Whether `namespace.__dict__` runs a `__getattribute__` written in Python (a transformers config's, on every
    read of every attribute): a guard then takes the instance dict directly (`own_dict`), where the attribute is
    stored, as the frontend found it (`attribute_source`)."""
    return (not isinstance(namespace, Source)
            and type(namespace).__getattribute__ not in (object.__getattribute__, type.__getattribute__))


def own_dict(obj: Any) -> dict[str, Any]:
    """`obj`'s instance dict, read as `object` reads it (not through its class's `__getattribute__`)."""
    return object.__getattribute__(obj, "__dict__")


def same_keys(container: Any, keys: tuple[Any, ...]) -> bool:
    """True when `container` iterates over exactly `keys`: constants by equality, objects by identity."""
    now = tuple(container)
    return len(now) == len(keys) and all(a is b or (is_constant(b) and type(a) is type(b) and a == b)
                                         for a, b in zip(now, keys))


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
MISSING = _MISSING


def accumulated_leaves(tensors: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    """id -> tensor: the leaves whose `.grad` a backward from `tensors` through their autograd graph accumulates
    into (each AccumulateGrad node's variable)."""
    found: dict[int, torch.Tensor] = {}
    stack = [t.grad_fn for t in tensors]
    # The nodes by id, held: torch may make a new Python object for a node at each access and free it after,
    # and an id freed could come back for another node.
    seen: dict[int, Any] = {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            found[id(variable)] = variable
        stack.extend(n for n, _ in node.next_functions)
    return found


def not_in_history(tensors: Sequence[torch.Tensor], read: Sequence[torch.Tensor]) -> bool:
    """Whether a backward from `tensors` through their histories leaves the `.grad` of each of `read` alone (a
    guard's check)."""
    leaves = accumulated_leaves(tensors)
    return not any(id(t) in leaves for t in read)

__all__ = ["accumulated_leaves", "bind", "build_guard", "guard_expression", "guard_names", "GuardEntry", "has_snapshot",
           "is_constant", "is_symbolic_number_value", "is_users_module", "MISSING", "not_in_history", "NumberSlot",
           "record", "same_keys", "slot_attribute", "slot_names", "Source", "TensorSeen"]
