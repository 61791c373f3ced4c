"""Whether the interpreted code is inside a user's `try` block whose `except` could catch an error.

An op recorded there may raise at run time on some data only (a Cholesky factorisation of a
matrix that is not positive-definite, an index tensor out of range), which the trace, recorded on
data that did not raise, cannot follow into the `except` branch. The capture notes such ops
(`CaptureState.ops_in_try`), so that a compiled call that raises runs the user's function eagerly instead
(minijit.runtime.fallback).

The interpreter's frames know their position; an instruction's exception table entry says where an
exception goes. A `with` block's or `finally`'s handler re-raises, so the search goes on from there to
the handler around it; an `except` clause (typed or bare) ends it.
"""

from __future__ import annotations

from minijit.frontend.code import Inst
from minijit.frontend.frame import Frame, current_state
from minijit.ir.trace import SourceLocation

_MATCHES = ("CHECK_EXC_MATCH", "CHECK_EG_MATCH")


def user_try_location() -> SourceLocation | None:
    """The user's line (innermost first) inside a `try` whose `except` may catch what the current op raises."""
    for frame in reversed(current_state().frames):
        if not frame.info.is_user or frame.line is None:
            continue
        inst = _current(frame)
        if inst is not None and _caught(frame, inst, hops=0):
            return frame.info.location(frame.line)
    return None


def _current(frame: Frame) -> Inst | None:
    """The instruction the frame is executing (the loop moves `ip` past it before running it)."""
    insts = frame.insts
    i = frame.ip - 1
    while i >= 0 and insts[i] is None:
        i -= 1
    return insts[i] if i >= 0 else None


def _caught(frame: Frame, inst: Inst, hops: int) -> bool:
    """True when an exception at `inst` reaches an `except` clause of this frame."""
    entry = inst.except_entry
    if entry is None or hops > 8:
        return False
    insts = frame.insts
    handler = insts[entry[0]]
    scan: Inst | None = handler
    for _ in range(6):
        if scan is None:
            break
        if scan.opname in _MATCHES:
            return True
        if scan is handler and scan.opname == "PUSH_EXC_INFO" and scan.next < len(insts) \
                and insts[scan.next] is not None and insts[scan.next].opname == "POP_TOP":
            return True  # a bare `except:`
        if scan.opname in ("RERAISE", "WITH_EXCEPT_START"):
            break
        scan = insts[scan.next] if scan.next < len(insts) else None
    # A cleanup (`with`, `finally`) that re-raises: on to the handler around it.
    return _caught(frame, handler, hops + 1)
