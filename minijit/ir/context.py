"""The dynamic state of a compile: the trace being recorded and the capture's constraints.

Both live in `contextvars.ContextVar`s, so a compile sees only its own state: a nested
compile (a trace built while another is paused, e.g. for a grad rule) stacks on top of
it and unwinds, and a compile on another thread starts from nothing.
"""

from __future__ import annotations

import itertools
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from minijit.ir.trace import Trace


@contextmanager
def _setting(var: ContextVar[Any], value: Any) -> Iterator[None]:
    """`var` set to `value` for the `with` block."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


# The traces being recorded, innermost last.
_TRACES: ContextVar[tuple[Trace, ...]] = ContextVar("minijit_traces", default=())


def current_trace() -> Trace | None:
    """The trace being recorded, or None outside tracing."""
    traces = _TRACES.get()
    return traces[-1] if traces else None


@contextmanager
def tracing(trace: Trace) -> Iterator[Trace]:
    """Record symbols called inside the `with` block into `trace`."""
    with _setting(_TRACES, (*_TRACES.get(), trace)):
        yield trace


_loose_names = itertools.count(1)


def new_name(prefix: str) -> str:
    """A fresh name in the current trace (or a throwaway one outside tracing)."""
    trace = current_trace()
    if trace is None:
        return f"_{prefix}{next(_loose_names)}"
    return trace.new_name(prefix)


def where_now() -> str:
    """' at file:line (source)' for the user line being traced, or ''."""
    trace = current_trace()
    loc: Any = trace.source if trace is not None else None
    return f" at {loc}" if loc is not None else ""


# The constraints the capture in progress relies on (Python expressions over the trace
# inputs that must be True for the trace to hold); None outside a capture. Only a capture
# records: the passes after it decide nothing that a later call could change.
_CONSTRAINTS: ContextVar[list[str] | None] = ContextVar("minijit_constraints", default=None)
# The constraints of the compile in progress, which its passes may take as facts: the cache
# entry's guard makes them hold on every call the trace runs for.
_KNOWN: ContextVar[Sequence[str]] = ContextVar("minijit_known_constraints", default=())


@contextmanager
def recording_constraints(into: list[str] | None = None) -> Iterator[list[str]]:
    """Collect into `into` (or a new list) the constraints that comparisons inside the block record.

    Only a capture records them (`guarded_compare` in minijit.ir.proxies); the compile's
    guard checks them on every later call.
    """
    constraints: list[str] = [] if into is None else into
    with _setting(_CONSTRAINTS, constraints):
        yield constraints


def knowing_constraints(constraints: Sequence[str]) -> AbstractContextManager[None]:
    """Let the passes inside the block take `constraints` (the capture's, guarded) as facts."""
    return _setting(_KNOWN, constraints)


# Inside a pass's record of a bound symbol the capture recorded, on values of the same sizes
# (functionalization's replays): the op's meta decides as the capture did.
_REPLAYING: ContextVar[bool] = ContextVar("minijit_replaying", default=False)


def replaying_captured() -> AbstractContextManager[None]:
    """Let the block re-record ops the capture recorded, on values of the same sizes: the rules'
    comparisons of symbolic sizes (`rule_compare`, `known_compare`) are decided on the values, as the
    capture decided them (its guard keeps them true), not as unknown where the sizes are spelt
    otherwise (`x.shape[0]` after a functionalized `x.copy_(y)` reads `y.shape[0]`). The comparison
    operators still raise here: only a capture guards them."""
    return _setting(_REPLAYING, True)


# The name of the pass running (`running_pass`), for the errors that name it; None where none is named.
_PASS: ContextVar[str | None] = ContextVar("minijit_pass", default=None)


def running_pass(name: str) -> AbstractContextManager[None]:
    """Name the pass run inside the block, for the errors a pass's mistakes raise."""
    return _setting(_PASS, name)


def current_pass() -> str | None:
    """The name of the pass running, or None."""
    return _PASS.get()


def replaying() -> bool:
    """True inside `replaying_captured`."""
    return _REPLAYING.get()


def capturing() -> bool:
    """True inside a capture, where comparisons of symbolic numbers are guarded."""
    return _CONSTRAINTS.get() is not None


def known_constraint(expr: str) -> bool:
    """Whether the compile in progress already relies on `expr` (its guard checks it)."""
    return expr in _KNOWN.get()


def known_equal(left: str, right: str) -> bool:
    """Whether the compile's constraints make the expressions `left` and `right` equal, through a chain
    of equalities (`a == b` and `b == c`: a functionalized `b.copy_(a)` then `b + c` asks about a and c).
    """
    known = _KNOWN.get()
    cached = _EQUAL_CLASSES.get()
    if cached is None or cached[0] is not known or cached[1] != len(known):
        cached = (known, len(known), _equality_classes(known))
        _EQUAL_CLASSES.set(cached)
    classes = cached[2]
    return left in classes and classes[left] is classes.get(right)


# The equality classes of the known constraints, for the list (and its length) they were built from.
_EQUAL_CLASSES: ContextVar[tuple[Sequence[str], int, dict[str, set[str]]] | None] = ContextVar(
    "minijit_equal_classes", default=None)


def _equality_classes(constraints: Sequence[str]) -> dict[str, set[str]]:
    """Expression -> the set of expressions the `a == b` constraints make equal to it (the same set object)."""
    classes: dict[str, set[str]] = {}
    for c in constraints:
        parts = c.split(" == ")
        if len(parts) != 2:
            continue
        a, b = (classes.setdefault(x, {x}) for x in parts)
        if a is not b:
            a |= b
            for x in b:
                classes[x] = a
    return classes


# The checks of the inputs' layouts the compile in progress relies on (`x.is_contiguous()`, ...), from
# its capture or any pass (functionalization decides `reshape`'s copy-or-view from them); None
# outside a compile. The cache entry's guard checks them with the constraints.
_LAYOUT_CHECKS: ContextVar[list[str] | None] = ContextVar("minijit_layout_checks", default=None)


def guarding_layouts(into: list[str]) -> AbstractContextManager[None]:
    """Collect into `into` the layout checks (`add_layout_check`) recorded inside the block, by any pass."""
    return _setting(_LAYOUT_CHECKS, into)


def add_layout_check(expr: str) -> None:
    """Record that the compile in progress relies on `expr`, a check of an input's layout, whichever pass decides."""
    checks = _LAYOUT_CHECKS.get()
    if checks is not None and expr not in checks:
        checks.append(expr)


def add_constraint(expr: str) -> None:
    """Record that the capture in progress relies on the Python expression `expr` being true."""
    constraints = _CONSTRAINTS.get()
    if constraints is not None and expr not in constraints:
        constraints.append(expr)


# What reads the real value of a proxy while a capture runs (minijit.runtime.values.ValueReader): a
# callable `(proxy, how, other) -> Python value` that also records the check of that value into the
# trace; None where no real inputs are at hand (outside a capture, in a pass, in a grad rule).
_VALUE_READER: ContextVar[Any] = ContextVar("minijit_value_reader", default=None)


def reading_values(reader: Any) -> AbstractContextManager[None]:
    """Let the capture inside the block read real values of its proxies through `reader`."""
    return _setting(_VALUE_READER, reader)


def value_reader() -> Any:
    """The capture's value reader, or None where values are only known when the trace runs."""
    return _VALUE_READER.get()


@contextmanager
def outside_capture() -> Iterator[None]:
    """Run the block (a side computation of the capture) as a pass would, but adding nothing to the compile:
    no trace recording, no constraints or layout checks recorded, no value reader."""
    with (_setting(_TRACES, ()), _setting(_CONSTRAINTS, None), _setting(_VALUE_READER, None),
          _setting(_LAYOUT_CHECKS, None)):
        yield


# State of the call that the code under capture read through a query whose answer the trace then
# keeps (`torch.is_inference_mode_enabled()`): query expression -> the query. The compile in progress
# adds, for each, a check that later calls run in the state of the call that compiled it.
_STATE_READS: ContextVar[dict[str, Callable[[], Any]] | None] = ContextVar("minijit_state_reads", default=None)


def noting_state_reads(into: dict[str, Callable[[], Any]]) -> AbstractContextManager[None]:
    """Collect into `into` the state queries (`note_state_read`) the code under capture made inside the block."""
    return _setting(_STATE_READS, into)


def note_state_read(expr: str, query: Callable[[], Any]) -> None:
    """Record that the trace keeps the answer of `query` (written `expr` in a guard), a state of the call."""
    reads = _STATE_READS.get()
    if reads is not None:
        reads.setdefault(expr, query)
