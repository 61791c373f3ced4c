"""Proxies: the symbolic stand-ins for tensors and numbers while a function is traced.

A proxy has a name (how the printed trace refers to it) and the metadata that the
ops' meta functions need. Tensor methods and operators on a `TensorProxy` are
dispatched through `TENSOR_METHODS`, a table that `minijit.ops` fills in, so this
module knows nothing about torch functions.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import torch

from minijit.errors import (
    UnguardedComparisonError,
    UnguardedValueError,
    UnsupportedMethodError,
    UnsupportedSyntaxError,
)
from minijit.ir.context import (
    add_constraint,
    capturing,
    current_pass,
    current_trace,
    known_constraint,
    known_equal,
    new_name,
    replaying,
    value_reader,
    where_now,
)

# method name -> callable(self, *args, **kwargs); filled in by minijit.ops.
TENSOR_METHODS: dict[str, Callable[..., Any]] = {}
# For the methods TENSOR_METHODS lacks: functions of a method name giving such a callable, or None
# (minijit.ops adds one: Tensor methods recorded as opaque torch ops).
TENSOR_METHOD_FALLBACKS: list[Callable[[str], Callable[..., Any] | None]] = []

_DTYPE_SHORT = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_short_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> 'f32', as printed in trace comments."""
    return _DTYPE_SHORT.get(dtype, str(dtype).removeprefix("torch."))


class Proxy:
    """Anything with a name in a trace.

    A proxy is its object: passes tell proxies apart by identity (minijit/ir/rewrite.py),
    and `name` only spells it in the printed source, given once, when it is made or
    becomes a trace input; a pass substitutes another proxy, it never renames one.
    """

    __slots__ = ("name",)
    name_prefix = "p"

    def __init__(self, name: str | None = None):
        self.name = name if name is not None else new_name(self.name_prefix)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.type_string()}>"

    def type_string(self) -> str:
        """A short description of the proxy's type for trace comments."""
        return type(self).__name__


