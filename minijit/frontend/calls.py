"""How the interpreter calls things: lookasides first, then interpret Python code, else run natively.

The order, for every call made by interpreted code:

1. a torch callable with an ltorch symbol is replaced by that symbol (it records into the trace; where
   its decomposition declines the call, it is recorded as an opaque torch op, minijit/ops/opaque.py);
2. a lookaside (`minijit.frontend.lookasides.LOOKASIDES`) replaces builtins that need the
   interpreter's view of things (`super()`, `isinstance(proxy, torch.Tensor)`, `map` of a Python
   function, ...);
3. Python functions, bound methods, partials, classes with a Python `__init__` and objects with a
   Python `__call__` are interpreted, unless their code belongs to minijit, torch (except the
   `torch.nn` layers' forwards) or a library module that is better run natively;
4. anything else runs natively, after checking that no proxy is passed into C code that cannot
   take one; a torch op without an ltorch symbol that receives a proxy is recorded as an opaque
   torch op (or refused with an UnsupportedOpError naming it).
"""

from __future__ import annotations

import collections
import functools
import itertools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import MetaError, MinijitError, TracesEagerBody, UnsupportedOpError, UnsupportedSyntaxError
from minijit.frontend.folding import NOT_FOLDED, fold, fold_numbers_only, unfold_sizes, with_known_numbers
from minijit.frontend.frame import current_state, observe_iteration, observe_mapping
from minijit.frontend.interpreter import run_function
from minijit.frontend.lookasides import LOOKASIDES
from minijit.frontend.native_tensors import run_native
from minijit.frontend.outside import contents_of, item_label, mutator_of, same_contents
from minijit.frontend.torch_function import dispatch_order, overloaded_arguments
from minijit.ir import Proxy, TensorProxy, current_trace, tree_map
from minijit.ir.context import where_now
from minijit.ir.proxies import _BoundMethod
from minijit.ops.ltorch.inplace import make_leaf
from minijit.ops.number_args import takes_tensor_first
from minijit.ops.opaque import call_ltorch, call_torch, draws_random_numbers, is_opaque_candidate, public_torch_names
from minijit.ops.registry import ltorch_symbol_for

# Modules whose Python code runs natively: minijit itself, torch's own machinery (dispatch, compilers,
# the autograd engine, Tensor internals), and library modules that inspect the calling frame, hold no
# user callbacks, or are simply faster run natively. Everything else, torch.nn, torch.optim and
# torch.utils.checkpoint included, is interpreted, so that its reads and writes are seen.
_NATIVE_MODULES = (
    "minijit", "typing", "typing_extensions", "importlib", "inspect", "logging", "warnings",
    "threading", "weakref", "_weakrefset", "abc", "enum", "re", "sre_", "copyreg", "collections",
    "dataclasses", "os", "posixpath", "genericpath", "linecache", "tokenize", "traceback", "contextvars",
    "numpy", "unittest", "_pytest", "pytest", "pluggy", "codecs", "encodings", "locale", "io", "_collections_abc",
    "functools", "ast", "dis", "opcode", "sympy", "site", "sysconfig",
    "torch._C", "torch._ops", "torch._tensor", "torch._tensor_str", "torch.overrides", "torch._jit_internal",
    "torch.jit", "torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch", "torch.func", "torch._subclasses",
    "torch._prims", "torch._prims_common", "torch._refs", "torch._decomp", "torch._higher_order_ops", "torch._library",
    "torch.library", "torch._guards", "torch._logging", "torch._utils", "torch._utils_internal", "torch.utils._pytree",
    "torch.utils._python_dispatch", "torch.utils.hooks", "torch.utils.data", "torch.autograd", "torch.amp",
    "torch.cpu", "torch.cuda", "torch.mps", "torch.xpu", "torch.backends", "torch.testing", "torch.serialization",
    "torch.hub", "torch.multiprocessing", "torch.storage", "torch.types", "torch.profiler", "torch.export",
    "torch._export", "torch.onnx", "torch.package", "torch._sources", "torch._classes", "torch._lazy",
    "torch.__config__", "torch._vmap_internals", "torch.distributed", "torch._namedtensor_internals",
    "torch.random", "torch.nn.parameter", "torch._compile", "torch.compiler",
)
# ... except these, which hold user-visible Python code worth tracing through (nn layer forwards, the function
# `@torch.autocast(...)` wraps a user function in, and the wrappers torch.func's transforms return, whose
# calls of torch's implementations minijit.frontend.func_transforms looks aside).
# Modules whose wrappers (with `__wrapped__`) only switch Dynamo off around the function they wrap.
_DYNAMO_WRAPPER_MODULES = ("torch._dynamo.eval_frame", "torch._compile")
_INTERPRETED_TORCH_MODULES = ("torch.nn.modules", "torch.amp.autocast_mode", "torch.amp.grad_scaler",
                              "torch._functorch.apis")

