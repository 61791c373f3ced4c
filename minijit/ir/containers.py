"""User containers flattened into leaves and a spec that rebuilds them afresh.

A jitted function may take and return tuples, lists, dicts, named tuples, dataclasses,
`OrderedDict`s, `defaultdict`s, other dict subclasses (a Hugging Face `ModelOutput` is an
`OrderedDict` that is also a dataclass) and types registered with `torch.utils._pytree`.
`flatten(value, is_leaf)` splits such a value into its leaves (tensors, proxies) and a
`Spec`; `spec.rebuild(leaves)` makes a new object of the same type and state around new
leaves, without calling the type's `__init__` (the state is copied, as `copy.copy` would):
so each call returns a fresh result built from that call's tensors.

Other objects that the caller says are *open* (the traced code created them: a Hugging Face
`DynamicCache` and its layers) are rebuilt the same way from their instance attributes,
when leaves are found in them. Any other object is kept as it is (a constant of the spec).

The flattener of a call's arguments (minijit.runtime.arguments, the checks of minijit.runtime.checks)
and of its result and effects (minijit.runtime.call_plan); the arguments and outputs of ops have
their own, faster one (minijit.ir.pytree, which says why).
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as torch_pytree

from minijit.ir.proxies import Proxy, number_values


class Spec:
    """How to rebuild a value from its leaves."""

    __slots__ = ()

    def rebuild(self, leaves: list[Any]) -> Any:
        """A new value of this spec's shape, with `leaves` in order."""
        return self._build(iter(leaves))

    def _build(self, leaves: Any) -> Any:
        raise NotImplementedError

    def key(self) -> tuple[Any, ...]:
        """A hashable description of the structure and constants (for cache keys)."""
        raise NotImplementedError

    def needs_rebuild(self) -> bool:
        """False when the value is made only of tuples, lists, str-keyed dicts and leaves, which a trace prints."""
        return True

    def describe(self, leaf_names: list[str]) -> str:
        """The value in words, with `leaf_names` for its leaves: `Out(a=t0, b=t1)`."""
        return self._describe(iter(leaf_names))

    def _describe(self, names: Any) -> str:
        raise NotImplementedError


class Leaf(Spec):
    """One leaf."""

    __slots__ = ()

    def _build(self, leaves: Any) -> Any:
        return next(leaves)

    def key(self) -> tuple[Any, ...]:
        return ("leaf",)

    def _describe(self, names: Any) -> str:
        return next(names)

    def needs_rebuild(self) -> bool:
        return False