class NumberProxy(Proxy):
    """A Python number the trace does not specialise on ("symbolic values" cache mode).

    It carries the value seen while tracing and `expr`, a Python expression that
    recomputes it from the trace inputs (`x.shape[1]`, `(n * 2)`). Arithmetic records
    number prims (dispatched through `NUMBER_METHODS`, filled in by minijit.ops) and
    gives new proxies.

    (Traced code's calls `int(n)`, `float(n)` and `math.cos(n)`, ... are number prims:
    minijit.frontend.lookasides.number_function.) The conversions `bool()`, `int()`, `float()`, `str()` and
    formatting have one meaning wherever they run:
    the value, relied on (`x.shape[1]` is 4): a capture records the fact as a constraint, which
    the cache entry's guard checks on later calls; a value the trace computes (`Tensor.item()`)
    is read through the capture's value reader, and refused where there is none (in a pass).
    A pass (outside a capture and its replays) records nothing, so there a conversion raises
    `UnguardedValueError` unless the compile's guard already fixes the value; a pass that needs
    the value seen, where it cannot change the trace, says so with `number_value`.

    The comparison operators (`==`, `!=`, `<`, ...) have one meaning too: the outcome on the
    values seen, guarded by the capture, which records it as a constraint the cache guard checks
    (`guarded_compare`). Anywhere else (a pass, its replay of ops the capture recorded under
    `minijit.ir.context.replaying_captured` included, no compile at all) they raise
    `UnguardedComparisonError`: code that decides there calls an explicit function,
    `same_value` / `same_shape` / `known_compare` in a pass (true on every call the trace runs
    for, recording nothing), `rule_compare` / `rule_same_shape` in an op's rules (metas,
    decompositions, VJP rules), which run in the capture and again where a pass records the op.
    """

    __slots__ = ("addends", "expr", "origin", "outcomes", "python_type", "read", "seen", "value")

    def __init__(self, value: int | float | bool, python_type: type, name: str | None = None,
                 expr: str | None = None):
        super().__init__(name)
        self.value = value
        self.python_type = python_type
        self.expr = expr
        # For a value computed by the trace (Tensor.item()): what computed it, for error messages.
        self.origin: str | None = None
        # True once the capture has read the real value of such a computed value (`value` is it):
        # the trace checks it where it was read (prims.check_value), so it is a constant from there on.
        self.read = False
        # True where `value` is the real value, on the call traced, of a value the trace computes that nothing
        # guards (a size only the trace knows, an `.item()` used as a slice bound: `seen_value`): a comparison
        # of it reads only the outcome, even in an op's rules, and the trace checks that outcome.
        self.seen = False
        # Of a seen value: (op, the other operand) -> the outcome the trace checks, from where the capture read it
        # on (`_checked_outcome`): asked again, by the capture or a pass after it, it is that outcome.
        self.outcomes: dict[tuple[str, str], bool] | None = None
        # Of an int made by `a + b` (prims.num_add): (a, b), so that `(a + b) - a` is `b` itself, not a new value
        # only the trace knows (a gradient sliced out of a concatenation of sizes only the trace knows has the
        # size of its input: `_minus_addend`)
        self.addends: tuple[Any, Any] | None = None

    def type_string(self) -> str:
        return f"{self.python_type.__name__} {self.value}"

    def __getattr__(self, name: str) -> Any:
        # The other methods and attributes of int and float (`f.is_integer()`, `n.bit_length()`): the value's,
        # relied on as a conversion relies on it.
        if name.startswith("__") or name in NumberProxy.__slots__ or not hasattr(self.python_type, name):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return getattr(self.python_type(self._specialise()), name)

    def _specialise(self) -> Any:
        """The value, relied on: guarded where the compile still records guards (a capture); a value
        the trace computes is read through the capture's value reader, and refused where there is none."""
        if data_dependent(self):
            _read(self, "value", None)
        _refuse_unguarded(self)
        record_constraint(self, "==", self.value, True)
        return self.value

    # The conversions mean the same everywhere: the value, relied on (`_specialise`).
    def __bool__(self) -> bool:
        if data_dependent(self):
            return bool(_read(self, "bool", None))  # one trace per truth value, not per value
        return bool(self._specialise())

    def __int__(self) -> int:
        return int(self._specialise())

    def __float__(self) -> float:
        return float(self._specialise())

    # Text needs the value: the trace specialises on it (a value only known when the trace runs is refused).
    # A value computed by the trace is not read for text (it would make a trace per value: a logged loss).
    def __format__(self, spec: str) -> str:
        if data_dependent(self):
            record_constraint(self, "==", self.value, True)  # raises: only known when the trace runs
        return format(self._specialise(), spec)

    def __str__(self) -> str:
        if data_dependent(self):
            record_constraint(self, "==", self.value, True)
        return str(self._specialise())

    def __repr__(self) -> str:
        if not (capturing() and _USER_TEXT.get()):
            return super().__repr__()
        if data_dependent(self):
            record_constraint(self, "==", self.value, True)  # raises, as for str()
        return repr(self._specialise())

    def __hash__(self) -> int:
        # A dict or set lookup that finds no equal key compares nothing: the hash alone decided it, so
        # hashing relies on the value (guarded where a capture records guards).
        return hash(self._specialise() if capturing() else self.value)

    def __eq__(self, other: Any) -> bool:  # type: ignore[override]
        return _compare(self, "==", other)

    def __ne__(self, other: Any) -> bool:  # type: ignore[override]
        return _compare(self, "!=", other)

    def __lt__(self, other: Any) -> bool:
        return _compare(self, "<", other)

    def __le__(self, other: Any) -> bool:
        return _compare(self, "<=", other)

    def __gt__(self, other: Any) -> bool:
        return _compare(self, ">", other)

    def __ge__(self, other: Any) -> bool:
        return _compare(self, ">=", other)


def number_values(x: Any) -> Any:
    """A key or keys `x` with each number proxy in it (a key the call computes, in a tuple or not) its value: the
    native lookup that read it hashed or compared it, which the capture guards (`NumberProxy.__hash__`)."""
    if isinstance(x, NumberProxy):
        return x.value
    if type(x) is tuple and any(isinstance(v, NumberProxy) or type(v) is tuple for v in x):
        return tuple(number_values(v) for v in x)
    return x


_USER_TEXT: ContextVar[bool] = ContextVar("minijit_user_text", default=False)


@contextlib.contextmanager
def user_text() -> Iterator[None]:
    """Text the traced code makes (`repr()`, `str()`, f-strings, `%`): in it a number proxy's repr is its value, relied
    on as `str()` relies on it (`f"{x.shape}"` of symbolic sizes). Elsewhere (minijit's own messages) it names the proxy."""
    token = _USER_TEXT.set(True)
    try:
        yield
    finally:
        _USER_TEXT.reset(token)


