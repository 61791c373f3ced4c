"""Flattening of the nested containers (tuple, list, dict, slice) that ops take and return."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def tree_iter(tree: Any) -> Iterator[Any]:
    """Yield the leaves of `tree` in order (containers are tuple, list, dict and slice)."""
    t = type(tree)
    if t is tuple or t is list:
        for x in tree:
            yield from tree_iter(x)
    elif t is dict:
        for x in tree.values():
            yield from tree_iter(x)
    elif t is slice:
        yield from tree_iter((tree.start, tree.stop, tree.step))
    elif isinstance(tree, tuple) and hasattr(tree, "_fields"):  # named tuples
        for x in tree:
            yield from tree_iter(x)
    else:
        yield tree


def tree_flatten(tree: Any) -> list[Any]:
    """The leaves of `tree` as a list."""
    return list(tree_iter(tree))


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Rebuild `tree` with every leaf replaced by `fn(leaf)`."""
    t = type(tree)
    if t is tuple:
        return tuple(tree_map(fn, x) for x in tree)
    if t is list:
        return [tree_map(fn, x) for x in tree]
    if t is dict:
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if t is slice:
        return slice(tree_map(fn, tree.start), tree_map(fn, tree.stop), tree_map(fn, tree.step))
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return t(*(tree_map(fn, x) for x in tree))
    return fn(tree)
