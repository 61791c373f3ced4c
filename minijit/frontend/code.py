"""Decoded code objects: instructions with their handlers, the exception table, line locations.

Each code object is decoded once (`code_info`) into a list indexed by code unit
(offset // 2), so a jump target is an index and dispatch is one list lookup plus
one call. Argument binding is delegated to CPython itself through a "binder": a
copy of the function's code whose body only returns its argument slots, so the
interpreter gets CPython's exact binding rules and error messages for free.
"""

from __future__ import annotations

import dis
import linecache
import os
import sysconfig
import types
from collections.abc import Callable
from typing import Any

from minijit.errors import UnsupportedSyntaxError
from minijit.ir import SourceLocation
from minijit.ir.context import where_now

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
CO_GENERATOR = 0x20
CO_COROUTINE = 0x80
CO_ITERABLE_COROUTINE = 0x100
CO_ASYNC_GENERATOR = 0x200
ASYNC_FLAGS = CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR


class Inst:
    """One decoded instruction: its handler, argument, successor index, line and handler entry."""

    __slots__ = ("arg", "argval", "except_entry", "handler", "line", "next", "offset", "opname")

    def __init__(self, opname: str, arg: int | None, argval: Any, offset: int, next_index: int,
                 line: int | None, handler: Callable[..., Any]):
        self.opname = opname
        self.arg = arg
        self.argval = argval
        self.offset = offset
        self.next = next_index
        self.line = line
        self.handler = handler
        self.except_entry: tuple[int, int, bool] | None = None  # (target index, stack depth, push lasti)

    def __repr__(self) -> str:
        return f"<Inst {self.offset} {self.opname} {self.argval!r} line {self.line}>"


class CodeInfo:
    """Everything the interpreter needs about a code object, computed once."""

    __slots__ = ("binder_code", "code", "filename", "insts", "is_user", "locations", "n_args",
                 "n_localsplus", "names", "sourceless")

    def __init__(self, code: types.CodeType, insts: list[Inst | None], is_user: bool):
        self.code = code
        self.insts = insts
        self.is_user = is_user
        self.names = localsplus_names(code)
        self.n_localsplus = len(self.names)
        flags = code.co_flags
        self.n_args = (code.co_argcount + code.co_kwonlyargcount + bool(flags & CO_VARARGS)
                       + bool(flags & CO_VARKEYWORDS))
        self.binder_code: types.CodeType | None = None
        self.filename = short_filename(code.co_filename)
        self.locations: dict[int, SourceLocation] = {}
        # Generated code (dataclass __init__, exec'd strings) has no text to show; its lines are
        # only used when no user line is known, else the calling user line stays the location.
        self.sourceless = code.co_filename.startswith("<") and not linecache.getline(code.co_filename,
                                                                                        code.co_firstlineno)

    def location(self, line: int) -> SourceLocation:
        """The SourceLocation of `line` in this code's file (cached)."""
        loc = self.locations.get(line)
        if loc is None:
            text = linecache.getline(self.code.co_filename, line).strip()
            loc = self.locations[line] = SourceLocation(self.filename, line, text)
        return loc


def localsplus_names(code: types.CodeType) -> list[str]:
    """Names of the frame's slots: locals, then cells that are not arguments, then free variables."""
    names = list(code.co_varnames)
    seen = set(names)
    names += [c for c in code.co_cellvars if c not in seen]
    return names + list(code.co_freevars)


_CWD = os.getcwd()
_SHORT: dict[str, str] = {}


def short_filename(path: str) -> str:
    """The path relative to the working directory when the file lies below it, relative to site-packages
    (or the standard library) for a library file (`torch/optim/adam.py`), else its basename."""
    short = _SHORT.get(path)
    if short is None:
        if path.startswith(_CWD + os.sep):
            short = os.path.relpath(path, _CWD)
        else:
            real = os.path.realpath(path)
            library = next((d for d in _LIBRARY_DIRS if real.startswith(d + os.sep)), None)
            short = os.path.relpath(real, library) if library is not None else os.path.basename(path)
        _SHORT[path] = short
    return short


_LIBRARY_DIRS = tuple({os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                      sysconfig.get_paths()["platlib"])})


def is_library_file(path: str) -> bool:
    """True for files of the standard library and installed packages (not the user's code)."""
    return os.path.realpath(path).startswith(_LIBRARY_DIRS)


_INFOS: dict[types.CodeType, CodeInfo] = {}


def code_info(code: types.CodeType) -> CodeInfo:
    """The decoded form of `code` (computed on first use, then cached)."""
    info = _INFOS.get(code)
    if info is None or info.code.co_filename != code.co_filename:
        info = _INFOS[code] = _decode(code)
    return info


