"""Strides that follow symbolic sizes: a computed tensor's layout as expressions of the trace's sizes.

Under `cache="symbolic values"` a layout query on a computed tensor (`y.stride()` where
`y = x.transpose(1, 2).reshape(B * H, T, D)`) would give strides that hold for the traced
sizes only, and the guard would then have to check the sizes (one trace per size). Instead
`symbolic_layout` replays the ops that made the tensor, with their eager implementations
(as `minijit.ops.strides` does on meta tensors), on fake tensors whose sizes are torch
symbols (`FakeTensorMode` with a `ShapeEnv`, as `minijit.ops.symbolic_sizes` does for one
op's output sizes):

- a trace input with symbolic sizes enters as a contiguous fake tensor with storage offset
  0, and the guard checks exactly that: its strides are the products of its sizes (an
  input laid out otherwise falls back, but for one the queried tensor's layout has as an
  order-only source, `minijit.ops.strides`: it enters contiguous, and the guard checks
  only `_row_major`); an input with constant sizes enters with its own
  strides, guarded as `minijit.ops.strides` guards them; a symbolic size traced at 1 stays
  a symbol, and where torch's rules rely on it being 1 (contiguity ignores the stride of a
  size-1 dim) they guard it;
- a number argument is its expression (`(x.shape[0] * 4)`) evaluated on the fake inputs,
  so every size the replay sees is an expression of the input symbols;
- each stride of the result comes back as a sympy expression of the symbols, rebuilt as
  arithmetic on minijit's number proxies; every decision torch's stride rules took on a
  size (`Eq(s0, 1)`, `s0 >= 2`) is a `ShapeEnv` guard, recorded as a constraint of the
  capture, so the strides are used only for sizes where torch decides the same way;
- where an answer relied on a size traced at 1 being 1, the question is asked again of a
  generic session, which replays those sizes at 2; where its answer, with those sizes set
  back to 1, is the same expression, it holds for both, and the constraint recorded is
  "those sizes are 1 and the first session's guards hold, or they are all 2 or more and the
  generic session's guards hold" (`_decide`): a batch of 1 shares the trace of larger ones.
  Else the sizes stay 1. (`minijit.ops.symbolic_sizes` does the same for an opaque op's
  output sizes.)

The fake tensors of one capture are kept (one replay per op however many queries ask).
Where anything cannot be followed (an op without an eager implementation or that fails on
fake tensors, a number without an expression, a guard minijit cannot express) the result
is None and the caller specialises as before: never a stride that is wrong for some input.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher

from minijit.ir import BoundSymbol, IntegerProxy, NumberProxy, Proxy, TensorProxy, Trace, tree_flatten, tree_map
from minijit.ir.context import add_layout_check, capturing
from minijit.ir.layouts import contiguous_strides, guard_layout, guard_row_major, outside_inference_mode, row_major
from minijit.ops.eager_facts import eager_impl
from minijit.ops.iterator_layouts import replay_layouts, results_as_tuple
from minijit.ops.symbolic_sizes import (
    _number,
    _record,
    _size_source,
    _sympy,
    _Unsupported,
    either_constraint,
    equalities,
    same_at_ones,
    size_range,
)

__all__ = ["symbolic_contiguous", "symbolic_layout", "symbolic_viewable"]


@contextmanager
def _quiet() -> Iterator[None]:
    """Keep torch's fake tensors from logging the kernels that fail on them (a failure here is a fallback)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Failed(Exception):
    """Something the replay on fake tensors cannot follow soundly."""


