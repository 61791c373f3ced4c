"""Lookasides: replacements for builtins whose native behaviour would be wrong for interpreted code.

A builtin runs in C and sees the interpreter's own frames and the proxies' real
types. The functions here give interpreted code what native code would see:
`super()` finds `__class__` in the interpreted frame, `isinstance(t, torch.Tensor)`
is True for a TensorProxy, `map(f, xs)` interprets `f`, `class` statements run their
bodies through the interpreter.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import math
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.utils.checkpoint
from torch.optim.optimizer import _get_value as _optimizer_get_value
from torch.optim.optimizer import _stack_if_compiling as _optimizer_stack_if_compiling

from minijit.errors import MetaError, UnsupportedSyntaxError, as_eager
from minijit.frontend.code import code_info
from minijit.frontend.frame import NULL, Frame, current_frame, current_state
from minijit.frontend.torch_function import has_override
from minijit.ir import NumberProxy, TensorProxy, current_trace
from minijit.ir.context import note_state_read, where_now
from minijit.ir.proxies import number_value, user_text
from minijit.ops import aten_prims, prims
from minijit.ops.autocast import clear_cast_cache
from minijit.ops.utils import broadcast_shapes

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


def _call(fn: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    from minijit.frontend.calls import call

    return call(fn, args, kwargs)


def _iterable(obj: Any) -> Any:
    from minijit.frontend.opcodes.build import interpreted_iterable

    return interpreted_iterable(obj)


def interpreted(fn: Any) -> Any:
    """`fn` wrapped so that native code calling it runs it through the interpreter."""
    if fn is None or (type(fn) in (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)
                      and not _is_torch_builtin(fn)):
        return fn

    def run(*args: Any, **kwargs: Any) -> Any:
        return _call(fn, args, kwargs)

    return run


def _is_torch_builtin(fn: Any) -> bool:
    """A torch function or Tensor method written in C (`torch.add`, `torch.Tensor.mul`): recorded when native code
    calls it (`functools.reduce(torch.add, xs)`), so it may be given proxies."""
    objclass = getattr(fn, "__objclass__", None)
    if isinstance(objclass, type):
        return issubclass(objclass, torch._C.TensorBase)
    module = getattr(fn, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


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


@lookaside(torch.Size)
def size_(*args: Any) -> Any:
    """torch.Size(sizes); with symbolic sizes among them, a tuple, as `x.shape` is where a size is symbolic (Dynamo's
    graphs build sizes so: `torch.Size([s0, s1, 48])`)."""
    if len(args) != 1:
        return torch.Size(*args)
    sizes = tuple(_iterable(args[0]))  # (read once: it may be a generator)
    if any(isinstance(d, NumberProxy) and d.python_type is int for d in sizes):
        torch.Size(number_value(d) if isinstance(d, NumberProxy) else d for d in sizes)  # eager's errors
        return sizes
    return torch.Size(sizes)


@lookaside(torch.broadcast_shapes)
def broadcast_shapes_(*shapes: Any) -> Any:
    """torch.broadcast_shapes; of shapes with symbolic sizes, broadcast as an op's operands are (each outcome
    guarded), where torch's own (run on the proxies) took them for a factory's sizes and raised. A mismatch is
    eager's RuntimeError (a MetaError typed so)."""
    given = [tuple(_iterable(s)) if not isinstance(s, int | NumberProxy) else (s,) for s in shapes]
    if not any(isinstance(d, NumberProxy) for shape in given for d in shape):
        return torch.broadcast_shapes(*shapes)
    try:
        return size_(broadcast_shapes(*given))
    except MetaError as error:
        raise as_eager(error, RuntimeError) from None


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


@lookaside(map)
def map_(fn: Any, *iterables: Any) -> map:
    """map, with a Python `fn` interpreted."""
    return map(interpreted(fn), *[_iterable(it) for it in iterables])


@lookaside(filter)
def filter_(fn: Any, iterable: Any) -> filter:
    """filter, with a Python predicate interpreted."""
    return filter(interpreted(fn), _iterable(iterable))


