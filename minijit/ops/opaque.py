"""Opaque torch ops: a torch callable with no ltorch decomposition, recorded as one bound symbol.

The design, in the order a call meets it:

- **Resolution is torch's own.** The bound symbol is the torch callable the user
  called (`torch.xlogy`, `torch.Tensor.frac`, `torch.linalg.solve`,
  `torch.nn.functional.softmin`, `torch.ops.aten.foo.default`), with the user's
  arguments unchanged (Python numbers, lists of tensors, `dtype=`, `device=`,
  optional arguments) and printed as that call (`t1 = torch.xlogy(a, b)`); the
  torch executor runs it by calling it. Which ATen operators it reaches, and what
  they do, is found by running it (`minijit.ops.meta_run`): no table maps Python
  callables to ATen overloads, so an op minijit never heard of works as well as
  one it did.
- **Metadata and effects from torch's kernels and schemas.** The meta run gives
  each output's shape, dtype and requires_grad; the ATen schemas' alias annotations
  give the arguments it writes (in-place ops, `out=`) and the argument each output
  views; ATen tags say whether it is random. These become the symbol's `Effects`,
  so functionalization, copy placement and fusion treat it like any other op:
  a view is replayed on its base's new value and written back by element
  positions; an op that writes is recorded as a composite whose decomposition is
  its *functional form* (the same call on a copy of what it writes, returning the
  copy) followed by `prims.copy_`, exactly as ltorch's in-place ops are.
- **Data-dependent output sizes are computed by the trace.** An op whose result's shape depends on the
  values (`nonzero`, `unique`, `masked_select`, `x[mask]`) called by the user's code is run by the capture
  on the real values (minijit.runtime.values) and recorded (`shapes_seen_symbol`) with a size only the trace
  knows in place of each size that depends on them, bound by `prims.size` after it (minijit.ops.unbacked);
  where torch's fake kernel cannot follow those sizes, with the shapes it gave, each checked by the trace
  right after it on every call.
- **Refusals are clear.** Such an op where no value can be read (inside a traced
  `autograd.Function`, with `out=`), an op with no meta kernel, a result that is not made
  of tensors, or a call with no tensor result that writes nothing (its effect would
  be lost) is a `MinijitError` naming the op and the user's line. So are callables
  outside torch's op modules (`torch.save`, `torch.distributed.*`), which are never
  run at trace time.
- **Gradients are torch's.** The grad transform gives every opaque symbol one rule
  (minijit/transforms/vjp/opaque.py): the backward is one opaque symbol that runs
  `torch.autograd.grad` of the same call on the saved inputs, so gradients equal
  eager's.
- **ltorch first.** A torch callable with an ltorch symbol is recorded as that
  symbol (decomposed, fusible); where the ltorch decomposition declines a call
  (an argument form it does not support: `flip(dims=...)`, a tensor `narrow`
  start), the call becomes opaque instead, and the decomposition's error stands
  if the opaque call fails too. An ltorch `MetaError` (inputs eager rejects as
  well) is never retried opaquely (see `DECLINED`).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch._library.custom_ops import CustomOpDef

from minijit.errors import (
    DataDependentShapeError,
    DeviceError,
    InplaceError,
    MinijitError,
    TracesEagerBody,
    UnsupportedOpError,
    as_eager,
)
from minijit.ir import Effects, Symbol, Tag, TensorProxy, current_trace, tree_flatten, tree_map
from minijit.ir.containers import sequence_leaves
from minijit.ir.context import value_reader, where_now
from minijit.ir.proxies import TENSOR_METHOD_FALLBACKS, TENSOR_METHODS, rule_same_shape
from minijit.ops import prims
from minijit.ops.aliases import canonical, resolve
from minijit.ops.autocast import active_autocast, opaque_autocast_arguments
from minijit.ops.eager_errors import out_refusal, raised_for_any_values
from minijit.ops.eager_facts import write_facts
from minijit.ops.meta_run import READS_STORAGE, MetaResult, TensorMeta, map_leaves, named_tuple_for, run_on_meta
from minijit.ops.number_args import check_dtype, numbers_only, takes_tensor_first, with_tensor_input
from minijit.ops.registry import ltorch_symbol_for

_any_autocast = torch._C._is_any_autocast_enabled
OPAQUE = Tag.OPAQUE  # the tag of opaque symbols: the torch executor runs each by calling its `fn`
# The errors by which an ltorch decomposition declines a call that torch may still run: a form of the
# call it does not support (UnsupportedOpError) or an argument its signature lacks (TypeError). A
# MetaError stands: ltorch raises it for inputs eager rejects too (shapes, dtypes), and torch's meta
# kernels do not check everything its CPU kernels check, so an opaque call would fail only at run time.
DECLINED = (UnsupportedOpError, TypeError)

__all__ = ["NOT_OPS", "OPAQUE", "TENSOR_DUNDERS", "FunctionalForm", "UnderAutocast", "aten_name", "call_ltorch",
           "call_torch", "describe", "draws_random_numbers", "install_tensor_method_fallbacks", "is_opaque_candidate",
           "opaque_call", "printed_name", "unique_opaque_name"]


# -- entry points -------------------------------------------------------------------------------

def call_torch(fn: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """Record the torch callable `fn` called on proxies: as its ltorch symbol where it has one, else opaque."""
    if isinstance(fn, CustomOpDef):
        fn = fn._opoverload  # a `torch.library.custom_op`: the operator it registered
    sym = ltorch_symbol_for(fn)
    if sym is not None:
        return call_ltorch(fn, sym, args, kwargs)
    op = canonical(fn)
    if op is not fn:
        try:
            return opaque_call(op, tuple(args), kwargs)
        except MinijitError:  # an argument named differently (`torch.det(input=x)`, `torch.linalg.det(A)`)
            pass
    return opaque_call(fn, tuple(args), kwargs)


def call_ltorch(fn: Any, sym: Symbol, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """`sym(*args, **kwargs)`; where the ltorch decomposition declines the call, the torch callable `fn` as an opaque op.

    `out=` given to an op whose decomposition has no `out` is the decomposition's result copied
    into it, as eager writes its result into `out` and returns `out`.
    """
    if current_trace() is not None and numbers_only(args, kwargs) and takes_tensor_first(sym.meta):
        # torch.div(7, 2): eager makes a 0-dim tensor of the first number (minijit.ops.number_args).
        found = with_tensor_input(fn, args, kwargs)
        if found is not None:
            return check_dtype(f"torch.{getattr(fn, '__name__', sym.name)}", sym(*found[0], **kwargs), found[1])
    try:
        out = kwargs.get("out")
        if out is None or "out" in _parameters(sym):
            return sym(*args, **kwargs)
        return _into_out(fn, sym, args, kwargs, out)
    except DECLINED as declined:
        trace = current_trace()
        if trace is None or not is_opaque_candidate(fn) or isinstance(declined, TracesEagerBody):
            raise _as_eager_refusal(declined, fn, args, kwargs) from declined.__cause__
        try:
            result = opaque_call(fn, tuple(args), kwargs)
        except MinijitError:
            raise _as_eager_refusal(declined, fn, args, kwargs) from None
        # Why the decomposition was not used, for debugging and docs/ops.md.
        if trace.capture is not None:
            trace.capture.declined.append((sym.id, f"{type(declined).__name__}: {declined}"))
        return result


def _as_eager_refusal(declined: Exception, fn: Any, args: Any, kwargs: dict[str, Any]) -> Exception:
    """`declined`, minijit's refusal of a call, as eager's error type too where eager's CPU kernel raises for the
    same call on stand-ins whatever their values (`torch.arange(0, 1, 0, out=o)`: ValueError), so the user's `except`
    behaves the same (a refusal typed for an error eager would not raise would send the user's code to its handler)."""
    if not isinstance(declined, UnsupportedOpError) or getattr(type(declined), "eager_type", None) is not None:
        return declined
    found = raised_for_any_values(fn, tuple(args), kwargs)
    if found is None:
        return declined
    typed = as_eager(declined, type(found))
    if typed is not declined:
        typed.__traceback__ = declined.__traceback__
    return typed


def _into_out(fn: Any, sym: Symbol, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], out: Any) -> Any:
    """`sym` without `out=`, its results copied into `out`: where eager refuses this `out` (of a dtype or shape torch
    callable `fn` will not take, or `fn` takes no `out=`), eager's error; declined where eager would resize it."""
    targets = out if isinstance(out, tuple | list) else (out,)
    if torch.is_grad_enabled() and any(isinstance(x, TensorProxy) and x.requires_grad
                                       for x in tree_flatten((args, kwargs))):
        raise InplaceError(f"{sym.id}{where_now()}: functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad (as in eager); call it without "
                           "out=, or under torch.no_grad()")
    plain = {k: v for k, v in kwargs.items() if k != "out"}
    refused = out_refusal(fn, tuple(args), plain, out)
    if refused is not None:  # eager refuses this out= (a dtype or shape it will not take, or no out= at all)
        raise refused
    result = sym(*args, **plain)
    results = result if isinstance(result, tuple | list) else (result,)
    if len(targets) != len(results):
        raise UnsupportedOpError(f"{sym.id} with {len(targets)} out= tensors for {len(results)} results{where_now()}")
    for target, value in zip(targets, results, strict=True):
        if target.device != value.device:
            raise DeviceError(f"{sym.id}: expected the out= tensor on {value.device}, the result's device, got "
                              f"{target.device}{where_now()}")
        if not rule_same_shape(tuple(target.shape), tuple(value.shape)) or target.device != value.device or not torch.can_cast(
                value.dtype, target.dtype):
            refused = out_refusal(fn, tuple(args), plain, out, shared=True)
            if refused is not None:  # eager refuses to resize an out= that is also an operand
                raise refused
            raise UnsupportedOpError(f"{sym.id} with out= {target.type_string()} for a result {value.type_string()}"
                                     f"{where_now()}: minijit does not resize out= tensors or cast into them")
    copy = TENSOR_METHODS["copy_"]
    trace = current_trace()
    user_call = trace is not None and trace.recording_user_call
    # A tensor from outside the call (an item of a global list) comes here as itself: its proxy is what the copy
    # writes and what the op read.
    capture = trace.capture_tensor if trace is not None else None
    as_proxy = (lambda x: capture(x) if isinstance(x, torch.Tensor) else x) if capture is not None else (lambda x: x)
    targets = tuple(as_proxy(t) for t in targets)
    operands = tuple(p for x in tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))
                     if isinstance(p := as_proxy(x), TensorProxy))
    for target, value in zip(targets, results, strict=True):
        copy(target, value)
        if user_call and trace.bound_symbols and trace.bound_symbols[-1].output is target:
            # Functionalization checks the out= tensor against what the op read (the copy reads a fresh value).
            trace.bound_symbols[-1].out_of = (sym, operands)
    return out


