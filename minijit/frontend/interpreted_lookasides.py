"""Lookasides that run Python code through the interpreter: builtins taking functions, iterables or objects
whose Python methods eager would call (`map(f, xs)` interprets `f`, `len(x)` a Python `__len__`, `class`
statements their bodies, `checkpoint(f, ...)` and `functional_call` their callables).

They call back into the interpreter (`minijit.frontend.calls.call`, the opcode handlers' protocols), so they
live apart from the table they join (`minijit.frontend.lookasides`), which the interpreter itself imports.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.utils.checkpoint
from torch.optim.optimizer import _get_value as _optimizer_get_value
from torch.optim.optimizer import _stack_if_compiling as _optimizer_stack_if_compiling

from minijit.errors import MetaError, UnsupportedSyntaxError, as_eager
from minijit.frontend.calls import call
from minijit.frontend.code import code_info
from minijit.frontend.frame import NULL, Frame, current_frame, current_state
from minijit.frontend.interpreter import run_new_frame
from minijit.frontend.lookasides import LOOKASIDES, lookaside
from minijit.frontend.opcodes import protocols
from minijit.frontend.opcodes.build import interpreted_iterable
from minijit.frontend.opcodes.names import attribute
from minijit.frontend.opcodes.protocols import get_iter, next_item
from minijit.ir import NumberProxy, TensorProxy, current_trace
from minijit.ir.context import where_now
from minijit.ir.proxies import number_value, user_text
from minijit.ops.utils import broadcast_shapes


def interpreted(fn: Any) -> Any:
    """`fn` wrapped so that native code calling it runs it through the interpreter."""
    if fn is None or (type(fn) in (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)
                      and not _is_torch_builtin(fn)):
        return fn

    def run(*args: Any, **kwargs: Any) -> Any:
        return call(fn, args, kwargs)

    return run


def _is_torch_builtin(fn: Any) -> bool:
    """A torch function or Tensor method written in C (`torch.add`, `torch.Tensor.mul`): recorded when native code
    calls it (`functools.reduce(torch.add, xs)`), so it may be given proxies."""
    objclass = getattr(fn, "__objclass__", None)
    if isinstance(objclass, type):
        return issubclass(objclass, torch._C.TensorBase)
    module = getattr(fn, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


@lookaside(torch.Size)
def size_(*args: Any) -> Any:
    """torch.Size(sizes); with symbolic sizes among them, a tuple, as `x.shape` is where a size is symbolic (Dynamo's
    graphs build sizes so: `torch.Size([s0, s1, 48])`)."""
    if len(args) != 1:
        return torch.Size(*args)
    sizes = tuple(interpreted_iterable(args[0]))  # (read once: it may be a generator)
    if any(isinstance(d, NumberProxy) and d.python_type is int for d in sizes):
        torch.Size(number_value(d) if isinstance(d, NumberProxy) else d for d in sizes)  # eager's errors
        return sizes
    return torch.Size(sizes)


@lookaside(torch.broadcast_shapes)
def broadcast_shapes_(*shapes: Any) -> Any:
    """torch.broadcast_shapes; of shapes with symbolic sizes, broadcast as an op's operands are (each outcome
    guarded), where torch's own (run on the proxies) took them for a factory's sizes and raised. A mismatch is
    eager's RuntimeError (a MetaError typed so)."""
    given = [tuple(interpreted_iterable(s)) if not isinstance(s, int | NumberProxy) else (s,) for s in shapes]
    if not any(isinstance(d, NumberProxy) for shape in given for d in shape):
        return torch.broadcast_shapes(*shapes)
    try:
        return size_(broadcast_shapes(*given))
    except MetaError as error:
        raise as_eager(error, RuntimeError) from None


@lookaside(map)
def map_(fn: Any, *iterables: Any) -> map:
    """map, with a Python `fn` interpreted."""
    return map(interpreted(fn), *[interpreted_iterable(it) for it in iterables])


@lookaside(filter)
def filter_(fn: Any, iterable: Any) -> filter:
    """filter, with a Python predicate interpreted."""
    return filter(interpreted(fn), interpreted_iterable(iterable))


@lookaside(sorted)
def sorted_(iterable: Any, /, *, key: Any = None, reverse: bool = False) -> list[Any]:
    """sorted, with a Python key function interpreted."""
    return sorted(interpreted_iterable(iterable), key=interpreted(key), reverse=reverse)