@lookaside(sorted)
def sorted_(iterable: Any, /, *, key: Any = None, reverse: bool = False) -> list[Any]:
    """sorted, with a Python key function interpreted."""
    return sorted(_iterable(iterable), key=interpreted(key), reverse=reverse)


@lookaside(list.sort)
def list_sort(self: list[Any], /, *, key: Any = None, reverse: bool = False) -> None:
    """list.sort, with a Python key function interpreted."""
    self.sort(key=interpreted(key), reverse=reverse)


def _min_max(native: Callable[..., Any]) -> Callable[..., Any]:
    def min_max(*args: Any, **kwargs: Any) -> Any:
        if "key" in kwargs:
            kwargs["key"] = interpreted(kwargs["key"])
        if len(args) == 1:
            args = (_iterable(args[0]),)
        return native(*args, **kwargs)

    min_max.__doc__ = f"{native.__name__}, with a Python key function interpreted."
    return min_max


LOOKASIDES[min] = _min_max(min)
LOOKASIDES[max] = _min_max(max)


@lookaside(functools.reduce)
def reduce_(fn: Any, *args: Any) -> Any:
    """functools.reduce, with a Python function interpreted."""
    return functools.reduce(interpreted(fn), _iterable(args[0]) if args else (), *args[1:])


@lookaside(iter)
def iter_(obj: Any, *sentinel: Any) -> Any:
    """iter, running a Python `__iter__` through the interpreter."""
    if sentinel:
        return iter(interpreted(obj), *sentinel)
    from minijit.frontend.opcodes.protocols import get_iter

    return get_iter(obj)


@lookaside(next)
def next_(it: Any, *default: Any) -> Any:
    """next, running a Python `__next__` through the interpreter."""
    from minijit.frontend.opcodes.protocols import next_item

    if not default:
        return next_item(it)
    try:
        return next_item(it)
    except StopIteration:
        return default[0]


@lookaside(builtins.__build_class__)
def build_class(func: types.FunctionType, name: str, *bases: Any, **kwds: Any) -> type:
    """The `class` statement: prepare the namespace, interpret the body, call the metaclass."""
    from minijit.frontend.interpreter import run_new_frame

    if not isinstance(func, types.FunctionType):
        raise TypeError("__build_class__: func must be a function")
    orig_bases = bases
    bases = types.resolve_bases(bases)
    meta, ns, kwds = types.prepare_class(name, bases, kwds)
    if bases is not orig_bases and bases != orig_bases:
        ns["__orig_bases__"] = orig_bases
    info = code_info(func.__code__)
    localsplus = [NULL] * info.n_localsplus
    builtins_ns = func.__builtins__ if isinstance(func.__builtins__, dict) else func.__builtins__.__dict__
    frame = Frame(info, func, localsplus, func.__globals__, builtins_ns, ns)
    cell = run_new_frame(frame)
    cls = _call(meta, (name, bases, ns), kwds)
    if isinstance(cell, types.CellType) and isinstance(cls, type):
        if cell.cell_contents is not cls:
            raise TypeError(f"__class__ set to {cell.cell_contents!r} defining {name!r} as {cls!r}")
    return cls


def _protocols() -> Any:
    from minijit.frontend.opcodes import protocols

    return protocols


@lookaside(len)
def len_(obj: Any, /) -> int:
    """len, running a Python `__len__` through the interpreter."""
    return _protocols().length(obj)


@lookaside(bool)
def bool_(*args: Any) -> bool:
    """bool, running a Python `__bool__`/`__len__` through the interpreter."""
    return _protocols().truth(args[0]) if len(args) == 1 else bool(*args)


@lookaside(getattr)
def getattr_(obj: Any, name: str, *default: Any) -> Any:
    """getattr, with Python properties and `__getattr__` interpreted (and guarded like `obj.name`)."""
    if type(name) is not str:
        return getattr(obj, name, *default)
    from minijit.frontend.opcodes.names import attribute

    try:
        return attribute(current_frame(), obj, name)
    except AttributeError:
        if default:
            return default[0]
        raise


