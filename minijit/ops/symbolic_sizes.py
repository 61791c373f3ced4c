"""Symbolic output sizes of torch kernels: torch's own meta kernels run on symbolic sizes.

Under `cache="symbolic values"` the sizes of a trace's inputs are symbolic numbers. An op
whose output shape minijit does not compute itself (an opaque op, an aten prim such as
`prims.convolution` or a pooling prim) gets its output's metadata from torch's meta kernel.
Run on plain meta tensors that kernel only sees the traced sizes, and every symbolic size
would have to be specialised (one trace per batch size). Instead `symbolic_output_shapes`
runs the same callable once more under a `FakeTensorMode` whose tensors have symbolic
sizes (torch's `ShapeEnv`, one sympy symbol per distinct symbolic size of the arguments):

- each output dim comes back as a sympy expression of those symbols (`(s0 - 1)//2 + 1`),
  which is rebuilt as arithmetic on minijit's number proxies (number prims in the trace),
  the symbol itself where the dim *is* an input size;
- every decision the kernel took on a size is one of the `ShapeEnv`'s guards (`Ne(s0, 1)`,
  `Eq(s1, 17)` where it specialised), and every symbol has a value range it assumed (at
  least 2, as torch specialises sizes 0 and 1; where a symbolic size is 1 as traced, the
  `ShapeEnv` keeps 1 symbolic too and the kernel guards `Eq(s0, 1)` where it relied on it):
  each is recorded as a constraint of the capture, which the cache entry's guard checks, so
  the formulas are used only for sizes where torch's kernel takes the same decisions.

Where anything cannot be followed (a guard or formula minijit's numbers cannot express, an
output that views an argument, a kernel that fails on fake tensors, a formula that does not
reproduce the traced shape) the result is None and the caller specialises on the values, as
before: never a size that is wrong for some input.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.ir import IntegerProxy, NumberProxy, TensorProxy, tree_flatten
from minijit.ir.containers import sequence_leaves
from minijit.ir.context import add_constraint, capturing
from minijit.ir.proxies import SWAPPED, data_dependent, guarded_compare

__all__ = ["SIZE_RULES", "SymbolicShapes", "derive", "has_symbolic_sizes", "size_rule", "symbolic_output_shapes"]

# A size rule: (args, kwargs, the traced output shapes) -> each output leaf's shape, or None to specialise.
SizeRule = Callable[[tuple[Any, ...], dict[str, Any], list[tuple[int, ...] | None]], list[tuple[Any, ...] | None] | None]
# Torch callables whose meta kernel specialises sizes the result does not depend on (a recurrent layer's
# kernel loops over the time steps), with their output shapes given by hand. A rule returns the sizes it
# follows as they are (proxies) and specialises every other symbolic number it reads (`NumberProxy.python_type`).
SIZE_RULES: dict[Any, SizeRule] = {}


def size_rule(*fns: Any) -> Callable[[SizeRule], SizeRule]:
    """Register the decorated function as the size rule of the torch callables `fns` (see SIZE_RULES)."""
    def register(rule: SizeRule) -> SizeRule:
        for fn in fns:
            SIZE_RULES[fn] = rule
        return rule
    return register


class _Unsupported(Exception):
    """A formula or guard that minijit's number prims cannot express."""


def _symbolic(x: Any) -> bool:
    """A symbolic int that can become a torch symbol: one the guard can recompute, not 0."""
    return isinstance(x, IntegerProxy) and x.expr is not None and x.value >= 1


def _unbacked(x: Any) -> bool:
    """A size only the trace knows (`nonzero`'s count): an unbacked torch symbol, never its value."""
    return isinstance(x, IntegerProxy) and data_dependent(x)