class Constant(Spec):
    """A value kept as it is."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def _build(self, leaves: Any) -> Any:
        return self.value

    def _describe(self, names: Any) -> str:
        v = self.value
        return repr(v) if v is None or type(v) in (int, float, bool, str) else f"<{type(v).__name__}>"

    def key(self) -> tuple[Any, ...]:
        v = self.value
        if v is None or type(v) in (int, float, bool, str, complex, bytes):
            return (type(v), v)
        return (type(v), id(v))

    def needs_rebuild(self) -> bool:
        return False


class Sequence(Spec):
    """A tuple, list, named tuple or slice."""

    __slots__ = ("children", "kind")

    def __init__(self, kind: type, children: list[Spec]):
        self.kind = kind
        self.children = children

    def _build(self, leaves: Any) -> Any:
        items = [c._build(leaves) for c in self.children]
        if self.kind is list:
            return items
        if self.kind is tuple:
            return tuple(items)
        return self.kind(*items)  # a named tuple or a slice

    def key(self) -> tuple[Any, ...]:
        return (self.kind, *(c.key() for c in self.children))

    def _describe(self, names: Any) -> str:
        items = ", ".join(c._describe(names) for c in self.children)
        if self.kind is list:
            return f"[{items}]"
        if self.kind is tuple:
            return f"({items}{',' if len(self.children) == 1 else ''})"
        return f"{self.kind.__name__}({items})"

    def needs_rebuild(self) -> bool:
        return self.kind not in (tuple, list, slice) or any(c.needs_rebuild() for c in self.children)


class Mapping(Spec):
    """A dict, or an instance of a dict subclass or a dataclass: items and attributes, copied."""

    __slots__ = ("attributes", "children", "keys", "kind", "names")

    def __init__(self, kind: type, keys: list[Any], children: list[Spec], names: list[str], attributes: list[Spec]):
        self.kind = kind
        self.keys = keys
        self.children = children
        self.names = names
        self.attributes = attributes

    def _build(self, leaves: Any) -> Any:
        items = [(k, c._build(leaves)) for k, c in zip(self.keys, self.children)]
        attributes = [(n, a._build(leaves)) for n, a in zip(self.names, self.attributes)]
        if self.kind is dict:
            return dict(items)
        obj = self.kind.__new__(self.kind)
        # The storage's own setter: OrderedDict keeps its order apart from dict's, and a subclass's
        # `__setitem__` (ModelOutput's) may do more than store.
        store = collections.OrderedDict.__setitem__ if isinstance(obj, collections.OrderedDict) else dict.__setitem__
        for k, v in items:
            store(obj, k, v)
        for name, value in attributes:
            object.__setattr__(obj, name, value)
        return obj

    def key(self) -> tuple[Any, ...]:
        return (self.kind, tuple(self.keys), *(c.key() for c in self.children), tuple(self.names),
                *(a.key() for a in self.attributes))

    def _describe(self, names: Any) -> str:
        items = ", ".join(f"{k!r}: {c._describe(names)}" for k, c in zip(self.keys, self.children))
        attributes = ", ".join(f"{n}={a._describe(names)}" for n, a in zip(self.names, self.attributes))
        if self.kind is dict:
            return "{" + items + "}"
        parts = [p for p in ("{" + items + "}" if items else "", attributes) if p]
        return f"{self.kind.__name__}({', '.join(parts)})"

    def needs_rebuild(self) -> bool:
        return (self.kind is not dict or any(type(k) is not str for k in self.keys)
                or any(c.needs_rebuild() for c in self.children))


class Registered(Spec):
    """A type registered with `torch.utils._pytree`: rebuilt by its own unflatten function."""

    __slots__ = ("children", "context", "kind")

    def __init__(self, kind: type, context: Any, children: list[Spec]):
        self.kind = kind
        self.context = context
        self.children = children

    def _build(self, leaves: Any) -> Any:
        values = [c._build(leaves) for c in self.children]
        return torch_pytree.SUPPORTED_NODES[self.kind].unflatten_fn(values, self.context)

    def _describe(self, names: Any) -> str:
        return f"{self.kind.__name__}({', '.join(c._describe(names) for c in self.children)})"

    def key(self) -> tuple[Any, ...]:
        try:
            hash(self.context)
            context: Any = self.context
        except TypeError:
            context = repr(self.context)
        return (self.kind, context, *(c.key() for c in self.children))


def is_container(value: Any) -> bool:
    """True for the values `flatten` looks into."""
    t = type(value)
    return (t is tuple or t is list or t is dict or t is slice or isinstance(value, tuple | list | dict)
            or (dataclasses.is_dataclass(value) and not isinstance(value, type)) or t in torch_pytree.SUPPORTED_NODES)


def is_tensor(value: Any) -> bool:
    """The leaves of a call's arguments that are trace inputs in "constant values" mode: tensors.

    The leaf tests of the runtime's flattening of arguments live here, beside the flattener, so
    that flattening never calls back up into the runtime for them.
    """
    return isinstance(value, torch.Tensor)


def is_tensor_or_number(value: Any) -> bool:
    """The leaves of a call's arguments that are trace inputs in "symbolic values" mode: tensors, Python ints and
    floats (not bools)."""
    return isinstance(value, torch.Tensor) or type(value) is int or type(value) is float


def flatten(value: Any, is_leaf: Callable[[Any], bool], is_open: Callable[[Any], bool] | None = None
            ) -> tuple[Spec, list[Any]]:
    """Split `value` into a `Spec` and its leaves (the values where `is_leaf` is True), in order.

    An object of a plain Python class (instance attributes in a `__dict__`, object's `__new__`
    and copy protocol) for which `is_open` is True is looked into too: rebuilt from its
    attributes when leaves are among them, kept as it is otherwise.
    """
    leaves: list[Any] = []
    spec = _flatten(value, _Walk(is_leaf, is_open, set()), leaves, 0)
    return spec, leaves


def leaves(value: Any, is_leaf: Callable[[Any], bool]) -> list[Any]:
    """The leaves `flatten` gives, in the same order, without building the spec (the per-call path)."""
    out: list[Any] = []
    _collect(value, is_leaf, out, 0)
    return out


def sequence_leaves(value: Any) -> list[Any]:
    """The leaves of nested lists and tuples, in order: an op's outputs (tensors, Nones, others) as its meta run
    and its eager run give them."""
    if isinstance(value, list | tuple):
        return [leaf for x in value for leaf in sequence_leaves(x)]
    return [value]


def _collect(value: Any, is_leaf: Callable[[Any], bool], out: list[Any], depth: int) -> None:
    if is_leaf(value):
        out.append(value)
        return
    t = type(value)
    if depth > _MAX_DEPTH:
        return
    if t is tuple or t is list:
        for v in value:
            _collect(v, is_leaf, out, depth + 1)
    elif t is dict:
        for v in value.values():
            _collect(v, is_leaf, out, depth + 1)
    elif is_container(value):
        out += _flatten_leaves(value, is_leaf, depth)


def _flatten_leaves(value: Any, is_leaf: Callable[[Any], bool], depth: int) -> list[Any]:
    found: list[Any] = []
    _flatten(value, _Walk(is_leaf, None, set()), found, depth)
    return found


_MAX_DEPTH = 64


class _Walk:
    """What one `flatten` looks for: leaves, open objects, and the open objects on the current path."""

    __slots__ = ("is_leaf", "is_open", "path")

    def __init__(self, is_leaf: Callable[[Any], bool], is_open: Callable[[Any], bool] | None, path: set[int]):
        self.is_leaf = is_leaf
        self.is_open = is_open
        self.path = path


def _flatten(value: Any, walk: _Walk, leaves: list[Any], depth: int) -> Spec:
    if walk.is_leaf(value):
        leaves.append(value)
        return Leaf()
    if depth > _MAX_DEPTH:
        return Constant(value)
    t = type(value)
    if t is tuple or t is list or (isinstance(value, tuple) and hasattr(value, "_fields")):
        return Sequence(t, [_flatten(v, walk, leaves, depth + 1) for v in value])
    if t is slice:
        return Sequence(slice, [_flatten(v, walk, leaves, depth + 1) for v in (value.start, value.stop, value.step)])
    if isinstance(value, dict):
        keys = list(value.keys())
        children = [_flatten(dict.__getitem__(value, k), walk, leaves, depth + 1) for k in keys]
        names, attributes = _attributes(value, walk, leaves, depth)
        if isinstance(value, collections.defaultdict):
            names.append("default_factory")
            attributes.append(Constant(value.default_factory))
        # A key the call computes (a symbolic size) as its value: building the dict hashed it, which the capture guards.
        return Mapping(t, [number_values(k) for k in keys], children, names, attributes)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names, attributes = _attributes(value, walk, leaves, depth)
        return Mapping(t, [], [], names, attributes)
    if t in torch_pytree.SUPPORTED_NODES and t is not collections.deque:
        children, context = torch_pytree.SUPPORTED_NODES[t].flatten_fn(value)
        return Registered(t, context, [_flatten(v, walk, leaves, depth + 1) for v in children])
    if walk.is_open is not None and id(value) not in walk.path and _plain_object(value) and walk.is_open(value):
        before = len(leaves)
        walk.path.add(id(value))  # a cycle back to an object being flattened stays a constant
        names, attributes = _attributes(value, walk, leaves, depth)
        walk.path.discard(id(value))
        if len(leaves) > before:
            return Mapping(t, [], [], names, attributes)
    return Constant(value)


def _plain_object(value: Any) -> bool:
    """True for an instance of a Python class that `copy.copy` would copy as `__new__` + its `__dict__`."""
    t = type(value)
    if (not isinstance(getattr(value, "__dict__", None), dict) or isinstance(value, type | torch.nn.Module | torch.Tensor)
            or t.__new__ is not object.__new__ or t.__reduce_ex__ is not object.__reduce_ex__
            or t.__reduce__ is not object.__reduce__ or hasattr(t, "__copy__")):
        return False
    return all(set(vars(k).get("__slots__", ())) <= {"__dict__", "__weakref__"} for k in t.__mro__)


def _attributes(value: Any, walk: _Walk, leaves: list[Any], depth: int) -> tuple[list[str], list[Spec]]:
    """The instance attributes of `value` (its `__dict__`, or its dataclass fields when it has slots)."""
    own = getattr(value, "__dict__", None)
    if isinstance(own, dict):
        names = list(own)
    elif dataclasses.is_dataclass(value):
        names = [f.name for f in dataclasses.fields(value) if hasattr(value, f.name)]
    else:
        names = []
    return names, [_flatten(getattr(value, n) if own is None else own[n], walk, leaves, depth + 1) for n in names]


def contains_proxy(value: Any, depth: int = 4) -> bool:
    """True when a proxy is reachable from `value` through containers and instance attributes (a bounded search)."""
    if isinstance(value, Proxy):
        return True
    if depth == 0 or value is None or isinstance(value, _OPAQUE):
        return False
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list | tuple | set | frozenset | collections.deque):
        items = value
    else:
        own = getattr(value, "__dict__", None)
        items = own.values() if isinstance(own, dict) else ()
    return any(contains_proxy(v, depth - 1) for v in items)


# Values no proxy can hide in (or that are not worth looking into).
_OPAQUE = (int, float, bool, str, bytes, complex, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
           torch.Tensor, torch.dtype, torch.device)


__all__ = ["Constant", "Leaf", "Mapping", "Registered", "Sequence", "Spec", "contains_proxy", "flatten", "is_container",
           "is_tensor", "is_tensor_or_number", "leaves", "sequence_leaves"]