_COMPARISONS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def number_value(x: Any) -> Any:
    """The value of a number proxy on the call traced, or `x` itself: the explicit read, guarding nothing.

    A pass converting a symbolic number raises (`UnguardedValueError`); it calls this instead only where the
    value cannot make the trace wrong on a later call of other sizes: text or a hash, a meta tensor's layout
    whose answer the guard checks (`eager_layout(sizes_matter=...)`), an op's check re-run as the capture ran it.
    """
    return x.value if isinstance(x, NumberProxy) else x


def _compare(a: NumberProxy, op: str, b: Any) -> bool:
    """The comparison operators: the outcome on the values seen, guarded by the capture (`guarded_compare`).

    Only a capture can guard an outcome; anywhere else (a pass, its replay of ops the capture recorded
    included) the operators raise. Code that decides there says how, with an explicit function.
    """
    if isinstance(b, TensorProxy):
        return NotImplemented
    if not capturing():
        raise UnguardedComparisonError(
            f"{a.name} {op} {_expression(b)}: a comparison operator on a symbolic number relies on the outcome, "
            "which only a capture can guard; outside one, decide with same_value / same_shape / known_compare "
            "(a pass) or rule_compare / rule_same_shape (an op's rules)")
    return guarded_compare(a, op, b)


def rule_compare(a: Any, op: str, b: Any) -> bool:
    """`a <op> b` for numbers (plain or proxies) as an op's rules (a meta, a decomposition) decide it.

    A rule runs in the capture and again where a pass records the op (functionalization, view
    updates): in the capture the outcome is guarded (`guarded_compare`); in a pass it is decided on
    what the capture guarded (`known_compare`: under `replaying_captured`, on the values, as the
    capture decided them).
    """
    if not isinstance(a, NumberProxy) or isinstance(b, TensorProxy):
        if not isinstance(b, NumberProxy) or isinstance(a, TensorProxy):
            return bool(_COMPARISONS[op](a, b))  # plain numbers, or a tensor's op (a slice bound given as a tensor)
        a, b, op = b, a, SWAPPED[op]
    if capturing():
        return guarded_compare(a, op, b)
    return known_compare(a, op, b)