class _Session:
    """One capture's fake tensors with symbolic sizes: a `ShapeEnv`, the fakes by proxy, the symbols' proxies."""

    def __init__(self, trace: Trace, generic: bool = False):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self._trace = weakref.ref(trace)  # the session is kept by the trace's capture state, not the other way
        # A generic session replays sizes traced at 1 at 2: torch's rules then decide as for any size >= 2.
        self.generic = generic
        # Sizes traced at 1 stay symbols too: the rules' decisions on them become guards (`Eq(s0, 1)`).
        self.env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        self.fakes: dict[int, torch.Tensor] = {}
        self.symbols: dict[Any, IntegerProxy] = {}  # sympy symbol -> the input size it stands for
        self.by_expr: dict[str, Any] = {}  # an input size's expression -> its SymInt
        self.inputs: dict[int, TensorProxy] = {}
        self.by_name: dict[str, Proxy] = {}
        self.used: dict[int, TensorProxy] = {}  # the inputs given fakes: their layouts join the guard
        # The inputs some queried tensor's layout was worked out from as full sources (not order-only ones): their
        # layouts are guarded exactly, the others' only `row_major`. None while a query's sources are unknown.
        self.strict: set[int] = set()
        self.query_sources: set[int] | None = None
        self.loose: set[int] = set()  # the inputs laid out otherwise that entered as contiguous fakes
        self.producers: dict[int, BoundSymbol] = {}
        self.scanned = 0
        self.failed: set[int] = set()
        self.recorded = 0  # the ShapeEnv guards already recorded as constraints
        self.either_recorded = False  # whether some were recorded in one case of an either-or constraint only

    @property
    def trace(self) -> Trace:
        trace = self._trace()
        if trace is None:
            raise _Failed("the trace is gone")
        return trace

    def refresh(self) -> None:
        """Take in the trace's inputs (a capture may add some as it meets them)."""
        args = self.trace.args
        if len(self.by_name) != len(args):
            self.inputs = {id(a): a for a in args if isinstance(a, TensorProxy)}
            self.by_name = {a.name: a for a in args if isinstance(a, Proxy)}

    # -- inputs ------------------------------------------------------------------------------

    def size(self, d: Any) -> Any:
        """An input's size: a SymInt for a symbolic size of 2 or more (the same expression the same symbol)."""
        if not isinstance(d, NumberProxy):
            return d
        if not isinstance(d, IntegerProxy) or d.expr is None:
            raise _Failed(f"size {d.name} without an expression")
        if d.value < 1:
            return int(d)  # 0: specialised (symbolic sizes keep 0 constant)
        node = self.by_expr.get(d.expr)
        if node is None:
            hint = self.hint(d)
            sym = self.env.create_symbol(hint, _size_source(len(self.symbols)))
            node = self.by_expr[d.expr] = self.env.create_symintnode(sym, hint=hint)
            self.symbols[sym] = d
        return node

    def hint(self, d: NumberProxy) -> int:
        """The value size `d` is replayed at: the traced one, but 2 for one traced at 1 in a generic session."""
        return 2 if self.generic and d.value == 1 else int(d.value)

    def ones(self) -> set[Any]:
        """The symbols of the sizes traced at 1."""
        return {sym for sym, d in self.symbols.items() if d.value == 1}

    def relied_on_ones(self) -> set[Any]:
        """The symbols of the sizes traced at 1 that a guard of this session says something of (beyond their
        being sizes): its later answers may rely on those sizes being 1."""
        ones = self.ones()
        return set().union(*(guard.expr.free_symbols & ones for guard in self.env.guards)) if ones else set()

    def at_point(self, d: Any) -> int:
        """Size `d` of the trace at the sizes this session replays (the traced ones, but for a generic session)."""
        if not self.generic:
            return int(_value(d))
        return _hint(self.number(d)) if isinstance(d, NumberProxy) else int(d)

    def input_fake(self, p: TensorProxy) -> torch.Tensor:
        layout = self.trace.layouts.get(p)
        if layout is None:
            raise _Failed(f"input {p.name}'s layout is unknown")
        strides, offset = layout.strides, layout.offset
        concrete = tuple(int(d.value) if isinstance(d, NumberProxy) else d for d in p.shape)
        with enable_python_dispatcher(), _quiet(), self.mode:
            if any(isinstance(d, NumberProxy) for d in p.shape):
                if 0 in concrete:
                    raise _Failed(f"input {p.name} is empty")
                if strides != contiguous_strides(concrete) or offset != 0:
                    self._enter_loose(p, concrete, strides)
                fake = torch.empty([self.size(d) for d in p.shape], dtype=p.dtype, device=p.device)
            else:
                extent = offset + 1 + sum((n - 1) * abs(s) for n, s in zip(concrete, strides, strict=True)) \
                    if all(concrete) else offset
                fake = torch.empty(extent, dtype=p.dtype, device=p.device).as_strided(concrete, strides, offset)
        self.used[id(p)] = p
        return fake

    def _enter_loose(self, p: TensorProxy, sizes: tuple[int, ...], strides: tuple[int, ...]) -> None:
        """Let input `p`, with symbolic sizes but not contiguous, enter as a contiguous fake: only where the
        queried tensor's layout was worked out from it as an order-only source, and it is `row_major`."""
        if self.query_sources is None or id(p) in self.query_sources or not row_major(sizes, strides):
            raise _Failed(f"input {p.name} with symbolic sizes is not contiguous")
        self.loose.add(id(p))

    def ask_about(self, p: TensorProxy) -> None:
        """Take in the full sources of `p`'s layout before a question on `p`; raises `_Failed` where one of them
        entered as a contiguous fake though laid out otherwise (a fake `p` would then be laid out wrongly)."""
        layout = self.trace.layouts.get(p)
        if layout is None:
            self.query_sources = None
            return
        full = {id(q) for q in layout.sources}
        if full & self.loose:
            raise _Failed(f"{p.name} is worked out from an input that entered as a contiguous fake")
        self.query_sources = full
        self.strict |= full

    def guard_inputs(self) -> None:
        """Add the guard of the layouts the replay assumed for the inputs given fakes."""
        for q in self.used.values():
            _guard_input(q, self.trace, row_major_only=id(q) not in self.strict)

    # -- computed tensors ----------------------------------------------------------------------

    def fake(self, p: TensorProxy) -> torch.Tensor:
        """The fake tensor of `p`, replaying the ops that made it (and their inputs') once."""
        found = self.fakes.get(id(p))
        if found is not None:
            return found
        if id(p) in self.failed:
            raise _Failed(f"{p.name} was not followed")
        try:
            fake = self.input_fake(p) if id(p) in self.inputs else self._replay_producer(p)
        except _Failed:
            self.failed.add(id(p))
            raise
        self.fakes[id(p)] = fake
        return fake

    def _producer(self, p: TensorProxy) -> BoundSymbol:
        bsyms = self.trace.bound_symbols
        for bsym in bsyms[self.scanned:]:
            for out in bsym.proxy_outputs():
                self.producers.setdefault(id(out), bsym)
        self.scanned = len(bsyms)
        found = self.producers.get(id(p))
        if found is None:
            raise _Failed(f"{p.name} has no producer in the trace")
        return found

    def _replay_producer(self, p: TensorProxy) -> torch.Tensor:
        # An iterative walk: a deep model would overflow Python's stack if each producer recursed.
        pending = [p]
        while pending:
            q = pending[-1]
            if id(q) in self.fakes:
                pending.pop()
                continue
            if id(q) in self.failed:
                raise _Failed(f"{q.name} was not followed")
            if id(q) in self.inputs:
                self.fake(q)
                pending.pop()
                continue
            bsym = self._producer(q)
            missing = [a for a in bsym.proxy_args() if isinstance(a, TensorProxy) and id(a) not in self.fakes]
            if missing:
                if len(pending) > 100_000:
                    raise _Failed("too deep")
                pending.extend(missing)
                continue
            self._replay(bsym)
            pending.pop()
            if id(q) not in self.fakes:
                self.failed.add(id(q))
                raise _Failed(f"{q.name} not made by its producer's replay")
        return self.fakes[id(p)]

    def number(self, x: NumberProxy) -> Any:
        """A number argument on fake tensors: its expression evaluated on the fake inputs."""
        if not isinstance(x, IntegerProxy):
            return x.value  # a float or bool argument: no stride rule reads it as a size
        if x.expr is None:
            raise _Failed(f"{x.name} is only known when the trace runs")
        return _eval(x.expr, self)

    def _replay(self, bsym: BoundSymbol) -> None:
        impl = eager_impl(bsym.sym)
        if impl is None:
            raise _Failed(f"{bsym.sym.name} has no eager implementation")
        if any(isinstance(a, Proxy) and not isinstance(a, TensorProxy | NumberProxy) for a in bsym.proxy_args()):
            raise _Failed(f"{bsym.sym.name} takes other proxies")

        def convert(x: Any) -> Any:
            if isinstance(x, TensorProxy):
                return self.fakes[id(x)]
            if isinstance(x, NumberProxy):
                return self.number(x)
            return x

        try:
            # The Python dispatcher lets the kernels written for symbolic sizes run (`constant_pad_nd`'s).
            with outside_inference_mode(), torch.no_grad(), enable_python_dispatcher(), _quiet(), self.mode, \
                    replay_layouts(bsym, impl):
                args, kwargs = tree_map(convert, (bsym.args, bsym.kwargs))
                result = tree_flatten(results_as_tuple(impl(*args, **kwargs)))
        except _Failed:
            raise
        except Exception as e:  # any failure on fake tensors: not followed
            raise _Failed(f"{bsym.sym.name} failed on fake tensors: {e}") from e
        outs = tree_flatten(bsym.output)
        if len(result) != len(outs):
            raise _Failed(f"{bsym.sym.name}: {len(result)} results, not {len(outs)}")
        for out, value in zip(outs, result, strict=True):
            if isinstance(out, TensorProxy) and isinstance(value, torch.Tensor):
                if tuple(_hint(d) for d in value.shape) != tuple(self.at_point(d) for d in out.shape):
                    raise _Failed(f"{bsym.sym.name}: the fake shape is not the traced one")
                self.fakes.setdefault(id(out), value)


