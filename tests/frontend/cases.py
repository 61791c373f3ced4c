"""Registry of pure-Python functions run natively and through the interpreter by the differential tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CASES: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []


def case(*arg_sets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` once per argument tuple (no arguments: one call with none)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        sets = arg_sets or ((),)
        for i, args in enumerate(sets):
            args = args if isinstance(args, tuple) else (args,)
            CASES.append((f"{fn.__name__}[{i}]" if len(sets) > 1 else fn.__name__, fn, args))
        return fn

    return register