def has_symbolic_sizes(args: Any) -> bool:
    """Whether any tensor proxy among `args` (a tree) has a symbolic size, or any argument is a symbolic int."""
    for x in tree_flatten(args):
        if isinstance(x, TensorProxy) and any(isinstance(d, NumberProxy) for d in x.shape):
            return True
        if isinstance(x, NumberProxy):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class SymbolicShapes:
    """What a run on symbolic sizes found, in terms of the flattened leaves of (args, kwargs).

    `symbols[k]` is where symbol k came from: `(leaf, dim)` for a tensor's size, `(leaf, None)`
    for an int argument. `outputs` has per flattened output leaf its shape as sympy
    expressions (None for a leaf that is not a tensor); `guards` are the relations the kernel
    relied on and `ranges` each symbol's assumed `(low, high)` (high None for unbounded).
    """

    symbols: tuple[tuple[int, int | None], ...]
    outputs: tuple[tuple[Any, ...] | None, ...]
    guards: tuple[Any, ...]
    ranges: tuple[tuple[int, int | None], ...]
    names: tuple[Any, ...]  # the sympy symbols, in the order of `symbols`

    def evaluate(self, values: list[int]) -> list[tuple[int, ...] | None] | None:
        """The output shapes for symbol values `values`, or None where a guard or range fails for them."""
        env = {s: v for s, v in zip(self.names, values, strict=True)}
        for (low, high), v in zip(self.ranges, values, strict=True):
            if v < low or (high is not None and v > high):
                return None
        for g in self.guards:
            if not bool(g.xreplace({s: _sympy().Integer(v) for s, v in env.items()})):
                return None
        return [None if shape is None else tuple(_evaluate(d, env) for d in shape) for shape in self.outputs]


def _sympy() -> Any:
    import sympy

    return sympy


def _evaluate(expr: Any, env: dict[Any, int]) -> int:
    sympy = _sympy()
    value = expr.xreplace({s: sympy.Integer(v) for s, v in env.items()})
    if not value.is_number:
        raise _Unsupported(f"{expr} is not a number for {env}")
    return int(value)


# -- the run on symbolic sizes --------------------------------------------------------------------

_CACHE: OrderedDict[Any, SymbolicShapes | None] = OrderedDict()
_CACHE_SIZE = 1024


def symbolic_output_shapes(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                           concrete: list[tuple[int, ...] | None], *, meta_device: bool = False,
                           reads_layout: bool = False) -> list[tuple[Any, ...] | None] | None:
    """Per flattened output leaf of `fn(*args, **kwargs)`, its shape with symbolic sizes where they follow from
    the arguments' symbolic sizes; None where that cannot be derived soundly (the caller specialises).

    `concrete` are the output shapes the plain meta run gave for the traced values (None for leaves
    that are not tensors); the derived formulas must reproduce them. With `meta_device`, the call
    gets `device="meta"` (a factory). While capturing, the kernel's guards become the capture's
    constraints. A callable whose result `reads_layout` (`as_strided`) has only its size rule.
    """
    rule = SIZE_RULES.get(fn)
    if rule is not None:
        return rule(args, kwargs, concrete)
    if reads_layout:
        return None
    leaves = tree_flatten((args, kwargs))
    key = _signature(fn, leaves, len(args), tuple(kwargs), meta_device)
    found = _derived(fn, args, kwargs, leaves, key, meta_device)
    if found is None or len(found.outputs) != len(concrete):
        return None
    try:
        values = [_value_at(leaves, where) for where in found.symbols]
        if found.evaluate(values) != concrete:
            return None
        ones = {sym for sym, v, where in zip(found.names, values, found.symbols, strict=True)
                if v == 1 and not _unbacked(_number_at(leaves, where))}
        across = None
        if any(guard.free_symbols & ones for guard in found.guards):
            generic = _derived(fn, args, kwargs, leaves, key, meta_device, generic=True)
            across = _across_ones(found, generic, leaves, ones)
        shapes = across if across is not None else _bind(found, leaves)
    except _Unsupported:
        return None
    for x in leaves:  # the numbers the run used as values: the trace relies on them
        for d in x.shape if isinstance(x, TensorProxy) else (x,):
            if isinstance(d, NumberProxy) and not _symbolic(d) and d.expr is not None:
                d.python_type(d)
    return shapes


