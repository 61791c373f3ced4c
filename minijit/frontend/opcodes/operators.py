"""Operators: unary, binary (BINARY_OP), comparisons, identity, membership, subscripts."""

from __future__ import annotations

from minijit.frontend.code import Inst
from minijit.frontend.frame import Frame
from minijit.frontend.opcodes.protocols import (
    binary_op,
    compare,
    contains,
    del_item,
    get_item,
    set_item,
    truth,
    unary_op,
)
from minijit.frontend.opcodes.table import handles


@handles("UNARY_POSITIVE", "UNARY_NEGATIVE", "UNARY_INVERT")
def unary(frame: Frame, inst: Inst) -> None:
    """+x, -x, ~x."""
    frame.stack[-1] = unary_op(frame.stack[-1], inst.opname)


@handles("UNARY_NOT")
def unary_not(frame: Frame, inst: Inst) -> None:
    """not x."""
    frame.stack[-1] = not truth(frame.stack[-1])


@handles("BINARY_OP")
def binary(frame: Frame, inst: Inst) -> None:
    """a <op> b and a <op>= b; the argument says which operator."""
    b = frame.stack.pop()
    frame.stack[-1] = binary_op(frame.stack[-1], b, inst.arg)


@handles("COMPARE_OP")
def compare_op(frame: Frame, inst: Inst) -> None:
    """a < b, a == b, ..."""
    b = frame.stack.pop()
    frame.stack[-1] = compare(frame.stack[-1], b, inst.argval)


@handles("IS_OP")
def is_op(frame: Frame, inst: Inst) -> None:
    """a is b (argument 1: is not)."""
    b = frame.stack.pop()
    frame.stack[-1] = (frame.stack[-1] is b) != bool(inst.arg)


@handles("CONTAINS_OP")
def contains_op(frame: Frame, inst: Inst) -> None:
    """a in b (argument 1: not in)."""
    container = frame.stack.pop()
    frame.stack[-1] = contains(container, frame.stack[-1]) != bool(inst.arg)


@handles("BINARY_SUBSCR")
def binary_subscr(frame: Frame, inst: Inst) -> None:
    """container[key]."""
    key = frame.stack.pop()
    frame.stack[-1] = get_item(frame.stack[-1], key)


@handles("STORE_SUBSCR")
def store_subscr(frame: Frame, inst: Inst) -> None:
    """container[key] = value (stack: value, container, key)."""
    key = frame.stack.pop()
    container = frame.stack.pop()
    set_item(container, key, frame.stack.pop())


@handles("DELETE_SUBSCR")
def delete_subscr(frame: Frame, inst: Inst) -> None:
    """del container[key]."""
    key = frame.stack.pop()
    del_item(frame.stack.pop(), key)


__all__: list[str] = []