def _value(d: Any) -> Any:
    return d.value if isinstance(d, NumberProxy) else d


def _hint(d: Any) -> int:
    """A size's value on the traced sizes, without a guard."""
    if isinstance(d, torch.SymInt):
        hint = d.node.hint
        if hint is None:
            raise _Failed("a size without a hint")
        return int(hint)
    return int(d)


class _Names(dict):
    """The names an expression of the trace's numbers reads: the trace inputs as fakes or SymInts."""

    def __init__(self, session: _Session):
        super().__init__()
        self.session = session

    def __missing__(self, name: str) -> Any:
        p = self.session.by_name.get(name)
        if isinstance(p, TensorProxy):
            value = self.session.fake(p)
        elif isinstance(p, IntegerProxy) and p.expr == name:
            value = self.session.size(p)
        else:
            raise _Failed(f"{name} in an expression")
        self[name] = value
        return value


_BUILTINS = {"abs": abs, "min": torch.sym_min, "max": torch.sym_max, "int": int}


def _eval(expr: str, session: _Session) -> Any:
    names = _Names(session)
    try:
        return eval(expr, {"__builtins__": _BUILTINS}, names)  # minijit's own expression text
    except _Failed:
        raise
    except Exception as e:
        raise _Failed(f"{expr}: {e}") from e