def _derived(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any], key: Any,
             meta_device: bool, generic: bool = False) -> SymbolicShapes | None:
    """`derive`'s result, cached by the call's signature `key` (None: not cached)."""
    key = key if key is None or not generic else (key, "generic")
    if key is not None and key in _CACHE:
        return _CACHE[key]
    found = derive(fn, args, kwargs, meta_device=meta_device, generic=generic)
    if key is not None:
        _CACHE[key] = found
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return found


def _across_ones(found: SymbolicShapes, generic: SymbolicShapes | None, leaves: list[Any],
                 ones: set[Any]) -> list[tuple[Any, ...] | None] | None:
    """The output shapes for sizes traced at 1 and for those sizes at 2 or more alike, or None.

    Where the kernel's decisions relied on a size traced at 1 being 1, the run at 2 (`generic`) may give
    the same shapes once those sizes are 1 again: then its shapes hold for both, under the constraint
    `either_constraint` records. Else the caller keeps the sizes at 1.
    """
    if generic is None or generic.symbols != found.symbols or len(generic.outputs) != len(found.outputs):
        return None
    sympy = _sympy()
    rename = dict(zip(generic.names, found.names, strict=True))
    at_one = {g: sympy.Integer(1) if f in ones else f for g, f in rename.items()}
    known = equalities(found.guards)
    for a, b in zip(found.outputs, generic.outputs, strict=True):
        if (a is None) != (b is None) or (a is not None and not same_at_ones(a, b, at_one, known)):
            return None
    env = _proxies(found, leaves)
    generic_env = {g: env[f] for g, f in rename.items()}
    if capturing():
        first = [*found.guards, *_range_relations(found), *(sympy.Eq(sym, 1) for sym in ones)]
        second = [*generic.guards, *_range_relations(generic)]
        either_constraint(first, env, second, generic_env, ones)
    return [None if shape is None else tuple(_number(d, generic_env) for d in shape) for shape in generic.outputs]


def _range_relations(found: SymbolicShapes) -> list[Any]:
    relations = []
    for sym, (low, high) in zip(found.names, found.ranges, strict=True):
        relations.append(sym >= low)
        if high is not None:
            relations.append(sym <= high)
    return [r for r in relations if r is not _sympy().true]


def equalities(guards: Sequence[Any]) -> dict[Any, Any]:
    """The guards that set an expression to a number, as a substitution (`(s0 // 4) -> 2`)."""
    sympy = _sympy()
    found = {}
    for expr in guards:
        if isinstance(expr, sympy.Eq):
            if isinstance(expr.rhs, sympy.Integer):
                found[expr.lhs] = expr.rhs
            elif isinstance(expr.lhs, sympy.Integer):
                found[expr.rhs] = expr.lhs
    return found


def same_at_ones(traced: Sequence[Any], generic: Sequence[Any], at_one: dict[Any, Any], known: dict[Any, Any]) -> bool:
    """Whether expressions `generic`, with the sizes traced at 1 set to 1 (`at_one` renames the others), are
    `traced` wherever the equalities `known` hold."""
    sympy = _sympy()
    return len(traced) == len(generic) and all(
        sympy.simplify((a - b.xreplace(at_one)).xreplace(known)) == 0 for a, b in zip(traced, generic, strict=True))


def either_constraint(first: Sequence[Any], env: dict[Any, Any], second: Sequence[Any], generic_env: dict[Any, Any],
                      ones: set[Any]) -> None:
    """Record that the trace holds where the sizes traced at 1 (`ones`) are 1 and the relations `first` hold, or
    where they are all 2 or more and the relations `second` (of the generic run's symbols) hold.

    The two cases part on those sizes: a call with some at 1 and others above misses."""
    sympy = _sympy()
    values = {sym: sympy.Integer(p.value if isinstance(p, NumberProxy) else p) for sym, p in env.items()}
    if any(relation.xreplace(values) is not sympy.true for relation in first):
        raise _Unsupported("a relation of the traced case is false")
    first_texts = dict.fromkeys(_condition(r, env) for r in first)  # each relation once, in order
    second_texts = dict.fromkeys([*(_condition(r, generic_env) for r in second), *(_condition(sym >= 2, env) for sym in ones)])
    add_constraint(f"(({' and '.join(first_texts)}) or ({' and '.join(second_texts)}))")