def rule_same_shape(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether shapes `a` and `b` are equal, as an op's rules decide it: compared as `==` on tuples compares,
    `rule_compare` of the sizes in turn up to the shorter shape (a size is equal to itself), stopping at the
    first that differs, then the lengths. (A list's `==` compares the lengths first: check them before.)"""
    for x, y in zip(a, b, strict=False):
        if not (x is y or rule_compare(x, "==", y)):
            return False
    return len(a) == len(b)


def guarded_compare(a: NumberProxy, op: str, b: Any) -> bool:
    """`a <op> b` on the values seen while capturing, recorded as a constraint the cache guard checks.

    What a capture decides on a symbolic number (a branch, a broadcast, a size check)
    holds for a later call only while the guard finds the same answer.
    """
    if a is b and a.python_type is not float:
        return op in ("==", "<=", ">=")  # an int compared with itself: true of every value, nothing to check
    if data_dependent(b) and not data_dependent(a):
        return guarded_compare(b, SWAPPED[op], a)
    if data_dependent(a) and a.seen and replaying():
        # Re-running a rule the capture ran (the verifier): decided as the capture did, which the trace checks.
        return bool(_COMPARISONS[op](a.value, number_value(b)))
    if data_dependent(a):
        # A value computed by the trace: read it now, and let the trace check the comparison's
        # outcome on every call (one trace per outcome, not per value); two sizes only the trace knows are
        # compared there too (the counts of two masks).
        if a.seen and (checked := _checked_outcome(a, op, b)) is not None:
            return checked
        both = a.seen and isinstance(b, NumberProxy) and b.seen and data_dependent(b)
        other = b if both else b._specialise() if isinstance(b, NumberProxy) else b
        result = bool(_read(a, op, other))
        if a.seen:
            a.outcomes = {**(a.outcomes or {}), (op, _operand_key(b)): result}
        return result
    result = bool(_COMPARISONS[op](a.value, number_value(b)))
    record_constraint(a, op, b, result)
    return result


def _operand_key(x: Any) -> str:
    return x.name if isinstance(x, NumberProxy) else repr(x)


def _checked_outcome(a: NumberProxy, op: str, b: Any) -> bool | None:
    """The outcome of `a <op> b` where the trace already checks it (the capture read it before: `a` and `b` are
    values the trace computes, which do not change), else None."""
    for x, how, y in ((a, op, b), (b, SWAPPED[op], a)):
        if isinstance(x, NumberProxy) and x.outcomes is not None:
            known = x.outcomes.get((how, _operand_key(y)))
            if known is not None:
                return known
            if type(y) is int and (fixed := _checked_constant(x)) is not None:
                return bool(_COMPARISONS[how](fixed, y))
    return None


def _checked_constant(x: NumberProxy) -> int | None:
    """The int that `x` equals on every call, where the trace checks that `x == c` holds or `x != c` fails (a slice
    of length 1 that an index the trace computes selects, squeezed), else None."""
    for (how, operand), outcome in (x.outcomes or {}).items():
        if (how, outcome) in (("==", True), ("!=", False)) and operand.lstrip("-").isdigit():
            return int(operand)
    return None


def _refuse_unguarded(x: NumberProxy) -> None:
    """Raise where converting symbolic `x` to its value would rely on it with nothing to guard it: in a pass (not
    a capture, nor a replay of what the capture recorded), unless the compile's guard already fixes the value."""
    if capturing() or replaying() or x.read or x.expr is None or known_equal(x.expr, number_source(x.value)):
        return
    where = f"the pass {name!r}" if (name := current_pass()) is not None else "a pass (outside a capture)"
    raise UnguardedValueError(
        f"{where} converted the symbolic number {x.name} ({x.expr}, {x.value!r} on the call traced) to a Python "
        "value: nothing guards it, so later calls of other sizes would run a trace decided on this one; decide with "
        "same_value / known_compare, or read a value that cannot change the trace with number_value")


def data_dependent(x: Any) -> bool:
    """Whether `x` is a number the trace computes (Tensor.item()) whose value the capture has not read."""
    return isinstance(x, NumberProxy) and x.expr is None and not x.read


def _read(x: Proxy, how: str, other: Any) -> Any:
    """The real value of `x` read the way `how` says, through the capture's value reader (which records
    the check of it); the error naming where `x` came from where there is no reader."""
    reader = value_reader()
    value = reader(x, how, other) if reader is not None else NotImplemented
    if value is NotImplemented:
        if isinstance(x, NumberProxy):
            record_constraint(x, "==", x.value, True)  # raises: the value is only known when the trace runs
        raise UnsupportedSyntaxError(
            f"the value of tensor {x.name}{where_now()} is needed as a Python value here, inside an op's "
            "decomposition or a traced autograd.Function, where only the trace knows it; read it in the "
            "function itself, or compute with tensors (torch.where)")
    if isinstance(x, NumberProxy) and how == "value":
        x.value = value
        x.read = True
    return value


def known_compare(a: NumberProxy, op: str, b: Any) -> bool:
    """`a <op> b` as a pass may decide it: recording nothing, true on every call the trace runs for.

    `==` is True only for one symbolic value (the same expression) or an equality the
    capture recorded (the guard keeps it true); two sizes merely equal on the traced call
    are not the same size. Orderings are decided on the traced values, and so is `==` where a pass
    replays ops the capture recorded (`replaying_captured`: the capture decided it, and guarded it).

    So `known_compare(n, "==", m)` of two sizes equal only on the call traced is False in a pass and True in a
    replay, on purpose: a pass deciding something new must not take them as one size; a replay re-runs an op's
    rules on the sizes the capture compared, spelt otherwise (`y.shape[0]` for a copied-into `x.shape[0]`),
    where the capture's guard made the same decision hold, but under names the known facts may not link.
    """
    result = bool(_COMPARISONS[op](a.value, number_value(b)))
    if op not in ("==", "!=") or replaying():
        return result
    if _expression(a) == _expression(b):
        return op == "=="
    if known_constraint(canonical_constraint(_expression(a), op, _expression(b), result, isinstance(b, NumberProxy))):
        return result
    if result == (op == "==") and known_equal(_expression(a), _expression(b)):
        return result
    return op == "!="  # not known equal


def checked_sizes(*sizes: Any) -> tuple[Any, ...]:
    """The sizes an op's argument check compares: themselves while capturing (the check records what the
    trace relies on); their values when a pass re-records an op the capture checked, whose sizes may be
    equal on every call but spelt otherwise (the capture's constraints keep the check true)."""
    return sizes if capturing() else tuple(number_value(x) for x in sizes)


def same_value(a: Any, b: Any) -> bool:
    """Whether numbers `a` and `b` (plain or proxies) are equal on every call the trace runs for, as a pass
    asks it: the same symbolic value, or equal by the compile's constraints (`known_compare`); records nothing."""
    if isinstance(a, NumberProxy):
        return known_compare(a, "==", b)
    if isinstance(b, NumberProxy):
        return known_compare(b, "==", a)
    return a == b


def same_shape(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether shapes `a` and `b` are equal on every call the trace runs for (`same_value` of each size)."""
    return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))


def same_size(a: Any, b: Any) -> bool:
    """Whether `a` and `b` (ints or number proxies) are one size on every call: equal ints, or one
    symbolic value (the same expression). Records nothing; False says only "not known the same"."""
    if isinstance(a, NumberProxy) or isinstance(b, NumberProxy):
        # A value the trace computes is the same size only as itself (its name is its expression).
        return _expression(a) == _expression(b) and (a is b or not (data_dependent(a) or data_dependent(b)))
    return a == b


def equal_sizes(a: Any, b: Any) -> bool:
    """Whether sizes `a` and `b` are equal, for a view that keeps a tensor as it is where they are:
    the same size, or equal values (the comparison records their equality); never a literal 1
    against a symbolic size, which may be 1 only as traced (that is a broadcast)."""
    if same_size(a, b):
        return True
    if is_one(a) or is_one(b) or number_value(a) != number_value(b):
        return False
    return rule_compare(a, "==", b)


def is_one(d: Any) -> bool:
    """Whether size `d` is the literal 1 (a symbolic size is not, even where its value is 1)."""
    return type(d) is int and d == 1


def broadcasts_to(size: Any, target: Any) -> bool:
    """Whether a dim of `size` broadcasts to `target` (it is 1 or equal to it).

    A literal 1 and the same size need no constraint; otherwise comparing the values records
    what the answer relied on: `size == target` where the values are equal (two sizes of 1 are
    taken as equal sizes, not as a broadcast), `size == 1` where a symbolic size broadcast.
    """
    if is_one(size) or same_size(size, target):
        return True
    if not capturing():  # a pass re-recording what the capture checked: the values (`checked_sizes`)
        checked_size, checked_target = checked_sizes(size, target)
        return checked_size == 1 or checked_size == checked_target
    if number_value(size) == number_value(target):
        return rule_compare(size, "==", target)
    return rule_compare(size, "==", 1)


def _expression(x: Any) -> str:
    """The Python expression of a number proxy (its name where it has none), or the repr of a constant."""
    if isinstance(x, NumberProxy):
        return x.expr if x.expr is not None else x.name
    return number_source(x)


def zero_sign_test(expr: str, value: Any) -> str | None:
    """For a float zero, the test that also tells its sign (`==` takes 0.0 and -0.0 for one value, which
    `math.copysign(1.0, k)`, `1 / k` and `torch.full(..., k)` tell apart); None for any other value."""
    if type(value) is float and value == 0:
        return f"_copysign(1.0, {expr}) == {math.copysign(1.0, value)!r}"
    return None


def number_source(x: Any) -> str:
    """Python source for the constant `x` in a constraint: its repr, but for a float that is not finite, whose repr
    (`inf`, `nan`) would read back as an undefined name."""
    if type(x) is float and not math.isfinite(x):
        return f"float({repr(x)!r})"
    return repr(x)


def record_constraint(a: NumberProxy, op: str, b: Any, result: bool) -> None:
    """Note that the trace relied on `a <op> b` being `result` (checked by the cache guard)."""
    exprs = []
    for x in (a, b):
        if isinstance(x, NumberProxy) and x.read:
            exprs.append(number_source(x.value))  # the trace checks this value where it was read
        elif isinstance(x, NumberProxy):
            if x.expr is None:
                here = where_now()
                what = f"{x.name}, {x.origin}," if x.origin else f"{x.name}{here}"
                used = f" (needed{here})" if x.origin and here not in x.origin else ""
                raise UnsupportedSyntaxError(
                    f"the value of {what} is only known when the trace runs; it cannot decide a branch or a shape"
                    f"{used}"
                )
            exprs.append(x.expr)
        else:
            exprs.append(number_source(x))
    itself = exprs[0] == exprs[1] and not any(isinstance(x, float | FloatProxy) for x in (a, b))  # (nan != nan)
    if itself or not any(isinstance(x, NumberProxy) and not x.read for x in (a, b)):
        return  # an int compared with itself, or values the trace checks itself: true for every input it runs
    add_constraint(canonical_constraint(exprs[0], op, exprs[1], result, isinstance(b, NumberProxy)))
    if (op == "==") == result and not isinstance(b, NumberProxy) and (sign := zero_sign_test(exprs[0], b)):
        add_constraint(sign)  # relied on equal to a float zero: to that zero, sign included


# (op, result) -> the same fact as a true comparison: `(a != b) is False` is `a == b`.
_NEGATED = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
# op -> the same comparison with its operands swapped: `a < b` is `b > a`.
SWAPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def canonical_constraint(left: str, op: str, right: str, result: bool, symmetric: bool = True) -> str:
    """One spelling per fact, so the guard checks each fact once: `a == b` and `b == a` are one.

    With `symmetric` False (the right side is a literal) the symbolic side stays on the left.
    """
    if not result:
        op = _NEGATED[op]
    if symmetric and left > right:
        left, right, op = right, left, SWAPPED[op]
    return f"{left} {op} {right}"


def _number_operator(method: str, reflected: bool = False) -> Callable[..., Any]:
    # Only numbers combine with a number proxy; anything else (a tensor, a list to repeat)
    # gets NotImplemented so that Python tries the other operand (a list repeat then
    # specialises the proxy through __index__).
    if reflected:
        def op(self: NumberProxy, other: Any) -> Any:
            if not isinstance(other, int | float | NumberProxy):
                return NotImplemented
            if self.read:  # a value the capture read: the trace checks it, so it is a constant from there on
                return _PLAIN[method](other, self.value)
            if _is_identity(method, other, reflected=True) and self.python_type is int:
                return self
            return NUMBER_METHODS[method](other, self)
    else:
        def op(self: NumberProxy, *args: Any) -> Any:
            if args and not isinstance(args[0], int | float | NumberProxy):
                return NotImplemented
            if self.read:
                return _PLAIN[method](self.value, *args)
            if args and _is_identity(method, args[0], reflected=False) and self.python_type is int:
                return self
            if method == "mod" and args and type(args[0]) is int and args[0] == 1 and self.python_type is int:
                return 0  # any int is divisible by 1 (`numel % 1` in `x.view(-1)`'s check)
            if method == "sub" and args and self.addends is not None:
                other = _minus_addend(self.addends, args[0])
                if other is not None:
                    return other
            return NUMBER_METHODS[method](self, *args)
    return op


def _minus_addend(addends: tuple[Any, Any], subtracted: Any) -> Any:
    """`(a + b) - subtracted` where it is `a` or `b` itself (ints: exact), else None."""
    a, b = addends
    for one, rest in ((a, b), (b, a)):
        if one is subtracted or (type(one) is int and type(subtracted) is int and one == subtracted):
            return rest
    return None


def _is_identity(method: str, other: Any, reflected: bool) -> bool:
    """x + 0, x - 0, x * 1, x // 1 (and 0 + x, 1 * x) are x: no need to record them."""
    if type(other) is not int:
        return False
    if method == "add" or (method == "sub" and not reflected):
        return other == 0
    return (method == "mul" and other == 1) or (method == "floordiv" and not reflected and other == 1)


# method name -> the operation on plain numbers.
_PLAIN: dict[str, Callable[..., Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow, "neg": operator.neg,
    "pos": operator.pos, "abs": operator.abs,
}
# method name -> callable recording a number prim; filled in by minijit.ops.
NUMBER_METHODS: dict[str, Callable[..., Any]] = {}

for _dunder in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"):
    setattr(NumberProxy, f"__{_dunder}__", _number_operator(_dunder))
    setattr(NumberProxy, f"__r{_dunder}__", _number_operator(_dunder, reflected=True))
for _dunder in ("neg", "pos", "abs"):
    setattr(NumberProxy, f"__{_dunder}__", _number_operator(_dunder))
# divmod(a, b) is (a // b, a % b) for ints and floats alike.
NumberProxy.__divmod__ = lambda self, other: (self // other, self % other)  # type: ignore[attr-defined]
NumberProxy.__rdivmod__ = lambda self, other: (other // self, other % self)  # type: ignore[attr-defined]


class IntegerProxy(NumberProxy):
    """A symbolic Python int."""

    __slots__ = ()
    name_prefix = "i"

    def __init__(self, value: int, name: str | None = None, expr: str | None = None):
        super().__init__(value, type(value), name, expr)

    def __index__(self) -> int:
        # Used where Python needs a real int (range(n), a list index): specialise on it.
        return int(self._specialise())


class UnbackedSize(IntegerProxy):
    """A size only the trace knows: the count of a `nonzero`, `x[mask]`, `unique` (minijit/ops/unbacked.py).

    A value the trace computes (`data_dependent`), bound where the op made it. A comparison of it, even one an
    op's rules make, reads only the outcome, which the trace checks: one trace per outcome, never per count.
    """

    __slots__ = ()

    def __init__(self, value: int, name: str | None = None):
        super().__init__(value, name)
        self.seen = True


class FloatProxy(NumberProxy):
    """A symbolic Python float."""

    __slots__ = ()
    name_prefix = "f"

    def __init__(self, value: float, name: str | None = None, expr: str | None = None):
        super().__init__(value, float, name, expr)


class TensorProxy(Proxy):
    """A tensor in a trace: shape, dtype, device and whether it requires grad.

    Its eager layout, where something asked, is not kept here but in its traces' table
    (`Trace.layouts`, `minijit.ir.layouts`).
    """

    # __weakref__: code that keeps weak references to its tensors (nn.RNNBase to its flat weights) traces too.
    __slots__ = ("__weakref__", "device", "dtype", "requires_grad", "shape")
    name_prefix = "t"

    def __init__(
        self,
        shape: tuple[int | IntegerProxy, ...],
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool = False,
        name: str | None = None,
    ):
        super().__init__(name)
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device if isinstance(device, torch.device) else torch.device(device)
        self.requires_grad = requires_grad

    @classmethod
    def like(cls, t: TensorProxy, **changes: Any) -> TensorProxy:
        """A new proxy with `t`'s metadata, changed where `changes` says."""
        meta = dict(shape=t.shape, dtype=t.dtype, device=t.device, requires_grad=t.requires_grad)
        meta.update(changes)
        return cls(**meta)

    def type_string(self) -> str:
        dims = ", ".join(d.name if isinstance(d, Proxy) else str(d) for d in self.shape)
        return f"{self.device.type} {dtype_short_name(self.dtype)}[{dims}]"

    # Metadata queries run at trace time and return Python values.
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def ndimension(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> Any:
        if dim is None:
            return torch.Size(self.shape) if all(type(d) is int for d in self.shape) else self.shape
        return self.shape[dim]

    def numel(self) -> Any:
        n = 1
        for d in self.shape:
            n = n * d
        return n

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    def is_signed(self) -> bool:
        return self.dtype.is_signed

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_nested(self) -> bool:
        return False  # traces hold strided tensors only (minijit.runtime.arguments refuses other layouts)

    @property
    def layout(self) -> torch.layout:
        return torch.strided

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def is_quantized(self) -> bool:
        return False

    @property
    def is_mkldnn(self) -> bool:
        return False

    @property
    def is_meta(self) -> bool:
        return self.device.type == "meta"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> Any:
        return self.numel() * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        if value_reader() is not None:
            return _read(self, "bool", None)
        raise UnsupportedSyntaxError(
            f"the truth value of tensor {self.name}{where_now()} depends on its data, which "
            "a trace cannot branch on; compute both branches with torch.where, or move the "
            "check outside the jitted function"
        )

    def __index__(self) -> int:
        return self._python_number("index")

    def __int__(self) -> int:
        return self._python_number("int")

    def __float__(self) -> float:
        return self._python_number("float")

    def _python_number(self, how: str) -> Any:
        trace = current_trace()
        known = trace.known_number(self) if trace is not None else None
        if known is not None:  # made of sizes and numbers only (minijit.ops.number_args): no read of data
            return {"index": operator.index, "int": int, "float": float}[how](known)
        if value_reader() is not None:
            return _read(self, how, None)
        raise UnsupportedSyntaxError(
            f"tensor {self.name}{where_now()} was used as a Python number; its value is only known when "
            "the trace runs"
        )

    def __format__(self, spec: str) -> str:
        if not self.shape and value_reader() is not None:
            # Eager formats a 0-dim tensor as its item (`f"tokens: {n}"`): its value is read, and checked by the trace.
            return format(_read(self, "tolist", None), spec)
        raise UnsupportedSyntaxError(
            f"formatting tensor {self.name} into a string{where_now()} needs its values, which a trace does not "
            "have; print the tensor itself (print(x) is repeated by every call, with its values), or format it "
            "outside the jitted function"
        )

    def __getattr__(self, attr: str) -> Any:
        method = TENSOR_METHODS.get(attr)
        if method is None:
            method = next((m for m in (find(attr) for find in TENSOR_METHOD_FALLBACKS) if m is not None), None)
        if method is None and hasattr(torch.Tensor, attr) and not attr.startswith("__"):
            raise UnsupportedMethodError(f"Tensor.{attr}{where_now()} is not supported on a traced tensor: it is not a "
                                         "computation on the tensor's values minijit can record (autograd, storage, "
                                         "devices, sparse layouts); call it outside the jitted function")
        if method is None:
            raise AttributeError(f"'TensorProxy' has no attribute or supported method {attr!r}{where_now()}")
        if attr in _PROPERTIES or getattr(method, "tensor_property", False):
            return method(self)
        return _BoundMethod(method, self)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: Any) -> Any:
        return TENSOR_METHODS["eq"](self, other)

    def __ne__(self, other: Any) -> Any:
        return TENSOR_METHODS["ne"](self, other)


# Tensor attributes that behave like properties (x.T, x.mT) rather than methods.
_PROPERTIES = {"T", "mT", "real", "imag", "data"}


class _BoundMethod:
    """`proxy.method` as a callable; keeps the table's function for the interpreter to look at."""

    __slots__ = ("fn", "self")

    def __init__(self, fn: Callable[..., Any], self_: TensorProxy):
        self.fn = fn
        self.self = self_

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self.self, *args, **kwargs)


# Reflected operators eager calls with the tensor first (`Tensor.__rmul__` is `self.mul(other)`): a Python number
# stays a wrapped number, which the kernel computes with in its own precision where `torch.mul(number, x)` rounds
# it to x's dtype first (bfloat16, float16).
_SELF_FIRST = frozenset({"add", "mul", "bitwise_and", "bitwise_or", "bitwise_xor"})


def _reflected_operator(method: str, self: TensorProxy, other: Any) -> Any:
    """`other <op> self` as eager's reflected operator computes it."""
    if method in _SELF_FIRST:
        return TENSOR_METHODS[method](self, other)
    if method == "div":  # `Tensor.__rtruediv__`: `self.reciprocal() * other`, two roundings
        return TENSOR_METHODS["mul"](TENSOR_METHODS["reciprocal"](self), other)
    return TENSOR_METHODS[method](other, self)


def _operator(method: str, reflected: bool = False) -> Callable[..., Any]:
    if reflected:
        def op(self: TensorProxy, other: Any) -> Any:
            return _reflected_operator(method, self, other)
    else:
        def op(self: TensorProxy, *args: Any) -> Any:
            return TENSOR_METHODS[method](self, *args)
    return op


_OPERATORS = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "pow", "matmul": "matmul", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift",
}
# Python operator method of TensorProxy -> (the Tensor method it calls, whether its operands swap).
OPERATOR_METHODS: dict[str, tuple[str, bool]] = {}
for _dunder, _method in _OPERATORS.items():
    OPERATOR_METHODS[f"__{_dunder}__"] = (_method, False)
    OPERATOR_METHODS[f"__r{_dunder}__"] = (_method, True)
    OPERATOR_METHODS[f"__i{_dunder}__"] = (f"{_method}_", False)
for _dunder, _method in {
    "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "neg": "neg", "pos": "positive",
    "abs": "abs", "invert": "bitwise_not", "getitem": "getitem", "setitem": "setitem",
}.items():
    OPERATOR_METHODS[f"__{_dunder}__"] = (_method, False)
for _dunder, (_method, _reflected) in OPERATOR_METHODS.items():
    setattr(TensorProxy, _dunder, _operator(_method, reflected=_reflected))
OPERATOR_METHODS.update({"__eq__": ("eq", False), "__ne__": ("ne", False)})  # defined in the class