# Modules whose C callables may receive proxies: they only store them or call their Python dunders.
_PROXY_SAFE_MODULES = {"builtins", "operator", "_operator", "functools", "_functools", "itertools",
                       "collections", "_collections", "copy", "_abc", "abc", "types"}
_PROXY_SAFE_TYPES = (list, dict, tuple, set, frozenset, str, object, type, slice)

# Code of native modules interpreted all the same: functools' single-dispatch wrappers dispatch on
# `args[0].__class__`, which only interpreted code reads as eager's class of a proxy (torch.Tensor, int).
_INTERPRETED_NATIVE_CODE = (functools.singledispatch(lambda x: x).__code__,
                            functools.singledispatchmethod(lambda self, x: x).__get__(None).__code__)

# Keyed by id: code objects compare equal across modules when their bodies match (a library's
# copy of torch code, say), and the decision depends on the module. The code is kept alive here.
_INTERPRET_CODE: dict[int, tuple[types.CodeType, bool]] = {}


def _module_of(globals_: dict[str, Any]) -> str:
    name = globals_.get("__name__")
    return name if isinstance(name, str) else ""


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") or (p.endswith("_") and module.startswith(p))
               for p in prefixes)


def should_interpret(fn: types.FunctionType) -> bool:
    """True when the Python function `fn` is run by the interpreter rather than natively."""
    code = fn.__code__
    known = _INTERPRET_CODE.get(id(code))
    if known is not None:
        return known[1]
    module = _module_of(fn.__globals__)
    decision = (not _matches(module, _NATIVE_MODULES) or _matches(module, _INTERPRETED_TORCH_MODULES)
                or code in _INTERPRETED_NATIVE_CODE)
    _INTERPRET_CODE[id(code)] = (code, decision)
    return decision


def has_proxy(args: Any, kwargs: dict[str, Any] | None = None) -> bool:
    """True when a proxy is among the arguments (looking into lists, tuples and dicts)."""
    return _contains(args, Proxy) or (bool(kwargs) and _contains(kwargs.values(), Proxy))


def _contains(args: Any, cls: type) -> bool:
    """True when an instance of `cls` is among `args`, looking into lists, tuples and dicts."""
    for a in args:
        if isinstance(a, cls):
            return True
        t = type(a)
        if (t is list or t is tuple) and _contains(a, cls):
            return True
        if t is dict and _contains(a.values(), cls):
            return True
    return False


