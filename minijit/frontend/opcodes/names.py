"""Loads and stores: locals, cells, globals, names (class bodies), attributes; stack shuffling; imports."""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any

import torch

from minijit.frontend.code import Inst
from minijit.frontend.frame import NULL, Frame, current_state
from minijit.frontend.guards import (
    MISSING,
    attribute_source,
    is_users_module,
    may_have_guarded_attributes,
    record,
    slot_attribute,
)
from minijit.frontend.opcodes.protocols import delete_attribute, load_attr, stand_in, store_attr
from minijit.frontend.opcodes.table import handles
from minijit.frontend.outside import tensor_attribute
from minijit.ir import TensorProxy, current_trace

_UNBOUND = "cannot access local variable '{}' where it is not associated with a value"
_UNBOUND_FREE = "cannot access free variable '{}' where it is not associated with a value in enclosing scope"


# -- the stack ----------------------------------------------------------------------------------
@handles("NOP", "RESUME", "EXTENDED_ARG")
def nop(frame: Frame, inst: Inst) -> None:
    """Nothing to do."""


@handles("POP_TOP")
def pop_top(frame: Frame, inst: Inst) -> None:
    """Drop the top of the stack."""
    frame.stack.pop()


@handles("PUSH_NULL")
def push_null(frame: Frame, inst: Inst) -> None:
    """Push NULL (marks a call without `self`)."""
    frame.stack.append(NULL)


@handles("COPY")
def copy(frame: Frame, inst: Inst) -> None:
    """Push the i-th item from the top."""
    frame.stack.append(frame.stack[-inst.arg])


@handles("SWAP")
def swap(frame: Frame, inst: Inst) -> None:
    """Swap the top with the i-th item from the top."""
    s = frame.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


# -- locals -------------------------------------------------------------------------------------
@handles("LOAD_CONST")
def load_const(frame: Frame, inst: Inst) -> None:
    """Push a constant."""
    frame.stack.append(inst.argval)


@handles("LOAD_FAST")
@handles("LOAD_FAST_CHECK", since="3.12")
def load_fast(frame: Frame, inst: Inst) -> None:
    """Push a local variable."""
    value = frame.localsplus[inst.arg]
    if value is NULL:
        raise UnboundLocalError(_UNBOUND.format(inst.argval))
    frame.stack.append(value)


@handles("STORE_FAST")
def store_fast(frame: Frame, inst: Inst) -> None:
    """Pop into a local variable."""
    frame.localsplus[inst.arg] = frame.stack.pop()


@handles("DELETE_FAST")
def delete_fast(frame: Frame, inst: Inst) -> None:
    """del a local variable."""
    if frame.localsplus[inst.arg] is NULL:
        raise UnboundLocalError(_UNBOUND.format(inst.argval))
    frame.localsplus[inst.arg] = NULL


@handles("LOAD_FAST_AND_CLEAR", since="3.12")
def load_fast_and_clear(frame: Frame, inst: Inst) -> None:
    """Push a local, even unbound (NULL), and unbind it: an inlined comprehension saves the outer variable."""
    frame.stack.append(frame.localsplus[inst.arg])
    frame.localsplus[inst.arg] = NULL


def _local(frame: Frame, index: int) -> Any:
    value = frame.localsplus[index]
    if value is NULL:
        raise UnboundLocalError(_UNBOUND.format(frame.info.names[index]))
    return value


@handles("LOAD_FAST_LOAD_FAST", since="3.13")
def load_fast_load_fast(frame: Frame, inst: Inst) -> None:
    """Push two locals (slots arg >> 4, then arg & 15)."""
    frame.stack.append(_local(frame, inst.arg >> 4))
    frame.stack.append(_local(frame, inst.arg & 15))


@handles("STORE_FAST_LOAD_FAST", since="3.13")
def store_fast_load_fast(frame: Frame, inst: Inst) -> None:
    """Pop into the local arg >> 4, then push the local arg & 15."""
    frame.localsplus[inst.arg >> 4] = frame.stack.pop()
    frame.stack.append(_local(frame, inst.arg & 15))


