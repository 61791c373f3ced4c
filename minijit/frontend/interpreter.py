"""Placeholder: calls the function directly. Replaced by the bytecode interpreter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def interpret(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run `fn(*args, **kwargs)` on proxies, recording into the current trace."""
    return fn(*args, **kwargs)
