"""Operators: unary, binary (BINARY_OP), comparisons, identity, membership, subscripts, truth.

3.12 moved `+x` into an intrinsic and added BINARY_SLICE/STORE_SLICE for `a[i:j]`; 3.13
added TO_BOOL (conditional jumps then take only bools) and a COMPARE_OP bit asking for a bool.
"""

from __future__ import annotations

from typing import Any

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
from minijit.ir import TensorProxy
from minijit.ir.context import current_trace


@handles("UNARY_POSITIVE", until="3.11")
@handles("UNARY_NEGATIVE", "UNARY_INVERT")
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


@handles("COMPARE_OP", until="3.12")
def compare_op(frame: Frame, inst: Inst) -> None:
    """a < b, a == b, ..."""
    b = frame.stack.pop()
    frame.stack[-1] = compare(frame.stack[-1], b, inst.argval)


@handles("COMPARE_OP", since="3.13")
def compare_op_313(frame: Frame, inst: Inst) -> None:
    """a < b, a == b, ...; argument bit 16 asks for the result as a bool (the comparison feeds a jump)."""
    b = frame.stack.pop()
    result = compare(frame.stack[-1], b, inst.argval)
    frame.stack[-1] = truth(result) if inst.arg & 16 else result


@handles("TO_BOOL", since="3.13")
def to_bool(frame: Frame, inst: Inst) -> None:
    """bool(top), before a conditional jump or `not`."""
    frame.stack[-1] = truth(frame.stack[-1])


@handles("IS_OP")
def is_op(frame: Frame, inst: Inst) -> None:
    """a is b (argument 1: is not)."""
    b = frame.stack.pop()
    frame.stack[-1] = _is(frame.stack[-1], b) != bool(inst.arg)


def _is(a: Any, b: Any) -> bool:
    """`a is b`, where two trace inputs standing for one tensor object (passed twice, or read twice from outside)
    are two proxies: answered by the tensors they stand for, and guarded (the capture's `identities`)."""
    if a is b or not (isinstance(a, TensorProxy) and isinstance(b, TensorProxy)):
        return a is b
    trace = current_trace()
    capture = trace.capture if trace is not None else None
    if capture is None:
        return False
    real = [capture.arguments.get(p.name, capture.captured_from.get(p.name)) for p in (a, b)]
    if real[0] is None or real[1] is None or not any(p is a for p in trace.args) or not any(p is b for p in trace.args):
        return False  # a tensor the trace computed is a new object, as eager's is
    same = real[0] is real[1]
    capture.identities.append((a.name, b.name, same))
    return same


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


@handles("BINARY_SLICE", since="3.12")
def binary_slice(frame: Frame, inst: Inst) -> None:
    """container[start:end] (stack: container, start, end)."""
    end = frame.stack.pop()
    start = frame.stack.pop()
    frame.stack[-1] = get_item(frame.stack[-1], slice(start, end))


@handles("STORE_SLICE", since="3.12")
def store_slice(frame: Frame, inst: Inst) -> None:
    """container[start:end] = value (stack: value, container, start, end)."""
    end = frame.stack.pop()
    start = frame.stack.pop()
    container = frame.stack.pop()
    set_item(container, slice(start, end), frame.stack.pop())


@handles("DELETE_SUBSCR")
def delete_subscr(frame: Frame, inst: Inst) -> None:
    """del container[key]."""
    key = frame.stack.pop()
    del_item(frame.stack.pop(), key)


__all__: list[str] = []