@handles("STORE_FAST_STORE_FAST", since="3.13")
def store_fast_store_fast(frame: Frame, inst: Inst) -> None:
    """Pop into the local arg >> 4, then pop into the local arg & 15."""
    frame.localsplus[inst.arg >> 4] = frame.stack.pop()
    frame.localsplus[inst.arg & 15] = frame.stack.pop()


# -- cells --------------------------------------------------------------------------------------
@handles("MAKE_CELL")
def make_cell(frame: Frame, inst: Inst) -> None:
    """Wrap a local slot into a new cell (keeping an argument's value)."""
    value = frame.localsplus[inst.arg]
    cell = types.CellType() if value is NULL else types.CellType(value)
    current_state().internal_cells.add(id(cell))
    frame.localsplus[inst.arg] = cell


@handles("COPY_FREE_VARS")
def copy_free_vars(frame: Frame, inst: Inst) -> None:
    """Copy the function's closure cells into the frame's last slots."""
    closure = frame.func.__closure__
    start = frame.info.n_localsplus - inst.arg
    frame.localsplus[start:start + inst.arg] = closure


@handles("LOAD_CLOSURE", until="3.12")
def load_closure(frame: Frame, inst: Inst) -> None:
    """Push a cell itself (to build a closure)."""
    frame.stack.append(frame.localsplus[inst.arg])


def _deref(frame: Frame, inst: Inst) -> Any:
    cell = frame.localsplus[inst.arg]
    try:
        value = cell.cell_contents
    except ValueError:
        if inst.arg >= frame.info.n_localsplus - len(frame.code.co_freevars):
            raise NameError(_UNBOUND_FREE.format(inst.argval), name=inst.argval) from None
        raise UnboundLocalError(_UNBOUND.format(inst.argval)) from None
    if id(cell) not in current_state().internal_cells:
        outside = current_state().outside
        if frame.info.is_user or worth_guarding_in_library(value):
            value = outside.read(current_state().guards, "cell", cell, inst.argval, value, inst.argval, dynamic=True)
        value = outside.seen(value)
    return value


def worth_guarding_in_library(value: Any) -> bool:
    """Whether a global or closure value read by library code is guarded: its tensors and mutable state.

    Library code reads many module-level functions, classes and constants; those are taken as
    fixed (guarding them would cost every call). Containers and objects can change: a hook
    registry, a cache, a config object; tensors are read afresh on each call.
    """
    return isinstance(value, torch.Tensor) or (may_have_guarded_attributes(value) and not isinstance(value, type))


@handles("LOAD_DEREF")
def load_deref(frame: Frame, inst: Inst) -> None:
    """Push the contents of a cell."""
    frame.stack.append(_deref(frame, inst))


@handles("LOAD_CLASSDEREF", until="3.11")
def load_classderef(frame: Frame, inst: Inst) -> None:
    """In a class body: the name from the class namespace if bound there, else the cell's contents."""
    try:
        frame.stack.append(frame.locals[inst.argval])
    except KeyError:
        frame.stack.append(_deref(frame, inst))


@handles("LOAD_LOCALS", since="3.12")
def load_locals(frame: Frame, inst: Inst) -> None:
    """Push the class body's namespace (for LOAD_FROM_DICT_OR_DEREF/GLOBALS)."""
    if frame.locals is None:
        raise SystemError("no locals found")
    frame.stack.append(frame.locals)


@handles("LOAD_FROM_DICT_OR_DEREF", since="3.12")
def load_from_dict_or_deref(frame: Frame, inst: Inst) -> None:
    """Pop a mapping; push the name from it if bound there, else the cell's contents (3.11's LOAD_CLASSDEREF)."""
    mapping = frame.stack.pop()
    try:
        frame.stack.append(mapping[inst.argval])
    except KeyError:
        frame.stack.append(_deref(frame, inst))


@handles("STORE_DEREF")
def store_deref(frame: Frame, inst: Inst) -> None:
    """Pop into a cell (a cell from outside the call: an effect, replayed on every call)."""
    cell = frame.localsplus[inst.arg]
    value = frame.stack.pop()
    if id(cell) not in current_state().internal_cells and current_trace() is not None:
        current_state().outside.write_cell(cell, inst.argval, value)
    cell.cell_contents = value


