"""Sizes known only when the trace runs: the results of `nonzero`, `torch.where(mask)`, `x[mask]`, `unique`.

Such an op's result has as many elements as its input has True (or distinct) values. Rather than a trace
per count, the capture records it with each size that depends on the values as a fresh `UnbackedSize` (what
torch calls an *unbacked* symbolic int), bound in the trace by `prims.size` of the first result holding it,
right after the op:

    (t3, t4) = torch.where(mask)  # t3: cpu i64[i7], t4: cpu i64[i7]
    i7 = prims.size(t3, 0)

- **Which sizes, and which are one size**, come from torch's own kernel run on fake tensors: one session per
  capture (`CaptureState.unbacked_session`: one `ShapeEnv`, a fake tensor per proxy until a write), so that
  torch's nonzero memo gives `torch.where(mask)` and then `x[mask]` one size; an input's symbolic sizes stay
  the expressions they are (`x[mask]` of a `(b, t, c)` x by a `(b, t)` mask is `(u0, c)`), and a size only the
  trace knows among the inputs is the unbacked symbol it was made as.
- **Its value is never a guard.** Nothing keys or guards on it: it is a number the trace computes, like
  `Tensor.item()` (`data_dependent`). Ops compute with it as with any symbolic size (a size is the same size
  only as itself: `same_size`). A comparison of it (a Python `if n > 0:`, an op's rule) reads the outcome on
  the capture's real values, which the trace checks (`prims.check_value`): one trace per outcome.
- **The capture still runs the op on the real values**, once (`ValueReader.call_with_shapes_seen`): the
  size seen is the proxy's `value`, so that whatever the capture decides on it agrees with the call traced.

Where torch's kernel cannot follow a size (a formula of a fresh size rather than the size itself, a guard on
one, a kernel that fails on fake tensors) the caller checks the shapes seen instead (a trace per shape).
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir import IntegerProxy, TensorProxy, tree_flatten
from minijit.ir.containers import sequence_leaves
from minijit.ir.context import current_trace, where_now
from minijit.ir.proxies import UnbackedSize, data_dependent, number_value
from minijit.ops import aten_prims
from minijit.ops.meta_run import kernel_reads_values
from minijit.ops.symbolic_sizes import (
    SymbolicShapes,
    _expr,
    _number,
    _size_source,
    _sympy,
    _Unsupported,
    record_guards,
    size_range,
)

__all__ = ["bind_unbacked_sizes", "unbacked_shapes"]


class _Session:
    """A capture's fake tensors for its data-dependent ops (`CaptureState.unbacked_session`): one `ShapeEnv` whose
    symbols stand for the capture's symbolic sizes, and one fake tensor per proxy until a write (torch's fake
    `nonzero` keeps its count on its input: `torch.where(mask)` then `x[mask]` give one size)."""

    def __init__(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        self.fakes: dict[int, tuple[TensorProxy, torch.Tensor]] = {}
        self.nodes: dict[str, Any] = {}  # a size's expression (an unbacked one's name) -> its torch SymInt
        self.numbers: dict[Any, IntegerProxy] = {}  # a torch symbol -> the proxy it stands for

    def forget(self) -> None:
        """Drop the fake tensors (a write may change a tensor whose count a fake one keeps)."""
        self.fakes.clear()

    def symint(self, x: IntegerProxy, created: list[Any]) -> Any:
        """The SymInt of `x`: a symbol per expression, an unbacked one for a size only the trace knows."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        key = x.expr if x.expr is not None else x.name
        node = self.nodes.get(key)
        if node is None:
            if x.expr is None:
                node = self.env.create_unbacked_symint()
                torch._check(node >= 0)
            else:
                sym = self.env.create_symbol(x.value, _size_source(len(self.nodes)), dynamic_dim=DimDynamic.DYNAMIC)
                node = self.env.create_symintnode(sym, hint=x.value)
                created.append(sym)
            self.nodes[key] = node
            self.numbers[node.node.expr] = x
        return node

    def fake(self, x: Any, created: list[Any]) -> Any:
        """`x` (a tree of arguments) with fake tensors for tensor proxies and SymInts for symbolic sizes."""
        t = type(x)
        if t is tuple or t is list:
            return t(self.fake(v, created) for v in x)
        if t is dict:
            return {k: self.fake(v, created) for k, v in x.items()}
        if t is slice:
            return slice(*(self.fake(v, created) for v in (x.start, x.stop, x.step)))
        if isinstance(x, TensorProxy):
            found = self.fakes.get(id(x))
            if found is None:
                shape = [self.symint(d, created) if _follows(d) else number_value(d) for d in x.shape]
                with self.mode:
                    found = self.fakes[id(x)] = (x, torch.empty(shape, dtype=x.dtype, device="meta"))
            return found[1]
        return self.symint(x, created) if _follows(x) else number_value(x)


