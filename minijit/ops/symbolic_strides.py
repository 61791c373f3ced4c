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
  input laid out otherwise falls back); an input with constant sizes enters with its own
  strides, guarded as `minijit.ops.strides` guards them; a symbolic size traced at 1 stays
  a symbol, and where torch's rules rely on it being 1 (contiguity ignores the stride of a
  size-1 dim) they guard it;
- a number argument is its expression (`(x.shape[0] * 4)`) evaluated on the fake inputs,
  so every size the replay sees is an expression of the input symbols;
- each stride of the result comes back as a sympy expression of the symbols, rebuilt as
  arithmetic on minijit's number proxies; every decision torch's stride rules took on a
  size (`Eq(s0, 1)`, `s0 >= 2`) is a `ShapeEnv` guard, recorded as a constraint of the
  capture, so the strides are used only for sizes where torch decides the same way.

The fake tensors of one capture are kept (one replay per op however many queries ask).
Where anything cannot be followed (an op without an eager implementation or that fails on
fake tensors, a number without an expression, a guard minijit cannot express) the result
is None and the caller specialises as before: never a stride that is wrong for some input.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher

from minijit.ir import BoundSymbol, IntegerProxy, NumberProxy, Proxy, TensorProxy, Trace, tree_flatten, tree_map
from minijit.ir.context import add_layout_check, capturing
from minijit.ops.registry import eager_impl
from minijit.ops.strides import _guard_layout, contiguous_strides, outside_inference_mode
from minijit.ops.symbolic_sizes import _compare, _number, _record, _size_source, _sympy, _Unsupported

__all__ = ["symbolic_layout", "symbolic_viewable"]


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

    def __init__(self, trace: Trace):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self._trace = weakref.ref(trace)  # the session is kept by the trace's capture state, not the other way
        # Sizes traced at 1 stay symbols too: the rules' decisions on them become guards (`Eq(s0, 1)`).
        self.env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        self.fakes: dict[int, torch.Tensor] = {}
        self.symbols: dict[Any, IntegerProxy] = {}  # sympy symbol -> the input size it stands for
        self.by_expr: dict[str, Any] = {}  # an input size's expression -> its SymInt
        self.inputs: dict[int, TensorProxy] = {}
        self.by_name: dict[str, Proxy] = {}
        self.used: dict[int, TensorProxy] = {}  # the inputs given fakes: their layouts join the guard
        self.producers: dict[int, BoundSymbol] = {}
        self.scanned = 0
        self.failed: set[int] = set()
        self.recorded = 0  # the ShapeEnv guards already recorded as constraints

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
            sym = self.env.create_symbol(d.value, _size_source(len(self.symbols)))
            node = self.by_expr[d.expr] = self.env.create_symintnode(sym, hint=d.value)
            self.symbols[sym] = d
        return node

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
                    raise _Failed(f"input {p.name} with symbolic sizes is not contiguous")
                fake = torch.empty([self.size(d) for d in p.shape], dtype=p.dtype, device=p.device)
            else:
                extent = offset + 1 + sum((n - 1) * abs(s) for n, s in zip(concrete, strides, strict=True)) \
                    if all(concrete) else offset
                fake = torch.empty(extent, dtype=p.dtype, device=p.device).as_strided(concrete, strides, offset)
        self.used[id(p)] = p
        return fake

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
            with outside_inference_mode(), torch.no_grad(), enable_python_dispatcher(), _quiet(), self.mode:
                args, kwargs = tree_map(convert, (bsym.args, bsym.kwargs))
                result = tree_flatten(impl(*args, **kwargs))
        except _Failed:
            raise
        except Exception as e:  # any failure on fake tensors: not followed
            raise _Failed(f"{bsym.sym.name} failed on fake tensors: {e}") from e
        outs = tree_flatten(bsym.output)
        if len(result) != len(outs):
            raise _Failed(f"{bsym.sym.name}: {len(result)} results, not {len(outs)}")
        for out, value in zip(outs, result, strict=True):
            if isinstance(out, TensorProxy) and isinstance(value, torch.Tensor):
                if tuple(_hint(d) for d in value.shape) != tuple(int(_value(d)) for d in out.shape):
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