def _decode(code: types.CodeType) -> CodeInfo:
    from minijit.frontend.opcodes import running_table

    handlers = running_table()
    n_units = len(code.co_code) // 2
    insts: list[Inst | None] = [None] * n_units
    positions = list(code.co_positions())
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        handler = handlers.get(ins.opname) or _unsupported_handler(ins.opname)
        index = ins.offset // 2
        line = positions[index][0] if index < len(positions) else None
        argval = code.co_consts[ins.arg] if ins.opname == "KW_NAMES" else ins.argval
        # The successor is the next instruction: dis skips the inline CACHE units (their count varies by version).
        next_index = instructions[i + 1].offset // 2 if i + 1 < len(instructions) else n_units
        insts[index] = Inst(ins.opname, ins.arg, argval, ins.offset, next_index, line, handler)
    # Instructions the compiler marks with no line (e.g. cleanup code) belong to the line before.
    last = code.co_firstlineno
    for inst in insts:
        if inst is not None:
            if inst.line is None:
                inst.line = last
            last = inst.line
    for entry in dis._parse_exception_table(code):
        target = (entry.target // 2, entry.depth, entry.lasti)
        for index in range(entry.start // 2, entry.end // 2):
            if insts[index] is not None:
                insts[index].except_entry = target
    return CodeInfo(code, insts, not is_library_file(code.co_filename))


def _unsupported_handler(opname: str) -> Callable[..., Any]:
    def unsupported(frame: Any, inst: Inst) -> None:
        raise UnsupportedSyntaxError(f"the Python opcode {opname}{where_now()} is not supported by the minijit interpreter")

    return unsupported


def _encode(op: str, arg: int = 0) -> bytes:
    opcode = dis.opmap[op]
    out = b""
    for shift in (24, 16, 8):
        if arg >> shift:
            out += bytes([dis.opmap["EXTENDED_ARG"], (arg >> shift) & 0xFF])
    return out + bytes([opcode, arg & 0xFF])


def _no_locations(n_units: int) -> bytes:
    """A location table (the 3.11+ format) saying that none of `n_units` code units has a source location.

    An empty table would make `co_positions()` yield nothing on 3.12+, which breaks the
    `traceback` module on any exception passing through the generated code.
    """
    table = b""
    while n_units > 0:
        span = min(n_units, 8)
        table += bytes([0x80 | (15 << 3) | (span - 1)])  # entry kind 15: no location, for `span` units
        n_units -= span
    return table


def binder_for(fn: types.FunctionType, info: CodeInfo) -> types.FunctionType:
    """A function with `fn`'s signature, defaults and closure whose body returns its argument slots.

    Calling it binds arguments exactly as CPython does (same errors, same messages).
    """
    bcode = info.binder_code
    if bcode is None:
        code = info.code
        body = _encode("RESUME") + b"".join(_encode("LOAD_FAST", i) for i in range(info.n_args))
        body += _encode("BUILD_TUPLE", info.n_args) + _encode("RETURN_VALUE")
        flags = code.co_flags & ~(CO_GENERATOR | ASYNC_FLAGS)
        bcode = info.binder_code = code.replace(
            co_code=body, co_consts=(None,), co_names=(), co_flags=flags, co_stacksize=max(info.n_args, 1),
            co_linetable=_no_locations(len(body) // 2), co_exceptiontable=b"",
        )
    binder = types.FunctionType(bcode, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    binder.__kwdefaults__ = fn.__kwdefaults__
    binder.__qualname__ = fn.__qualname__
    return binder


_NATIVE: dict[tuple[str, int, int], types.CodeType] = {}


def native_instruction(opname: str, arg: int, n_inputs: int, globals_: dict[str, Any]) -> types.FunctionType:
    """A function whose body is the one CPython instruction `opname arg` applied to its `n_inputs` arguments.

    For instructions that only compute from their inputs (PREP_RERAISE_STAR, most
    CALL_INTRINSIC_1/2 functions), calling it runs CPython's own implementation: exact
    results and errors. It runs with the interpreted frame's `globals_`, as the instruction
    would (TypeVar reads its module name there). The instruction must have no inline caches.
    """
    key = (opname, arg, n_inputs)
    code = _NATIVE.get(key)
    if code is None:
        params = ", ".join(f"a{i}" for i in range(n_inputs))
        env: dict[str, Any] = {}
        exec(f"def native({params}): pass", env)
        body = _encode("RESUME") + b"".join(_encode("LOAD_FAST", i) for i in range(n_inputs))
        body += _encode(opname, arg) + _encode("RETURN_VALUE")
        code = _NATIVE[key] = env["native"].__code__.replace(
            co_code=body, co_consts=(None,), co_names=(), co_stacksize=max(n_inputs, 1),
            co_linetable=_no_locations(len(body) // 2), co_exceptiontable=b"", co_name=opname.lower(),
            co_qualname=opname.lower())
    return types.FunctionType(code, globals_)


__all__ = ["CodeInfo", "Inst", "binder_for", "code_info", "is_library_file", "localsplus_names", "native_instruction",
           "short_filename"]