@handles("DELETE_DEREF")
def delete_deref(frame: Frame, inst: Inst) -> None:
    """Empty a cell."""
    cell = frame.localsplus[inst.arg]
    try:
        del cell.cell_contents
    except ValueError:
        raise UnboundLocalError(_UNBOUND.format(inst.argval)) from None


# -- globals and names --------------------------------------------------------------------------
def _load_global(frame: Frame, name: str) -> Any:
    g = frame.globals
    try:
        value = g[name]
    except KeyError:
        try:
            value = frame.builtins[name]
        except KeyError:
            raise NameError(f"name '{name}' is not defined", name=name) from None
        if frame.info.is_user:
            record(current_state().guards, "builtin", frame.builtins, name, value, g)
        return value
    outside = current_state().outside
    if outside.shown:
        value = outside.shown.get((id(g), name), value)
    if frame.info.is_user or worth_guarding_in_library(value):
        value = outside.read(current_state().guards, "global", g, name, value, name, dynamic=True)
    return outside.seen(value)


@handles("LOAD_GLOBAL", until="3.12")
def load_global(frame: Frame, inst: Inst) -> None:
    """Push a global (or builtin); the low bit of the argument asks for a NULL first."""
    if inst.arg & 1:
        frame.stack.append(NULL)
    frame.stack.append(_load_global(frame, inst.argval))


@handles("LOAD_GLOBAL", since="3.13")
def load_global_313(frame: Frame, inst: Inst) -> None:
    """Push a global (or builtin); the low bit of the argument asks for a NULL after it (3.13's call layout)."""
    frame.stack.append(_load_global(frame, inst.argval))
    if inst.arg & 1:
        frame.stack.append(NULL)


@handles("LOAD_FROM_DICT_OR_GLOBALS", since="3.12")
def load_from_dict_or_globals(frame: Frame, inst: Inst) -> None:
    """Pop a mapping; push the name from it if bound there, else the global or builtin (annotation scopes)."""
    mapping = frame.stack.pop()
    try:
        frame.stack.append(mapping[inst.argval])
    except KeyError:
        frame.stack.append(_load_global(frame, inst.argval))


@handles("STORE_GLOBAL")
def store_global(frame: Frame, inst: Inst) -> None:
    """Pop into a global (an effect, replayed on every call)."""
    value = frame.stack.pop()
    if current_trace() is not None:
        current_state().outside.write_global(frame.globals, inst.argval, value)
    frame.globals[inst.argval] = value


@handles("DELETE_GLOBAL")
def delete_global(frame: Frame, inst: Inst) -> None:
    """del a global (an effect, replayed on every call)."""
    if inst.argval not in frame.globals:
        raise NameError(f"name '{inst.argval}' is not defined", name=inst.argval)
    if current_trace() is not None:
        current_state().outside.write_global(frame.globals, inst.argval, None, delete=True)
    del frame.globals[inst.argval]


@handles("LOAD_NAME")
def load_name(frame: Frame, inst: Inst) -> None:
    """Push a name from the class namespace, else the globals, else the builtins."""
    name = inst.argval
    if frame.locals is not None:
        try:
            frame.stack.append(frame.locals[name])
            return
        except KeyError:
            pass
    frame.stack.append(_load_global(frame, name))


@handles("STORE_NAME")
def store_name(frame: Frame, inst: Inst) -> None:
    """Pop into the class namespace."""
    frame.locals[inst.argval] = frame.stack.pop()


@handles("DELETE_NAME")
def delete_name(frame: Frame, inst: Inst) -> None:
    """del a name of the class namespace."""
    try:
        del frame.locals[inst.argval]
    except KeyError:
        raise NameError(f"name '{inst.argval}' is not defined", name=inst.argval) from None


@handles("SETUP_ANNOTATIONS")
def setup_annotations(frame: Frame, inst: Inst) -> None:
    """Create `__annotations__` in a class namespace that has annotated names."""
    if "__annotations__" not in frame.locals:
        frame.locals["__annotations__"] = {}