def _session(trace: Trace) -> _Session:
    """The capture's session (`CaptureState.strides_session`); a trace recorded apart (an extension's meta)
    gets one of its own for the question."""
    state = trace.capture
    if state is None:
        return _Session(trace)
    if state.strides_session is None:
        state.strides_session = _Session(trace)
    return state.strides_session


def symbolic_layout(p: TensorProxy, trace: Trace) -> tuple[tuple[Any, ...], Any] | None:
    """`p`'s eager strides and storage offset as ints and number proxies that follow the trace's symbolic
    sizes; None where they cannot be followed soundly (the caller specialises on the sizes).

    Only while capturing: the guards torch's stride rules took become the capture's constraints, and the
    inputs' layouts the replay assumed join the cache entry's guard.
    """
    try:
        found = _fake_as_eager(p, trace)
        if found is None:
            return None
        session, fake = found
        strides = [_symbolic_int(s) for s in fake.stride()]
        offset = _symbolic_int(fake.storage_offset())
        env = _settle(session)
        return tuple(_number(s, env) for s in strides), _number(offset, env)
    except (_Failed, _Unsupported):
        return None


def _fake_as_eager(p: TensorProxy, trace: Trace) -> tuple[_Session, torch.Tensor] | None:
    """The capture's session and `p` replayed on its fake tensors, where capturing and where torch's fake
    kernels laid `p` out as its eager kernels (on meta tensors) did; else None. Raises `_Failed`/`_Unsupported`
    where the replay cannot be followed."""
    if not capturing():
        return None
    session = _session(trace)
    session.refresh()
    fake = session.fake(p)
    layout = trace.layouts.get(p)
    if layout is None or (tuple(_hint(s) for s in fake.stride()), _hint(fake.storage_offset())) != (
            layout.strides, layout.offset):
        return None
    return session, fake


def symbolic_viewable(p: TensorProxy, trace: Trace, shape: tuple[Any, ...]) -> bool:
    """Whether `p.view(shape)` is possible for every call whose sizes meet the constraints this records
    (torch's view rule run on `p`'s layout with symbolic sizes); False where that cannot be followed."""
    try:
        found = _fake_as_eager(p, trace)
        if found is None:
            return False
        session, fake = found
        sizes = [session.number(d) if isinstance(d, NumberProxy) else d for d in shape]
        try:
            with outside_inference_mode(), torch.no_grad(), enable_python_dispatcher(), _quiet(), session.mode:
                fake.view(sizes)
        except _Failed:
            raise
        except Exception as e:
            raise _Failed(f"view on fake tensors: {e}") from e
        _settle(session)
        return True
    except (_Failed, _Unsupported):
        return False


def _settle(session: _Session) -> dict[Any, IntegerProxy]:
    """Record the `ShapeEnv`'s new guards and its symbols' ranges as constraints, and the guard of the inputs'
    layouts the replay assumed; the symbols' proxies."""
    env = dict(session.symbols)
    guards = session.env.guards
    for guard in guards[session.recorded:]:
        _record(guard.expr, env)
    session.recorded = len(guards)
    sympy = _sympy()
    for sym, size in env.items():
        vr = session.env.var_to_range[sym]
        low = int(vr.lower) if isinstance(vr.lower, sympy.Integer) else 0
        _compare(size, ">=", max(low, min(size.value, 2)))  # at least 2, or 1 for a size traced at 1
        if isinstance(vr.upper, sympy.Integer):
            _compare(size, "<=", int(vr.upper))
    for q in session.used.values():
        _guard_input(q, session.trace)
    return env


def _symbolic_int(x: Any) -> Any:
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return _sympy().Integer(int(x))


def _guard_input(p: TensorProxy, trace: Trace) -> None:
    """The guard checks the layout the replay gave input `p`: contiguous with offset 0 for symbolic sizes
    (the strides exactly, size-1 dims included), its own layout otherwise."""
    if not any(isinstance(d, NumberProxy) for d in p.shape):
        _guard_layout(p, trace, offset_matters=True)
        return
    texts = [d.expr if isinstance(d, NumberProxy) else repr(d) for d in p.shape]
    strides = []
    for k in range(len(texts)):
        rest = [t for t in texts[k + 1:] if t != "1"]
        strides.append(" * ".join(f"({t})" for t in rest) if rest else "1")
    add_layout_check(f"{p.name}.stride() == ({''.join(s + ', ' for s in strides)})")
    add_layout_check(f"{p.name}.storage_offset() == 0")
