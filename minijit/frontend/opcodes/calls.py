"""Calls: method loads, CALL and its keyword forms, CALL_FUNCTION_EX, and function creation.

The stack layout of a call changed twice. 3.11 and 3.12 push `[NULL, callable, *args]` or
`[method, self, *args]` (3.11 through LOAD_METHOD, 3.12 through LOAD_ATTR's method bit)
with the keyword names set by a KW_NAMES instruction; 3.13 pushes `[callable, NULL or
self, *args]` and passes keyword names on the stack to CALL_KW. 3.13 also builds a
function in steps: MAKE_FUNCTION takes only the code, SET_FUNCTION_ATTRIBUTE adds the rest.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.calls import call
from minijit.frontend.code import Inst
from minijit.frontend.frame import NULL, Frame, current_state, observe_iteration, observe_mapping
from minijit.frontend.opcodes.names import attribute
from minijit.frontend.opcodes.table import handles
from minijit.ir.context import where_now


@handles("LOAD_METHOD", until="3.11")
def load_method(frame: Frame, inst: Inst) -> None:
    """Replace the object on top by NULL and its (bound) attribute; CALL then calls it."""
    obj = frame.stack.pop()
    frame.stack.append(NULL)
    frame.stack.append(attribute(frame, obj, inst.argval))


@handles("PRECALL", until="3.11")
def precall(frame: Frame, inst: Inst) -> None:
    """Nothing to do: CPython uses it to unpack bound methods for specialisation."""


@handles("KW_NAMES", until="3.12")
def kw_names(frame: Frame, inst: Inst) -> None:
    """Remember the names of the keyword arguments of the next CALL."""
    frame.kw_names = inst.argval


@handles("CALL", until="3.12")
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
    stack.append(call(fn, args, _pop_keywords(args, names)))


def _pop_keywords(args: list[Any], names: tuple[str, ...] | None) -> dict[str, Any]:
    """The keyword arguments named by `names`: the last len(names) of `args`, removed from it."""
    if not names:
        return {}
    k = len(names)
    kwargs = dict(zip(names, args[len(args) - k:]))
    del args[len(args) - k:]
    return kwargs


def function_str(fn: Any) -> str:
    """How CPython names a callable in argument errors: `module.qualname()`, or `type object`."""
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        return f"{type(fn).__name__} object"
    module = getattr(fn, "__module__", None)
    if isinstance(module, str) and module != "builtins":
        return f"{module}.{qualname}()"
    return f"{qualname}()"


@handles("CALL_FUNCTION_EX", until="3.12")
def call_function_ex(frame: Frame, inst: Inst) -> None:
    """f(*args, **kwargs): stack is [NULL, f, args, kwargs (if arg & 1)]."""
    stack = frame.stack
    kwargs = stack.pop() if inst.arg & 1 else {}
    args = stack.pop()
    fn = stack.pop()
    stack.pop()  # the NULL
    stack.append(_call_unpacked(fn, args, kwargs))


def _call_unpacked(fn: Any, args: Any, kwargs: Any) -> Any:
    """fn(*args, **kwargs) with CPython's errors for an args that is not iterable or a kwargs that is not a mapping."""
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
    return call(fn, args, kwargs)


@handles("MAKE_FUNCTION", until="3.12")
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
    current_state().internal_cells.add(id(fn))  # made by the traced code: its defaults are not from outside
    if kwdefaults is not None:
        fn.__kwdefaults__ = kwdefaults
    if annotations is not None:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2])) if isinstance(annotations, tuple) else annotations
    stack.append(fn)



# -- 3.12: LOAD_ATTR's method bit replaces LOAD_METHOD; LOAD_SUPER_ATTR -------------------------
@handles("LOAD_ATTR", since="3.12", until="3.12")
def load_attr_312(frame: Frame, inst: Inst) -> None:
    """obj.name; with the low bit set (a method call follows), push NULL and the bound attribute instead."""
    if inst.arg & 1:
        obj = frame.stack.pop()
        frame.stack.append(NULL)
        frame.stack.append(attribute(frame, obj, inst.argval))
    else:
        frame.stack[-1] = attribute(frame, frame.stack[-1], inst.argval)


def _super_attribute(frame: Frame, inst: Inst) -> Any:
    """`super().name` or `super(cls, self).name` from the stack [global super, class, self]."""
    stack = frame.stack
    self_ = stack.pop()
    cls = stack.pop()
    global_super = stack.pop()
    if global_super is super:
        sup = super(cls, self_)  # the zero-argument form finds the same class cell and first argument
    else:
        # A shadowed `super` is called as written: with no arguments for `super().name` (bit 2 unset).
        sup = call(global_super, (cls, self_) if inst.arg & 2 else (), {})
    return attribute(frame, sup, inst.argval)


