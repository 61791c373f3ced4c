"""Python's object protocols (operators, truth, iteration, attributes) with user dunders interpreted.

Native `a + b` would run a user class's `__add__` in C, out of the interpreter's
sight. These helpers take the native fast path when neither operand's class defines
the protocol in (interpretable) Python, and otherwise follow CPython's rules in
Python, calling the dunders through `call`.
"""

from __future__ import annotations

import collections
import operator
import types
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.backward import assign_grad, set_traced_grad
from minijit.frontend.calls import call, dispatch_torch_function, should_interpret
from minijit.frontend.folding import NOT_FOLDED, fold
from minijit.frontend.frame import current_state, observe_iteration
from minijit.frontend.interpreter import InterpretedGenerator
from minijit.frontend.lookasides import eager_class
from minijit.frontend.native_tensors import COMPUTING_ITERATORS, run_native
from minijit.frontend.outside import item_label
from minijit.frontend.torch_function import OPERATOR_METHODS, overrides_torch_function
from minijit.ir import NumberProxy, TensorProxy, current_trace
from minijit.ir.containers import contains_proxy
from minijit.ir.context import where_now
from minijit.ir.proxies import SWAPPED, guarded_compare, user_text
from minijit.ops.ltorch.inplace import make_leaf

# class -> names of the dunders and properties it (or a base) defines in interpretable Python.
_PY_MEMBERS: dict[type, frozenset[str]] = {}


def python_members(cls: type) -> frozenset[str]:
    """The special methods, `__getattr__` and properties of `cls` that the interpreter should run."""
    members = _PY_MEMBERS.get(cls)
    if members is None:
        found: set[str] = set()
        for klass in cls.__mro__:
            for name, value in vars(klass).items():
                if type(value) is types.FunctionType and name[:2] == "__" and should_interpret(value):
                    found.add(name)
                elif type(value) is property and type(value.fget) is types.FunctionType and should_interpret(value.fget):
                    found.add("property")
        members = _PY_MEMBERS[cls] = frozenset(found)
    return members


def class_attr(cls: type, name: str) -> Any:
    """The attribute `name` as found in `cls`'s MRO (no descriptor binding), or None."""
    for klass in cls.__mro__:
        d = vars(klass)
        if name in d:
            return d[name]
    return None


def _method(obj: Any, name: str) -> Any:
    """The unbound special method `name` of obj's class, or None."""
    return class_attr(type(obj), name)


def traced(x: Any) -> Any:
    """`x`, or while tracing, the proxy of a real tensor: operators on it must be recorded, not run once here
    (except on a tensor folded from Python numbers: minijit/frontend/folding.py)."""
    if isinstance(x, torch.Tensor) and not isinstance(x, TensorProxy):
        trace = current_trace()
        if trace is not None and trace.capture_tensor is not None and id(x) not in trace.capture.folded_constants:
            return trace.capture_tensor(x)
    return x


def call_dunder(obj: Any, name: str, *args: Any) -> Any:
    """type(obj).name(obj, *args) through the interpreter."""
    fn = getattr(type(obj), name)
    return call(fn, (obj, *args), {})


# -- binary operators ---------------------------------------------------------------------------
BINARY_OPS: list[tuple[str, Any, str, str]] = []  # index (BINARY_OP arg) -> (symbol, native op, dunder, reflected)
_NAMES = [
    ("+", "add", "add"), ("&", "and_", "and"), ("//", "floordiv", "floordiv"), ("<<", "lshift", "lshift"),
    ("@", "matmul", "matmul"), ("*", "mul", "mul"), ("%", "mod", "mod"), ("|", "or_", "or"),
    ("**", "pow", "pow"), (">>", "rshift", "rshift"), ("-", "sub", "sub"), ("/", "truediv", "truediv"),
    ("^", "xor", "xor"),
]
for _symbol, _op, _dunder in _NAMES:
    BINARY_OPS.append((_symbol, getattr(operator, _op), f"__{_dunder}__", f"__r{_dunder}__"))
for _symbol, _op, _dunder in _NAMES:
    BINARY_OPS.append((_symbol + "=", getattr(operator, "i" + _op.rstrip("_")), f"__i{_dunder}__", f"__{_dunder}__"))


def _members_of(a: Any, b: Any) -> tuple[Any, Any]:
    """The Python-level dunders of both operands' types (cached per type)."""
    ma = _PY_MEMBERS.get(type(a))
    mb = _PY_MEMBERS.get(type(b))
    if ma is None or mb is None:
        ma, mb = python_members(type(a)), python_members(type(b))
    return ma, mb


