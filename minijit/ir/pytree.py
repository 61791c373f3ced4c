"""Flattening of the nested containers (tuple, list, dict, slice, named tuple) that ops take and return.

The second flattener of the project, kept beside `minijit.ir.containers` (the flattener of a
call's arguments, results and effects, used by minijit.runtime.arguments) for two reasons:

- a hot path: every pass walks every bound symbol's arguments and outputs with it (about
  4,000 flattenings to compile a 16-layer MLP with its backward). Measured on a symbol's
  arguments (`((a, b), {})`, `(([a, b, a], 0), {})`), `tree_flatten` takes 2.2-3.4 µs and
  `containers.leaves` 7-13 µs (3-4x), for want of a spec-free walk of exact types only;
- a different meaning: an op's arguments are tuples, lists, dicts and slices, and any other
  value is one value (a `torch.Size`, a dataclass), where a call's arguments look into
  tuple subclasses, dataclasses and pytree-registered types.
"""

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


def tree_structure(tree: Any) -> Any:
    """A hashable picture of how `tree`'s containers nest (a dict's keys too), without its leaves: with
    `tree_flatten`'s leaves, a key for the whole tree."""
    t = type(tree)
    if t is dict:
        return (t, tuple((k, tree_structure(v)) for k, v in tree.items()))
    if t is slice:
        return (t, tree_structure(tree.start), tree_structure(tree.stop), tree_structure(tree.step))
    if t is tuple or t is list or (isinstance(tree, tuple) and hasattr(tree, "_fields")):
        return (t, tuple(tree_structure(v) for v in tree))
    return None


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
