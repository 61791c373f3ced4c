"""Exceptions: raise and re-raise, the handlers the exception table jumps to, and `with`.

The exception being handled (`sys.exc_info()` inside interpreted code) lives in
`STATE.handled`: PUSH_EXC_INFO saves the previous one on the value stack and
POP_EXCEPT restores it, exactly as CPython does with its thread state.
"""

from __future__ import annotations

from typing import Any

from minijit.errors import MinijitError
from minijit.frontend.calls import bind_method, call
from minijit.frontend.code import Inst
from minijit.frontend.frame import STATE, Frame
from minijit.frontend.interpreter import raise_passthrough, set_context
from minijit.frontend.opcodes.protocols import class_attr
from minijit.frontend.opcodes.table import handles


def _exception_instance(value: Any, what: str) -> BaseException:
    if isinstance(value, type) and issubclass(value, BaseException):
        instance = call(value, (), {})
        if not isinstance(instance, BaseException):
            raise TypeError(f"calling {value!r} should have returned an instance of BaseException, "
                            f"not {type(instance).__name__}")
        return instance
    if isinstance(value, BaseException):
        return value
    raise TypeError(f"{what} must derive from BaseException")


@handles("RAISE_VARARGS")
def raise_varargs(frame: Frame, inst: Inst) -> None:
    """`raise` (re-raise the handled exception), `raise exc`, or `raise exc from cause`."""
    if inst.arg == 0:
        exc = STATE.handled
        if exc is None:
            raise RuntimeError("No active exception to reraise")
        raise_passthrough(exc)
    cause = frame.stack.pop() if inst.arg == 2 else None
    exc = _exception_instance(frame.stack.pop(), "exceptions")
    if inst.arg == 2:
        exc.__cause__ = None if cause is None else _exception_instance(cause, "exception causes")
    set_context(exc, STATE.handled)
    raise_passthrough(exc)


@handles("RERAISE")
def reraise(frame: Frame, inst: Inst) -> None:
    """Re-raise the exception on top (cleanup code at the end of a handler or finally)."""
    raise_passthrough(frame.stack.pop())


@handles("PUSH_EXC_INFO")
def push_exc_info(frame: Frame, inst: Inst) -> None:
    """Entering a handler: save the previously handled exception below the new one, which becomes handled."""
    exc = frame.stack[-1]
    frame.stack[-1] = STATE.handled
    frame.stack.append(exc)
    STATE.handled = exc


@handles("POP_EXCEPT")
def pop_except(frame: Frame, inst: Inst) -> None:
    """Leaving a handler: restore the previously handled exception."""
    STATE.handled = frame.stack.pop()


@handles("CHECK_EXC_MATCH")
def check_exc_match(frame: Frame, inst: Inst) -> None:
    """`except E:` test: push whether the exception below matches the class (or tuple) on top."""
    cls = frame.stack.pop()
    classes = cls if isinstance(cls, tuple) else (cls,)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise TypeError("catching classes that do not inherit from BaseException is not allowed")
    exc = frame.stack[-1]
    # A MinijitError must reach the user: their `except` clauses never catch it.
    frame.stack.append(issubclass(type(exc), cls) and not isinstance(exc, MinijitError))


@handles("LOAD_ASSERTION_ERROR")
def load_assertion_error(frame: Frame, inst: Inst) -> None:
    """Push AssertionError (for `assert`)."""
    frame.stack.append(AssertionError)


@handles("BEFORE_WITH")
def before_with(frame: Frame, inst: Inst) -> None:
    """Enter a context manager: push its bound `__exit__` and the result of `__enter__`."""
    manager = frame.stack.pop()
    cls = type(manager)
    enter = class_attr(cls, "__enter__")
    if enter is None:
        raise TypeError(f"'{cls.__name__}' object does not support the context manager protocol")
    exit_ = class_attr(cls, "__exit__")
    if exit_ is None:
        raise TypeError(f"'{cls.__name__}' object does not support the context manager protocol "
                        "(missed __exit__ method)")
    frame.stack.append(bind_method(exit_, manager))
    frame.stack.append(call(bind_method(enter, manager), (), {}))


@handles("WITH_EXCEPT_START")
def with_except_start(frame: Frame, inst: Inst) -> None:
    """Leaving a `with` by an exception: call `__exit__(type, exc, tb)` (stack: exit, lasti, prev, exc)."""
    exc = frame.stack[-1]
    exit_ = frame.stack[-4]
    suppress = call(exit_, (type(exc), exc, exc.__traceback__), {})
    # __exit__ runs (restoring grad mode, closing files), but it cannot suppress a MinijitError.
    frame.stack.append(False if isinstance(exc, MinijitError) else suppress)


__all__: list[str] = []