def binary_op(a: Any, b: Any, index: int) -> Any:
    """`a <op> b` for BINARY_OP's argument `index` (in-place forms for 13 and up)."""
    symbol, native, dunder, other = BINARY_OPS[index]
    a, b = traced(a), traced(b)
    ma, mb = _members_of(a, b)
    if not (ma or mb):
        if type(a) is str:  # `"%s" % (sizes,)`: text the traced code makes
            with user_text():
                return native(a, b)
        folded = fold(native, (a, b), {})  # arithmetic on a tensor folded from numbers: folded too
        return native(a, b) if folded is NOT_FOLDED else folded
    if index >= 13:
        inplace = _method(a, dunder)
        if inplace is not None:
            result = call(inplace, (a, b), {})
            if result is not NotImplemented:
                return result
        plain = BINARY_OPS[index - 13]
        return _binary_slow(a, b, plain[2], plain[3], symbol)
    if dunder in OPERATOR_METHODS:
        method = _tensor_operator_override(a, b, dunder)
        if method is not None:
            return method
    return _binary_slow(a, b, dunder, other, symbol)


def _tensor_operator_override(a: Any, b: Any, dunder: str) -> Any:
    """`a <op> b` between a traced tensor and an object overriding `__torch_function__`: eager's dispatch to it
    (the Tensor method, the tensor first); None where no override takes part."""
    left, right = OPERATOR_METHODS[dunder]
    if isinstance(a, TensorProxy) and overrides_torch_function(type(b)):
        return dispatch_torch_function(left, [b], (a, b), {})
    if isinstance(b, TensorProxy) and overrides_torch_function(type(a)) and class_attr(type(a), dunder) is None:
        return dispatch_torch_function(right, [a], (b, a), {})
    return None


def _dispatch(a: Any, b: Any, fa: Any, fb: Any, reflected_first: bool) -> Any:
    """`fa(a, b)` then `fb(b, a)` (the other way round where `reflected_first`), skipping a None: the first
    result that is not NotImplemented, else NotImplemented."""
    tries = [(fb, b, a), (fa, a, b)] if reflected_first else [(fa, a, b), (fb, b, a)]
    for f, x, y in tries:
        if f is not None:
            result = call(f, (x, y), {})
            if result is not NotImplemented:
                return result
    return NotImplemented


def _binary_slow(a: Any, b: Any, dunder: str, reflected: str, symbol: str) -> Any:
    ta, tb = type(a), type(b)
    fb = class_attr(tb, reflected) if tb is not ta else None
    # A subclass's own reflected method goes first (CPython's binary_op1).
    first = fb is not None and issubclass(tb, ta) and fb is not class_attr(ta, reflected)
    result = _dispatch(a, b, class_attr(ta, dunder), fb, first)
    if result is not NotImplemented:
        return result
    raise TypeError(f"unsupported operand type(s) for {symbol}: '{ta.__name__}' and '{tb.__name__}'")


# -- comparisons --------------------------------------------------------------------------------
COMPARISONS = {
    "<": (operator.lt, "__lt__", "__gt__"), "<=": (operator.le, "__le__", "__ge__"),
    "==": (operator.eq, "__eq__", "__eq__"), "!=": (operator.ne, "__ne__", "__ne__"),
    ">": (operator.gt, "__gt__", "__lt__"), ">=": (operator.ge, "__ge__", "__le__"),
}


def compare(a: Any, b: Any, symbol: str) -> Any:
    """`a <symbol> b` for the six rich comparisons."""
    native, dunder, reflected = COMPARISONS[symbol]
    a, b = traced(a), traced(b)
    # The user's code deciding on a symbolic number: decided on the value seen, and guarded.
    if isinstance(a, NumberProxy) and not isinstance(b, TensorProxy):
        return guarded_compare(a, symbol, b)
    if isinstance(b, NumberProxy) and type(a) in (int, float, bool):
        return guarded_compare(b, SWAPPED[symbol], a)
    ma, mb = _members_of(a, b)
    if not (ma or mb):
        return native(a, b)
    ta, tb = type(a), type(b)
    # A subclass's reflected comparison goes first (CPython's do_richcompare).
    result = _dispatch(a, b, class_attr(ta, dunder), class_attr(tb, reflected), tb is not ta and issubclass(tb, ta))
    if result is not NotImplemented:
        return result
    if symbol == "==":
        return a is b
    if symbol == "!=":
        return a is not b
    raise TypeError(f"'{symbol}' not supported between instances of '{ta.__name__}' and '{tb.__name__}'")