def _session(trace: Trace, generic: bool = False) -> _Session:
    """The capture's session (`CaptureState.strides_session`), or its generic one; a trace recorded apart
    (an extension's meta) gets one of its own for the question."""
    state = trace.capture
    if state is None:
        return _Session(trace, generic)
    if state.strides_session is None:
        state.strides_session = {}
    found = state.strides_session.get(generic)
    if found is None:
        found = state.strides_session[generic] = _Session(trace, generic)
    return found


def symbolic_layout(p: TensorProxy, trace: Trace) -> tuple[tuple[Any, ...], Any] | None:
    """`p`'s eager strides and storage offset as ints and number proxies that follow the trace's symbolic
    sizes; None where they cannot be followed soundly (the caller specialises on the sizes).

    Only while capturing: the guards torch's stride rules took become the capture's constraints, and the
    inputs' layouts the replay assumed join the cache entry's guard.
    """
    def ask(session: _Session, fake: torch.Tensor) -> tuple[Any, ...]:
        return (*(_symbolic_int(s) for s in fake.stride()), _symbolic_int(fake.storage_offset()))

    try:
        found = _decide(p, trace, ask)
        if found is None:
            return None
        answer, env = found
        numbers = [_number(x, env) for x in answer]
        return tuple(numbers[:-1]), numbers[-1]
    except (_Failed, _Unsupported):
        return None


