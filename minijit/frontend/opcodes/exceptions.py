"""Exceptions: raise and re-raise, the handlers the exception table jumps to, `with`, and `except*`.

The exception being handled (`sys.exc_info()` inside interpreted code) lives in
`current_state().handled`: PUSH_EXC_INFO saves the previous one on the value stack and
POP_EXCEPT restores it, exactly as CPython does with its thread state.

A MinijitError always reaches the user: no `except` or `except*` clause matches it (unless it
stands for an error eager raises too, `minijit.errors.as_eager`: that one is caught as eager's), and
one raised inside an `except*` clause leaves the block as it is, not inside a group.
"""

from __future__ import annotations

from typing import Any

from minijit.errors import reaches_user
from minijit.frontend.calls import bind_method, call
from minijit.frontend.code import Inst, native_instruction
from minijit.frontend.frame import Frame, current_state
from minijit.frontend.interpreter import raise_passthrough, set_context
from minijit.frontend.opcodes.protocols import class_attr, load_attr
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
        exc = current_state().handled
        if exc is None:
            raise RuntimeError("No active exception to reraise")
        raise_passthrough(exc)
    cause = frame.stack.pop() if inst.arg == 2 else None
    exc = _exception_instance(frame.stack.pop(), "exceptions")
    if inst.arg == 2:
        exc.__cause__ = None if cause is None else _exception_instance(cause, "exception causes")
    set_context(exc, current_state().handled)
    if isinstance(exc, KeyboardInterrupt):
        current_state().raised.append(exc)
    raise_passthrough(exc)


@handles("RERAISE")
def reraise(frame: Frame, inst: Inst) -> None:
    """Re-raise the exception on top (cleanup code at the end of a handler or finally)."""
    raise_passthrough(frame.stack.pop())


@handles("PUSH_EXC_INFO")
def push_exc_info(frame: Frame, inst: Inst) -> None:
    """Entering a handler: save the previously handled exception below the new one, which becomes handled."""
    exc = frame.stack[-1]
    frame.stack[-1] = current_state().handled
    frame.stack.append(exc)
    current_state().handled = exc


@handles("POP_EXCEPT")
def pop_except(frame: Frame, inst: Inst) -> None:
    """Leaving a handler: restore the previously handled exception."""
    current_state().handled = frame.stack.pop()


@handles("CHECK_EXC_MATCH")
def check_exc_match(frame: Frame, inst: Inst) -> None:
    """`except E:` test: push whether the exception below matches the class (or tuple) on top."""
    cls = frame.stack.pop()
    classes = cls if isinstance(cls, tuple) else (cls,)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise TypeError("catching classes that do not inherit from BaseException is not allowed")
    exc = frame.stack[-1]
    # A MinijitError must reach the user: their `except` clauses never catch it (one standing for eager's may).
    frame.stack.append(issubclass(type(exc), cls) and not reaches_user(exc))


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
    frame.stack.append(False if reaches_user(exc) else suppress)



# -- except* ------------------------------------------------------------------------------------
def _check_except_star_type(match_type: Any) -> None:
    classes = match_type if isinstance(match_type, tuple) else (match_type,)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise TypeError("catching classes that do not inherit from BaseException is not allowed")
    if any(issubclass(c, BaseExceptionGroup) for c in classes):
        raise TypeError("catching ExceptionGroup with except* is not allowed. Use except instead.")


def _split_group(exc: Any, match_type: Any) -> tuple[Any, Any]:
    """(match, rest) of the exception being handled against an `except*` clause's classes (None: nothing)."""
    if exc is None:
        return None, None
    if reaches_user(exc):
        return None, exc
    if issubclass(type(exc), match_type):
        if isinstance(exc, BaseExceptionGroup):
            return exc, None
        # A naked exception caught by except* is handled as a group of one.
        return BaseExceptionGroup("", [exc]).with_traceback(exc.__traceback__), None
    if isinstance(exc, BaseExceptionGroup):
        pair = call(load_attr(exc, "split"), (match_type,), {})
        if type(pair) is not tuple:
            raise TypeError(f"{type(exc).__name__}.split must return a tuple, not {type(pair).__name__}")
        if len(pair) != 2:
            raise TypeError(f"{type(exc).__name__}.split must return a 2-tuple, got tuple of size {len(pair)}")
        return pair
    return None, exc


@handles("CHECK_EG_MATCH")
def check_eg_match(frame: Frame, inst: Inst) -> None:
    """`except* E:` test: replace [exc, E] by [rest, match] (the group split by E), or by [exc, None] on no match."""
    match_type = frame.stack.pop()
    _check_except_star_type(match_type)
    match, rest = _split_group(frame.stack[-1], match_type)
    if match is None:
        frame.stack.append(None)
        return
    frame.stack[-1] = rest
    frame.stack.append(match)
    current_state().handled = match


def reraise_star(orig: BaseException, raised: list[Any], native: Any) -> BaseException | None:
    """What a try/except* block re-raises: `native` (CPython's own PREP_RERAISE_STAR) combines what its
    clauses raised and re-raised with the original group; a MinijitError among them goes out alone."""
    for exc in raised:
        if reaches_user(exc):
            return exc
    # CPython tells a part of `orig` re-raised by a bare `raise` from a new exception by its unchanged
    # traceback. Re-raising from the interpreter's Python code prepends entries for its own frames:
    # cut them off again.
    tb = orig.__traceback__
    for exc in raised:
        if isinstance(exc, BaseException) and tb is not None and exc.__traceback__ is not tb:
            t = exc.__traceback__
            while t is not None and t is not tb:
                t = t.tb_next
            if t is tb:
                exc.__traceback__ = tb
    return native(orig, raised)


@handles("PREP_RERAISE_STAR", until="3.11")
def prep_reraise_star(frame: Frame, inst: Inst) -> None:
    """End of a try/except* block: replace [original, list of raised] by the exception to re-raise, or None."""
    raised = frame.stack.pop()
    frame.stack[-1] = reraise_star(frame.stack[-1], raised, native_instruction("PREP_RERAISE_STAR", 0, 2, frame.globals))


# -- yield from ---------------------------------------------------------------------------------
@handles("CLEANUP_THROW", since="3.12")
def cleanup_throw(frame: Frame, inst: Inst) -> None:
    """An exception thrown into a `yield from` left its receiver ([receiver, last sent, exc]): a StopIteration
    ends the loop with its value ([None, value], for END_SEND); anything else propagates."""
    exc = frame.stack[-1]
    if not isinstance(exc, StopIteration):
        raise_passthrough(exc)
    del frame.stack[-3:]
    frame.stack.append(None)
    frame.stack.append(exc.value)


__all__ = ["reraise_star"]
