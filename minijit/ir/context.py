"""The trace being recorded right now, if any.

Tracing is single-threaded and re-entrant (a trace may be built while another is
paused, e.g. for a grad rule), so the active traces form a stack.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from minijit.ir.trace import Trace

_STACK: list[Trace] = []


def current_trace() -> Trace | None:
    """The trace being recorded, or None outside tracing."""
    return _STACK[-1] if _STACK else None


@contextmanager
def tracing(trace: Trace) -> Iterator[Trace]:
    """Record symbols called inside the `with` block into `trace`."""
    _STACK.append(trace)
    try:
        yield trace
    finally:
        _STACK.pop()


def new_name(prefix: str) -> str:
    """A fresh name in the current trace (or a throwaway one outside tracing)."""
    trace = current_trace()
    if trace is None:
        global _loose_names
        _loose_names += 1
        return f"_{prefix}{_loose_names}"
    return trace.new_name(prefix)


_loose_names = 0


def where_now() -> str:
    """' at file:line (source)' for the user line being traced, or ''."""
    trace = current_trace()
    loc: Any = trace.source if trace is not None else None
    return f" at {loc}" if loc is not None else ""


# The constraints a compile in "symbolic values" mode relied on (Python expressions over the
# trace inputs that must be True for the trace to hold); None outside such a compile.
_CONSTRAINTS: list[list[str]] = []


@contextmanager
def recording_constraints() -> Iterator[list[str]]:
    """Collect the constraints recorded by symbolic numbers inside the block."""
    constraints: list[str] = []
    _CONSTRAINTS.append(constraints)
    try:
        yield constraints
    finally:
        _CONSTRAINTS.pop()


def add_constraint(expr: str) -> None:
    """Record that the trace being built relies on the Python expression `expr` being true."""
    if _CONSTRAINTS and expr not in _CONSTRAINTS[-1]:
        _CONSTRAINTS[-1].append(expr)
