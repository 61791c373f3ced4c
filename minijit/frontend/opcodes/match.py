"""The `match` statement: GET_LEN, MATCH_MAPPING, MATCH_SEQUENCE, MATCH_KEYS, MATCH_CLASS."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from minijit.frontend.code import Inst
from minijit.frontend.frame import Frame
from minijit.frontend.lookasides import isinstance_
from minijit.frontend.opcodes.protocols import length, load_attr
from minijit.frontend.opcodes.table import handles

# Builtin classes whose single positional sub-pattern matches the subject itself (`case int(x)`).
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)


@handles("GET_LEN")
def get_len(frame: Frame, inst: Inst) -> None:
    """Push len() of the top."""
    frame.stack.append(length(frame.stack[-1]))


@handles("MATCH_MAPPING")
def match_mapping(frame: Frame, inst: Inst) -> None:
    """Push whether the subject is a mapping."""
    frame.stack.append(isinstance(frame.stack[-1], Mapping))


@handles("MATCH_SEQUENCE")
def match_sequence(frame: Frame, inst: Inst) -> None:
    """Push whether the subject is a sequence (not str, bytes or bytearray)."""
    subject = frame.stack[-1]
    frame.stack.append(isinstance(subject, Sequence) and not isinstance(subject, str | bytes | bytearray))


class _Missing:
    __slots__ = ()


@handles("MATCH_KEYS")
def match_keys(frame: Frame, inst: Inst) -> None:
    """Push a tuple of the subject's values for the keys on top, or None when one is missing."""
    keys = frame.stack[-1]
    subject = frame.stack[-2]
    if not keys:
        frame.stack.append(())
        return
    get = subject.get
    missing = _Missing()
    seen: set[Any] = set()
    values = []
    for key in keys:
        if key in seen:
            raise ValueError(f"mapping pattern checks duplicate key ({key!r})")
        seen.add(key)
        value = get(key, missing)
        if value is missing:
            frame.stack.append(None)
            return
        values.append(value)
    frame.stack.append(tuple(values))


@handles("MATCH_CLASS")
def match_class(frame: Frame, inst: Inst) -> None:
    """Replace subject, class and keyword names by the tuple of matched attributes, or None."""
    names = frame.stack.pop()
    cls = frame.stack.pop()
    subject = frame.stack.pop()
    frame.stack.append(_match_class(subject, cls, inst.arg, names))


def _match_class(subject: Any, cls: Any, count: int, names: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(cls, type):
        raise TypeError("called match pattern must be a class")
    if not isinstance_(subject, cls):  # a symbolic int matches `int()`
        return None
    attrs: list[Any] = []
    seen: set[str] = set()
    positional: tuple[str, ...] = ()
    if count:
        match_args = getattr(cls, "__match_args__", None)
        if match_args is None:
            if cls in _SELF_MATCHING or (any(issubclass(cls, c) and c in cls.__mro__ for c in _SELF_MATCHING) \
                    and count == 1):
                attrs.append(subject)
                count = 0
            else:
                raise TypeError(f"{cls.__name__}() accepts 0 positional sub-patterns ({count} given)")
        else:
            if not isinstance(match_args, tuple):
                raise TypeError(f"{cls.__name__}.__match_args__ must be a tuple (got {type(match_args).__name__})")
            if count > len(match_args):
                n = len(match_args)
                raise TypeError(f"{cls.__name__}() accepts {n} positional sub-pattern{'' if n == 1 else 's'} "
                                f"({count} given)")
            positional = match_args[:count]
    for name in (*positional, *names):
        if not isinstance(name, str):
            raise TypeError(f"__match_args__ elements must be strings (got {type(name).__name__})")
        if name in seen:
            raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
        seen.add(name)
        try:
            attrs.append(load_attr(subject, name))
        except AttributeError:
            return None
    return tuple(attrs)


__all__: list[str] = []
