"""Building containers and strings: tuples, lists, sets, dicts, slices, f-strings, unpacking."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minijit.frontend.code import Inst
from minijit.frontend.frame import Frame, observe_iteration, observe_mapping
from minijit.frontend.opcodes.calls import function_str
from minijit.frontend.opcodes.protocols import call_dunder, get_iter, next_item, python_members
from minijit.frontend.opcodes.table import handles
from minijit.ir import TensorProxy
from minijit.ir.proxies import user_text


def _pop_n(frame: Frame, n: int) -> list[Any]:
    stack = frame.stack
    if not n:
        return []
    items = stack[len(stack) - n:]
    del stack[len(stack) - n:]
    return items


@handles("BUILD_TUPLE")
def build_tuple(frame: Frame, inst: Inst) -> None:
    """Replace the top n items by a tuple of them."""
    frame.stack.append(tuple(_pop_n(frame, inst.arg)))


@handles("BUILD_LIST")
def build_list(frame: Frame, inst: Inst) -> None:
    """Replace the top n items by a list of them."""
    frame.stack.append(_pop_n(frame, inst.arg))


@handles("BUILD_SET")
def build_set(frame: Frame, inst: Inst) -> None:
    """Replace the top n items by a set of them."""
    frame.stack.append(set(_pop_n(frame, inst.arg)))


@handles("BUILD_MAP")
def build_map(frame: Frame, inst: Inst) -> None:
    """Replace the top 2n items (key, value, ...) by a dict."""
    items = _pop_n(frame, 2 * inst.arg)
    frame.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


@handles("BUILD_CONST_KEY_MAP")
def build_const_key_map(frame: Frame, inst: Inst) -> None:
    """A dict from the tuple of keys on top and the n values below it."""
    keys = frame.stack.pop()
    frame.stack.append(dict(zip(keys, _pop_n(frame, inst.arg))))


@handles("BUILD_SLICE")
def build_slice(frame: Frame, inst: Inst) -> None:
    """slice(start, stop[, step])."""
    frame.stack.append(slice(*_pop_n(frame, inst.arg)))


@handles("BUILD_STRING")
def build_string(frame: Frame, inst: Inst) -> None:
    """Concatenate the top n strings (f-strings)."""
    frame.stack.append("".join(_pop_n(frame, inst.arg)))


@handles("FORMAT_VALUE", until="3.12")
def format_value(frame: Frame, inst: Inst) -> None:
    """f-string field: optional !s/!r/!a conversion, then format() with the spec."""
    flags = inst.arg
    spec = frame.stack.pop() if flags & 0x04 else ""
    value = _convert(frame.stack.pop(), flags & 0x03)
    frame.stack.append(_format(value, spec))


def _convert(value: Any, conversion: int) -> Any:
    """An f-string field's conversion: 1 is !s, 2 is !r, 3 is !a (0: none)."""
    with user_text():
        return _converted(value, conversion)


def _converted(value: Any, conversion: int) -> Any:
    members = python_members(type(value))
    if conversion == 1:
        return call_dunder(value, "__str__") if "__str__" in members else str(value)
    if conversion == 2:
        return call_dunder(value, "__repr__") if "__repr__" in members else repr(value)
    if conversion == 3:
        return ascii(value)
    return value


def _format(value: Any, spec: str) -> str:
    """format(value, spec), with a Python `__format__` (or `__str__`) interpreted."""
    if type(value) is str and not spec:
        return value
    with user_text():
        return _formatted(value, spec)


def _formatted(value: Any, spec: str) -> str:
    members = python_members(type(value))
    if "__format__" in members:
        return call_dunder(value, "__format__", spec)
    if not spec and "__str__" in members:
        return call_dunder(value, "__str__")
    return format(value, spec)


@handles("CONVERT_VALUE", since="3.13")
def convert_value(frame: Frame, inst: Inst) -> None:
    """f-string field conversion (3.13 split FORMAT_VALUE in three): !s, !r or !a of the top."""
    frame.stack[-1] = _convert(frame.stack[-1], inst.arg)


@handles("FORMAT_SIMPLE", since="3.13")
def format_simple(frame: Frame, inst: Inst) -> None:
    """f-string field without a spec: format(top)."""
    frame.stack[-1] = _format(frame.stack[-1], "")


@handles("FORMAT_WITH_SPEC", since="3.13")
def format_with_spec(frame: Frame, inst: Inst) -> None:
    """f-string field with a spec: format(value, spec) (stack: value, spec)."""
    spec = frame.stack.pop()
    frame.stack[-1] = _format(frame.stack[-1], spec)


@handles("LIST_TO_TUPLE", until="3.11")
def list_to_tuple(frame: Frame, inst: Inst) -> None:
    """Turn the list on top into a tuple."""
    frame.stack[-1] = tuple(frame.stack[-1])


@handles("LIST_APPEND")
def list_append(frame: Frame, inst: Inst) -> None:
    """Pop and append to the list i items down (comprehensions)."""
    value = frame.stack.pop()
    frame.stack[-inst.arg].append(value)


@handles("SET_ADD")
def set_add(frame: Frame, inst: Inst) -> None:
    """Pop and add to the set i items down."""
    value = frame.stack.pop()
    frame.stack[-inst.arg].add(value)


