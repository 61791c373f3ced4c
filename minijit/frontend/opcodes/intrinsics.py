"""CALL_INTRINSIC_1 and CALL_INTRINSIC_2 (3.12+): small functions CPython calls by number.

3.12 moved rare operations out of the opcode space into these two instructions. Those
that look at the frame or must stay inside the interpreter are written here: a
generator's StopIteration turning into a RuntimeError, `+x` (a Python `__pos__` is
interpreted), list-to-tuple, and the end of a try/except* block (a MinijitError leaves
it alone). Those that only compute from their arguments (PEP 695's TypeVar, ParamSpec,
Generic and type-alias builders) run natively, through a function whose body is that
very instruction, so their results and errors are CPython's. Module-level ones
(`import *`, the REPL's printing) and async generators are refused.
"""

from __future__ import annotations

import dis
from collections.abc import Callable
from typing import Any

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.code import CO_ASYNC_GENERATOR, CO_COROUTINE, Inst, native_instruction
from minijit.frontend.frame import Frame
from minijit.frontend.opcodes.exceptions import reraise_star
from minijit.frontend.opcodes.protocols import unary_op
from minijit.frontend.opcodes.table import handles
from minijit.ir.context import where_now

# Why an intrinsic is refused (its name as dis spells it).
_REFUSED = {
    "INTRINSIC_PRINT": "printing an expression statement (only the interactive interpreter does)",
    "INTRINSIC_IMPORT_STAR": "`from module import *`",
    "INTRINSIC_ASYNC_GEN_WRAP": "an async generator",
}


def _stopiteration_error(frame: Frame, exc: Any) -> Any:
    """A StopIteration escaping a generator's body becomes a RuntimeError caused by it (PEP 479)."""
    flags = frame.code.co_flags
    if isinstance(exc, StopIteration):
        kind = "async generator" if flags & CO_ASYNC_GENERATOR else "coroutine" if flags & CO_COROUTINE else "generator"
        message = f"{kind} raised StopIteration"
    elif flags & CO_ASYNC_GENERATOR and isinstance(exc, StopAsyncIteration):
        message = "async generator raised StopAsyncIteration"
    else:
        return exc
    error = RuntimeError(message)
    error.__cause__ = exc
    error.__context__ = exc
    return error


_WRITTEN_1: dict[str, Callable[[Frame, Any], Any]] = {
    "INTRINSIC_STOPITERATION_ERROR": _stopiteration_error,
    "INTRINSIC_UNARY_POSITIVE": lambda frame, value: unary_op(value, "UNARY_POSITIVE"),
    "INTRINSIC_LIST_TO_TUPLE": lambda frame, value: tuple(value),
}
_WRITTEN_2: dict[str, Callable[[Frame, Any, Any], Any]] = {
    "INTRINSIC_PREP_RERAISE_STAR": lambda frame, orig, raised: reraise_star(
        orig, raised, native_instruction("CALL_INTRINSIC_2", _INDEX_2["INTRINSIC_PREP_RERAISE_STAR"], 2, frame.globals)),
}


def _refused(name: str) -> Callable[..., Any]:
    def refuse(frame: Frame, *args: Any) -> Any:
        what = _REFUSED.get(name, f"the intrinsic {name}")
        raise UnsupportedSyntaxError(f"{what}{where_now()} is not supported by the minijit interpreter")

    return refuse


def _native(opname: str, index: int, n_inputs: int) -> Callable[..., Any]:
    def run(frame: Frame, *args: Any) -> Any:
        return native_instruction(opname, index, n_inputs, frame.globals)(*args)

    return run


def _table(opname: str, names: list[str], written: dict[str, Callable[..., Any]], n_inputs: int) -> list[Callable[..., Any]]:
    """The functions of one intrinsic instruction, by number."""
    table = []
    for index, name in enumerate(names):
        if name in written:
            table.append(written[name])
        elif name in _REFUSED or name.endswith("_INVALID"):
            table.append(_refused(name))
        else:
            table.append(_native(opname, index, n_inputs))
    return table


# dis names the intrinsics on 3.12 and later (3.11 has none).
_NAMES_1: list[str] = list(getattr(dis, "_intrinsic_1_descs", []))
_NAMES_2: list[str] = list(getattr(dis, "_intrinsic_2_descs", []))
_INDEX_2 = {name: index for index, name in enumerate(_NAMES_2)}
_INTRINSICS_1 = _table("CALL_INTRINSIC_1", _NAMES_1, _WRITTEN_1, 1)
_INTRINSICS_2 = _table("CALL_INTRINSIC_2", _NAMES_2, _WRITTEN_2, 2)


@handles("CALL_INTRINSIC_1", since="3.12")
def call_intrinsic_1(frame: Frame, inst: Inst) -> None:
    """Replace the top by intrinsic number `arg` of it."""
    frame.stack[-1] = _INTRINSICS_1[inst.arg](frame, frame.stack[-1])


@handles("CALL_INTRINSIC_2", since="3.12")
def call_intrinsic_2(frame: Frame, inst: Inst) -> None:
    """Replace the top two by intrinsic number `arg` of them (the lower one first)."""
    second = frame.stack.pop()
    frame.stack[-1] = _INTRINSICS_2[inst.arg](frame, frame.stack[-1], second)


__all__: list[str] = []