@lookaside(hasattr)
def hasattr_(obj: Any, name: str, /) -> bool:
    """hasattr, through the same lookup as getattr."""
    try:
        getattr_(obj, name)
    except AttributeError:
        return False
    return True


@lookaside(setattr)
def setattr_(obj: Any, name: str, value: Any, /) -> None:
    """setattr, with Python property setters and `__setattr__` interpreted."""
    if type(name) is not str:
        setattr(obj, name, value)
    else:
        _protocols().store_attr(obj, name, value)


@lookaside(delattr)
def delattr_(obj: Any, name: str, /) -> None:
    """delattr, with a Python `__delattr__` interpreted."""
    _protocols().delete_attribute(obj, name)


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


def _dunder_lookaside(native: Any, dunder: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with user_text() if native in (str, repr) else contextlib.nullcontext():
            if len(args) == 1 and not kwargs and dunder in _protocols().python_members(type(args[0])):
                result = _protocols().call_dunder(args[0], dunder)
                if native in (str, repr) and not isinstance(result, str):
                    raise TypeError(f"{dunder} returned non-string (type {type(result).__name__})")
                return result
            return native(*args, **kwargs)

    run.__doc__ = f"{native.__name__}, running a Python `{dunder}` through the interpreter."
    return run


for _native, _dunder in ((repr, "__repr__"), (str, "__str__"), (hash, "__hash__"), (abs, "__abs__")):
    LOOKASIDES[_native] = _dunder_lookaside(_native, _dunder)


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


@lookaside(torch.utils.checkpoint.checkpoint)
def checkpoint(function: Any, *args: Any, use_reentrant: bool | None = None,
               context_fn: Any = torch.utils.checkpoint.noop_context_fn, determinism_check: str = "default",
               debug: bool = False, early_stop: bool = True, **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint: `function(*args, **kwargs)` traced in place, without recomputation.

    The values and gradients are eager's; the trace simply keeps what its backward needs
    instead of recomputing it. As in eager, the reentrant variant gives no gradient to
    anything inside `function` when no tensor argument requires grad.
    """
    kwargs.pop("preserve_rng_state", None)
    if context_fn is not torch.utils.checkpoint.noop_context_fn:
        raise UnsupportedSyntaxError(f"torch.utils.checkpoint.checkpoint with a context_fn{where_now()} is not "
                                     "supported by minijit; call it without context_fn")
    if use_reentrant is None or use_reentrant:
        if kwargs:  # eager's own checks of the reentrant variant
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if debug:
            raise ValueError("Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
        if torch.is_grad_enabled() and not any(isinstance(a, TensorProxy) and a.requires_grad for a in args):
            with torch.no_grad():
                return _call(function, args, {})
    return _call(function, args, kwargs)


def _graph_module_code(body: Any) -> Any:
    """What to interpret for a subgraph of a Dynamo graph: a GraphModule's generated forward, generated now if
    torch.fx has put that off (its lazy forward, and `GraphModule.__call__`, are torch.fx code run natively)."""
    if isinstance(body, torch.fx.GraphModule):
        needs_recompile = getattr(body, "_needs_recompile", None)
        if needs_recompile is not None and needs_recompile():
            body.real_recompile()
        return body.forward
    return body


def _higher_order_op(name: str) -> Any:
    return getattr(torch.ops.higher_order, name, None) if hasattr(torch.ops, "higher_order") else None


def tag_activation_checkpoint(body: Any, *args: Any, **kwargs: Any) -> Any:
    """torch.ops.higher_order.tag_activation_checkpoint (checkpoint in a Dynamo graph): as `checkpoint`."""
    return checkpoint(_graph_module_code(body), *args, **kwargs)


def wrap(body: Any, *args: Any, **kwargs: Any) -> Any:
    """torch.ops.higher_order.wrap (a function Dynamo kept as a subgraph): the subgraph, traced in place."""
    return _call(_graph_module_code(body), args, kwargs)


for _name, _lookaside in (("tag_activation_checkpoint", tag_activation_checkpoint), ("wrap", wrap)):
    if (_op := _higher_order_op(_name)) is not None:
        LOOKASIDES[_op] = _lookaside


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


def _numbers_stay_tensors() -> bool:
    """Whether torch.optim's step counts stay 0-dim tensors, as under torch.compile: in a trace replayed from CUDA
    graphs, whose replays repeat the numbers they were captured with, or fused by an executor that asks for it."""
    trace = current_trace()
    return trace is not None and trace.capture is not None and trace.capture.numbers_stay_tensors


@lookaside(_optimizer_get_value)
def optimizer_step_value(x: Any) -> Any:
    """torch.optim's `_get_value(step)` as eager computes it: the step count read as a Python number.

    Under torch.compile it stays a 0-dim tensor, and Adam's bias corrections become eight tiny tensor ops per
    parameter. minijit reads it (`Tensor.item()`, a number the trace computes, never a guard): the corrections
    are then number ops, and equal eager's to the bit, as eager computes them in float64.
    """
    if _numbers_stay_tensors():
        return x
    # A foreach optimizer's step list holds the state's real tensors (read from outside the call, proxied only when
    # an op takes them): their `item()` is recorded on their proxies too (native_tensors.run_native), not run here.
    return x.item() if isinstance(x, TensorProxy | torch.Tensor) and x.ndim == 0 else x


@lookaside(_optimizer_stack_if_compiling)
def optimizer_number_list(x: Any) -> Any:
    """torch.optim's `_stack_if_compiling(values)`: the numbers `_get_value` gave, as a list as eager keeps them;
    stacked into one tensor where they stayed tensors."""
    if _numbers_stay_tensors():
        return _call(torch.stack, (x,), {})
    return x


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


__all__ = ["LOOKASIDES", "interpreted", "lookaside"]


@lookaside(torch.func.functional_call, torch.nn.utils.stateless.functional_call)
def functional_call(module: torch.nn.Module, parameter_and_buffer_dicts: Any, args: Any = None,
                    kwargs: dict[str, Any] | None = None, *, tie_weights: bool = True, strict: bool = False) -> Any:
    """torch.func.functional_call: `module` called with the given tensors in place of its parameters and buffers.

    Nothing is swapped into the module (torch's own implementation writes into it, which other threads would
    see): the given tensors stand in for the module's own wherever traced code reads those (`Outside.seen`, as a
    jitted module's parameters are served). Stand-ins go by the tensor, so tied weights take the value given for
    either name, as with `tie_weights=True`."""
    dicts = parameter_and_buffer_dicts if isinstance(parameter_and_buffer_dicts, list | tuple) \
        else [parameter_and_buffer_dicts]
    given: dict[str, Any] = {}
    for d in dicts:
        for name, value in d.items():
            if name in given:
                raise ValueError(f"{name} appeared in multiple dictionaries; behavior of functional call is ambiguous")
            given[name] = value
    own = {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}
    if strict and set(given) != set(own):
        missing, unexpected = sorted(set(own) - set(given)), sorted(set(given) - set(own))
        raise RuntimeError(f"Error(s) in reparametrizing for {type(module).__name__}: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
    unknown = [name for name in given if name not in own]
    if unknown or not tie_weights:
        what = f"names that are not parameters or buffers of the module ({', '.join(unknown)})" if unknown \
            else "tie_weights=False"
        raise UnsupportedSyntaxError(f"torch.func.functional_call with {what}{where_now()} is not supported by "
                                     "minijit; call it outside the jitted function")
    outside = current_state().outside
    before: dict[int, Any] = {}
    for name, value in given.items():
        real = own[name]
        before.setdefault(id(real), outside.stand_ins.get(id(real)))
        outside.stand_ins[id(real)] = (real, value)
    try:
        call_args = () if args is None else args if isinstance(args, tuple) else (args,)
        return _call(module, call_args, kwargs or {})
    finally:
        for key, old in before.items():
            if old is None:
                del outside.stand_ins[key]
            else:
                outside.stand_ins[key] = old
