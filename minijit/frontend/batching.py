"""Batching a per-sample trace: what `torch.func.vmap` records (minijit/frontend/func_transforms.py).

`vmap(f)` traces `f` once, on proxies of one sample's shape, into a sub-trace; `Batching` then walks the
sub-trace's bound symbols and records each into the caller's trace on the whole batch. Every value of the
sub-trace stands for an outer value that is either *batched* (the batch is its dim 0, the sample's dims
follow) or not (the same for every sample: a tensor from outside, or one computed only from such). For each
bound symbol:

- none of its arguments batched: recorded again as it is (computed once for the batch);
- a batching rule for its symbol (`RULES`): the rule records the batched op. Elementwise prims take their
  unbatched tensors broadcast to the batch; reductions, permutations, slices, reshapes and the like shift
  their dims by one; matmul lifts and pads its operands so that the batch dim lines up;
- a composite op without a rule (or whose rule declines): its decomposition is batched, op by op;
- otherwise the op is *unrolled*: run once per sample on that sample's slices, the results stacked. Only
  that op: the rest of the trace stays batched. `Batching.unrolled` names the symbols unrolled.

A rule returns None where it cannot batch the call as given (say, a gather whose index is batched too); the
op then falls back as above. A rule's result is checked against the sample's (shape with the batch prepended,
dtype) before it is used, so a wrong rule unrolls rather than computing something else.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError, where
from minijit.ir import BoundSymbol, Proxy, Symbol, Tag, TensorProxy, current_trace, tree_flatten, tree_map
from minijit.ir.proxies import same_shape
from minijit.ir.rewrite import ProxyMap, replay_bsym
from minijit.ops import ltorch, prims

__all__ = ["RULES", "Batching"]

# rule(batching, bound arguments of the call) -> the batched outputs, or None where it cannot batch this call
BatchRule = Callable[["Batching", inspect.BoundArguments], Any]


class Batching:
    """The state of batching one per-sample trace into the trace being recorded.

    `size` is the batch size (an int, or a symbolic size: then an op without a rule is refused, since
    unrolling needs the count); `no_grad` the names the sub-trace recorded under `torch.no_grad()` (their
    batched ops are recorded under it too, so that a gradient taken outside treats them as eager does).
    """

    def __init__(self, size: Any, no_grad: set[str]):
        self.size = size
        self.no_grad = no_grad
        self.env = ProxyMap()
        self._batched: set[int] = set()
        self.unrolled: list[str] = []

    # -- values --------------------------------------------------------------------------------
    def is_batched(self, x: Any) -> bool:
        """Whether the outer value `x` carries the batch as its dim 0."""
        return isinstance(x, TensorProxy) and id(x) in self._batched

    def bind_input(self, sample: Proxy, value: Any, batched: bool) -> None:
        """The sub-trace's input `sample` stands for `value` (batched along dim 0 where `batched`)."""
        self.env[sample] = value
        if batched:
            self._batched.add(id(value))

    def value(self, sample: Any) -> Any:
        """The outer value standing for the sub-trace's `sample` (itself where nothing does: a value from outside)."""
        return self.env.value(sample)

    def batch(self, x: TensorProxy) -> TensorProxy:
        """`x` batched: itself if it is, else broadcast to the batch (a view, as eager's vmap expands it)."""
        if self.is_batched(x):
            return x
        out = prims.broadcast_in_dim(x, (self.size, *x.shape), tuple(range(1, x.ndim + 1)))
        self._batched.add(id(out))
        return out

    def _mark(self, out: Any) -> None:
        for p in tree_flatten(out):
            if isinstance(p, TensorProxy):
                self._batched.add(id(p))

    # -- the walk ------------------------------------------------------------------------------
    def run(self, bsyms: Sequence[BoundSymbol]) -> None:
        """Record each of `bsyms` (the sub-trace's, in order) batched into the current trace."""
        trace = current_trace()
        assert trace is not None
        saved = trace.source
        try:
            for b in bsyms:
                trace.source = b.source or saved
                grad_off = any(p.name in self.no_grad for p in b.proxy_outputs())
                with torch.no_grad() if grad_off else nullcontext():
                    self._one(b)
                if grad_off and trace.capture is not None:  # also where it was appended as it is (no record)
                    trace.capture.recorded_without_grad.update(
                        v.name for v in map(self.env.value, b.proxy_outputs()) if isinstance(v, Proxy))
        finally:
            trace.source = saved

    def _one(self, b: BoundSymbol) -> None:
        args, kwargs = self.env((b.args, b.kwargs))
        if not any(self.is_batched(x) for x in tree_flatten((args, kwargs))):
            replay_bsym(b, self.env, reuse_unchanged=True)
            return
        out = self._by_rule(b, args, kwargs)
        if out is not None:
            self.env.bind(b.output, out)
            return
        if b.subsymbols and Tag.OPAQUE not in b.sym.tags:
            self.run(b.subsymbols)
            return
        self._unroll(b, args, kwargs)

    def _by_rule(self, b: BoundSymbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rule = RULES.get(b.sym)
        if rule is None:
            return None
        try:
            bound = _signature(b.sym).bind(*args, **kwargs)
        except TypeError:
            return None
        out = rule(self, bound)
        if out is None or not _fits(b.output, out, self.size):
            return None
        self._mark(out)
        return out

    def _unroll(self, b: BoundSymbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """`b` run once per sample, its tensor outputs stacked along the batch."""
        if not isinstance(self.size, int):
            raise UnsupportedSyntaxError(
                f"torch.func.vmap over a dimension of symbolic size {self.size}: {b.sym.id}{where(b.source)} has no "
                "batching rule, and running it once per sample needs the count; use cache='constant values' "
                "for this function")
        self.unrolled.append(b.sym.id)
        samples = []
        for i in range(self.size):
            a, k = tree_map(lambda x, i=i: ltorch.select(x, 0, i) if self.is_batched(x) else x, (args, kwargs))
            samples.append(tree_flatten(b.sym(*a, **k)))
        for j, old in enumerate(tree_flatten(b.output)):
            if not isinstance(old, Proxy):
                continue
            if not isinstance(old, TensorProxy):
                raise UnsupportedSyntaxError(
                    f"torch.func.vmap: {b.sym.id}{where(b.source)} gives the number {old.name}, which differs per "
                    "sample; compute it outside vmap")
            stacked = ltorch.stack([s[j] for s in samples], 0)
            self._batched.add(id(stacked))
            self.env[old] = stacked


_SIGNATURES: dict[Symbol, inspect.Signature] = {}


def _signature(sym: Symbol) -> inspect.Signature:
    if sym not in _SIGNATURES:
        _SIGNATURES[sym] = inspect.signature(sym.meta)
    return _SIGNATURES[sym]


def _fits(sample: Any, batched: Any, size: Any) -> bool:
    """Whether the rule's `batched` outputs are the sample's with the batch of `size` prepended (structure, shape,
    dtype, device)."""
    old, new = tree_flatten(sample), tree_flatten(batched)
    if len(old) != len(new):
        return False
    for o, n in zip(old, new):
        if isinstance(o, TensorProxy) != isinstance(n, TensorProxy):
            return False
        if isinstance(o, TensorProxy) and (not same_shape(n.shape, (size, *o.shape)) or n.dtype != o.dtype
                                           or n.device != o.device):
            return False
    return True


def _call(sym: Symbol, bound: inspect.BoundArguments, **changes: Any) -> Any:
    """`sym` called on `bound`'s arguments with `changes` made to them."""
    bound.arguments.update(changes)
    return sym(*bound.args, **bound.kwargs)


def _shift(dims: Any, ndim: int) -> Any:
    """Dims of a sample of rank `ndim`, as dims of the batched tensor (wrapped, then one further on)."""
    bound = max(ndim, 1)
    if isinstance(dims, int):
        return dims % bound + 1
    return type(dims)(d % bound + 1 for d in dims)


def _sample_ndim(batching: Batching, x: TensorProxy) -> int:
    return x.ndim - 1 if batching.is_batched(x) else x.ndim


# -- rules ---------------------------------------------------------------------------------------
def _elementwise_rule(sym: Symbol) -> BatchRule:
    """Elementwise prims take tensors of one shape: the unbatched ones are broadcast to the batch."""
    def rule(batching: Batching, bound: inspect.BoundArguments) -> Any:
        args, kwargs = tree_map(lambda x: batching.batch(x) if isinstance(x, TensorProxy) else x,
                                (bound.args, bound.kwargs))
        return sym(*args, **kwargs)
    return rule


def _dims_rule(sym: Symbol, name: str, batch_all: Sequence[str] = ()) -> BatchRule:
    """A rule for an op on one tensor (`x`, or the first parameter) whose `name` argument holds dims of it;
    the tensors named in `batch_all` are batched too."""
    def rule(batching: Batching, bound: inspect.BoundArguments) -> Any:
        first = next(iter(bound.arguments))
        x = bound.arguments[first]
        changes = {first: batching.batch(x), name: _shift(bound.arguments[name], _sample_ndim(batching, x))}
        changes.update({k: batching.batch(bound.arguments[k]) for k in batch_all})
        return _call(sym, bound, **changes)
    return rule


def _transpose(batching: Batching, bound: inspect.BoundArguments) -> Any:
    perm = bound.arguments["permutation"]
    return _call(prims.transpose, bound, permutation=(0, *(p + 1 for p in perm)))


def _reshape(batching: Batching, bound: inspect.BoundArguments) -> Any:
    return _call(prims.reshape, bound, shape=(batching.size, *bound.arguments["shape"]))


def _broadcast_in_dim(batching: Batching, bound: inspect.BoundArguments) -> Any:
    dims = bound.arguments["broadcast_dims"]
    return _call(prims.broadcast_in_dim, bound, shape=(batching.size, *bound.arguments["shape"]),
                 broadcast_dims=(0, *(d + 1 for d in dims)))


def _slice(batching: Batching, bound: inspect.BoundArguments) -> Any:
    a = bound.arguments
    strides = a.get("strides")
    n = len(a["start_indices"])
    return _call(prims.slice_prim, bound, start_indices=[0, *a["start_indices"]],
                 end_indices=[batching.size, *a["end_indices"]],
                 strides=[1, *(strides if strides is not None else [1] * n)])


def _slice_scatter(batching: Batching, bound: inspect.BoundArguments) -> Any:
    a = bound.arguments
    strides = a.get("strides")
    n = len(a["start_indices"])
    return _call(prims.slice_scatter, bound, x=batching.batch(a["x"]), value=batching.batch(a["value"]),
                 start_indices=[0, *a["start_indices"]], end_indices=[batching.size, *a["end_indices"]],
                 strides=[1, *(strides if strides is not None else [1] * n)])


def _cat(batching: Batching, bound: inspect.BoundArguments) -> Any:
    tensors = bound.arguments["tensors"]
    ndim = _sample_ndim(batching, tensors[0])
    return _call(prims.cat, bound, tensors=[batching.batch(t) for t in tensors], dim=_shift(bound.arguments["dim"], ndim))


def _take(batching: Batching, bound: inspect.BoundArguments) -> Any:
    x, index, dim = bound.arguments["x"], bound.arguments["index"], bound.arguments["dim"]
    ndim = _sample_ndim(batching, x)
    if not batching.is_batched(index):
        return prims.take(x, index, _shift(dim, ndim))
    d = dim % max(ndim, 1)
    n = index.shape[1]
    if batching.is_batched(x):
        # Each sample's index into its own tensor: the index spread over the other dims, gathered along `d`.
        shape = (*x.shape[:d + 1], n, *x.shape[d + 2:])
        return prims.take_along_axis(x, prims.broadcast_in_dim(index, shape, (0, d + 1)), d + 1)
    # One table, an index per sample: gather the indices of all samples at once, then split them apart.
    flat = prims.take(x, prims.reshape(index, (batching.size * n,)), d)
    split = prims.reshape(flat, (*x.shape[:d], batching.size, n, *x.shape[d + 1:]))
    return ltorch.movedim(split, d, 0)


def _matmul(batching: Batching, bound: inspect.BoundArguments) -> Any:
    """torch.matmul's rank rules per sample, on the batch: vectors lifted to matrices, the batch dims lined up
    (a sample of lower rank padded with dims of size 1 after the batch dim), lifted dims dropped again."""
    a, b = bound.arguments["a"], bound.arguments["b"]
    ba, bb = batching.is_batched(a), batching.is_batched(b)
    ra, rb = a.ndim - ba, b.ndim - bb
    if ba and not bb and rb == 1:
        return ltorch.matmul(a, b)  # (B, ..., m) @ (m,)
    if bb and not ba and rb == 1:
        return ltorch.movedim(ltorch.matmul(a, prims.transpose(b, (1, 0))), -1, 0)  # a @ (m, B)
    lift_a = ba and ra == 1
    lift_b = bb and rb == 1
    if lift_a:
        a, ra = ltorch.unsqueeze(a, -2), 2
    if lift_b:
        b, rb = ltorch.unsqueeze(b, -1), 2
    rank = max(ra, rb)
    if ba:
        a = _pad(a, rank - ra)
    if bb:
        b = _pad(b, rank - rb)
    out = ltorch.matmul(a, b)
    if lift_b:
        out = ltorch.squeeze(out, -1)
    if lift_a:
        out = ltorch.squeeze(out, -1 if lift_b else -2)
    return out


def _pad(x: TensorProxy, n: int) -> TensorProxy:
    """Batched `x` with `n` dims of size 1 after the batch dim."""
    for _ in range(n):
        x = ltorch.unsqueeze(x, 1)
    return x


def _linear(batching: Batching, bound: inspect.BoundArguments) -> Any:
    a = bound.arguments
    if any(batching.is_batched(a.get(k)) for k in ("weight", "bias")):
        return None  # a weight per sample: its decomposition (matmul, add) is batched
    return _call(ltorch.linear, bound)


def _shape(batching: Batching, bound: inspect.BoundArguments) -> Any:
    return prims.shape(bound.arguments["x"])[1:]  # a sample's sizes: the batch's but its first


RULES: dict[Symbol, BatchRule] = {}
for _name in (*prims.UNARY, *prims.BINARY, *prims.TERNARY):
    RULES[getattr(prims, _name)] = _elementwise_rule(getattr(prims, _name))
for _sym in (prims.polygamma, prims.convert_element_type, prims.device_put, prims.clone, prims.detach,
             prims.no_grad_update):
    RULES[_sym] = _elementwise_rule(_sym)
for _sym in (prims.sum, prims.prod, prims.amax, prims.amin, prims.var_mean):
    RULES[_sym] = _dims_rule(_sym, "dims")
for _sym in (prims.argmax, prims.argmin, prims.cumsum, prims.topk, prims.sort):
    RULES[_sym] = _dims_rule(_sym, "dim")
RULES[prims.squeeze] = _dims_rule(prims.squeeze, "dims")
RULES[prims.take_along_axis] = _dims_rule(prims.take_along_axis, "dim", batch_all=("index",))
RULES[prims.scatter_add] = _dims_rule(prims.scatter_add, "dim", batch_all=("index", "value"))
RULES.update({
    prims.transpose: _transpose,
    prims.reshape: _reshape,
    prims.broadcast_in_dim: _broadcast_in_dim,
    prims.slice_prim: _slice,
    prims.slice_scatter: _slice_scatter,
    prims.cat: _cat,
    prims.take: _take,
    prims.matmul: _matmul,
    prims.shape: _shape,
    ltorch.linear: _linear,
})