# -- unary operators, truth ---------------------------------------------------------------------
UNARY_OPS = {
    "UNARY_POSITIVE": (operator.pos, "__pos__", "+"), "UNARY_NEGATIVE": (operator.neg, "__neg__", "-"),
    "UNARY_INVERT": (operator.invert, "__invert__", "~"),
}


def unary_op(value: Any, opname: str) -> Any:
    """`-x`, `+x`, `~x`."""
    native, dunder, _ = UNARY_OPS[opname]
    value = traced(value)
    if dunder in python_members(type(value)):
        return call_dunder(value, dunder)
    folded = fold(native, (value,), {})  # `-k` of a tensor folded from numbers: folded too
    return native(value) if folded is NOT_FOLDED else folded


def truth(value: Any) -> bool:
    """bool(value), with a Python `__bool__` / `__len__` interpreted."""
    if value is True:
        return True
    if value is False or value is None:
        return False
    if type(value) is int:
        return value != 0
    value = traced(value)
    members = python_members(type(value))
    if "__bool__" in members:
        result = call_dunder(value, "__bool__")
        if type(result) is not bool:
            raise TypeError(f"__bool__ should return bool, returned {type(result).__name__}")
        return result
    if "__len__" in members and _method(value, "__bool__") is None:
        return length(value) != 0
    if current_state().outside.is_root(value) and hasattr(type(value), "__len__") and _method(value, "__bool__") is None:
        current_state().outside.observe(current_state().guards, value, "length")
    return bool(value)


def length(value: Any) -> int:
    """len(value), with a Python `__len__` interpreted."""
    if "__len__" in python_members(type(value)):
        result = call_dunder(value, "__len__")
        return operator.index(result) if type(result) is not int else result
    if current_state().outside.is_root(value):
        current_state().outside.observe(current_state().guards, value, "length")
    return len(value)


# -- containers ---------------------------------------------------------------------------------
def get_item(container: Any, key: Any) -> Any:
    """container[key]; read from a container from outside the call, it is guarded."""
    container = traced(container)
    if "__getitem__" in python_members(type(container)):
        return call_dunder(container, "__getitem__", key)
    outside = current_state().outside
    if not outside.is_root(container):
        return container[key]
    if isinstance(container, collections.defaultdict) and not dict.__contains__(container, key):
        # The factory's value is stored into the outside dict: an effect like any other write.
        outside.observe(current_state().guards, container, "contains", key, False)
        if container.default_factory is None:
            raise KeyError(key)
        value = container.default_factory()
        outside.write_item(container, key, value)
        outside.before_write(container)
        dict.__setitem__(container, key, value)
        outside.settled(container)
        return value
    try:
        value = container[key]
    except (KeyError, IndexError):
        if isinstance(container, dict):
            outside.observe(current_state().guards, container, "contains", key, False)
        else:
            outside.observe(current_state().guards, container, "length")
        raise
    if type(key) is slice:
        outside.observe(current_state().guards, container, "iterate")
    else:
        value = outside.read(current_state().guards, "item", container, key, value,
                             item_label(outside.label_of(container), key), dynamic=True)
    return outside.seen(value)


def set_item(container: Any, key: Any, value: Any) -> None:
    """container[key] = value; into a container from outside the call, it is an effect (logged, replayed)."""
    container = traced(container)
    if "__setitem__" in python_members(type(container)):
        call_dunder(container, "__setitem__", key, value)
        return
    outside = current_state().outside
    if not (outside.is_root(container) and current_trace() is not None):
        container[key] = value
        return
    outside.write_item(container, key, value)
    before = outside.before_write(container)
    container[key] = value
    if (type(container) is dict and not contains_proxy(key)) or (type(container) is list and type(key) is int):
        # What the write made of the contents kept: another thread's write at that moment is not taken for it.
        after = type(before)(before)  # (`before` is kept as it is: the contents to put back)
        after[key] = value
        outside.settled(container, after)
    else:
        outside.settled(container)


def del_item(container: Any, key: Any) -> None:
    """del container[key]; from a container from outside the call, it is an effect (logged, replayed)."""
    if "__delitem__" in python_members(type(container)):
        call_dunder(container, "__delitem__", key)
        return
    outside = current_state().outside
    if outside.is_root(container) and current_trace() is not None:
        outside.write_item(container, key, None, delete=True)
        outside.before_write(container)
    del container[key]
    outside.settled(container)