def _number_at(leaves: list[Any], where: tuple[int, int | None]) -> Any:
    leaf, dim = where
    return leaves[leaf] if dim is None else leaves[leaf].shape[dim]


def _value_at(leaves: list[Any], where: tuple[int, int | None]) -> int:
    return _number_at(leaves, where).value


def _signature(fn: Any, leaves: list[Any], nargs: int, kwnames: tuple[str, ...], meta_device: bool) -> Any:
    exprs: dict[str, int] = {}
    ids: dict[int, int] = {}
    parts: list[Any] = [fn, torch.is_grad_enabled(), torch.get_default_dtype(), nargs, kwnames, meta_device]

    def size(d: Any) -> Any:
        if _symbolic(d):
            return ("s", exprs.setdefault(d.expr, len(exprs)), d.value)
        if _unbacked(d):
            return ("u", exprs.setdefault(d.name, len(exprs)), d.value)
        return int(d.value) if isinstance(d, NumberProxy) else d

    for x in leaves:
        if isinstance(x, TensorProxy):
            parts.append(("t", ids.setdefault(id(x), len(ids)), tuple(size(d) for d in x.shape), x.dtype, x.device))
        elif isinstance(x, NumberProxy):
            parts.append(("n", size(x) if isinstance(x, IntegerProxy) else x.value, x.python_type))
        elif isinstance(x, torch.Tensor):
            parts.append(("real", id(x)))
        else:
            parts.append((type(x), x))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def derive(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
           meta_device: bool = False, generic: bool = False) -> SymbolicShapes | None:
    """Run `fn` on fake tensors with one torch symbol per distinct symbolic size among the arguments.

    Tensor proxies become fake meta tensors (the same proxy the same tensor), symbolic ints
    of value 1 or more become torch symbols (the same expression the same symbol), other
    numbers their values. None where the run fails or an output views an argument. With
    `generic`, the sizes traced at 1 are run at 2: the kernel decides as for any size of 2 or more.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    # A symbolic size traced at 1 stays a symbol: the kernel's decisions on it become guards.
    ones = any(_symbolic(d) and d.value == 1 for x in tree_flatten((args, kwargs))
               for d in (x.shape if isinstance(x, TensorProxy) else (x,)))
    env = ShapeEnv(duck_shape=False, specialize_zero_one=not ones)
    symbols: list[tuple[int, int | None]] = []
    names: list[Any] = []
    by_expr: dict[str, Any] = {}
    tensors: dict[int, torch.Tensor] = {}
    leaf_index = iter(range(1 << 62))

    def symint(x: IntegerProxy, where: tuple[int, int | None]) -> Any:
        key = x.expr if x.expr is not None else x.name
        node = by_expr.get(key)
        if node is None:
            if x.expr is None:  # a size only the trace knows: no hint, the kernel may not decide on it
                node = by_expr[key] = env.create_unbacked_symint()
                torch._check(node >= 0)
                sym = node.node.expr
            else:
                hint = 2 if generic and x.value == 1 else x.value
                sym = env.create_symbol(hint, _size_source(len(names)), dynamic_dim=DimDynamic.DYNAMIC)
                node = by_expr[key] = env.create_symintnode(sym, hint=hint)
            symbols.append(where)
            names.append(sym)
        return node

    def convert(x: Any) -> Any:
        t = type(x)
        if t is tuple or t is list:
            return t(convert(v) for v in x)
        if t is dict:
            return {k: convert(v) for k, v in x.items()}
        if t is slice:
            return slice(*(convert(v) for v in (x.start, x.stop, x.step)))
        i = next(leaf_index)
        if isinstance(x, TensorProxy):
            fake = tensors.get(id(x))
            if fake is None:
                shape = [symint(d, (i, k)) if _symbolic(d) or _unbacked(d)
                         else int(d.value) if isinstance(d, NumberProxy) else d for k, d in enumerate(x.shape)]
                fake = tensors[id(x)] = torch.empty(shape, dtype=x.dtype, device="meta")
            return fake
        if _symbolic(x) or _unbacked(x):
            return symint(x, (i, None))
        if isinstance(x, NumberProxy):
            return x.value
        return x

    try:
        with FakeTensorMode(shape_env=env, allow_non_fake_inputs=True):
            fargs = [convert(a) for a in args]
            fkwargs = {k: convert(v) for k, v in kwargs.items()}
            if meta_device:
                fkwargs["device"] = "meta"
            out = fn(*fargs, **fkwargs)
    except Exception:  # any failure on fake tensors: the caller specialises instead
        return None
    storages = {t.untyped_storage()._cdata for t in tensors.values()}
    outputs: list[tuple[Any, ...] | None] = []
    for leaf in sequence_leaves(out):
        if isinstance(leaf, torch.Tensor):
            if leaf.untyped_storage()._cdata in storages:
                return None  # a view or an argument itself: its layout decides more than its sizes
            outputs.append(tuple(_expr(d) for d in leaf.shape))
        else:
            outputs.append(None)
    guards = tuple(g.expr for g in env.guards)
    ranges = tuple(size_range(env, sym) for sym in names)
    return SymbolicShapes(tuple(symbols), tuple(outputs), guards, ranges, tuple(names))


def size_range(env: Any, sym: Any) -> tuple[int, int | None]:
    """(lowest, highest or None for unbounded) value of the torch symbol `sym` that the `ShapeEnv` `env` allows."""
    vr = env.var_to_range[sym]
    sympy = _sympy()
    low = int(vr.lower) if isinstance(vr.lower, sympy.Integer) else 0
    return low, int(vr.upper) if isinstance(vr.upper, sympy.Integer) else None


def _expr(d: Any) -> Any:
    if isinstance(d, torch.SymInt):
        return d.node.expr
    return _sympy().Integer(int(d))


@functools.cache
def _size_source(index: int) -> Any:
    """The `torch._guards.Source` a `ShapeEnv` names symbol `index` by (only its name is read here)."""
    from torch._guards import GuardSource, Source

    @dataclasses.dataclass(frozen=True)
    class SizeSource(Source):
        index: int

        @property
        def name(self) -> str:
            return f"size{self.index}"

        def guard_source(self) -> GuardSource:
            return GuardSource.LOCAL

    return SizeSource(index)


# -- back to minijit's numbers ----------------------------------------------------------------------

def _proxies(found: SymbolicShapes, leaves: list[Any]) -> dict[Any, Any]:
    """Each symbol of the run -> the number (proxy) of this call's arguments it stands for."""
    return {sym: leaves[leaf] if dim is None else leaves[leaf].shape[dim]
            for sym, (leaf, dim) in zip(found.names, found.symbols, strict=True)}


