"""The interpreter's frame and the state shared by the frames of one interpretation."""

from __future__ import annotations

import types
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from minijit.frontend.code import CodeInfo, Inst
from minijit.frontend.outside import Outside

if TYPE_CHECKING:
    from collections.abc import Iterator


class _Null:
    """CPython's NULL on the value stack and in unbound local slots."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL"


NULL: Any = _Null()

# What a handler returns to stop the frame's loop (any other handler returns None).
RETURN = "return"
YIELD = "yield"
GENERATOR = "generator"


class Frame:
    """One activation of interpreted code: slots for locals/cells, a value stack, a position."""

    __slots__ = ("builtins", "code", "func", "globals", "info", "insts", "ip", "kw_names", "line",
                 "locals", "localsplus", "retval", "stack", "suspended_at")

    def __init__(self, info: CodeInfo, func: types.FunctionType | None, localsplus: list[Any],
                 globals_: dict[str, Any], builtins: dict[str, Any], locals_: Any = None):
        self.info = info
        self.code = info.code
        self.insts = info.insts
        self.func = func
        self.localsplus = localsplus
        self.stack: list[Any] = []
        self.ip = 0
        self.globals = globals_
        self.builtins = builtins
        self.locals = locals_  # the namespace mapping of class bodies (LOAD_NAME/STORE_NAME)
        self.kw_names: tuple[str, ...] | None = None
        self.line: int | None = None
        self.retval: Any = None
        self.suspended_at: Inst | None = None  # the YIELD_VALUE (or RETURN_GENERATOR) a generator waits at

    def __repr__(self) -> str:
        return f"<Frame {self.code.co_qualname} at {self.info.filename}:{self.line}>"


class State:
    """Per-interpretation state: the frame stack, the handled exception, guards and known cells."""

    __slots__ = ("escapes", "frames", "guards", "handled", "internal_cells", "outside", "passthrough", "raised")

    def __init__(self, frames: list[Frame] | None = None, handled: BaseException | None = None) -> None:
        self.frames: list[Frame] = [] if frames is None else frames
        # The exception being handled (what sys.exc_info() would say inside the interpreted code).
        self.handled: BaseException | None = handled
        # An exception that must keep its __context__ when the next frame sees it (re-raised or
        # propagating out of a callee): only freshly raised exceptions get the handled one as context.
        self.passthrough: BaseException | None = None
        # (kind, id(namespace), name, id(shadow)) -> GuardEntry, first read wins.
        self.guards: dict[tuple[str, int, str, int], Any] = {}
        # ids of cells (and functions) created by the interpreted code; their contents (defaults) are not guarded.
        self.internal_cells: set[int] = set()
        # The objects from outside the call, the tensors read from them, and the writes into them.
        self.outside = Outside()
        # exception -> the user locations it propagated out of, innermost first (for its note).
        self.escapes: dict[BaseException, list[Any]] = {}
        # KeyboardInterrupts a `raise` statement of the interpreted code made: the code's own, where another one
        # is Ctrl-C interrupting minijit (minijit.frontend.interpreter.Escaped).
        self.raised: list[BaseException] = []


# The state of the interpretation running in this context: a nested one (a jitted function
# called by traced code) replaces it until it returns; another thread has its own.
_STATE: ContextVar[State | None] = ContextVar("minijit_interpretation", default=None)


def current_state() -> State:
    """The state of the interpretation in progress (an idle one outside any)."""
    state = _STATE.get()
    if state is None:
        state = State()
        _STATE.set(state)
    return state


@contextmanager
def new_interpretation(handled: BaseException | None) -> Iterator[State]:
    """A fresh `State` for the `with` block, continuing the frame stack of the one it interrupts."""
    token = _STATE.set(State(current_state().frames, handled))
    try:
        yield current_state()
    finally:
        _STATE.reset(token)


def current_frame() -> Frame | None:
    """The innermost interpreted frame, or None when no interpreted code runs."""
    frames = current_state().frames
    return frames[-1] if frames else None


def observe_iteration(obj: Any) -> None:
    """Guard what iterating over `obj` reads, when it is a container from outside the call."""
    if current_state().outside.is_root(obj):
        current_state().outside.observe(current_state().guards, obj, "iterate")


def observe_mapping(mapping: Any) -> None:
    """Guard every key and value of `mapping` when it is from outside the call (`{**d}`, `f(**d)`)."""
    if current_state().outside.is_root(mapping):
        current_state().outside.observe_values(current_state().guards, mapping)


__all__ = ["GENERATOR", "NULL", "RETURN", "YIELD", "Frame", "State", "current_frame", "current_state",
           "new_interpretation", "observe_iteration", "observe_mapping"]