def call(fn: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """Call `fn(*args, **kwargs)` on behalf of interpreted code."""
    t = type(fn)
    if t is types.FunctionType:
        sym = ltorch_symbol_for(fn)
        if sym is not None:
            observe_whole_arguments(args, kwargs)
            try:
                return _call_ltorch(fn, sym, args, kwargs)
            except TracesEagerBody:
                return run_function(fn, args, kwargs)
        lookaside = LOOKASIDES.get(fn)
        if lookaside is not None:
            return run_native(lookaside, *args, **kwargs)
        if should_interpret(fn):
            return run_function(fn, args, kwargs)
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None and _module_of(fn.__globals__) in _DYNAMO_WRAPPER_MODULES:
            # torch._dynamo.disable's wrapper (Dynamo rebinds torch.manual_seed and, once torch.compile
            # has run, optimizers' methods to one) only turns Dynamo off: trace what it wraps.
            return call(wrapped, args, kwargs)
        return _call_native(fn, args, kwargs)
    if t is types.MethodType:
        owner = fn.__self__
        if (type(fn.__func__) is types.FunctionType and not should_interpret(fn.__func__)
                and mutator_of(owner, fn.__name__) and current_state().outside.is_root(owner)):
            # A container method written in Python that runs natively (Counter.update): its writes are not seen
            # one by one, so the call is the effect, as a C method's is.
            return _call_root_method(owner, fn, args, kwargs)
        return call(fn.__func__, (owner, *args), kwargs)
    if t is weakref.ReferenceType and not args and not kwargs:
        return _dereference(fn)
    if t is _BoundMethod:
        args, kwargs = unfold_sizes(args, kwargs)
        return _with_known_numbers_if_refused(fn, args, kwargs)
    if t is types.MethodWrapperType and fn.__name__ in ("__setattr__", "__delattr__"):
        # `super().__setattr__(name, value)`: object's own slot, bound; an effect on an outside object.
        if getattr(fn, "__objclass__", None) is object:
            return LOOKASIDES[getattr(object, fn.__name__)](fn.__self__, *args, **kwargs)
    if t is types.BuiltinMethodType:
        owner = fn.__self__
        if owner is not None and not isinstance(owner, types.ModuleType):
            if isinstance(owner, torch.Tensor) and not isinstance(owner, Proxy):
                method = _real_tensor_method(owner, fn.__name__)
                if method is not None:
                    return method(*args, **kwargs)
            # A C method bound to an object (xs.sort): look aside its unbound form (list.sort).
            try:
                lookaside = LOOKASIDES.get(getattr(type(owner), fn.__name__, None))
            except TypeError:
                lookaside = None
            if lookaside is not None:
                return run_native(lookaside, owner, *args, **kwargs)
            if current_state().outside.is_root(owner):
                return _call_root_method(owner, fn, args, kwargs)
    if t is functools._lru_cache_wrapper and has_proxy(args, kwargs):
        # The cache would keep the proxies (as keys and results) past this trace, for later calls and traces to
        # find: the function it wraps is traced instead, the cache left as it is.
        return call(fn.__wrapped__, args, kwargs)
    try:
        sym = ltorch_symbol_for(fn)
        lookaside = LOOKASIDES.get(fn)
    except TypeError:  # unhashable callable
        sym = lookaside = None
    if sym is not None:
        observe_whole_arguments(args, kwargs)
        return _call_ltorch(fn, sym, args, kwargs)
    if lookaside is not None:
        return run_native(lookaside, *args, **kwargs)
    if t is functools.partial:
        return call(fn.func, (*fn.args, *args), {**fn.keywords, **kwargs})
    if isinstance(fn, type):
        return _instantiate(fn, args, kwargs)
    inline = getattr(t, "minijit_traced_callable", None)
    if inline is not None:
        # A jitted function called by traced code: its function is traced into the caller's trace.
        return call(inline(fn), args, kwargs)
    dunder_call = next((vars(k)["__call__"] for k in t.__mro__ if "__call__" in vars(k)), None)
    if type(dunder_call) is types.FunctionType and should_interpret(dunder_call):
        return run_function(dunder_call, (fn, *args), kwargs)
    return _call_native(fn, args, kwargs)


def _call_ltorch(fn: Any, sym: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """A torch callable with an ltorch symbol: recorded, dispatched to an argument's `__torch_function__`,
    or folded (on Python numbers only: minijit/frontend/folding.py)."""
    overloaded = overloaded_arguments(args, kwargs)
    if overloaded:
        return dispatch_torch_function(fn, overloaded, args, kwargs)
    if kwargs.get("requires_grad") is True:
        return _made_leaf(fn, sym, args, kwargs)
    folded = fold(fn, args, kwargs)
    if folded is NOT_FOLDED and takes_tensor_first(sym.meta):
        # Tensor arithmetic given plain Python numbers only (constants of this trace, `torch.div(7, 2)`):
        # computed now, so that a size may read the result (minijit/frontend/folding.py).
        folded = fold_numbers_only(fn, args, kwargs)
    if folded is not NOT_FOLDED:
        return folded
    args, kwargs = unfold_sizes(args, kwargs)
    try:
        return _with_known_numbers_if_refused(lambda *a, **k: call_ltorch(fn, sym, a, k), args, kwargs)
    except MetaError:
        folded = fold_numbers_only(fn, args, kwargs)
        if folded is NOT_FOLDED:
            raise
        return folded


def _made_leaf(fn: Any, sym: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """A factory called with `requires_grad=True` (`torch.zeros(3, requires_grad=True)`): the tensor, made a leaf
    requiring grad as eager makes it (minijit.ops.ltorch.inplace.make_leaf), whose `.grad` a backward in the traced
    code sets."""
    made = _call_ltorch(fn, sym, args, {k: v for k, v in kwargs.items() if k != "requires_grad"})
    trace = current_trace()
    if isinstance(made, torch.Tensor) and not isinstance(made, Proxy) and trace is not None and trace.capture_tensor:
        made = trace.capture_tensor(made)  # folded while tracing: a constant of the trace
    if not (isinstance(made, TensorProxy) and make_leaf(made)):
        raise UnsupportedOpError(f"{torch_name(fn)}(..., requires_grad=True){where_now()} is not supported here; "
                                 "create the tensor outside the jitted function")
    return made


def _with_known_numbers_if_refused(fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)`; where refused, the call with the traced 0-dim integer tensors whose values are known
    numbers given as those numbers, as eager reads them where it needs an int (minijit/frontend/folding.py)."""
    try:
        return fn(*args, **kwargs)
    except MinijitError as refused:
        numbers = with_known_numbers(args, kwargs)
        if numbers is None:
            raise
        try:
            return fn(*numbers[0], **numbers[1])
        except MinijitError:
            # Refused with the numbers too: where the call as made was refused as eager refuses it, that is
            # eager's error (`torch.unbind` of a 0-dim int tensor: IndexError, not unbinding a number's TypeError).
            if getattr(type(refused), "eager_type", None) is None:
                raise
            raise refused from None


def dispatch_torch_function(fn: Any, overloaded: list[Any], args: tuple[Any, ...] | list[Any],
                            kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` where arguments override `__torch_function__`: each override in eager's order,
    interpreted, until one does not return NotImplemented (minijit/frontend/torch_function.py)."""
    ordered = dispatch_order(overloaded)
    types_ = tuple(type(a) for a in ordered)
    for a in ordered:
        result = call(a.__torch_function__, (fn, types_, tuple(args), dict(kwargs)), {})
        if result is not NotImplemented:
            return result
    raise TypeError(f"Multiple dispatch failed for '{torch_name(fn)}'; all __torch_function__ handlers returned "
                    "NotImplemented:\n\n" + "".join(f"  - tensor subclass {t}\n" for t in types_)
                    + "\nFor more information, try re-running with TORCH_LOGS=not_implemented")


def _real_tensor_method(t: torch.Tensor, name: str) -> Callable[..., Any] | None:
    """`t.name` for a real tensor met while tracing: the method of its proxy (so the call is recorded)."""
    trace = current_trace()
    if trace is None or trace.capture_tensor is None:
        return None
    return getattr(trace.capture_tensor(t), name)


def _dereference(ref: weakref.ReferenceType) -> Any:
    """`ref()`: what a weakref from outside the call refers to is read from outside too (an optimizer reached
    through the weakref an lr scheduler's `opt.step` wrapper holds), its identity guarded."""
    value = ref()
    outside = current_state().outside
    if outside.is_root(ref) and value is not None:
        label = f"{outside.label_of(ref)}()"
        outside.read(current_state().guards, "referent", ref, None, value, label)
        return outside.seen(value)
    return value


# Methods of a list or deque that only store their arguments (never iterate or compare them).
_STORING = frozenset({"append", "appendleft", "insert"})


def _call_root_method(owner: Any, fn: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """A C method of a container from outside the call: reads are guarded, writes are effects."""
    outside, guards, name = current_state().outside, current_state().guards, fn.__name__
    if mutator_of(owner, name):
        if current_trace() is not None:
            outside.call_mutator(guards, owner, name, tuple(args), kwargs)
        if name in _STORING and not kwargs and (type(owner) is list or (
                type(owner) is collections.deque and owner.maxlen is None)):
            # Only stores its argument: made right after the contents are kept (`before_write`), and what it makes
            # of them is known, so that another thread's write at that moment is not taken for this one.
            before = outside.before_write(owner)
            result = fn(*args)
            after = list(before)
            if name == "appendleft":
                after.insert(0, *args)
            else:
                getattr(after, name)(*args)  # append, insert
            outside.settled(owner, after)
            return result
        outside.before_write(owner)
        result = _call_native(fn, args, kwargs)
        outside.settled(owner)
        return result
    if isinstance(owner, dict) and name == "get" and args:
        present = dict.__contains__(owner, args[0])
        if present:
            value = dict.__getitem__(owner, args[0])
            value = outside.read(guards, "item", owner, args[0], value, item_label(outside.label_of(owner), args[0]),
                                 dynamic=True)
            return outside.seen(value)
        outside.observe(guards, owner, "contains", args[0], False)
    elif isinstance(owner, dict) and name in ("items", "values"):
        observe_mapping(owner)
    elif name in ("keys", "copy", "index", "count", "__iter__", "__len__", "__contains__", "__reversed__"):
        observe_iteration(owner)
    return _call_native(fn, args, kwargs)


def _instantiate(cls: type, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """`cls(*args, **kwargs)` with Python `__new__`/`__init__` interpreted (plain `type` metaclass only)."""
    if type(cls).__call__ is not type.__call__:
        meta_call = type(cls).__call__
        if type(meta_call) is types.FunctionType and should_interpret(meta_call):
            return run_function(meta_call, (cls, *args), kwargs)
        return _call_native(cls, args, kwargs)
    new = cls.__new__
    init = cls.__init__
    py_new = type(new) is types.FunctionType and should_interpret(new)
    py_init = type(init) is types.FunctionType and should_interpret(init)
    if not (py_new or py_init):
        return _call_native(cls, args, kwargs)
    if py_new:
        obj = run_function(new, (cls, *args), kwargs)
    elif new is object.__new__:
        obj = object.__new__(cls)
    else:
        obj = new(cls, *args, **kwargs)
    if not isinstance(obj, cls):
        return obj
    current_state().outside.note_created(obj)
    if py_init:
        result = run_function(init, (obj, *args), kwargs)
        if result is not None:
            raise TypeError(f"__init__() should return None, not '{type(result).__name__}'")
    elif init is not object.__init__:
        init(obj, *args, **kwargs)
    return obj


def _call_native(fn: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    observe_whole_arguments(args, kwargs)
    trace = current_trace()
    if trace is not None and is_torch_callable(fn):
        overloaded = overloaded_arguments(args, kwargs)
        if overloaded:
            return dispatch_torch_function(fn, overloaded, args, kwargs)
        folded = fold(fn, args, kwargs)
        if folded is not NOT_FOLDED:
            return folded
        args, kwargs = unfold_sizes(args, kwargs)
    if (trace is not None and trace.capture_tensor is not None and is_torch_callable(fn)
            and (_contains(args, torch.Tensor) or _contains(kwargs.values(), torch.Tensor))):
        # A torch function given tensors from outside the call would run once, here: record it instead.
        capture = trace.capture_tensor
        args, kwargs = tree_map(lambda x: capture(x) if isinstance(x, torch.Tensor) else x, (list(args), kwargs))
        return call(fn, args, kwargs) if not _is_same_native(fn) else _call_native_with_proxies(fn, args, kwargs)
    return _call_native_with_proxies(fn, args, kwargs)


def observe_whole_arguments(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
    """Guard every element of the containers from outside the call among `args`: an op (`torch.cat(xs)`) or
    native code reads each of them whole, so a later call with an element added, removed or replaced
    must miss. Looks into the lists, tuples, dicts and deques it finds, nested ones included."""
    outside = current_state().outside
    if not outside.roots:
        return
    pending: list[Any] = [*args, *kwargs.values()]
    seen: set[int] = set()
    while pending:
        x = pending.pop()
        t = type(x)
        if not (t is list or t is tuple or t is dict or t is collections.deque) or id(x) in seen:
            continue
        seen.add(id(x))
        if outside.is_root(x):
            if t is dict:
                outside.observe_values(current_state().guards, x)
            else:
                outside.observe(current_state().guards, x, "iterate")
        pending.extend(x.values() if t is dict else x)


def _is_same_native(fn: Any) -> bool:
    """True when calling `fn` again would come straight back here (no symbol or lookaside would take it)."""
    try:
        return ltorch_symbol_for(fn) is None and fn not in LOOKASIDES
    except TypeError:
        return True


def _call_native_with_proxies(fn: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    if has_proxy(args, kwargs):
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.Tensor) and type(fn) is types.BuiltinMethodType:
            # real_tensor.method(proxy): the same as torch.Tensor.method(real_tensor, proxy)
            method = getattr(torch.Tensor, fn.__name__, None)
            if method is not None and (ltorch_symbol_for(method) is not None or is_opaque_candidate(method)):
                return call_torch(method, (owner, *args), kwargs)
        if is_torch_callable(fn) and is_opaque_candidate(fn):
            return call_torch(fn, args, kwargs)
        _check_native_call_with_proxy(fn)
    elif is_torch_callable(fn) and is_opaque_candidate(fn) and draws_random_numbers(fn):
        # A random torch op on Python values only (`torch.randperm(n)`): recorded, so that each
        # call draws new numbers (run here, its result would be frozen into the trace).
        return call_torch(fn, args, kwargs)
    try:
        consumes = _ITERABLE_CONSUMERS.get(fn)
    except TypeError:
        consumes = None
    if consumes is not None and args:
        from minijit.frontend.opcodes.build import interpreted_iterable

        if current_state().outside.iterators:
            for a in args:
                current_state().outside.check_not_outside_iterator(a)

        if consumes == "all":
            args = [interpreted_iterable(a) for a in args]
        elif consumes == "first" or len(args) == 1:
            args = [interpreted_iterable(args[0]), *args[1:]]
    outside = current_state().outside
    # Lists and dicts from outside that native code may change (`heapq.heappush(h, 3)`): no traced opcode sees it.
    given = [(x, contents_of(x)) for x in (*args, *kwargs.values())
             if type(x) in (list, dict) and outside.is_root(x)] if outside.roots else []
    result = run_native(fn, *args, **kwargs)
    for container, before in given:
        if not same_contents(container, before):
            outside.changed_natively(container, before, getattr(fn, "__qualname__", repr(fn)))
    # A parameter of a jitted module that native code returns (a weak reference's target) is its proxy.
    return outside.seen(result)


# Native callables that iterate over their positional arguments ("first": only the first one;
# "single": the first when it is the only one). An argument whose class iterates in Python is
# wrapped so that its __iter__/__next__ run through the interpreter.
_ITERABLE_CONSUMERS: dict[Any, str] = {
    list: "first", tuple: "first", set: "first", frozenset: "first", sorted: "first", sum: "first",
    any: "first", all: "first", enumerate: "first", min: "single", max: "single", zip: "all", map: "all",
    itertools.chain: "all", itertools.islice: "first", itertools.cycle: "first", itertools.product: "all",
    itertools.permutations: "first", itertools.combinations: "first", itertools.accumulate: "first",
    itertools.groupby: "first", itertools.zip_longest: "all", itertools.starmap: "all", itertools.tee: "first",
    itertools.chain.from_iterable: "first", itertools.dropwhile: "all", itertools.takewhile: "all",
    itertools.filterfalse: "all", itertools.compress: "all", itertools.pairwise: "first",
}


def _check_native_call_with_proxy(fn: Any) -> None:
    """Refuse to pass a proxy into native code that would not treat it as a tensor."""
    if is_torch_callable(fn):
        raise UnsupportedOpError(f"{torch_name(fn)} is not supported by minijit{where_now()}")
    if type(fn) is types.FunctionType:
        return  # native Python code only reaches proxies through their Python methods
    if isinstance(fn, type):
        return
    owner = getattr(fn, "__self__", None)
    objclass = getattr(fn, "__objclass__", None)
    module = getattr(fn, "__module__", None)
    if module is None and owner is not None:
        module = type(owner).__module__ if not isinstance(owner, types.ModuleType) else owner.__name__
    if module in _PROXY_SAFE_MODULES or isinstance(owner, _PROXY_SAFE_TYPES) or objclass in _PROXY_SAFE_TYPES:
        return
    if isinstance(owner, type) or isinstance(owner, Proxy):
        return
    raise UnsupportedSyntaxError(
        f"{_callable_name(fn)} was called with a tensor proxy{where_now()}; it is native code that cannot "
        "take a traced tensor. Use a torch operation instead, or call it outside the jitted function")


def is_torch_callable(fn: Any) -> bool:
    """True for torch's functions, Tensor methods and torch's Python functions."""
    if type(fn) is types.FunctionType:
        return _module_of(fn.__globals__).startswith("torch")
    objclass = getattr(fn, "__objclass__", None)
    if isinstance(objclass, type) and issubclass(objclass, torch._C.TensorBase):
        return True
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.Tensor):
        return True
    module = getattr(fn, "__module__", None)
    if module is None and isinstance(owner, types.ModuleType):
        module = owner.__name__
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def torch_name(fn: Any) -> str:
    """The public name of a torch callable (`torch.fft.fft`, `torch.Tensor.add`), for messages."""
    path = public_torch_names().get(id(fn))
    if path is not None:
        return f"torch.{path}"
    if isinstance(getattr(fn, "__self__", None), torch.Tensor):
        return f"torch.Tensor.{fn.__name__}"
    maker = _wrapper_maker(fn)
    if maker is not None:
        # `torch.func.jacrev(g)` returns a function wearing g's name (functools.wraps): name both.
        return f"the function {torch_name(maker)} made of {_callable_name(fn.__wrapped__)}"
    return _callable_name(fn)


def _wrapper_maker(fn: Any) -> Any:
    """The torch function that made `fn`, a closure wrapping another function with functools.wraps
    (`torch.func.jacrev(g)`), or None."""
    if type(fn) is not types.FunctionType or getattr(fn, "__wrapped__", None) is None:
        return None
    outer = fn.__code__.co_qualname.split(".<locals>")[0]
    maker = fn.__globals__.get(outer)
    return maker if callable(maker) and maker is not fn and "<locals>" in fn.__code__.co_qualname else None


def _callable_name(fn: Any) -> str:
    objclass = getattr(fn, "__objclass__", None)
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if objclass is not None:
        return f"{objclass.__module__}.{qualname}"
    module = getattr(fn, "__module__", None)
    return f"{module}.{qualname}" if module else str(qualname)


def bind_method(fn: Any, obj: Any) -> Callable[..., Any]:
    """`fn` (found on `type(obj)`) bound to `obj`, as attribute lookup would."""
    get = getattr(type(fn), "__get__", None)
    return get(fn, obj, type(obj)) if get is not None else fn


__all__ = ["bind_method", "call", "has_proxy", "is_torch_callable", "should_interpret", "torch_name"]