_HASHED = (dict, set, frozenset, collections.Counter, collections.OrderedDict, collections.defaultdict)
_NUMBERS = (int, float, bool)
_PLAIN_KEYS = (*_NUMBERS, str, bytes, type(None))


def _plain_keys(container: Any) -> bool:
    """Whether `container`'s keys are few plain values, whose `==` with a number is the number's own comparison."""
    return len(container) <= 16 and all(type(k) in _PLAIN_KEYS for k in container)


def contains(container: Any, item: Any) -> bool:
    """item in container."""
    container = traced(container)
    members = python_members(type(container))
    if "__contains__" in members:
        return truth(call_dunder(container, "__contains__", item))
    if "__iter__" in members:
        it = get_iter(container)
        while True:
            try:
                x = next_item(it)
            except StopIteration:
                return False
            if x is item or truth(compare(x, item, "==")):
                return True
    if isinstance(item, NumberProxy) and type(container) in _HASHED and _plain_keys(container):
        # Compared with each key, not hashed: hashing relies on the value, a trace per value.
        if current_state().outside.is_root(container):
            current_state().outside.observe(current_state().guards, container, "keys")
        return any(type(k) in _NUMBERS and truth(compare(item, k, "==")) for k in container)
    result = item in container
    if current_state().outside.is_root(container):
        if isinstance(container, dict | set | frozenset):
            current_state().outside.observe(current_state().guards, container, "contains", item, result)
        else:
            current_state().outside.observe(current_state().guards, container, "iterate")
    return result


# -- iteration ----------------------------------------------------------------------------------
def _tensor_rows(t: TensorProxy) -> Any:
    if not t.shape:
        raise TypeError("iteration over a 0-d tensor")
    for i in range(t.shape[0]):
        yield t[i]


def get_iter(obj: Any) -> Any:
    """iter(obj), with a Python `__iter__` interpreted; a TensorProxy iterates over its rows, like a tensor."""
    obj = traced(obj)
    if isinstance(obj, TensorProxy):
        return _tensor_rows(obj)
    if "__iter__" in python_members(type(obj)):
        it = call_dunder(obj, "__iter__")
        if _method(it, "__next__") is None:
            raise TypeError(f"iter() returned non-iterator of type '{type(it).__name__}'")
        return it
    observe_iteration(obj)
    return iter(obj)


def next_item(it: Any) -> Any:
    """next(it), with a Python `__next__` interpreted (raises StopIteration at the end)."""
    cls = type(it)
    if cls is InterpretedGenerator:
        return it.__next__()
    if current_state().outside.iterators:
        current_state().outside.check_not_outside_iterator(it)
    members = _PY_MEMBERS.get(cls)
    if members is None:
        members = python_members(cls)
    if "__next__" in members:
        return call_dunder(it, "__next__")
    try:
        return run_native(next, it) if cls in COMPUTING_ITERATORS else next(it)
    except TypeError:
        if _method(it, "__next__") is None:
            raise TypeError(f"'{type(it).__name__}' object is not an iterator") from None
        raise


# -- attributes ---------------------------------------------------------------------------------
def stand_in(obj: Any) -> Any:
    """What traced code reads and writes the attributes of in place of `obj`: the module a jitted module wraps
    (its class's `minijit_traced_object`), so that those reads are guarded and writes logged as the module's."""
    redirect = getattr(type(obj), "minijit_traced_object", None)
    return obj if redirect is None else redirect(obj)


def load_attr(obj: Any, name: str) -> Any:
    """getattr(obj, name), with Python properties and `__getattr__` interpreted."""
    if name == "__class__" and isinstance(obj, TensorProxy | NumberProxy):
        return eager_class(obj)
    cls = type(obj)
    members = python_members(cls)
    if not members or isinstance(obj, type):
        return getattr(obj, name)
    if "__getattribute__" in members:
        try:
            return call_dunder(obj, "__getattribute__", name)
        except AttributeError:
            if "__getattr__" not in members:
                raise
            return call_dunder(obj, "__getattr__", name)
    if "property" in members:
        desc = class_attr(cls, name)
        if type(desc) is property and type(desc.fget) is types.FunctionType and should_interpret(desc.fget):
            try:
                return call(desc.fget, (obj,), {})
            except AttributeError:
                if "__getattr__" not in members:
                    raise
                return call_dunder(obj, "__getattr__", name)
    if "__getattr__" in members:
        try:
            return cls.__getattribute__(obj, name)
        except AttributeError:
            return call_dunder(obj, "__getattr__", name)
    return getattr(obj, name)


