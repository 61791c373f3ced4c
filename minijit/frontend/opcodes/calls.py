"""Calls: LOAD_METHOD, PRECALL/CALL with KW_NAMES, CALL_FUNCTION_EX, and MAKE_FUNCTION."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from minijit.frontend.calls import call
from minijit.frontend.code import Inst
from minijit.frontend.frame import NULL, STATE, Frame
from minijit.frontend.opcodes.build import observe_mapping
from minijit.frontend.opcodes.names import attribute
from minijit.frontend.opcodes.protocols import observe_iteration
from minijit.frontend.opcodes.table import handles


@handles("LOAD_METHOD")
def load_method(frame: Frame, inst: Inst) -> None:
    """Replace the object on top by NULL and its (bound) attribute; CALL then calls it."""
    obj = frame.stack.pop()
    frame.stack.append(NULL)
    frame.stack.append(attribute(frame, obj, inst.argval))


@handles("PRECALL")
def precall(frame: Frame, inst: Inst) -> None:
    """Nothing to do: CPython uses it to unpack bound methods for specialisation."""


@handles("KW_NAMES")
def kw_names(frame: Frame, inst: Inst) -> None:
    """Remember the names of the keyword arguments of the next CALL."""
    frame.kw_names = inst.argval


@handles("CALL")
def call_(frame: Frame, inst: Inst) -> None:
    """Call with `arg` arguments: stack is [NULL or method, callable or self, *args]."""
    stack = frame.stack
    n = inst.arg
    args = stack[len(stack) - n:] if n else []
    del stack[len(stack) - n:]
    second = stack.pop()
    first = stack.pop()
    if first is NULL:
        fn = second
    else:
        fn = first
        args.insert(0, second)
    names = frame.kw_names
    if names:
        frame.kw_names = None
        k = len(names)
        kwargs = dict(zip(names, args[len(args) - k:]))
        del args[len(args) - k:]
    else:
        kwargs = {}
    stack.append(call(fn, args, kwargs))


def function_str(fn: Any) -> str:
    """How CPython names a callable in argument errors: `module.qualname()`, or `type object`."""
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        return f"{type(fn).__name__} object"
    module = getattr(fn, "__module__", None)
    if isinstance(module, str) and module != "builtins":
        return f"{module}.{qualname}()"
    return f"{qualname}()"


@handles("CALL_FUNCTION_EX")
def call_function_ex(frame: Frame, inst: Inst) -> None:
    """f(*args, **kwargs): stack is [NULL, f, args, kwargs (if arg & 1)]."""
    stack = frame.stack
    kwargs = stack.pop() if inst.arg & 1 else {}
    args = stack.pop()
    fn = stack.pop()
    stack.pop()  # the NULL
    observe_iteration(args)
    if type(args) is not tuple:
        try:
            iter(args)
        except TypeError:
            raise TypeError(f"{function_str(fn)} argument after * must be an iterable, not {type(args).__name__}") from None
        args = tuple(args)
    if type(kwargs) is not dict:
        if not isinstance(kwargs, Mapping) and not hasattr(kwargs, "keys"):
            raise TypeError(f"{function_str(fn)} argument after ** must be a mapping, not {type(kwargs).__name__}")
        kwargs = {k: kwargs[k] for k in kwargs.keys()}
    observe_mapping(kwargs)
    stack.append(call(fn, args, kwargs))


@handles("MAKE_FUNCTION")
def make_function(frame: Frame, inst: Inst) -> None:
    """Build a function from the code on top, with closure/annotations/kw-defaults/defaults below it."""
    stack = frame.stack
    flags = inst.arg
    code = stack.pop()
    closure = stack.pop() if flags & 0x08 else None
    annotations = stack.pop() if flags & 0x04 else None
    kwdefaults = stack.pop() if flags & 0x02 else None
    defaults = stack.pop() if flags & 0x01 else None
    fn = types.FunctionType(code, frame.globals, code.co_name, defaults, closure)
    fn.__qualname__ = code.co_qualname
    STATE.internal_cells.add(id(fn))  # made by the traced code: its defaults are not from outside
    if kwdefaults is not None:
        fn.__kwdefaults__ = kwdefaults
    if annotations is not None:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2])) if isinstance(annotations, tuple) else annotations
    stack.append(fn)


__all__ = ["function_str"]
