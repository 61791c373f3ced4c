"""Control flow: jumps, `for` loops, return, generators (`yield`, `yield from` via SEND).

3.12 made conditional jumps direction-free (POP_JUMP_IF_TRUE), left the exhausted
iterator of a `for` loop and the finished receiver of a `yield from` on the stack for
END_FOR and END_SEND to remove, and added RETURN_CONST; 3.13's END_FOR pops one value
and is followed by a POP_TOP.
"""

from __future__ import annotations

from typing import Any

from minijit.frontend.calls import call
from minijit.frontend.code import Inst
from minijit.frontend.frame import GENERATOR, RETURN, YIELD, Frame
from minijit.frontend.interpreter import InterpretedGenerator
from minijit.frontend.opcodes.protocols import get_iter, next_item, truth
from minijit.frontend.opcodes.table import handles


# -- jumps --------------------------------------------------------------------------------------
@handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def jump(frame: Frame, inst: Inst) -> None:
    """Jump unconditionally."""
    frame.ip = inst.argval // 2


@handles("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", until="3.11")
@handles("POP_JUMP_IF_TRUE", since="3.12")
def pop_jump_if_true(frame: Frame, inst: Inst) -> None:
    """Pop; jump if it was true."""
    if truth(frame.stack.pop()):
        frame.ip = inst.argval // 2


@handles("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", until="3.11")
@handles("POP_JUMP_IF_FALSE", since="3.12")
def pop_jump_if_false(frame: Frame, inst: Inst) -> None:
    """Pop; jump if it was false."""
    if not truth(frame.stack.pop()):
        frame.ip = inst.argval // 2


@handles("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", until="3.11")
@handles("POP_JUMP_IF_NONE", since="3.12")
def pop_jump_if_none(frame: Frame, inst: Inst) -> None:
    """Pop; jump if it was None."""
    if frame.stack.pop() is None:
        frame.ip = inst.argval // 2


@handles("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", until="3.11")
@handles("POP_JUMP_IF_NOT_NONE", since="3.12")
def pop_jump_if_not_none(frame: Frame, inst: Inst) -> None:
    """Pop; jump if it was not None."""
    if frame.stack.pop() is not None:
        frame.ip = inst.argval // 2


@handles("JUMP_IF_TRUE_OR_POP", until="3.11")
def jump_if_true_or_pop(frame: Frame, inst: Inst) -> None:
    """`a or b`: keep a true top and jump, else pop it."""
    if truth(frame.stack[-1]):
        frame.ip = inst.argval // 2
    else:
        frame.stack.pop()


@handles("JUMP_IF_FALSE_OR_POP", until="3.11")
def jump_if_false_or_pop(frame: Frame, inst: Inst) -> None:
    """`a and b`: keep a false top and jump, else pop it."""
    if not truth(frame.stack[-1]):
        frame.ip = inst.argval // 2
    else:
        frame.stack.pop()


# -- iteration ----------------------------------------------------------------------------------
@handles("GET_ITER")
def get_iter_(frame: Frame, inst: Inst) -> None:
    """Replace the top by an iterator over it."""
    frame.stack[-1] = get_iter(frame.stack[-1])


@handles("FOR_ITER", until="3.11")
def for_iter(frame: Frame, inst: Inst) -> None:
    """Push the iterator's next item, or pop the exhausted iterator and jump past the loop."""
    try:
        value = next_item(frame.stack[-1])
    except StopIteration:
        frame.stack.pop()
        frame.ip = inst.argval // 2
        return
    frame.stack.append(value)


@handles("FOR_ITER", since="3.12")
def for_iter_312(frame: Frame, inst: Inst) -> None:
    """Push the iterator's next item; when exhausted, jump to the loop's END_FOR, which removes the iterator.

    (CPython skips the END_FOR instead; pushing a placeholder for it to pop is the documented equivalent.)
    """
    try:
        value = next_item(frame.stack[-1])
    except StopIteration:
        value = None
        frame.ip = inst.argval // 2
    frame.stack.append(value)


@handles("END_FOR", since="3.12", until="3.12")
def end_for_312(frame: Frame, inst: Inst) -> None:
    """End of a `for` loop: pop the placeholder and the exhausted iterator."""
    del frame.stack[-2:]


@handles("END_FOR", since="3.13")
def end_for_313(frame: Frame, inst: Inst) -> None:
    """End of a `for` loop: pop the placeholder (the POP_TOP after it removes the iterator)."""
    frame.stack.pop()


# -- return and generators ----------------------------------------------------------------------
@handles("RETURN_VALUE")
def return_value(frame: Frame, inst: Inst) -> str:
    """Return the top of the stack from the frame."""
    frame.retval = frame.stack.pop()
    return RETURN


@handles("RETURN_CONST", since="3.12")
def return_const(frame: Frame, inst: Inst) -> str:
    """Return a constant from the frame."""
    frame.retval = inst.argval
    return RETURN


@handles("RETURN_GENERATOR")
def return_generator(frame: Frame, inst: Inst) -> str:
    """Stop here and hand the caller a generator for this frame (generator functions start like this)."""
    frame.suspended_at = inst
    return GENERATOR


@handles("YIELD_VALUE")
def yield_value(frame: Frame, inst: Inst) -> str:
    """Suspend the generator, giving the top of the stack to its consumer."""
    frame.retval = frame.stack.pop()
    frame.suspended_at = inst
    return YIELD


@handles("GET_YIELD_FROM_ITER")
def get_yield_from_iter(frame: Frame, inst: Inst) -> None:
    """`yield from x`: generators are used as they are, other iterables through iter()."""
    value = frame.stack[-1]
    if type(value).__name__ == "coroutine":
        raise TypeError("cannot 'yield from' a coroutine object in a non-coroutine generator")
    if not isinstance(value, InterpretedGenerator) and type(value).__name__ != "generator":
        frame.stack[-1] = get_iter(value)


@handles("SEND", until="3.11")
def send(frame: Frame, inst: Inst) -> None:
    """One step of `yield from`: send the top into the iterator below; on its return, jump with its value."""
    value = frame.stack.pop()
    receiver = frame.stack[-1]
    try:
        result = _send(receiver, value)
    except StopIteration as stop:
        frame.stack[-1] = stop.value
        frame.ip = inst.argval // 2
        return
    frame.stack.append(result)


@handles("SEND", since="3.12")
def send_312(frame: Frame, inst: Inst) -> None:
    """One step of `yield from`: [receiver, value] becomes [receiver, result]; when the receiver returns,
    [receiver, its value] and a jump to END_SEND."""
    value = frame.stack[-1]
    receiver = frame.stack[-2]
    try:
        result = _send(receiver, value)
    except StopIteration as stop:
        frame.stack[-1] = stop.value
        frame.ip = inst.argval // 2
        return
    frame.stack[-1] = result


@handles("END_SEND", since="3.12")
def end_send(frame: Frame, inst: Inst) -> None:
    """End of `yield from`: drop the receiver below the value it returned."""
    del frame.stack[-2]


def _send(receiver: Any, value: Any) -> Any:
    """`receiver.send(value)`, or `next(receiver)` for None, as CPython's SEND does."""
    if value is None:
        return next_item(receiver)
    method = getattr(receiver, "send", None)
    if method is None:
        raise AttributeError(f"'{type(receiver).__name__}' object has no attribute 'send'")

    return call(method, (value,), {})


__all__: list[str] = []