@lookaside(list.sort)
def list_sort(self: list[Any], /, *, key: Any = None, reverse: bool = False) -> None:
    """list.sort, with a Python key function interpreted."""
    self.sort(key=interpreted(key), reverse=reverse)


def _min_max(native: Callable[..., Any]) -> Callable[..., Any]:
    def min_max(*args: Any, **kwargs: Any) -> Any:
        if "key" in kwargs:
            kwargs["key"] = interpreted(kwargs["key"])
        if len(args) == 1:
            args = (interpreted_iterable(args[0]),)
        return native(*args, **kwargs)

    min_max.__doc__ = f"{native.__name__}, with a Python key function interpreted."
    return min_max


LOOKASIDES[min] = _min_max(min)
LOOKASIDES[max] = _min_max(max)


@lookaside(functools.reduce)
def reduce_(fn: Any, *args: Any) -> Any:
    """functools.reduce, with a Python function interpreted."""
    return functools.reduce(interpreted(fn), interpreted_iterable(args[0]) if args else (), *args[1:])


@lookaside(iter)
def iter_(obj: Any, *sentinel: Any) -> Any:
    """iter, running a Python `__iter__` through the interpreter."""
    if sentinel:
        return iter(interpreted(obj), *sentinel)
    return get_iter(obj)


@lookaside(next)
def next_(it: Any, *default: Any) -> Any:
    """next, running a Python `__next__` through the interpreter."""
    if not default:
        return next_item(it)
    try:
        return next_item(it)
    except StopIteration:
        return default[0]


@lookaside(builtins.__build_class__)
def build_class(func: types.FunctionType, name: str, *bases: Any, **kwds: Any) -> type:
    """The `class` statement: prepare the namespace, interpret the body, call the metaclass."""
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
    cls = call(meta, (name, bases, ns), kwds)
    if isinstance(cell, types.CellType) and isinstance(cls, type):
        if cell.cell_contents is not cls:
            raise TypeError(f"__class__ set to {cell.cell_contents!r} defining {name!r} as {cls!r}")
    return cls


@lookaside(len)
def len_(obj: Any, /) -> int:
    """len, running a Python `__len__` through the interpreter."""
    return protocols.length(obj)


@lookaside(bool)
def bool_(*args: Any) -> bool:
    """bool, running a Python `__bool__`/`__len__` through the interpreter."""
    return protocols.truth(args[0]) if len(args) == 1 else bool(*args)


@lookaside(getattr)
def getattr_(obj: Any, name: str, *default: Any) -> Any:
    """getattr, with Python properties and `__getattr__` interpreted (and guarded like `obj.name`)."""
    if type(name) is not str:
        return getattr(obj, name, *default)
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
        protocols.store_attr(obj, name, value)


@lookaside(delattr)
def delattr_(obj: Any, name: str, /) -> None:
    """delattr, with a Python `__delattr__` interpreted."""
    protocols.delete_attribute(obj, name)


def _dunder_lookaside(native: Any, dunder: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with user_text() if native in (str, repr) else contextlib.nullcontext():
            if len(args) == 1 and not kwargs and dunder in protocols.python_members(type(args[0])):
                result = protocols.call_dunder(args[0], dunder)
                if native in (str, repr) and not isinstance(result, str):
                    raise TypeError(f"{dunder} returned non-string (type {type(result).__name__})")
                return result
            return native(*args, **kwargs)

    run.__doc__ = f"{native.__name__}, running a Python `{dunder}` through the interpreter."
    return run


for _native, _dunder in ((repr, "__repr__"), (str, "__str__"), (hash, "__hash__"), (abs, "__abs__")):
    LOOKASIDES[_native] = _dunder_lookaside(_native, _dunder)


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
                return call(function, args, {})
    return call(function, args, kwargs)


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
    return call(_graph_module_code(body), args, kwargs)


for _name, _lookaside in (("tag_activation_checkpoint", tag_activation_checkpoint), ("wrap", wrap)):
    if (_op := _higher_order_op(_name)) is not None:
        LOOKASIDES[_op] = _lookaside


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
        return call(torch.stack, (x,), {})
    return x


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
        return call(module, call_args, kwargs or {})
    finally:
        for key, old in before.items():
            if old is None:
                del outside.stand_ins[key]
            else:
                outside.stand_ins[key] = old