def _bind(found: SymbolicShapes, leaves: list[Any]) -> list[tuple[Any, ...] | None]:
    """The output shapes on this call's proxies; the guards and ranges recorded as constraints while capturing."""
    env = _proxies(found, leaves)
    shapes = [None if shape is None else tuple(_number(d, env) for d in shape) for shape in found.outputs]
    record_guards(found, env)
    return shapes


def record_guards(found: SymbolicShapes, env: dict[Any, Any]) -> None:
    """Record the run's guards and ranges (on the numbers `env` gives its symbols) as constraints, while capturing."""
    if capturing():
        for guard in found.guards:
            _record(guard, env)
        for sym, (low, high) in zip(found.names, found.ranges, strict=True):
            if _unbacked(env[sym]) and low <= 0 and high is None:
                continue  # what torch assumes of any size: nothing to check
            _compare(env[sym], ">=", low)
            if high is not None:
                _compare(env[sym], "<=", high)


def _compare(a: Any, op: str, b: Any) -> None:
    """Record `a <op> b` (numbers or number proxies; true on the traced values) as a constraint."""
    if not isinstance(a, NumberProxy):
        a, b, op = b, a, SWAPPED[op]
    if isinstance(a, NumberProxy) and not guarded_compare(a, op, b):
        raise _Unsupported(f"{a} {op} {b} is false")