@handles("LOAD_SUPER_ATTR", since="3.12", until="3.12")
def load_super_attr_312(frame: Frame, inst: Inst) -> None:
    """super().name in one instruction; the low bit asks for a method load ([NULL, bound attribute])."""
    value = _super_attribute(frame, inst)
    if inst.arg & 1:
        frame.stack.append(NULL)
    frame.stack.append(value)


# -- 3.13: [callable, NULL or self, *args]; CALL_KW; SET_FUNCTION_ATTRIBUTE -----------------------
@handles("LOAD_ATTR", since="3.13")
def load_attr_313(frame: Frame, inst: Inst) -> None:
    """obj.name; with the low bit set (a method call follows), push the bound attribute and NULL."""
    frame.stack[-1] = attribute(frame, frame.stack[-1], inst.argval)
    if inst.arg & 1:
        frame.stack.append(NULL)


@handles("LOAD_SUPER_ATTR", since="3.13")
def load_super_attr_313(frame: Frame, inst: Inst) -> None:
    """super().name in one instruction; the low bit asks for a method load ([bound attribute, NULL])."""
    frame.stack.append(_super_attribute(frame, inst))
    if inst.arg & 1:
        frame.stack.append(NULL)


def _call_313(frame: Frame, n: int, names: tuple[str, ...]) -> None:
    stack = frame.stack
    args = stack[len(stack) - n:] if n else []
    del stack[len(stack) - n:]
    self_ = stack.pop()
    fn = stack.pop()
    if self_ is not NULL:
        args.insert(0, self_)
    stack.append(call(fn, args, _pop_keywords(args, names)))


@handles("CALL", since="3.13")
def call_313(frame: Frame, inst: Inst) -> None:
    """Call with `arg` arguments: stack is [callable, NULL or self, *args]."""
    _call_313(frame, inst.arg, ())


@handles("CALL_KW", since="3.13")
def call_kw(frame: Frame, inst: Inst) -> None:
    """CALL whose last arguments are keywords, named by the tuple on top: [callable, NULL or self, *args, names]."""
    _call_313(frame, inst.arg, frame.stack.pop())


@handles("CALL_FUNCTION_EX", since="3.13")
def call_function_ex_313(frame: Frame, inst: Inst) -> None:
    """f(*args, **kwargs): stack is [f, NULL, args, kwargs (if arg & 1)]."""
    stack = frame.stack
    kwargs = stack.pop() if inst.arg & 1 else {}
    args = stack.pop()
    stack.pop()  # the NULL
    fn = stack.pop()
    stack.append(_call_unpacked(fn, args, kwargs))


@handles("MAKE_FUNCTION", since="3.13")
def make_function_313(frame: Frame, inst: Inst) -> None:
    """Build a function from the code on top; SET_FUNCTION_ATTRIBUTE adds defaults, closure, annotations."""
    code = frame.stack[-1]
    # A closure's cells come next (SET_FUNCTION_ATTRIBUTE 8): until then, empty ones hold their place.
    placeholder = tuple(types.CellType() for _ in code.co_freevars) if code.co_freevars else None
    fn = types.FunctionType(code, frame.globals, code.co_name, None, placeholder)
    fn.__qualname__ = code.co_qualname
    current_state().internal_cells.add(id(fn))  # made by the traced code: its defaults are not from outside
    frame.stack[-1] = fn


@handles("SET_FUNCTION_ATTRIBUTE", since="3.13")
def set_function_attribute(frame: Frame, inst: Inst) -> None:
    """Set one attribute (by flag, as MAKE_FUNCTION's 3.11 flags) of the function on top to the value below it."""
    fn = frame.stack.pop()
    value = frame.stack.pop()
    flag = inst.arg
    if flag == 0x08:
        # A function's closure cannot be assigned: rebuild the function around it (it is fresh, nothing refers to it).
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, value)
        new.__qualname__ = fn.__qualname__
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__annotations__ = fn.__annotations__
        fn = new
        current_state().internal_cells.add(id(fn))
    elif flag == 0x04:
        fn.__annotations__ = dict(zip(value[::2], value[1::2])) if isinstance(value, tuple) else value
    elif flag == 0x02:
        fn.__kwdefaults__ = value
    elif flag == 0x01:
        fn.__defaults__ = value
    else:
        raise UnsupportedSyntaxError(f"SET_FUNCTION_ATTRIBUTE with flag {flag:#x}{where_now()} is not supported by "
                                     "the minijit interpreter")
    frame.stack.append(fn)


__all__ = ["function_str"]
