"""Lookasides: replacements for builtins whose native behaviour would be wrong for interpreted code.

A builtin runs in C and sees the interpreter's own frames and the proxies' real
types. The functions here give interpreted code what native code would see:
`super()` finds `__class__` in the interpreted frame, `isinstance(t, torch.Tensor)`
is True for a TensorProxy, `math.cos(n)` of a symbolic number is computed by the trace.
`LOOKASIDES` is the one table, filled by `@lookaside` here and in the modules that add their own; those
that run Python code through the interpreter (`map(f, xs)` interprets `f`, `class` statements run their
bodies) are in `minijit.frontend.interpreted_lookasides`.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from minijit.frontend.frame import NULL, current_frame, current_state
from minijit.frontend.torch_function import has_override
from minijit.ir import NumberProxy, TensorProxy, current_trace
from minijit.ir.context import note_state_read
from minijit.ir.proxies import number_value, user_text
from minijit.ops import aten_prims, prims
from minijit.ops.autocast import clear_cast_cache

LOOKASIDES: dict[Any, Callable[..., Any]] = {}


def lookaside(*originals: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the replacement of `originals` in interpreted calls.

    The functions an original wraps (`__wrapped__`) are replaced too: torch._dynamo rebinds
    `torch.manual_seed` to a wrapper of `torch.random.manual_seed`, and code may call either.
    """

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for original in originals:
            for _ in range(8):  # a few wrappers deep at most
                if original is None:
                    break
                LOOKASIDES[original] = fn
                original = getattr(original, "__wrapped__", None)
        return fn

    return register


def _classinfo_has(classinfo: Any, target: type) -> bool:
    if isinstance(classinfo, tuple):
        return any(_classinfo_has(c, target) for c in classinfo)
    return isinstance(classinfo, type) and issubclass(target, classinfo)


@lookaside(isinstance)
def isinstance_(obj: Any, classinfo: Any) -> bool:
    """isinstance, with a TensorProxy an instance of torch.Tensor and a NumberProxy of its Python type."""
    # A proxy is a plain tensor: isinstance(t, nn.Parameter) stays False.
    if isinstance(obj, TensorProxy) and _classinfo_has(classinfo, torch.Tensor):
        return True
    if isinstance(obj, NumberProxy) and _classinfo_has(classinfo, obj.python_type):
        return True
    return isinstance(obj, classinfo)


@lookaside(torch.is_tensor)
def is_tensor(obj: Any) -> bool:
    """torch.is_tensor, True for a TensorProxy."""
    return isinstance(obj, TensorProxy) or torch.is_tensor(obj)


def _tensor_query(native: Callable[..., Any], method: str) -> Callable[..., Any]:
    def query(obj: Any) -> Any:
        return getattr(obj, method)() if isinstance(obj, TensorProxy) else native(obj)

    query.__doc__ = f"torch.{native.__name__}, answered from a TensorProxy's metadata."
    return query


for _native_query, _method in ((torch.is_floating_point, "is_floating_point"), (torch.is_complex, "is_complex"),
                               (torch.is_signed, "is_signed"), (torch.numel, "numel")):
    LOOKASIDES[_native_query] = _tensor_query(_native_query, _method)


@lookaside(torch.overrides.is_tensor_like)
def is_tensor_like(obj: Any) -> bool:
    """torch.overrides.is_tensor_like, True for a TensorProxy (torch.distributions checks its arguments with it)."""
    return isinstance(obj, TensorProxy) or torch.overrides.is_tensor_like(obj)