_PARAMETERS: dict[Symbol, frozenset[str]] = {}


def _parameters(sym: Symbol) -> frozenset[str]:
    """The parameter names of `sym`'s decomposition."""
    names = _PARAMETERS.get(sym)
    if names is None:
        try:
            names = frozenset(inspect.signature(sym.meta).parameters)
        except (TypeError, ValueError):
            names = frozenset({"out"})
        _PARAMETERS[sym] = names
    return names


def opaque_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Record `fn(*args, **kwargs)` (a torch callable, called on proxies) as one opaque bound symbol."""
    trace = current_trace()
    if trace is None:
        return fn(*args, **kwargs)
    what = describe(fn)
    if not is_opaque_candidate(fn):
        raise UnsupportedOpError(f"{what} was called with a traced tensor{where_now()}; it is not a torch op minijit "
                                 "can record (it may have effects outside the trace); call it outside the jitted "
                                 "function")
    if trace.capture_tensor is not None and any(isinstance(x, torch.Tensor) for x in tree_flatten((args, kwargs))):
        capture = trace.capture_tensor
        args, kwargs = tree_map(lambda x: capture(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
    try:
        result = run_on_meta(fn, args, kwargs, what)
    except DataDependentShapeError:
        # Its result's shape depends on the values: the capture runs it on the real values and the trace
        # checks the shapes seen (minijit.runtime.values), where the capture can read values here.
        reader = value_reader()
        out = reader.call_with_shapes_seen(fn, args, kwargs) if reader is not None else NotImplemented
        if out is NotImplemented:
            raise
        return out
    autocast = active_autocast(args, kwargs) if trace.recording_user_call and _any_autocast() else None
    if autocast is not None:
        # The trace runs with autocast off: the casts eager's autocast makes of the arguments are recorded
        # here, and the op runs under the same autocast state, as eager's kernels may cast inside.
        cast_args, cast_kwargs = opaque_autocast_arguments(what, aten_name(fn), result.ops, args, kwargs)
        if any(a is not b for a, b in zip(tree_flatten((cast_args, cast_kwargs)), tree_flatten((args, kwargs)),
                                           strict=True)):
            args, kwargs = tuple(cast_args), cast_kwargs
            result = run_on_meta(fn, args, kwargs, what)
        dtypes = tuple(m.dtype if isinstance(m, TensorMeta) else None for m in tree_flatten(result.outputs))
        fn = UnderAutocast.of(fn, *autocast, dtypes, f"{what}{where_now()}")
    leaves = tree_flatten((args, kwargs))
    tensors = [m for m in tree_flatten(result.outputs) if isinstance(m, TensorMeta)]
    if not result.written:
        if not tensors and result.outputs in ((), []):
            return result.outputs  # nothing at all (`torch.unravel_index(i, ())` gives `()`)
        if not tensors:
            raise UnsupportedOpError(f"{what}{where_now()} gives no tensor and writes into none, so whatever it does "
                                     "is outside the trace; call it outside the jitted function")
        if all(s is not None for s, m in zip(result.same_as, tree_flatten(result.outputs), strict=True)
               if isinstance(m, TensorMeta)):
            # It returns its arguments themselves (`x.contiguous()`): nothing to record.
            return _rebuild(result.outputs, iter(()), [leaves[s] if s is not None else None for s in result.same_as])
        return _plain_symbol(fn, result, _arg_refs(args, kwargs))(*args, **kwargs)
    return _inplace_symbol(fn, result, _arg_refs(args, kwargs))(*args, **kwargs)


class UnderAutocast:
    """`fn` run under the autocast state the user's code called it in (traces run with autocast off).

    Some kernels call other operators that autocast casts for (`aten::_cdist_forward` runs
    `matmul`), which a run on meta tensors does not see: the results must have the dtypes
    the trace recorded (`dtypes`, per output leaf), else the call is refused where it runs.
    """

    _MADE: dict[tuple[Any, ...], UnderAutocast] = {}

    def __init__(self, fn: Any, device_type: str, dtype: torch.dtype, dtypes: tuple[torch.dtype | None, ...],
                 what: str):
        self.fn, self.device_type, self.dtype, self.dtypes, self.what = fn, device_type, dtype, dtypes, what
        self.__name__ = self.__qualname__ = f"{getattr(fn, '__name__', 'op')}_under_autocast"
        self.__module__ = getattr(fn, "__module__", None)

    @classmethod
    def of(cls, fn: Any, device_type: str, dtype: torch.dtype, dtypes: tuple[torch.dtype | None, ...],
           what: str) -> UnderAutocast:
        """The one wrapper of `fn` for this state, results and call site (symbols are cached by their callable)."""
        key = (fn, device_type, dtype, dtypes, what)
        made = cls._MADE.get(key)
        if made is None:
            made = cls._MADE[key] = cls(fn, device_type, dtype, dtypes, what)
        return made

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.fn(*args, **kwargs)
        got = tuple(t.dtype if isinstance(t, torch.Tensor) else None for t in sequence_leaves(out))
        if got != self.dtypes:
            raise UnsupportedOpError(
                f"{self.what} runs under torch.autocast({self.device_type!r}), where eager casts inside it: its results "
                f"are {got}, not {self.dtypes} as the trace recorded; cast the arguments yourself, or call it "
                "outside the autocast region")
        return out

    def __repr__(self) -> str:
        return f"<{describe(self.fn)} under torch.autocast({self.device_type!r}, {self.dtype})>"


def aten_name(fn: Any) -> str | None:
    """The ATen operator the torch callable `fn` stands for by its name (`aten::addbmm`), or None."""
    if isinstance(fn, torch._ops.OpOverload):
        return fn._schema.name
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return fn._qualified_op_name
    name = getattr(canonical(fn), "__name__", None)
    return f"aten::{name}" if isinstance(name, str) and not name.startswith("_") else None


def draws_random_numbers(fn: Any) -> bool:
    """Whether the torch callable `fn` is a random ATen operator (tagged `nondeterministic_seeded`), by its name.

    Such a call is recorded even when no traced tensor reaches it (`torch.randperm(n)`): run at
    trace time, its result would be frozen into the trace as a constant.
    """
    name = getattr(canonical(fn), "__name__", None)
    if not isinstance(name, str) or name.startswith("_"):
        return False
    found = _RANDOM_BY_NAME.get(name)
    if found is None:
        packet = getattr(torch.ops.aten, name, None)
        overloads = [getattr(packet, o) for o in packet.overloads()] if isinstance(packet, torch._ops.OpOverloadPacket) \
            else []
        found = _RANDOM_BY_NAME[name] = any(torch.Tag.nondeterministic_seeded in o.tags for o in overloads)
    return found


_RANDOM_BY_NAME: dict[str, bool] = {}


def is_opaque_candidate(fn: Any) -> bool:
    """Whether `fn` is a torch op minijit may run on meta tensors at trace time and record opaquely.

    C functions and Tensor methods of torch, ATen operators (`torch.ops.aten.*`), and the
    Python functions of torch's op modules; not torch's I/O, distributed, autograd-engine
    or compiler functions, whose effects reach outside the trace.
    """
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket | TensorProperty | CustomOpDef):
        return True
    objclass = getattr(fn, "__objclass__", None)
    if isinstance(objclass, type) and issubclass(objclass, torch._C.TensorBase):
        name = getattr(fn, "__name__", "_")
        return not name.startswith("_") or name in TENSOR_DUNDERS
    module = getattr(fn, "__module__", None)
    if module is None and isinstance(getattr(fn, "__self__", None), types.ModuleType):
        module = fn.__self__.__name__
    if not isinstance(module, str):
        return False
    if type(fn) is types.BuiltinFunctionType:
        return module == "torch" or module.startswith("torch._C")
    return any(module == m or module.startswith(m + ".") for m in _OP_MODULES)


# Python modules of torch whose functions are ops on tensors (run on meta tensors without harm).
_OP_MODULES = ("torch.functional", "torch._tensor", "torch.nn.functional", "torch.linalg", "torch.fft",
               "torch.special", "torch.nn.init", "torch.masked", "torch.signal", "torch._refs", "torch._decomp",
               "torch._prims_common", "torch._lowrank", "torch.testing._internal")
# The operator methods of Tensor (`x + y`, `2 ** x`, `x[i] = v`): ops like any other.
TENSOR_DUNDERS = {f"__{prefix}{op}__" for op in ("add", "sub", "mul", "div", "truediv", "floordiv", "mod", "pow",
                                                   "matmul", "and", "or", "xor", "lshift", "rshift")
                   for prefix in ("", "r", "i")} | {
    f"__{op}__" for op in ("neg", "pos", "abs", "invert", "lt", "le", "gt", "ge", "eq", "ne", "getitem", "setitem")}


# -- proxy methods that ltorch does not have ------------------------------------------------------

# Tensor methods whose result is not a function of the tensor's values, or that act on autograd,
# memory, devices or other layouts (sparse, quantized, MKL-DNN) rather than compute: never opaque
# ops (a proxy refuses them with an UnsupportedMethodError).
NOT_OPS = {
    "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "numpy", "data_ptr",
    "const_data_ptr", "storage", "untyped_storage", "storage_type", "share_memory_", "pin_memory", "record_stream",
    "is_shared", "is_pinned", "dim_order", "element_size", "get_device",
    "is_set_to", "set_", "apply_", "map_", "map2_", "as_subclass", "new", "reinforce", "is_distributed",
    "is_inference", "cuda", "cpu", "ipu", "xpu", "mps", "mtia", "module_load", "resize", "resize_as",
    "resize_as_sparse_", "to_dense", "to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr",
    "to_sparse_bsc", "to_mkldnn", "to_padded_tensor", "coalesce", "is_coalesced", "sparse_dim", "dense_dim", "values",
    "indices", "crow_indices", "col_indices", "ccol_indices", "row_indices", "sparse_mask", "sparse_resize_",
    "sparse_resize_and_clear_", "smm", "sspaddmm", "int_repr", "dequantize", "q_scale", "q_zero_point",
    "q_per_channel_scales", "q_per_channel_zero_points", "q_per_channel_axis",
}


class TensorProperty:
    """`x.<name>` for a Tensor property that is a tensor (`x.H`, `x.real`): a callable for opaque calls."""

    tensor_property = True  # proxies call it on attribute access, as a property

    def __init__(self, name: str):
        self.name = name
        self.__name__ = self.__qualname__ = f"Tensor_{name}"

    def __call__(self, tensor: Any) -> Any:
        return getattr(tensor, self.name)

    def __repr__(self) -> str:
        return f"<Tensor.{self.name}>"


# Tensor properties whose value is a tensor computed from the tensor (views, for complex tensors).
_TENSOR_PROPERTIES = {name: TensorProperty(name) for name in ("H", "mH", "real", "imag")}


def _tensor_method(name: str) -> Callable[..., Any] | None:
    """`proxy.name(...)` as an opaque op on `torch.Tensor.name`, for Tensor methods with no ltorch symbol."""
    prop = _TENSOR_PROPERTIES.get(name)
    if prop is not None:
        def get(self: Any) -> Any:
            return opaque_call(prop, (self,), {})
        get.tensor_property = True  # type: ignore[attr-defined]
        return get
    if name.startswith("_") or name in NOT_OPS:
        return None
    method = canonical(getattr(torch.Tensor, name, None))
    if not callable(method) or isinstance(method, type) or not is_opaque_candidate(method):
        return None
    return lambda self, *args, **kwargs: opaque_call(method, (self, *args), kwargs)


_METHOD_NAMES = {"getitem": "__getitem__", "setitem": "__setitem__"}


def _with_fallback(impl: Callable[..., Any], name: str) -> Callable[..., Any]:
    method = getattr(torch.Tensor, _METHOD_NAMES.get(name, name), None)
    if not callable(method) or isinstance(method, property):
        return impl

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return impl(*args, **kwargs)
        except DECLINED as declined:
            if current_trace() is None:
                raise
            try:
                return opaque_call(method, args, kwargs)
            except MinijitError:
                raise declined from None

    call.__wrapped__ = impl  # type: ignore[attr-defined]
    return call


def install_tensor_method_fallbacks() -> None:
    """Make Tensor methods on proxies fall back to opaque ops: where ltorch has none, or declines a call."""
    for name, impl in list(TENSOR_METHODS.items()):
        if not hasattr(impl, "__wrapped__"):
            TENSOR_METHODS[name] = _with_fallback(impl, name)
    if _tensor_method not in TENSOR_METHOD_FALLBACKS:
        TENSOR_METHOD_FALLBACKS.append(_tensor_method)


# -- symbols --------------------------------------------------------------------------------------

_SYMBOLS: dict[Any, Symbol] = {}


def _arg_refs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int | str]:
    """For each leaf of tree_flatten((args, kwargs)), the argument it belongs to (a position or a keyword)."""
    refs: list[int | str] = []
    for i, a in enumerate(args):
        refs += [i] * len(tree_flatten(a))
    for k, v in kwargs.items():
        refs += [k] * len(tree_flatten(v))
    return refs


# `Effects.unread` of every torch call: its `out=` (the schema's keyword-only `out`), where given, is only
# written into, its value never read.
_UNREAD = ("out",)


def _plain_symbol(fn: Any, result: MetaResult, refs: list[int | str]) -> Symbol:
    """The symbol of a call that writes nothing: `fn` itself, with the views and randomness the meta run found."""
    views = tuple(refs[v] if v is not None else refs[s] if s is not None else None
                  for v, s in zip(result.views, result.same_as, strict=True))
    namespace, name = printed_name(fn)
    effects = Effects(views=views if any(v is not None for v in views) else None, random=result.random,
                      unread=_UNREAD, **write_facts(name))
    key = ("plain", fn, effects)
    sym = _SYMBOLS.get(key)
    if sym is None:
        what = describe(fn)

        def meta(*args: Any, **kwargs: Any) -> Any:
            return _rebuild(run_on_meta(fn, args, kwargs, what).outputs, iter(()))

        tags = frozenset({OPAQUE, Tag.READS_LAYOUT} if fn in READS_STORAGE else {OPAQUE})
        sym = _SYMBOLS[key] = Symbol(name, meta, namespace=namespace, is_prim=True, tags=tags, fn=fn, effects=effects)
    return sym


def _inplace_symbol(fn: Any, result: MetaResult, refs: list[int | str]) -> Symbol:
    """The symbol of a call that writes into arguments: a composite of its functional form and `prims.copy_`s."""
    namespace, name = printed_name(fn)
    effects = Effects(writes=tuple(dict.fromkeys(refs[i] for i in result.written)), random=result.random,
                      unread=_UNREAD, **write_facts(name))
    key = ("in place", fn, effects)
    sym = _SYMBOLS.get(key)
    if sym is None:
        what = describe(fn)

        def decomposition(*args: Any, **kwargs: Any) -> Any:
            res = run_on_meta(fn, args, kwargs, what)
            leaves = tree_flatten((args, kwargs))
            new = _functional_symbol(fn, res, _arg_refs(args, kwargs))(*args, **kwargs)
            for position, value in zip(res.written, new, strict=False):
                prims.copy_(value, leaves[position])
            fresh = iter(new[len(res.written):])
            return _rebuild(res.outputs, fresh, [leaves[s] if s in res.written else None for s in res.same_as])

        decomposition.__name__ = name
        sym = _SYMBOLS[key] = Symbol(name, decomposition, namespace=namespace, tags=frozenset({OPAQUE}), fn=fn,
                                     effects=effects)
    return sym


class FunctionalForm:
    """`fn` on copies of the tensors it writes, returning their new values, then its other tensor results.

    The functional form of an op that writes into its arguments (`x.frac_()`, `torch.add(a, b, out=c)`):
    functionalization records it, followed by one copy into each written tensor.
    """

    def __init__(self, fn: Any, written: tuple[int, ...], fresh: tuple[int, ...]):
        self.fn = fn
        self.written = written
        self.fresh = fresh

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        leaves = tree_flatten((args, kwargs))
        # Every occurrence of a written tensor (`torch.add(x, y, out=y)` has two) becomes its copy.
        clones = {id(leaves[i]): leaves[i].clone() for i in self.written}
        args, kwargs = tree_map(lambda x: clones.get(id(x), x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
        out = self.fn(*args, **kwargs)
        leaves = tree_flatten((args, kwargs))
        outs = sequence_leaves(out)
        return (*(leaves[i] for i in self.written), *(outs[i] for i in self.fresh))

    def __repr__(self) -> str:
        return f"<functional form of {describe(self.fn)}>"


def _functional_symbol(fn: Any, result: MetaResult, refs: list[int | str]) -> Symbol:
    written = set(result.written)
    out_leaves = tree_flatten(result.outputs)
    fresh = tuple(i for i, (m, s) in enumerate(zip(out_leaves, result.same_as, strict=True))
                  if isinstance(m, TensorMeta) and (s is None or s not in written))
    views = (None,) * len(result.written) + tuple(
        refs[result.views[i]] if result.views[i] is not None else
        refs[result.same_as[i]] if result.same_as[i] is not None else None for i in fresh)
    effects = Effects(views=views if any(v is not None for v in views) else None, random=result.random,
                      unread=_UNREAD)
    key = ("functional", fn, result.written, fresh, effects)
    sym = _SYMBOLS.get(key)
    if sym is None:
        form = FunctionalForm(fn, result.written, fresh)
        base = printed_name(fn)[1].replace(".", "_")
        name = unique_opaque_name(f"{base}_functional", form)
        what = describe(fn)

        def meta(*args: Any, **kwargs: Any) -> tuple[TensorProxy, ...]:
            res = run_on_meta(fn, args, kwargs, what)
            outs = tree_flatten(res.outputs)
            return tuple(_proxy(m) for m in (*res.written_meta, *(outs[i] for i in fresh)))

        sym = _SYMBOLS[key] = Symbol(name, meta, namespace="opaque", is_prim=True, tags=frozenset({OPAQUE}), fn=form,
                                     effects=effects)
    return sym


def _proxy(m: TensorMeta) -> TensorProxy:
    return TensorProxy(m.shape, m.dtype, m.device, m.requires_grad)


def _rebuild(outputs: Any, fresh: Any, given: list[Any] | None = None) -> Any:
    """`outputs` (TensorMeta leaves) as proxies: `given[i]` where set, else the next of `fresh`, else a new proxy."""
    def build(meta: TensorMeta | None, i: int) -> Any:
        if meta is None:
            return None
        if given is not None and given[i] is not None:
            return given[i]
        value = next(fresh, None)
        return value if value is not None else _proxy(meta)

    return map_leaves(outputs, build)


def views_seen(args: tuple[Any, ...], kwargs: dict[str, Any], real: tuple[tuple[Any, ...], dict[str, Any]],
               real_out: Any) -> tuple[int | str | None, ...] | None:
    """For each leaf of `real_out`, the result of an op run on the real values `real` of its arguments, the argument
    whose memory it shares (it views it, or is it), else None; None where no leaf does."""
    storages: dict[int, int | str] = {}
    for ref, x in zip(_arg_refs(args, kwargs), tree_flatten(real), strict=True):
        if isinstance(x, torch.Tensor):
            storages.setdefault(x.untyped_storage()._cdata, ref)
    views = tuple(storages.get(t.untyped_storage()._cdata) if isinstance(t, torch.Tensor) else None
                  for t in tree_flatten(real_out))
    return views if any(v is not None for v in views) else None


def shapes_seen_symbol(fn: Any, real_out: Any, shapes: list[tuple[Any, ...] | None] | None = None,
                       views: tuple[int | str | None, ...] | None = None) -> Symbol:
    """The opaque symbol of `fn`, an op whose result's shape depends on the values, giving `real_out`'s shapes,
    or `shapes` (per leaf of `real_out`, sizes only the trace knows among them: minijit.ops.unbacked).

    The capture ran it on the real values (`real_out`, which requires grad as eager's would); the trace checks
    the shapes seen on every call, or binds the sizes it does not know. `views`: the arguments its results view
    (`views_seen`: `torch.narrow` with a tensor start views its input), so that writes through them reach it.
    """
    given = iter(shapes) if shapes is not None else None

    def meta_of(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            shape = next(given) if given is not None else None
            return TensorMeta(tuple(x.shape) if shape is None else shape, x.dtype, x.device, x.requires_grad)
        if isinstance(x, tuple) and hasattr(type(x), "n_fields"):  # torch.return_types: as a named tuple
            return named_tuple_for(type(x))(*(meta_of(v) for v in x))
        if isinstance(x, list | tuple):
            return type(x)(meta_of(v) for v in x) if type(x) in (list, tuple) else type(x)(*(meta_of(v) for v in x))
        raise UnsupportedOpError(f"{describe(fn)}{where_now()} returns a {type(x).__name__}, not tensors; compute it "
                                 "with tensor ops, whose values the code may read (`if (a - b).abs().max() < tol:`)")

    outputs = meta_of(real_out)
    namespace, name = printed_name(fn)

    def meta(*args: Any, **kwargs: Any) -> Any:
        if views is None:
            return _rebuild(outputs, iter(()))

        def like_viewed(leaf: TensorMeta | None, i: int) -> TensorMeta | None:
            # A view has the dtype of the tensor it views, which a replay may change (on a tensor of positions).
            viewed = None if leaf is None or views[i] is None else \
                args[views[i]] if isinstance(views[i], int) else kwargs.get(views[i])
            return leaf if not isinstance(viewed, TensorProxy) else replace(leaf, dtype=viewed.dtype)

        return _rebuild(map_leaves(outputs, like_viewed), iter(()))

    return Symbol(name, meta, namespace=namespace, is_prim=True, tags=frozenset({OPAQUE}), fn=fn,
                  effects=Effects(data_dependent=True, views=views))


# -- names ----------------------------------------------------------------------------------------

_PUBLIC: dict[int, str] = {}
_NAMESPACES = ("", "nn.functional", "linalg", "fft", "special", "nn.init", "Tensor")


def public_torch_names() -> dict[int, str]:
    """id(callable) -> its public path under torch (`linalg.solve`), the first namespace that has it: the one
    table of torch's public names, for printed traces and for messages (`minijit.frontend.calls.torch_name`)."""
    if not _PUBLIC:
        for prefix in _NAMESPACES:
            ns: Any = torch
            for part in prefix.split(".") if prefix else ():
                ns = getattr(ns, part)
            # vars(), not getattr: torch imports some submodules lazily on attribute access.
            names = vars(ns) if isinstance(ns, types.ModuleType) else {a: getattr(ns, a, None) for a in dir(ns)}
            for attr, value in list(names.items()):
                if attr.startswith("_") and prefix != "Tensor":
                    continue
                if callable(value) and not isinstance(value, type):
                    _PUBLIC.setdefault(id(value), f"{prefix}.{attr}" if prefix else attr)
    return _PUBLIC


def _torch_path(fn: Any) -> str | None:
    """The attribute path under `torch` that gives `fn` itself, if there is one."""
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and getattr(torch.Tensor, name, None) is fn:
        return f"Tensor.{name}"
    if isinstance(fn, torch._ops.OpOverload):
        path = f"ops.{fn.namespace}.{fn._opname}.{fn._overloadname}"
        return path if resolve(path) is fn else None
    if isinstance(fn, torch._ops.OpOverloadPacket):
        path = f"ops.{fn._qualified_op_name.replace('::', '.')}"
        return path if resolve(path) is fn else None
    public = public_torch_names().get(id(fn))
    if public is not None and resolve(public) is fn:
        return public
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and module.startswith("torch"):
        path = ".".join([*module.split(".")[1:], qualname])
        if path and resolve(path) is fn:
            return path
    return None


_OPAQUE_NAMES: dict[str, Any] = {}


def unique_opaque_name(base: str, fn: Any) -> str:
    """A name in the printed `opaque` namespace for `fn`, distinct from every other callable's."""
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "op"
    if not base[0].isalpha():
        base = f"op_{base}"
    name, n = base, 1
    while _OPAQUE_NAMES.setdefault(name, fn) is not fn:
        name, n = f"{base}_{n}", n + 1
    return name


def printed_name(fn: Any) -> tuple[str, str]:
    """(namespace, name) a trace prints `fn` as: `torch` and its path where that gives `fn`, else `opaque`."""
    path = _torch_path(fn)
    if path is not None:
        return "torch", path
    return "opaque", unique_opaque_name(getattr(fn, "__name__", "op"), fn)


def describe(fn: Any) -> str:
    """`fn`'s name for messages: `torch.linalg.solve`, `torch.Tensor.frac`, or its qualified name."""
    path = _torch_path(fn)
    if path is not None:
        return f"torch.{path}"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}" if module else str(qualname)