@handles("LOAD_BUILD_CLASS")
def load_build_class(frame: Frame, inst: Inst) -> None:
    """Push `__build_class__` (the call is looked aside to interpret the class body)."""
    try:
        frame.stack.append(frame.builtins["__build_class__"])
    except KeyError:
        raise NameError("__build_class__ not found") from None


# -- attributes ---------------------------------------------------------------------------------
def attribute(frame: Frame | None, obj: Any, name: str) -> Any:
    """obj.name for interpreted code, guarded when obj is from outside the call (minijit.frontend.outside).

    An attribute of a user module is guarded like a global; a real tensor's attribute is
    read through its proxy (`t.shape`, `t.add_`), or read and guarded (`t.grad`). An object
    that stands for another (a jitted module: `minijit_traced_object`) is read through that one.
    """
    if type(obj) is types.ModuleType:
        value = getattr(obj, name)
        if frame is not None and frame.info.is_user and is_users_module(obj):
            value = current_state().outside.read(current_state().guards, "global", obj.__dict__, name, value, name,
                                                 dynamic=True)
        return value
    if isinstance(obj, torch.Tensor):
        trace = current_trace()
        if trace is not None and trace.capture_tensor is not None:
            return tensor_attribute(current_state().outside, current_state().guards, obj, name, trace.capture_tensor)
    if name == "shape" and type(obj) is TensorProxy:
        return obj.size()  # a torch.Size, as eager's, where no size is symbolic
    obj = stand_in(obj)
    outside = current_state().outside
    try:
        value = load_attr(obj, name)
    except AttributeError:
        if outside.is_root(obj) and (isinstance(getattr(obj, "__dict__", None), dict) or slot_attribute(obj, name)):
            outside.read(current_state().guards, "attribute", obj, name, MISSING, name)  # guard its absence
        raise
    if outside.shown:
        value = outside.shown.get((id(obj), name), value)
    if outside.is_root(obj):
        source = attribute_source(obj, name)
        if source is not None:
            # Guard what is stored: for a method read through an instance that is the class's
            # function (a bound method is a new object on every read).
            holder, shadow = source
            stored = value if shadow is None else vars(holder).get(name, value)
            seen = outside.read(current_state().guards, "attribute", holder, name, stored, name, shadow, dynamic=True)
            if shadow is None:
                value = seen
        elif name == "__dict__":
            outside.add_root(value, outside.label_of(obj))
    return outside.seen(value)


@handles("LOAD_ATTR", until="3.11")
def load_attr_(frame: Frame, inst: Inst) -> None:
    """Replace the top of the stack by its attribute."""
    frame.stack[-1] = attribute(frame, frame.stack[-1], inst.argval)


@handles("STORE_ATTR")
def store_attr_(frame: Frame, inst: Inst) -> None:
    """obj.name = value (obj on top, value below it)."""
    obj = frame.stack.pop()
    store_attr(obj, inst.argval, frame.stack.pop())


@handles("DELETE_ATTR")
def delete_attr(frame: Frame, inst: Inst) -> None:
    """del obj.name."""
    delete_attribute(frame.stack.pop(), inst.argval)


# -- imports ------------------------------------------------------------------------------------
@handles("IMPORT_NAME")
def import_name(frame: Frame, inst: Inst) -> None:
    """`import x` / `from x import y`: call `__import__` with the level and fromlist on the stack."""
    fromlist = frame.stack.pop()
    level = frame.stack.pop()
    importer = frame.builtins.get("__import__", builtins.__import__)
    frame.stack.append(importer(inst.argval, frame.globals, frame.locals, fromlist, level))


@handles("IMPORT_FROM")
def import_from(frame: Frame, inst: Inst) -> None:
    """Push an attribute of the module on top of the stack (falling back to a submodule)."""
    module = frame.stack[-1]
    name = inst.argval
    try:
        frame.stack.append(getattr(module, name))
        return
    except AttributeError:
        pass
    mod_name = getattr(module, "__name__", None)
    full = f"{mod_name}.{name}"
    if full in sys.modules:
        frame.stack.append(sys.modules[full])
        return
    where = getattr(module, "__file__", None) or "unknown location"
    raise ImportError(f"cannot import name '{name}' from '{mod_name}' ({where})", name=mod_name, path=where)


__all__ = ["attribute"]
