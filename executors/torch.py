"""The torch executor: runs every prim and every ltorch op as eager torch. Always the fallback.

ltorch ops run as the torch callable they stand for (one `scaled_dot_product_attention`,
one `layer_norm`), so a trace that no fusion executor touches costs what eager costs.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch

from executors import torch_foreach
from minijit.extend import (
    OPAQUE,
    BoundSymbol,
    Effects,
    Implementation,
    NumberProxy,
    OperatorExecutor,
    Symbol,
    Tag,
    TensorProxy,
    aten_prim_implementations,
    check_table,
    ltorch_eager_implementations,
    prims,
    register_executor,
)


class TorchExecutor(OperatorExecutor):
    """The torch executor; writes a result straight into a mutated input where the analysis allows it."""

    def __init__(self) -> None:
        super().__init__("torch", version=torch.__version__)
        self._inplace_symbols: dict[Symbol, Symbol] = {}
        self._out_symbols: dict[Symbol, Symbol] = {}

    def implementation_for(self, bsym: BoundSymbol) -> Implementation | None:
        """Also opaque torch ops (symbols tagged OPAQUE): each runs as the torch callable it is."""
        impl = super().implementation_for(bsym)
        if impl is None and OPAQUE in bsym.sym.tags and bsym.sym.is_prim and bsym.sym.fn is not None:
            return Implementation(bsym.sym.fn)
        return impl

    def executable_symbol(self, sym: Symbol) -> Symbol:
        """An opaque torch op stays the torch call it is (`torch.xlogy(a, b)`) in final traces."""
        if OPAQUE in sym.tags and sym not in self.implementations:
            return sym
        return super().executable_symbol(sym)

    def produce_into(self, producer: BoundSymbol, out: TensorProxy) -> BoundSymbol | None:
        """`torch.add(a, b, out=x)` for pointwise ops, `x.index_copy_(...)` where x is the first argument."""
        fn = producer.sym.fn
        if fn is None or "out" in producer.kwargs or len(list(producer.proxy_outputs())) != 1:
            return None
        others = [p for p in producer.proxy_args() if p is not out]
        reads_out = len(others) != len(list(producer.proxy_args()))
        if _is_pointwise_with_out(fn) and _accepts_out(fn, producer, out):
            # TensorIterator allows an input to be exactly the output; the analysis guarantees
            # that no other view of `out` is read (docs/design.md, invariant 2).
            return producer.replace(sym=self._out_symbol(producer.sym), kwargs={**producer.kwargs, "out": out})
        method = _inplace_method(fn)
        if method is not None and producer.args and producer.args[0] is out and out not in _ids(producer.args[1:]):
            return producer.replace(sym=self._inplace_symbol(producer.sym, method))
        if _in(fn, _OUT_NOT_POINTWISE) and not reads_out and not _folds(fn, producer) and _accepts_out(fn, producer, out):
            return producer.replace(sym=self._out_symbol(producer.sym), kwargs={**producer.kwargs, "out": out})
        return None

    def group_key(self, bsym: BoundSymbol, writes_first_argument: bool) -> Hashable | None:
        """Pointwise ops on CPU tensors: a `torch._foreach_*` call over their lists (executors/torch_foreach.py)."""
        return torch_foreach.group_key(bsym, writes_first_argument)

    def grouped(self, bsyms: Sequence[BoundSymbol], key: Hashable) -> BoundSymbol:
        """One `torch._foreach_*` call running `bsyms`."""
        return torch_foreach.grouped(bsyms, key, self.namespace)

    def allocates_output(self, bsym: BoundSymbol) -> bool:
        """Pointwise ops and matmul/cat without `out=`: torch returns a new tensor for each call."""
        fn = bsym.sym.fn
        return (not bsym.written()
                and (_is_pointwise_with_out(fn) or _in(fn, _OUT_NOT_POINTWISE) or _in(fn, _ALLOCATING)))

    def _out_symbol(self, sym: Symbol) -> Symbol:
        """`sym` called with `out=`: the same call, which also writes its `out` argument."""
        exe = self._out_symbols.get(sym)
        if exe is None:
            exe = Symbol(sym.name, sym.meta, namespace=sym.namespace, is_prim=True, tags=sym.tags, fn=sym.fn,
                         effects=dataclasses.replace(sym.effects, writes=(*sym.effects.writes, "out"), unread=("out",),
                                                     result_into="out"))
            self._out_symbols[sym] = exe
        return exe

    def _inplace_symbol(self, sym: Symbol, method: Any) -> Symbol:
        exe = self._inplace_symbols.get(sym)
        if exe is None:
            exe = Symbol(f"{sym.name}_", None, namespace=self.namespace, is_prim=True, tags=sym.tags,
                         effects=Effects(writes=(0,)), fn=method)
            self._inplace_symbols[sym] = exe
        return exe


def _ids(values: Any) -> _IdSet:
    return _IdSet(values)


class _IdSet:
    """Membership by identity (proxies overload ==)."""

    def __init__(self, values: Any) -> None:
        self.ids = {id(v) for v in values}

    def __contains__(self, x: Any) -> bool:
        return id(x) in self.ids


_NO_OUT = {prims.isfinite, prims.isnan, prims.isinf, prims.real, prims.imag}
# The torch functions the elementwise prims are named after, which take `out=`.
_POINTWISE_OUT = {getattr(torch, s.name) for s in prims.ALL_PRIMS.values()
                  if Tag.ELEMENTWISE in s.tags and s not in _NO_OUT and hasattr(torch, s.name)}
_POINTWISE_OUT |= {torch.clamp, torch.clip, torch.addcmul, torch.addcdiv, torch.sigmoid, torch.square}
_OUT_NOT_POINTWISE = {torch.matmul, torch.mm, torch.bmm, torch.cat}


def _in(fn: Any, fns: set[Any]) -> bool:
    try:
        return fn in fns
    except TypeError:  # unhashable callable
        return False


def _is_pointwise_with_out(fn: Any) -> bool:
    return _in(fn, _POINTWISE_OUT)


_OUT_PROBES: dict[Any, bool] = {}


def _folds(fn: Any, producer: BoundSymbol) -> bool:
    """Whether `producer` is a torch.matmul of a batch by a matrix or vector (or the reverse), which folds the batch
    into rows and writes `out` through a view of it: an `out` laid out otherwise (a buffer the trace made by
    `a + b` with a transposed `a`) raises."""
    if fn is not torch.matmul:
        return False
    ranks = [x.ndim for x in producer.args[:2] if isinstance(x, TensorProxy)]
    return len(ranks) == 2 and max(ranks) >= 3 and min(ranks) <= 2


def _accepts_out(fn: Any, producer: BoundSymbol, out: TensorProxy) -> bool:
    """Whether `fn` takes `out=` with these kinds of arguments (`torch.where(c, 0, x, out=)` does not).

    Probed once per signature on one-element tensors; a call that warns does not.
    """
    def probe(x: Any) -> Any:
        if isinstance(x, NumberProxy):  # a number the trace computes (`value=` from `step.item()`): its kind
            return x.python_type(x.value)
        return torch.zeros((1,) * x.ndim, dtype=x.dtype) if isinstance(x, TensorProxy) else x

    def kind(x: Any) -> Any:
        if isinstance(x, NumberProxy):
            return x.python_type
        return ("t", x.dtype, x.ndim) if isinstance(x, TensorProxy) else type(x)

    key = (fn, tuple(kind(a) for a in producer.args), tuple((k, kind(v)) for k, v in producer.kwargs.items()),
           out.dtype, out.ndim)
    ok = _OUT_PROBES.get(key)
    if ok is None:
        try:
            with warnings.catch_warnings():  # a warning (`matmul` of a vector resizing `out`) would reach the user
                warnings.simplefilter("error")
                fn(*[probe(a) for a in producer.args], **{k: probe(v) for k, v in producer.kwargs.items()},
                   out=probe(out))
            ok = True
        except Exception:
            ok = False
        _OUT_PROBES[key] = ok
    return ok


# torch functions whose Tensor method `<name>_` computes the same thing into its first argument
# (listed, since some `<name>_` differ: `x.bernoulli_()` ignores x's values, `torch.bernoulli(x)` does not).
_SAME_AS_INPLACE = {
    "index_copy", "index_add", "index_fill", "index_put", "index_reduce", "masked_fill", "masked_scatter",
    "scatter", "scatter_add", "scatter_reduce", "tril", "triu", "cumsum", "cumprod", "renorm", "put",
    "clamp", "clip", "lerp", "addcmul", "addcdiv", "where", "nan_to_num", "logit", "hardtanh", "relu",
    "sigmoid", "sinc", "xlogy", "hypot", "heaviside", "logaddexp",
}


def _inplace_method(fn: Any) -> Any:
    """The in-place Tensor method computing `fn(x, *rest)` into x, if there is one."""
    method = _PRIM_INPLACE.get(fn)
    if method is not None:
        return method
    name = getattr(fn, "__name__", None)
    if name not in _SAME_AS_INPLACE or not (fn is getattr(torch, name, None) or fn is getattr(torch.Tensor, name, None)):
        return None
    return getattr(torch.Tensor, f"{name}_", None)


ex = TorchExecutor()


def _broadcast_in_dim(x: torch.Tensor, shape: Sequence[int], broadcast_dims: Sequence[int]) -> torch.Tensor:
    view_shape = [1] * len(shape)
    for size, d in zip(x.shape, broadcast_dims, strict=True):
        view_shape[d] = size
    return x.reshape(view_shape).expand(shape)


def _slice(x: torch.Tensor, start_indices: Sequence[int], end_indices: Sequence[int],
           strides: Sequence[int] | None = None) -> torch.Tensor:
    strides = strides if strides is not None else [1] * x.ndim
    return x[tuple(slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides, strict=True))]


# The reduction prims keep their input's dtype (the meta says so); torch.sum and torch.prod
# would otherwise give int64 for bool and small integer inputs.
def _sum(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return torch.sum(x, tuple(dims), dtype=x.dtype) if dims else x.clone()


def _prod(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, dtype=x.dtype)
    return x if dims else x.clone()


def _amax(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return torch.amax(x, tuple(dims)) if dims else x.clone()


def _amin(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return torch.amin(x, tuple(dims)) if dims else x.clone()


def _var_mean(x: torch.Tensor, dims: Sequence[int], correction: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, tuple(dims), correction=correction)


def _full(shape: Sequence[int], fill_value: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full(tuple(shape), fill_value, dtype=dtype, device=device)


def _iota(length: int, *, start: Any, step: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + length * step, step, dtype=dtype, device=device)[:length]


# Random prims: exactly eager's calls on a fresh tensor (`torch.rand` is `empty(size).uniform_(0, 1)`,
# `rand_like(x)` is `empty_like(x).uniform_(0, 1)`), so the draws match eager's bit for bit.
def _fresh(size_or_like: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
    if isinstance(size_or_like, torch.Tensor):
        return torch.empty_like(size_or_like, dtype=dtype, device=device)
    return torch.empty(tuple(size_or_like), dtype=dtype, device=device)


def _uniform(size_or_like: Any, low: float, high: float, *, dtype: torch.dtype, device: Any = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    return _fresh(size_or_like, dtype, device).uniform_(low, high, generator=generator)


def _normal(size_or_like: Any, mean: float, std: float, *, dtype: torch.dtype, device: Any = None,
            generator: torch.Generator | None = None) -> torch.Tensor:
    return _fresh(size_or_like, dtype, device).normal_(mean, std, generator=generator)


def _random_integers(size_or_like: Any, low: int | None, high: int | None, *, dtype: torch.dtype,
                     device: Any = None, generator: torch.Generator | None = None) -> torch.Tensor:
    fresh = _fresh(size_or_like, dtype, device)
    if low is None and high is None:
        return fresh.random_(generator=generator)
    return fresh.random_(low, high, generator=generator)


def _bernoulli(size_or_like: Any, p: Any, *, dtype: torch.dtype, device: Any = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    return _fresh(size_or_like, dtype, device).bernoulli_(p, generator=generator)


def _exponential(size_or_like: Any, rate: float, *, dtype: torch.dtype, device: Any = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    return _fresh(size_or_like, dtype, device).exponential_(rate, generator=generator)


def _manual_seed(seed: int) -> None:
    torch.manual_seed(seed)  # its result, the default generator, is not a value of the trace


def _get_rng_state(device: torch.device) -> torch.Tensor:
    return torch.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device)


def _set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, device)


_RANDOM_IMPLS = {
    prims.uniform: _uniform, prims.normal: _normal, prims.random_integers: _random_integers,
    prims.bernoulli: _bernoulli, prims.exponential: _exponential,
    prims.randperm: lambda n, *, dtype, device, generator=None: torch.randperm(n, dtype=dtype, device=device,
                                                                                  generator=generator),
    prims.multinomial: torch.multinomial, prims.manual_seed: _manual_seed,
    prims.seed: torch.seed, prims.initial_seed: torch.initial_seed, prims.get_rng_state: _get_rng_state,
    prims.set_rng_state: _set_rng_state,
    prims.native_dropout: lambda x, p: tuple(torch.native_dropout(x, p, True)),
    prims.native_dropout_backward: torch.ops.aten.native_dropout_backward,
}


def _take(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.index_select(x, dim, index)


def _index_add(x: torch.Tensor, index: torch.Tensor, value: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.index_add(x, dim, index, value)


def _index_copy(x: torch.Tensor, index: torch.Tensor, value: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.index_copy(x, dim, index, value)


def _scatter_add(x: torch.Tensor, index: torch.Tensor, value: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.scatter_add(x, dim, index, value)


# In-place forms of the prims above: x is both the first argument and where the result goes.
def _slice_scatter(x: torch.Tensor, value: torch.Tensor, start_indices: Sequence[int], end_indices: Sequence[int],
                   strides: Sequence[int] | None = None) -> torch.Tensor:
    out = x.clone()
    _slice(out, start_indices, end_indices, strides).copy_(value)
    return out


def _slice_scatter_into(x: torch.Tensor, value: torch.Tensor, start_indices: Sequence[int],
                        end_indices: Sequence[int], strides: Sequence[int] | None = None) -> torch.Tensor:
    _slice(x, start_indices, end_indices, strides).copy_(value)
    return x


_PRIM_INPLACE = {
    _index_add: lambda x, index, value, dim: x.index_add_(dim, index, value),
    _index_copy: lambda x, index, value, dim: x.index_copy_(dim, index, value),
    _scatter_add: lambda x, index, value, dim: x.scatter_add_(dim, index, value),
    _slice_scatter: _slice_scatter_into,
}


def _scalars_as_tensors(fn: Any) -> Any:
    """`fn(a, b)` for torch functions that refuse Python numbers, which prims allow as scalars."""
    def impl(a: Any, b: Any) -> torch.Tensor:
        if not isinstance(a, torch.Tensor):
            a = torch.tensor(a, dtype=b.dtype, device=b.device)
        elif not isinstance(b, torch.Tensor):
            b = torch.tensor(b, dtype=a.dtype, device=a.device)
        return fn(a, b)
    return impl


def _maximum(a: Any, b: Any) -> torch.Tensor:
    # clamp_min propagates NaN like maximum and takes a Python number without a tensor allocation.
    if not isinstance(b, torch.Tensor):
        return torch.clamp_min(a, b)
    return torch.clamp_min(b, a) if not isinstance(a, torch.Tensor) else torch.maximum(a, b)


def _minimum(a: Any, b: Any) -> torch.Tensor:
    if not isinstance(b, torch.Tensor):
        return torch.clamp_max(a, b)
    return torch.clamp_max(b, a) if not isinstance(a, torch.Tensor) else torch.minimum(a, b)


def _copy_(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return dst.copy_(src)


def _copy_to_out_(computed: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    if computed is not out:
        out.copy_(computed)
    return out


# Other implementations that always return a tensor of their own (none has an `inplace=` option).
_F = torch.nn.functional
_ALLOCATING = {_sum, _prod, _amax, _amin, torch.argmax, torch.argmin, torch.sum, torch.mean, torch.prod, torch.amax,
               torch.amin, torch.cumsum, torch.cumprod, torch.softmax, torch.log_softmax, _F.softmax, _F.log_softmax,
               _F.linear, _F.layer_norm, _F.scaled_dot_product_attention}

_PRIM_IMPLS: dict[Symbol, Any] = {
    # copy=True: a same-dtype conversion is how ltorch.clone makes a new tensor.
    prims.convert_element_type: lambda x, dtype: x.to(dtype, copy=True),
    prims.device_put: lambda x, device: x.to(device),
    prims.copy_in_format: lambda x, memory_format: x.clone(memory_format=memory_format),
    prims.topk: lambda x, k, dim, largest, is_sorted: tuple(torch.topk(x, k, dim, largest, is_sorted)),
    prims.sort: lambda x, dim, descending, stable: tuple(torch.sort(x, dim=dim, descending=descending, stable=stable)),
    prims.broadcast_in_dim: _broadcast_in_dim,
    prims.transpose: torch.permute,
    prims.slice_prim: _slice,
    prims.shape: lambda x: tuple(x.shape),
    prims.sum: _sum,
    prims.prod: _prod,
    prims.amax: _amax,
    prims.amin: _amin,
    prims.var_mean: _var_mean,
    prims.full: _full,
    prims.iota: _iota,
    **_RANDOM_IMPLS,
    prims.take: _take,
    prims.take_along_axis: lambda x, index, dim: torch.gather(x, dim, index),
    prims.index_add: _index_add,
    prims.index_copy: _index_copy,
    prims.scatter_add: _scatter_add,
    prims.slice_scatter: _slice_scatter,
    prims.tensor_constant: lambda value: value,
    prims.copy_: _copy_,
    prims.copy_to_out_: _copy_to_out_,
    prims.maximum: _maximum,
    prims.minimum: _minimum,
    **{sym: _scalars_as_tensors(getattr(torch, sym.name))
       for sym in (prims.fmod, prims.atan2, prims.copysign, prims.eq, prims.ne, prims.lt, prims.le, prims.gt, prims.ge,
                   prims.logical_and, prims.logical_or, prims.logical_xor)},
    prims.no_grad_update: lambda old, new: new,
}

def _sdpa_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any, is_causal: bool,
                scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale))


def _sdpa_flash_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         out: torch.Tensor, logsumexp: torch.Tensor, attn_mask: Any, is_causal: bool,
                         scale: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, 0.0, is_causal, attn_mask=attn_mask, scale=scale))


_PRIM_IMPLS[prims.sdpa_flash] = _sdpa_flash
_PRIM_IMPLS[prims.sdpa_flash_backward] = _sdpa_flash_backward
# Convolution, pooling, batch norm, ...: one aten call each, made without torch's Python wrapper around an aten op
# (`OpOverload.__call__`, a frame per call).
_PRIM_IMPLS.update({sym: fn._op if isinstance(fn, torch._ops.OpOverload) else fn
                    for sym, fn in aten_prim_implementations().items()})
_PRIM_IMPLS.update({prims.NUMBER_PRIMS[op]: fn for op, (_, fn) in prims.NUMBER_OPS.items()})
# The other prims run as the torch function they are named after (`prims.exp` as `torch.exp`).
_PRIM_IMPLS.update({sym: getattr(torch, sym.name) for sym in prims.ALL_PRIMS.values()
                    if sym not in _PRIM_IMPLS and hasattr(torch, sym.name)})


def check_implementations(prim_symbols: Iterable[Symbol] | None = None) -> None:
    """Raise a MinijitError naming each prim (of `prim_symbols`, by default every one) the torch executor cannot run."""
    check_table(_PRIM_IMPLS, prims.ALL_PRIMS.values() if prim_symbols is None else prim_symbols, lambda s: True,
                "torch implementation (executors/torch.py _PRIM_IMPLS)")


check_implementations()

for _sym in prims.ALL_PRIMS.values():
    ex.register_implementation(_sym, _PRIM_IMPLS[_sym])
for _sym, _impl in ltorch_eager_implementations().items():
    ex.register_implementation(_sym, _impl)

register_executor(ex, default=True)
torch_executor = ex