def _fake(p: TensorProxy, trace: Trace, generic: bool = False,
          size_one_strides_matter: bool = True) -> tuple[_Session, torch.Tensor] | None:
    """The capture's session (or its generic one) and `p` replayed on its fake tensors, where capturing and
    where torch's fake kernels laid `p` out as its eager kernels (on meta tensors) did (for a generic
    session that is checked on its answers instead: `_decide`); else None. Raises `_Failed`/`_Unsupported`
    where the replay cannot be followed."""
    if not capturing():
        return None
    session = _session(trace, generic)
    session.refresh()
    session.ask_about(p)
    fake = session.fake(p)
    if generic:
        return session, fake
    layout = trace.layouts.get(p)
    if layout is None or _hint(fake.storage_offset()) != layout.offset or any(
            _hint(s) != t for s, t, n in zip(fake.stride(), layout.strides, fake.shape, strict=True)
            if size_one_strides_matter or _hint(n) != 1):
        return None
    return session, fake


def symbolic_viewable(p: TensorProxy, trace: Trace, shape: tuple[Any, ...]) -> bool:
    """Whether `p.view(shape)` is possible for every call whose sizes meet the constraints this records
    (torch's view rule run on `p`'s layout with symbolic sizes); False where that cannot be followed."""
    def ask(session: _Session, fake: torch.Tensor) -> tuple[Any, ...]:
        sizes = [session.number(d) if isinstance(d, NumberProxy) else d for d in shape]
        try:
            with outside_inference_mode(), torch.no_grad(), enable_python_dispatcher(), _quiet(), session.mode:
                fake.view(sizes)
        except _Failed:
            raise
        except Exception as e:
            raise _Failed(f"view on fake tensors: {e}") from e
        return ()

    try:
        return _decide(p, trace, ask, size_one_strides_matter=False) is not None
    except (_Failed, _Unsupported):
        return False


def symbolic_contiguous(p: TensorProxy, trace: Trace, memory_format: torch.memory_format) -> bool | None:
    """Whether `p.is_contiguous(memory_format)` for every call whose sizes meet the constraints this records
    (torch's contiguity rule run on `p`'s layout with symbolic sizes); None where that cannot be followed."""
    def ask(session: _Session, fake: torch.Tensor) -> tuple[Any, ...]:
        try:
            with outside_inference_mode(), enable_python_dispatcher(), _quiet(), session.mode:
                answer = bool(fake.is_contiguous(memory_format=memory_format))
        except Exception as e:
            raise _Failed(f"is_contiguous on fake tensors: {e}") from e
        return (_sympy().Integer(int(answer)),)

    try:
        found = _decide(p, trace, ask, size_one_strides_matter=False)
    except (_Failed, _Unsupported):
        return None
    return None if found is None else bool(found[0][0])


def _decide(p: TensorProxy, trace: Trace, ask: Any,
            size_one_strides_matter: bool = True) -> tuple[tuple[Any, ...], dict[Any, IntegerProxy]] | None:
    """`ask(session, fake of p)`'s answer (sympy expressions) and the symbols' proxies, its guards recorded;
    None where `p` cannot be followed.

    Torch's rules decide some questions on whether a size is 1 (contiguity ignores a size-1 dim's stride).
    Where the answer relied on a size traced at 1 being 1, the question is asked again of the generic
    session, which replays those sizes at 2; where its answer is the same expression once those sizes are
    1, the answer holds for both, and the constraint recorded is: the sizes are 1 and the first session's
    guards hold, or they are at least 2 and the generic session's guards hold. Else the sizes stay 1.
    """
    found = _fake(p, trace, size_one_strides_matter=size_one_strides_matter)
    if found is None:
        return None
    session, fake = found
    answer = ask(session, fake)
    relied_on = session.relied_on_ones()
    if relied_on:
        across = _across_ones(p, trace, ask, session, answer)
        if across is not None:
            return across
        # Where an earlier answer's constraint let those sizes be 2 or more, this one holds at 1 only: all the
        # session relied on is pinned. Else its guards, recorded, keep what this answer relied on.
        pin = [_sympy().Eq(sym, 1) for sym in relied_on] if session.either_recorded else []
        return answer, _settle(session, pin=pin)
    return answer, _settle(session)