def _record(guard: Any, env: dict[Any, Any]) -> None:
    """Record a `ShapeEnv` guard (true on the traced values) as the capture's constraints."""
    sympy = _sympy()
    if isinstance(guard, sympy.And):
        for part in guard.args:
            _record(part, env)
    elif isinstance(guard, sympy.Rel) and guard.rel_op in SWAPPED:
        _compare(_number(guard.lhs, env), guard.rel_op, _number(guard.rhs, env))
    else:
        values = {s: sympy.Integer(p.value if isinstance(p, NumberProxy) else p) for s, p in env.items()}
        if guard.xreplace(values) is not sympy.true:
            raise _Unsupported(f"guard {guard} is not true")
        add_constraint(_condition(guard, env))


def _condition(guard: Any, env: dict[Any, Any]) -> str:
    """A guard (relations joined by and, or, not) as the Python text of a constraint."""
    sympy = _sympy()
    if isinstance(guard, sympy.Rel) and guard.rel_op in SWAPPED:
        lhs, rhs = (_text(_number(x, env)) for x in (guard.lhs, guard.rhs))
        return f"({lhs} {guard.rel_op} {rhs})"
    if isinstance(guard, sympy.And | sympy.Or):
        joiner = " and " if isinstance(guard, sympy.And) else " or "
        return "(" + joiner.join(_condition(part, env) for part in guard.args) + ")"
    if isinstance(guard, sympy.Not):
        return f"(not {_condition(guard.args[0], env)})"
    raise _Unsupported(f"guard {guard}")


def _text(x: Any) -> str:
    if isinstance(x, NumberProxy):
        if x.expr is None:
            raise _Unsupported(f"{x.name} is only known when the trace runs")
        return x.expr
    return repr(x)


def _number(expr: Any, env: dict[Any, Any]) -> Any:
    """`expr` (a sympy integer expression) as an int or arithmetic on the number proxies `env` gives its symbols."""
    sympy = _sympy()
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod
    from torch.utils._sympy.functions import Max as TorchMax
    from torch.utils._sympy.functions import Min as TorchMin

    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr not in env:
            raise _Unsupported(f"unknown symbol {expr}")
        return env[expr]
    if isinstance(expr, sympy.Add):
        positive, negative = [], []
        for term in expr.args:
            if term.as_coeff_Mul()[0].is_negative:
                negative.append(_number(-term, env))
            else:
                positive.append(_number(term, env))
        total = positive[0] if positive else 0
        for x in positive[1:]:
            total = total + x
        for x in negative:
            total = total - x
        return total
    if isinstance(expr, sympy.Mul):
        product: Any = 1
        for factor in expr.args:
            product = product * _number(factor, env)
        return product
    if isinstance(expr, FloorDiv):
        return _number(expr.args[0], env) // _number(expr.args[1], env)
    if isinstance(expr, Mod | PythonMod):
        return _number(expr.args[0], env) % _number(expr.args[1], env)
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and expr.exp >= 0:
        return _number(expr.base, env) ** int(expr.exp)
    if isinstance(expr, sympy.Max | sympy.Min | TorchMax | TorchMin) and len(expr.args) == 2:
        # max(a, b) = (a + b + |a - b|) // 2 (exact for ints), min likewise with the difference taken away.
        a, b = (_number(x, env) for x in expr.args)
        spread = abs(a - b)
        return (a + b + spread) // 2 if isinstance(expr, sympy.Max | TorchMax) else (a + b - spread) // 2
    raise _Unsupported(f"{type(expr).__name__} in {expr}")