@lookaside(torch._C._group_tensors_by_device_and_dtype)
def group_tensors_by_device_and_dtype(tensorlistlist: Any, with_indices: bool = False) -> Any:
    """torch's grouping of tensor lists by device and dtype (`clip_grad_norm_`, the foreach optimizers), on proxies.

    The grouping, and the order of its groups, are torch's own: it runs on empty stand-ins with the proxies'
    devices and dtypes, and each stand-in is replaced by its proxy again."""
    stand_ins: dict[int, Any] = {}

    def stand_in(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            real = torch.empty(0, dtype=x.dtype, device=x.device)
            stand_ins[id(real)] = x
            return real
        return x

    real_lists = [[stand_in(x) for x in tensors] for tensors in tensorlistlist]
    grouped = torch._C._group_tensors_by_device_and_dtype(real_lists, with_indices)
    return {key: ([[stand_ins.get(id(x), x) for x in tensors] for tensors in lists], indices)
            for key, (lists, indices) in grouped.items()}


@lookaside(torch.is_inference_mode_enabled)
def is_inference_mode_enabled() -> bool:
    """The mode now; the trace keeps it, so the entry's guard checks the mode of later calls (the key has grad mode only)."""
    note_state_read("torch.is_inference_mode_enabled()", torch.is_inference_mode_enabled)
    return torch.is_inference_mode_enabled()


@lookaside(round)
def round_(number: Any, ndigits: Any = None) -> Any:
    """round(); a TensorProxy fails like a tensor does (Tensor has no __round__). A symbolic number (no __round__
    either) is rounded as its value, guarded as `float()` and `int()` guard it, but for round(n) of an int: n."""
    if isinstance(number, TensorProxy):
        raise TypeError("type Tensor doesn't define __round__ method")
    if isinstance(number, NumberProxy):
        if number.python_type is int and ndigits is None:
            return number
        number = float(number) if number.python_type is float else int(number)
    return round(number) if ndigits is None else round(number, ndigits)


@lookaside(float)
def float_(*args: Any) -> Any:
    """float(); of a one-element TensorProxy, a number the trace computes when it runs (as Tensor.item()); of a
    symbolic number, one the trace computes (`number_function`)."""
    if len(args) == 1 and isinstance(args[0], TensorProxy):
        x = args[0]
        if not x.dtype.is_floating_point:
            x = prims.convert_element_type(x, torch.float64)
        return aten_prims.item(x)
    return number_function("float", float, args)


@lookaside(int)
def int_(*args: Any, **kwargs: Any) -> Any:
    """int(); of a symbolic number, one the trace computes (`number_function`)."""
    return number_function("int", int, args) if not kwargs else int(*args, **kwargs)


def number_function(op: str, native: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`native(*args)` (`int`, `float`, `math.cos`, ...): where an argument is a symbolic number, the number prim
    `prims.num_<op>` (`num_math_cos`), so that the trace computes it with each call's value rather than rely on this
    one's (an lr schedule's `math.cos(math.pi * epoch / T)` would trace once per epoch). A conversion that changes nothing
    (`int(n)` of an int, `math.floor(n)`) is the number itself."""
    symbolic = [a for a in args if isinstance(a, NumberProxy) and not a.read]
    if not symbolic or not all(isinstance(a, int | float | NumberProxy) and type(a) is not bool for a in args):
        return native(*args)
    native(*[number_value(a) for a in args])  # eager's error for this call's values (`math.sqrt(-1)`), if any
    if len(args) == 1 and args[0].python_type is (float if op == "float" else int) and op in _SAME_FOR_ITS_TYPE:
        return args[0]
    return prims.NUMBER_PRIMS[op](*args)


# Conversions that give back a number of the type they convert to.
_SAME_FOR_ITS_TYPE = frozenset({"int", "float", "math_floor", "math_ceil", "math_trunc"})


def _math_function(name: str) -> Callable[..., Any]:
    native = getattr(math, name)

    def function(*args: Any) -> Any:
        return number_function(f"math_{name}", native, args)

    function.__doc__ = f"math.{name}; of a symbolic number, one the trace computes (`number_function`)."
    return function


for _name in prims.MATH_FUNCTIONS:
    LOOKASIDES[getattr(math, _name)] = _math_function(_name)


def _text_of(native: Callable[..., Any]) -> Callable[..., Any]:
    def text(*args: Any, **kwargs: Any) -> Any:
        with user_text():
            return native(*args, **kwargs)

    text.__doc__ = f"{native.__qualname__}, natively, as text the traced code makes (`user_text`: sizes as values)."
    return text


for _native_text in (ascii, format, str.format, str.__mod__):  # (repr and str: `_dunder_lookaside`)
    LOOKASIDES[_native_text] = _text_of(_native_text)


def eager_class(obj: Any) -> type:
    """The class eager code sees for `obj`: torch.Tensor for a TensorProxy, the Python type of a NumberProxy
    (`singledispatch`, `type(n) is int` and `n.__class__` dispatch on it), else its own."""
    if isinstance(obj, TensorProxy):
        return torch.Tensor
    if isinstance(obj, NumberProxy):
        return obj.python_type
    return type(obj)


@lookaside(type)
def type_(*args: Any, **kwargs: Any) -> Any:
    """type(x) as eager code sees it (`eager_class`); otherwise the builtin."""
    if len(args) == 1 and not kwargs:
        return eager_class(args[0])
    return type(*args, **kwargs)


@lookaside(super)
def super_(*args: Any) -> super:
    """Zero-argument super() reads `__class__` and the first argument from the interpreted frame."""
    if args:
        return super(*args)
    frame = current_frame()
    code = frame.code if frame is not None else None
    if code is None or (code.co_argcount == 0 and not code.co_flags & 0x04):
        raise RuntimeError("super(): no arguments")
    first = frame.localsplus[0]
    if isinstance(first, types.CellType) and code.co_varnames[0] in code.co_cellvars:
        first = first.cell_contents
    if first is NULL:
        raise RuntimeError("super(): arg[0] deleted")
    if "__class__" not in code.co_freevars:
        raise RuntimeError("super(): __class__ cell not found")
    index = frame.info.names.index("__class__", len(frame.info.names) - len(code.co_freevars))
    try:
        cls = frame.localsplus[index].cell_contents
    except ValueError:
        raise RuntimeError("super(): empty __class__ cell") from None
    return super(cls, first)


@lookaside(object.__setattr__)
def object_setattr(obj: Any, name: str, value: Any, /) -> None:
    """object.__setattr__ (how a Python `__setattr__` ends): on an object from outside the call, an effect."""
    if current_state().outside.is_root(obj) and current_trace() is not None:
        current_state().outside.write_attribute(obj, name, value, native=object.__setattr__)
    object.__setattr__(obj, name, value)


@lookaside(object.__delattr__)
def object_delattr(obj: Any, name: str, /) -> None:
    """object.__delattr__: on an object from outside the call, an effect."""
    if current_state().outside.is_root(obj) and current_trace() is not None:
        current_state().outside.write_attribute(obj, name, None, delete=True, native=object.__delattr__)
    object.__delattr__(obj, name)


@lookaside(print)
def print_(*args: Any, **kwargs: Any) -> None:
    """print: while tracing, an effect replayed by every call, with that call's tensors."""
    if current_trace() is None:
        print(*args, **kwargs)
    else:
        current_state().outside.call_function(print, args, kwargs)


@lookaside(globals)
def globals_() -> dict[str, Any]:
    """globals() of the interpreted frame."""
    frame = current_frame()
    return frame.globals if frame is not None else globals()


@lookaside(locals)
def locals_() -> Any:
    """locals() of the interpreted frame (a snapshot dict, or the class body's namespace)."""
    frame = current_frame()
    if frame is None:
        return {}
    if frame.locals is not None:
        return frame.locals
    out = {}
    n_free = len(frame.code.co_freevars)
    cells = set(frame.code.co_cellvars)
    for i, name in enumerate(frame.info.names):
        value = frame.localsplus[i]
        if value is NULL:
            continue
        if name in cells or i >= len(frame.info.names) - n_free:
            if not isinstance(value, types.CellType):
                out[name] = value
                continue
            try:
                value = value.cell_contents
            except ValueError:
                continue
        out[name] = value
    return out


@lookaside(vars)
def vars_(*args: Any) -> Any:
    """vars(); with no argument, the interpreted frame's locals; of an outside object, its guarded `__dict__`."""
    if not args:
        return locals_()
    namespace = vars(*args)
    if current_state().outside.is_root(args[0]):
        current_state().outside.add_root(namespace, current_state().outside.label_of(args[0]))
    return namespace


@lookaside(dir)
def dir_(*args: Any) -> list[str]:
    """dir(); with no argument, the names of the interpreted frame's locals."""
    return dir(*args) if args else sorted(locals_())


@lookaside(sys.exc_info)
def exc_info() -> tuple[Any, Any, Any]:
    """sys.exc_info() as seen by the interpreted code."""
    exc = current_state().handled
    return (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)


@lookaside(sys.exception)
def exception() -> BaseException | None:
    """sys.exception() as seen by the interpreted code."""
    return current_state().handled


def _dynamic(native: Callable[..., Any]) -> Callable[..., Any]:
    def run(source: Any, globals: Any = None, locals: Any = None, /) -> Any:  # noqa: A002
        if globals is None:
            frame = current_frame()
            if frame is not None:
                globals = frame.globals  # noqa: A001
                locals = locals_() if locals is None else locals  # noqa: A001
        return native(source, globals, locals)

    run.__doc__ = f"{native.__name__} in the interpreted frame's namespaces (the code itself runs natively)."
    return run


LOOKASIDES[eval] = _dynamic(eval)
LOOKASIDES[exec] = _dynamic(exec)


# -- torch's own machinery, as seen by torch's Python code running on proxies ---------------------------

# torch.overrides.has_torch_function: eager's answer for real objects; proxies (plain tensors) have no override.
LOOKASIDES[torch.overrides.has_torch_function] = has_override
LOOKASIDES[torch.overrides.has_torch_function_unary] = lambda a: has_override((a,))
LOOKASIDES[torch.overrides.has_torch_function_variadic] = lambda *args: has_override(args)


def _compiling(*args: Any, **kwargs: Any) -> bool:
    """True while minijit traces, as under torch.compile: libraries skip their data-dependent checks."""
    return current_trace() is not None


def _not_dynamo(*args: Any, **kwargs: Any) -> bool:
    """minijit is not Dynamo: code specific to Dynamo's tracing stays off."""
    return False


LOOKASIDES[torch.compiler.is_compiling] = _compiling
LOOKASIDES[torch.compiler.is_dynamo_compiling] = _not_dynamo
LOOKASIDES[torch._utils.is_compiling] = _compiling


def add_dynamo_lookasides() -> None:
    """Look aside `torch._dynamo.is_compiling` once something has imported torch._dynamo.

    minijit does not import it itself (about 0.9 s of a fresh process); code can call it
    only after importing it, so checking before each capture is enough.
    """
    dynamo = sys.modules.get("torch._dynamo")
    is_compiling = getattr(dynamo, "is_compiling", None)
    if is_compiling is not None and is_compiling not in LOOKASIDES:
        LOOKASIDES[is_compiling] = _compiling


@lookaside(torch.clear_autocast_cache)
def clear_autocast_cache() -> None:
    """torch.clear_autocast_cache (leaving the outermost autocast), also for the casts the trace shares."""
    clear_cast_cache()
    torch.clear_autocast_cache()


__all__ = ["LOOKASIDES", "lookaside"]
