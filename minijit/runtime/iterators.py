"""Iterators passed to a jitted function: `f(iter(list_of_tensors))`, consumed inside it.

The iterator of a list, a tuple or a range tells how far it is (`__reduce__`) and can be set to a
position (`__setstate__`). Each call hands the trace an `ArgumentIterator` over the items the caller's
iterator has left (its tensors are trace inputs, like a list's), the capture notes how many the code
took, and after the compiled call the caller's iterator is moved on by that many, as eager leaves it.
The count is fixed per cache entry: the code's path (how many `next` calls) is what the entry was
traced for, and the items left are part of the cache key.

Other iterators (generators, `zip`, `map`, files) cannot be read ahead without being advanced, so
the interpreter refuses to advance them (minijit.frontend.outside), with what to do instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minijit.errors import UnsupportedSyntaxError
from minijit.ir.proxies import number_value

# The iterators whose remaining items can be read, and whose position can be set, without advancing them.
_REWINDABLE = (type(iter([])), type(iter(())), type(iter(range(0))))


@dataclass
class ArgumentIterator:
    """What the trace is given for an iterator argument: the items the caller's iterator has left."""

    items: tuple[Any, ...]
    position: int = 0

    def __iter__(self) -> ArgumentIterator:
        return self

    def __next__(self) -> Any:
        if self.position >= len(self.items):
            raise StopIteration
        self.position += 1
        return self.items[self.position - 1]


def standing_in(args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[tuple[Any, ...], dict[str, Any], list[tuple[int, Any, int]]] | None:
    """The arguments with each list, tuple or range iterator among them replaced by an `ArgumentIterator`,
    and (argument position, the caller's iterator, its position) of each; None when there is none."""
    for v in args:  # the common case, no iterator, costs one type test per argument
        if type(v) in _REWINDABLE:
            break
    else:
        if not kwargs or not any(type(v) in _REWINDABLE for v in kwargs.values()):
            return None
    values = [*args, *kwargs.values()]
    found = [(i, v) for i, v in enumerate(values) if type(v) in _REWINDABLE]
    originals = []
    for i, it in found:
        reduced = it.__reduce__()
        # (Python 3.12 reduces a range iterator to the range left, with no position.)
        sequence, start = reduced[1][0], (reduced[2] if len(reduced) > 2 and reduced[2] is not None else 0)
        values[i] = ArgumentIterator(tuple(sequence[start:]))
        originals.append((i, it, start))
    return tuple(values[:len(args)]), dict(zip(kwargs, values[len(args):], strict=True)), originals


def consumed(position: int, before: Any) -> int:
    """How many items the trace took from an `ArgumentIterator` whose snapshot state was `before`.

    The positions may be symbolic (an int attribute that changed between calls goes symbolic), but their
    difference counts the trace's `next` calls, which its path fixes: read on the call traced."""
    _, attributes = before
    return number_value(position) - number_value(dict(attributes)["position"])


def advance(originals: list[tuple[int, Any, int]], taken: dict[int, int]) -> None:
    """Move each caller's iterator on by the number of items the trace took from it."""
    for index, it, _ in originals:
        for _ in range(taken.get(index, 0)):
            next(it)


def refuse_escaping(value: Any, what: str) -> None:
    """Refuse an `ArgumentIterator` inside `value` (the result, or a value stored outside): the caller would get
    the stand-in, not their iterator."""
    if _holds_stand_in(value, 0):
        raise UnsupportedSyntaxError(
            f"{what} holds the iterator passed in as an argument; minijit traces it as the items it has left and "
            "cannot hand the caller's iterator back. Return or store the items (list(it)) instead")


def _holds_stand_in(value: Any, depth: int) -> bool:
    if isinstance(value, ArgumentIterator):
        return True
    if depth > 20:
        return False
    if isinstance(value, dict):
        return any(_holds_stand_in(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_stand_in(v, depth + 1) for v in value)
    own = getattr(value, "__dict__", None)
    if isinstance(own, dict) and not isinstance(value, type):
        return any(_holds_stand_in(v, depth + 1) for v in own.values())
    return False