@handles("MAP_ADD")
def map_add(frame: Frame, inst: Inst) -> None:
    """Pop value and key; store them in the dict i items down."""
    value = frame.stack.pop()
    key = frame.stack.pop()
    frame.stack[-inst.arg][key] = value


@handles("LIST_EXTEND")
def list_extend(frame: Frame, inst: Inst) -> None:
    """Pop an iterable and extend the list i items down ([*a, *b], f(*a, *b))."""
    iterable = frame.stack.pop()
    try:
        frame.stack[-inst.arg].extend(interpreted_iterable(iterable))
    except TypeError:
        if not hasattr(type(iterable), "__iter__") and not hasattr(type(iterable), "__getitem__"):
            raise TypeError(f"Value after * must be an iterable, not {type(iterable).__name__}") from None
        raise


@handles("SET_UPDATE")
def set_update(frame: Frame, inst: Inst) -> None:
    """Pop an iterable and add its items to the set i items down."""
    iterable = frame.stack.pop()
    frame.stack[-inst.arg].update(interpreted_iterable(iterable))


@handles("DICT_UPDATE")
def dict_update(frame: Frame, inst: Inst) -> None:
    """Pop a mapping and update the dict i items down ({**a})."""
    update = frame.stack.pop()
    if not hasattr(update, "keys"):
        raise TypeError(f"'{type(update).__name__}' object is not a mapping")
    observe_mapping(update)
    frame.stack[-inst.arg].update(update)


@handles("DICT_MERGE", until="3.12")
def dict_merge(frame: Frame, inst: Inst) -> None:
    """Pop a mapping and merge it into the kwargs dict i items down, refusing repeated keys (f(**a, **b))."""
    update = frame.stack.pop()
    _merge_kwargs(frame.stack[-inst.arg], update, frame.stack[-inst.arg - 2])  # [NULL, f, args, kwargs]


@handles("DICT_MERGE", since="3.13")
def dict_merge_313(frame: Frame, inst: Inst) -> None:
    """DICT_MERGE under 3.13's call layout (the function sits below NULL, not above it)."""
    update = frame.stack.pop()
    _merge_kwargs(frame.stack[-inst.arg], update, frame.stack[-inst.arg - 3])  # [f, NULL, args, kwargs]


def _merge_kwargs(target: dict[Any, Any], update: Any, fn: Any) -> None:
    if not hasattr(update, "keys"):
        raise TypeError(f"{function_str(fn)} argument after ** must be a mapping, not {type(update).__name__}")
    observe_mapping(update)
    for key in update.keys():
        if key in target:
            raise TypeError(f"{function_str(fn)} got multiple values for keyword argument '{key}'")
        target[key] = update[key]


# -- unpacking ----------------------------------------------------------------------------------
class _InterpretedIterator:
    """Wraps an object with a Python `__iter__`/`__next__` so native code drives it through the interpreter."""

    __slots__ = ("it",)

    def __init__(self, it: Any):
        self.it = it

    def __iter__(self) -> _InterpretedIterator:
        return self

    def __next__(self) -> Any:
        return next_item(self.it)


def interpreted_iterable(obj: Any) -> Any:
    """`obj`, or a wrapper that makes native iteration over it run its Python `__iter__`/`__next__`."""
    if isinstance(obj, TensorProxy):
        return get_iter(obj)
    members = python_members(type(obj))
    if "__iter__" in members or "__next__" in members:
        return _InterpretedIterator(get_iter(obj))
    observe_iteration(obj)
    return obj


_UNPACKERS: dict[tuple[int, int], Callable[[Any], list[Any]]] = {}


def _unpacker(before: int, after: int | None) -> Callable[[Any], list[Any]]:
    """A native function doing `a0, a1 = s` (or `a0, *m, b0 = s`): CPython's exact errors and messages."""
    key = (before, -1 if after is None else after)
    fn = _UNPACKERS.get(key)
    if fn is None:
        names = [f"a{i}" for i in range(before)]
        if after is not None:
            names += ["*m"] + [f"b{i}" for i in range(after)]
        targets = ", ".join(names) + ("," if len(names) == 1 else "")
        values = ", ".join(n.lstrip("*") for n in names)
        env: dict[str, Any] = {}
        exec(f"def unpack(s):\n    {targets} = s\n    return [{values}]\n", env)
        fn = _UNPACKERS[key] = env["unpack"]
    return fn


@handles("UNPACK_SEQUENCE")
def unpack_sequence(frame: Frame, inst: Inst) -> None:
    """Replace the iterable on top by its n items (the first on top)."""
    seq = frame.stack.pop()
    if (type(seq) is tuple or type(seq) is list) and len(seq) == inst.arg:
        observe_iteration(seq)
        frame.stack.extend(reversed(seq))
        return
    if inst.arg == 0:
        if list(interpreted_iterable(seq)):
            raise ValueError("too many values to unpack (expected 0)")
        return
    frame.stack.extend(reversed(_unpacker(inst.arg, None)(interpreted_iterable(seq))))


@handles("UNPACK_EX")
def unpack_ex(frame: Frame, inst: Inst) -> None:
    """`a, *rest, b = s`: push the items after the star, the starred list, then those before it."""
    seq = frame.stack.pop()
    before, after = inst.arg & 0xFF, inst.arg >> 8
    frame.stack.extend(reversed(_unpacker(before, after)(interpreted_iterable(seq))))


__all__ = ["interpreted_iterable"]