def store_attr(obj: Any, name: str, value: Any) -> None:
    """setattr(obj, name, value), with Python property setters and `__setattr__` interpreted.

    Set natively on an object from outside the call, it is an effect (logged, replayed).
    """
    obj = stand_in(obj)
    cls = type(obj)
    members = python_members(cls)
    if members and not isinstance(obj, type):
        if "property" in members:
            desc = class_attr(cls, name)
            if type(desc) is property and type(desc.fset) is types.FunctionType and should_interpret(desc.fset):
                call(desc.fset, (obj, value), {})
                return
        if "__setattr__" in members:
            call_dunder(obj, "__setattr__", name, value)
            return
    if isinstance(obj, TensorProxy) and name == "requires_grad" and _set_requires_grad(obj, value):
        return
    if isinstance(obj, TensorProxy) and name == "grad" and set_traced_grad(obj, value):
        return
    if isinstance(obj, torch.Tensor) and not isinstance(obj, TensorProxy) and name == "grad":
        current_state().outside.shown.pop((id(obj), "grad"), None)
        if isinstance(value, TensorProxy):
            assign_grad(obj, value)  # shown to the traced code, and made by every call as an effect
            return
    if isinstance(obj, TensorProxy) or (isinstance(obj, torch.Tensor) and isinstance(value, TensorProxy)):
        _refuse_tensor_attribute_write(obj, name)
    _log_attribute_write(obj, name, value, delete=False)
    setattr(obj, name, value)


def _set_requires_grad(t: TensorProxy, value: Any) -> bool:
    """`t.requires_grad = value` for a tensor the trace computed; False where it is refused instead.

    As in eager, only a leaf's flag may change: a computed tensor that requires grad has a
    history (eager's RuntimeError), one that does not is a leaf. Turning it on makes it a leaf
    whose own gradient nobody reads (transformers does this to a view of the input so that
    gradient checkpointing sees a tensor requiring grad): later ops see the flag, as eager's
    do, and their gradients flow to the inputs as eager's do. Refused where the flag would
    be all that requires grad (no input does: the outputs would require grad only in eager).
    """
    trace = current_trace()
    if trace is None or type(value) is not bool or any(a is t for a in trace.args):
        return False  # an input's flag is the caller's: refused
    if t.requires_grad:
        raise RuntimeError(f"you can only change requires_grad flags of leaf variables ({t.name}{where_now()})")
    if value and torch.is_grad_enabled() and not any(isinstance(a, TensorProxy) and a.requires_grad
                                                     for a in trace.args):
        raise UnsupportedSyntaxError(
            f"assigning {t.name}.requires_grad = True{where_now()} in a function none of whose inputs requires "
            "grad is not supported: the outputs would require grad only through that tensor, which minijit "
            "does not differentiate; set requires_grad on an input before the call")
    if value:
        make_leaf(t)
    else:
        t.requires_grad = False
        if trace.capture is not None:
            trace.capture.made_leaves.pop(id(t), None)
    return True


def _refuse_tensor_attribute_write(obj: Any, name: str) -> None:
    what = obj.name if isinstance(obj, TensorProxy) else f"a {type(obj).__name__}"
    raise UnsupportedSyntaxError(
        f"assigning {what}.{name} inside a jitted function{where_now()} is not supported: minijit traces tensor "
        "operations, not rebinding a tensor's attributes to traced values. Update values in place under "
        "torch.no_grad() (p.copy_(...), p.grad.zero_()), or make the assignment outside the jitted function")


def delete_attribute(obj: Any, name: str) -> None:
    """delattr(obj, name), with a Python `__delattr__` interpreted; on an outside object, an effect."""
    obj = stand_in(obj)
    if "__delattr__" in python_members(type(obj)) and not isinstance(obj, type):
        call_dunder(obj, "__delattr__", name)
        return
    _log_attribute_write(obj, name, None, delete=True)
    delattr(obj, name)


def _log_attribute_write(obj: Any, name: str, value: Any, delete: bool) -> None:
    outside = current_state().outside
    if current_trace() is not None and (outside.is_root(obj) or (isinstance(obj, torch.Tensor)
                                                                 and not isinstance(obj, TensorProxy))):
        outside.write_attribute(obj, name, value, delete)


__all__ = [
    "BINARY_OPS", "binary_op", "call_dunder", "class_attr", "compare", "contains", "del_item", "delete_attribute",
    "get_item", "get_iter", "length", "load_attr", "next_item", "python_members", "set_item",
    "stand_in", "store_attr", "truth", "unary_op",
]
