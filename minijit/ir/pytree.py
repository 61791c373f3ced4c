"""Flattening of the nested containers (tuple, list, dict, slice) that ops take and return."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def _is_container(x: Any) -> bool:
    t = type(x)
    return t is tuple or t is list or t is dict or t is slice or (isinstance(x, tuple) and hasattr(x, "_fields"))


def _flatten_into(tree: Any, out: list[Any]) -> None:
    t = type(tree)
    if t is dict:
        items: Any = tree.values()
    elif t is slice:
        items = (tree.start, tree.stop, tree.step)
    else:  # tuple, list, named tuple
        items = tree
    for x in items:
        tx = type(x)
        # Leaves are by far the most common items: test the exact container types inline.
        if tx is tuple or tx is list or tx is dict or tx is slice or (isinstance(x, tuple) and hasattr(x, "_fields")):
            _flatten_into(x, out)
        else:
            out.append(x)


def tree_flatten(tree: Any) -> list[Any]:
    """The leaves of `tree` as a list (containers are tuple, list, dict, slice and named tuples)."""
    if not _is_container(tree):
        return [tree]
    out: list[Any] = []
    _flatten_into(tree, out)
    return out


def tree_iter(tree: Any) -> Iterator[Any]:
    """Iterate over the leaves of `tree` in order (containers are tuple, list, dict, slice and named tuples)."""
    # Flattened eagerly into a list: the trees are small, and nested generators cost more
    # than the list on every pass over a trace.
    return iter(tree_flatten(tree))


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