def _follows(x: Any) -> bool:
    """Whether number `x` is a size the session follows as a symbol (not a constant, not a value read)."""
    return isinstance(x, IntegerProxy) and ((x.expr is not None and x.value >= 1) or data_dependent(x))


def _session() -> _Session:
    trace = current_trace()
    state = trace.capture if trace is not None else None
    if state is None:
        return _Session()
    if state.unbacked_session is None:
        state.unbacked_session = _Session()
    return state.unbacked_session


def unbacked_shapes(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], what: str,
                    real: list[torch.Tensor]) -> tuple[list[tuple[Any, ...]], list[IntegerProxy]] | None:
    """Per tensor of `real` (the results of `fn(*args, **kwargs)` on the real values, flattened), its shape with
    a fresh `IntegerProxy` for each size that depends on the values, and those proxies; None where torch's kernel
    cannot say which sizes those are (the caller checks the shapes seen). `what` names the op in their origin."""
    if kernel_reads_values(fn, args):
        return None
    session = _session()
    created: list[Any] = []
    before = len(session.env.guards)
    try:
        fargs, fkwargs = session.fake((args, kwargs), created)
        with session.mode:
            out = fn(*fargs, **fkwargs)
    except Exception:  # any failure on fake tensors: the caller checks the shapes seen instead
        return None
    leaves = [leaf for leaf in sequence_leaves(out) if leaf is not None]
    if len(leaves) != len(real) or not all(isinstance(t, torch.Tensor) for t in leaves):
        return None
    inputs = {fake.untyped_storage()._cdata for _, fake in session.fakes.values()}
    if any(t.untyped_storage()._cdata in inputs for t in leaves):
        return None  # a view of an argument: its layout decides more than its sizes
    fresh: dict[Any, UnbackedSize] = {}
    origin = f"a size of {what}'s result{where_now()}"
    for fake, tensor in zip(leaves, real, strict=True):
        if fake.ndim != tensor.ndim:
            return None
        for d, size in zip(fake.shape, tensor.shape, strict=True):
            expr = _expr(d)
            new = expr.free_symbols - set(session.numbers)
            if not new:
                continue
            if not isinstance(expr, _sympy().Symbol):
                return None  # a formula of a fresh size: its value is not the size seen
            if expr not in fresh:
                fresh[expr] = UnbackedSize(int(size))
                fresh[expr].origin = origin
            elif fresh[expr].value != size:
                return None
    guards = tuple(g.expr for g in session.env.guards[before:])
    if any(g.free_symbols - set(session.numbers) for g in guards):
        return None
    env = {**session.numbers, **fresh}
    ranges = tuple(size_range(session.env, sym) for sym in created)
    try:
        shapes = [tuple(_number(_expr(d), env) for d in t.shape) for t in leaves]
        record_guards(SymbolicShapes((), (), guards, ranges, tuple(created)), env)  # on sizes known before
    except _Unsupported:
        return None
    traced = [tuple(number_value(d) for d in s) for s in shapes]
    seen = [tuple(map(int, t.size())) for t in real]
    if traced != seen:  # the formulas must give the sizes seen
        return None
    for sym, proxy in fresh.items():  # later ops on these results follow the same symbols
        session.numbers[sym] = proxy
        session.nodes[proxy.name] = next(d for t in leaves for d in t.shape if _expr(d) == sym)
    return shapes, list(fresh.values())


def bind_unbacked_sizes(out: Any, fresh: list[IntegerProxy]) -> None:
    """Record, for each of the `fresh` sizes, a `prims.size` of the first result in `out` (a tree) holding it:
    the trace computes the size there, from the tensor the op made."""
    unbound = {id(d): d for d in fresh}
    for t in tree_flatten(out):
        if isinstance(t, TensorProxy):
            for dim, d in enumerate(t.shape):
                if unbound.pop(id(d), None) is not None:
                    aten_prims.size(t, dim)
