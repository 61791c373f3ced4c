"""The table from opcode names to handlers, filled in by the family modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# opname -> handler(frame, inst) returning None to go on, or a signal (RETURN, YIELD, GENERATOR) to stop.
HANDLERS: dict[str, Callable[..., Any]] = {}


def handles(*opnames: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler of `opnames`."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in opnames:
            if name in HANDLERS:
                raise ValueError(f"opcode {name} has two handlers")
            HANDLERS[name] = fn
        return fn

    return register


__all__ = ["HANDLERS", "handles"]