def _across_ones(p: TensorProxy, trace: Trace, ask: Any, session: _Session,
                 answer: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[Any, IntegerProxy]] | None:
    """`_decide`'s answer for sizes traced at 1 and for those sizes at 2 or more, or None (see `_decide`)."""
    try:
        found = _fake(p, trace, generic=True)
        if found is None:
            return None
        generic, fake = found
        other = ask(generic, fake)
    except (_Failed, _Unsupported):
        return None
    sympy = _sympy()
    ones = session.ones()
    by_expr = {d.expr: sym for sym, d in session.symbols.items()}
    renamed = {sym: by_expr.get(d.expr) for sym, d in generic.symbols.items()}
    if None in renamed.values():
        return None  # a size the traced session never met
    at_one = {sym: sympy.Integer(1) if renamed[sym] in ones else renamed[sym] for sym in generic.symbols}
    if not same_at_ones(answer, other, at_one, equalities([g.expr for g in session.env.guards])):
        return None
    first = [*_new_guards(session), *(sympy.Eq(sym, 1) for sym in ones)]
    generic_env = dict(generic.symbols)
    either_constraint(first, dict(session.symbols), _new_guards(generic), generic_env, ones)
    for s in (session, generic):
        s.recorded = len(s.env.guards)
        s.either_recorded = True
        s.guard_inputs()
    return other, generic_env


def _new_guards(session: _Session) -> list[Any]:
    """The session's guards not recorded yet and its symbols' ranges, as sympy relations."""
    sympy = _sympy()
    found = [guard.expr for guard in session.env.guards[session.recorded:]]
    for sym, d in session.symbols.items():
        low, high = size_range(session.env, sym)
        found.append(sym >= max(low, min(session.hint(d), 2)))  # at least 2, or 1 for a size traced at 1
        if high is not None:
            found.append(sym <= high)
    return [relation for relation in found if relation is not sympy.true]


def _settle(session: _Session, pin: Sequence[Any] = ()) -> dict[Any, IntegerProxy]:
    """Record the `ShapeEnv`'s new guards and its symbols' ranges (and the relations `pin`) as constraints,
    and the guard of the inputs' layouts the replay assumed; the symbols' proxies."""
    env = dict(session.symbols)
    for guard in [*_new_guards(session), *pin]:
        _record(guard, env)
    session.recorded = len(session.env.guards)
    session.guard_inputs()
    return env


def _symbolic_int(x: Any) -> Any:
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return _sympy().Integer(int(x))


def _guard_input(p: TensorProxy, trace: Trace, row_major_only: bool = False) -> None:
    """The guard checks the layout the replay gave input `p`: contiguous with offset 0 for symbolic sizes
    (the strides exactly, size-1 dims included), its own layout otherwise; only that it is `row_major` where
    `row_major_only` (no queried tensor's layout depends on more of it)."""
    if row_major_only:
        guard_row_major(p)
        return
    if not any(isinstance(d, NumberProxy) for d in p.shape):
        guard_layout(p, trace, offset_matters=True, strides_matter=True)
        return
    texts = [d.expr if isinstance(d, NumberProxy) else repr(d) for d in p.shape]
    strides = []
    for k in range(len(texts)):
        rest = [t for t in texts[k + 1:] if t != "1"]
        strides.append(" * ".join(f"({t})" for t in rest) if rest else "1")
    add_layout_check(f"{p.name}.stride() == ({''.join(s + ', ' for s in strides)})")
    add_layout_check(f"{p.name}.storage_offset() == 0")
