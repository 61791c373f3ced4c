"""`torch.func.grad`, `grad_and_value` and `vmap` called by traced code, written with what the trace already has.

- `grad(f)(x)`: `f` is traced on a fresh leaf standing for `x` (its value, requiring grad), and the gradient
  is taken inside the trace as `torch.autograd.grad` is (`minijit/frontend/backward.py`: one `autograd.grad_of`,
  expanded into the backward's ops after functionalization).
- `vmap(f, in_dims, out_dims)(...)`: `f` is traced once, into a sub-trace, on a fresh proxy of one sample's shape
  for each mapped tensor (`in_dims`/`out_dims` ints, None, or nested tuples and dicts, as torch.func broadcasts
  them); in-place ops in it are functionalized and gradients it takes (`vmap(grad(f))`, per-sample gradients)
  expanded into the backward's ops; then each of its ops is recorded on the whole batch by its batching rule
  (minijit/frontend/batching.py), an op without one being run once per sample alone. So the trace does not grow
  with the batch, and the batch size may be a symbolic size (an unrolled op then needs it known: refused by name).
  A function that writes into its mapped inputs (or tensors from outside) is traced once per sample instead, its
  results stacked, as eager's writes land in those tensors.

As in eager, `grad(f)` raises where `f` writes in place into a tensor it did not make (a module's running statistics
captured from outside): torch.func refuses to mutate a captured tensor. Refused by name where eager would give
something else: a gradient of a tensor that requires grad outside (eager's
result is then differentiable again; minijit's inline gradients are not), and `randomness="different"`/`"same"`
for a function that draws random numbers (with "error", such a function raises as in eager). `chunk_size` is
accepted and means nothing here (the whole batch is one call).

The function a transform returns may leave the jitted call (returned, or stored on an object): called outside a
trace, it is torch's own transform of the same function, as eager would have returned it. The other way round, a
transform torch made outside the call (`per_sample = vmap(grad(loss))` at module level) runs here when traced code
calls it: its wrapper's call of torch's implementation (`grad_impl`, `grad_and_value_impl`, `vmap_impl`) is
looked aside to the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from minijit.errors import UnsupportedSyntaxError, where
from minijit.frontend.backward import captured
from minijit.frontend.backward import grad as autograd_grad
from minijit.frontend.batching import Batching
from minijit.frontend.calls import call
from minijit.frontend.frame import current_state
from minijit.frontend.lookasides import lookaside
from minijit.ir import NumberProxy, TensorProxy, Trace, current_trace, tracing
from minijit.ir.context import where_now
from minijit.transforms.functionalize import functionalize
from minijit.transforms.inline_grad import expand_inline_grads, has_inline_grads


def _fresh_leaf(x: Any, what: str) -> Any:
    """A tensor with `x`'s value that requires grad and has no history (what `torch.func.grad` differentiates)."""
    if not isinstance(x, TensorProxy):
        if isinstance(x, torch.Tensor):
            x = call(torch.Tensor.detach, (x,), {})  # captured
        else:
            raise TypeError(f"{what}: expected tensors for the arguments differentiated, got {type(x).__name__}")
    if x.requires_grad and torch.is_grad_enabled():
        raise UnsupportedSyntaxError(
            f"{what} of a tensor that requires grad outside it{where_now()}: eager's gradient is then differentiable "
            "again, and gradients minijit takes inside a trace are not. Detach the tensor first, or call it outside "
            "the jitted function")
    leaf = call(torch.Tensor.detach, (x,), {})
    leaf.requires_grad = True
    return leaf


def _differentiated(func: Callable[..., Any], argnums: int | tuple[int, ...], has_aux: bool, what: str,
                    args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(gradients shaped as the arguments at `argnums`, the value, the aux or None) of `func(*args, **kwargs)`."""
    positions = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    args = list(args)
    leaves: dict[int, Any] = {}
    for i in positions:
        args[i] = pytree.tree_map(lambda x: _fresh_leaf(x, what), args[i])
        leaves[i] = args[i]
    trace = current_trace()
    start = len(trace.bound_symbols)
    with torch.enable_grad():
        out = call(func, tuple(args), kwargs)
    _refuse_captured_writes(trace, start, what, {id(x) for x in pytree.tree_leaves(leaves)})
    value, aux = (out if has_aux else (out, None))
    if has_aux and not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(f"{what}(f)(*args): output of function f should be a tuple: (output, aux) if has_aux is True")
    if not isinstance(value, TensorProxy) or value.numel() != 1:
        raise RuntimeError(f"{what}(f)(*args): Expected f(*args) to return a scalar Tensor")
    flat, specs = [], []
    for i in positions:
        leaves_i, spec = pytree.tree_flatten(leaves[i])
        flat += leaves_i
        specs.append((len(leaves_i), spec))
    grads = list(autograd_grad(value, flat, allow_unused=True, materialize_grads=True)) if flat else []
    per_arg, start = [], 0
    for n, spec in specs:
        per_arg.append(pytree.tree_unflatten(grads[start:start + n], spec))
        start += n
    result = per_arg[0] if isinstance(argnums, int) else tuple(per_arg)
    return result, call(torch.Tensor.detach, (value,), {}), aux


def _refuse_captured_writes(trace: Trace, start: int, what: str, leaves: set[int]) -> None:
    """Raise eager's error where the function differentiated (recorded from `start` on) wrote in place into a tensor
    it did not make (from outside, or an argument not differentiated), or into a view of one: torch.func refuses
    such a write ("would mutate a captured Tensor"), and minijit would carry it out."""
    if not trace.recording_user_call:
        return
    producers = {id(o): b for b in trace.bound_symbols for o in b.proxy_outputs()}
    made_inside = {id(o) for b in trace.bound_symbols[start:] for o in b.proxy_outputs()}
    for bsym in trace.bound_symbols[start:]:
        for t in bsym.written():
            root = t
            while (producer := producers.get(id(root))) is not None and producer.viewed_argument(root) is not None:
                root = producer.viewed_argument(root)
            if id(root) not in made_inside and id(root) not in leaves:
                raise RuntimeError(
                    f"During a grad (vjp, jvp, grad, etc) transform, the function provided attempted to call in-place "
                    f"operation ({bsym.sym.name}{where(bsym.source)}) that would mutate a captured Tensor ({what}, as "
                    "in eager). This is not supported; please rewrite the function being transformed to explicitly "
                    "accept the mutated Tensor(s) as inputs.")


@lookaside(torch._functorch.eager_transforms.grad_impl)
def _grad_impl(func: Callable[..., Any], argnums: int | tuple[int, ...], has_aux: bool, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
    """The call of a `torch.func.grad` transform made outside the jitted function."""
    grads, _, aux = _differentiated(func, argnums, has_aux, "torch.func.grad", args, kwargs)
    return (grads, aux) if has_aux else grads


@lookaside(torch._functorch.eager_transforms.grad_and_value_impl)
def _grad_and_value_impl(func: Callable[..., Any], argnums: int | tuple[int, ...], has_aux: bool,
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call of a `torch.func.grad_and_value` transform made outside the jitted function."""
    grads, value, aux = _differentiated(func, argnums, has_aux, "torch.func.grad_and_value", args, kwargs)
    return (grads, (value, aux)) if has_aux else (grads, value)


def _eager_outside_traces(traced: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
    """`traced`, except where it is called outside any trace (it escaped the jitted call): then `eager`."""
    def transformed(*args: Any, **kwargs: Any) -> Any:
        return (traced if current_trace() is not None else eager)(*args, **kwargs)

    return transformed


@lookaside(torch.func.grad)
def func_grad(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable[..., Any]:
    """torch.func.grad: a function returning the gradient of `func`'s scalar result (and its aux)."""
    def grad_of_func(*args: Any, **kwargs: Any) -> Any:
        return _grad_impl(func, argnums, has_aux, args, kwargs)

    return _eager_outside_traces(grad_of_func, torch.func.grad(func, argnums, has_aux))


@lookaside(torch.func.grad_and_value)
def func_grad_and_value(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0,
                        has_aux: bool = False) -> Callable[..., Any]:
    """torch.func.grad_and_value: a function returning the gradient of `func`'s scalar result and that result."""
    def grad_and_value_of_func(*args: Any, **kwargs: Any) -> Any:
        return _grad_and_value_impl(func, argnums, has_aux, args, kwargs)

    return _eager_outside_traces(grad_and_value_of_func, torch.func.grad_and_value(func, argnums, has_aux))


def _name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _flat_dims(dims: Any, tree: Any, what: str, func: Any) -> list[Any]:
    """`dims` (an int, None, or a nested tuple of them) broadcast to one per leaf of `tree`, as torch.func does."""
    if not (dims is None or isinstance(dims, int | tuple | dict)):
        raise ValueError(f"vmap({_name(func)}, {what}={dims}, ...): expected `{what}` to be int or a (potentially "
                         f"nested) tuple matching the structure of {'inputs' if what == 'in_dims' else 'outputs'}, "
                         f"got: {type(dims)}.")
    flat = pytree._broadcast_to_and_flatten(dims, pytree.tree_structure(tree))
    if flat is None:
        raise ValueError(f"vmap({_name(func)}, {what}={dims}, ...): {what} is not compatible with the structure of "
                         f"`{'inputs' if what == 'in_dims' else 'outputs'}`")
    return flat


class _VmapCall:
    """One call `vmap(func, in_dims, out_dims, randomness)(*args, **kwargs)` in traced code."""

    def __init__(self, func: Callable[..., Any], in_dims: Any, out_dims: Any, randomness: str,
                 args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.func, self.out_dims, self.randomness, self.kwargs = func, out_dims, randomness, kwargs
        leaves, self.spec = pytree.tree_flatten(args)
        self.dims = _flat_dims(in_dims, args, "in_dims", func)
        self.leaves = [captured(x) if d is not None else x for x, d in zip(leaves, self.dims)]
        for i, (x, d) in enumerate(zip(self.leaves, self.dims)):
            if d is None:
                continue
            if not isinstance(x, TensorProxy):
                raise ValueError(f"vmap({_name(func)}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={d} for an input "
                                 f"but the input is of type {type(x)}. We cannot vmap over non-Tensor arguments")
            if not isinstance(d, int) or not -x.ndim <= d < x.ndim:
                raise ValueError(f"vmap({_name(func)}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={d} for some "
                                 f"input, but that input is a Tensor of dimensionality {x.ndim}")
            self.dims[i] = d % x.ndim
        self.size = _mapped_size(self.leaves, self.dims)

    def run(self) -> Any:
        """The batched results (see the module docstring)."""
        outer = current_trace()
        outside = current_state().outside
        effects_before = len(outside.effects)
        sub, samples = self._trace_one_sample(outer)
        self._check_randomness(sub)
        no_grad = sub.capture.recorded_without_grad | sub.capture.written_without_grad
        if any(b.written() for b in sub.bound_symbols):
            sub, result = functionalize(sub, grad_enabled=False, no_grad=no_grad)
            if result.mutated_inputs:  # writes into the mapped tensors (or tensors from outside): per sample
                if len(outside.effects) != effects_before:
                    raise UnsupportedSyntaxError(
                        f"torch.func.vmap{where_now()} of a function that writes into its inputs in place and "
                        f"changes state outside the call ({outside.effects[effects_before].describe()}): minijit "
                        "would run it once per sample; call vmap outside the jitted function")
                return self._per_sample()
        if has_inline_grads(sub):
            sub = expand_inline_grads(sub, (), no_grad)
        batching = Batching(self.size, no_grad)
        for x, d, sample in zip(self.leaves, self.dims, samples):
            if sample is not None:
                batching.bind_input(sample, x if d == 0 else call(torch.movedim, (x, d, 0), {}), batched=True)
        batching.run(sub.bound_symbols)
        return self._outputs(sub.output, batching)

    def _trace_one_sample(self, outer: Any) -> tuple[Trace, list[TensorProxy | None]]:
        """`func` traced into a sub-trace of its own, on one sample of each mapped tensor (a fresh proxy)."""
        sub = outer.nested(f"{_name(self.func)}_sample")
        samples: list[TensorProxy | None] = []
        with tracing(sub):
            for x, d in zip(self.leaves, self.dims):
                samples.append(None if d is None else TensorProxy(x.shape[:d] + x.shape[d + 1:], x.dtype, x.device,
                                                                  x.requires_grad))
            args = pytree.tree_unflatten([x if s is None else s for x, s in zip(self.leaves, samples)], self.spec)
            sub.output = call(self.func, tuple(args), self.kwargs)
        given = [s for s in samples if s is not None]
        sub.args = given + [p for p in sub.free_proxies() if not any(p is s for s in given)]
        return sub, samples

    def _check_randomness(self, sub: Trace) -> None:
        draw = next((b for b in sub.bound_symbols if b.is_random()), None)
        if draw is None:
            return
        if self.randomness == "error":
            raise RuntimeError("vmap: called random operation while in randomness error mode. Please either use the "
                               "'same' or 'different' randomness flags on vmap or perform the randomness operation "
                               "out of vmap")
        raise UnsupportedSyntaxError(
            f"torch.func.vmap(randomness={self.randomness!r}){where_now()} of a function that draws random numbers "
            f"({draw.sym.id}{where(draw.source)}) is not supported by minijit: its draws would not be eager's. "
            "Call it outside the jitted function")

    def _outputs(self, output: Any, batching: Batching) -> Any:
        """The sub-trace's `output` on the batch, each batch dim moved to its `out_dims`."""
        leaves, spec = pytree.tree_flatten(output)
        dims = _flat_dims(self.out_dims, output, "out_dims", self.func)
        results = []
        for leaf, d in zip(leaves, dims):
            value = batching.value(leaf)
            if not isinstance(value, TensorProxy):
                if d is not None:
                    raise ValueError(f"vmap({_name(self.func)}, ...): `{_name(self.func)}` must only return Tensors, "
                                     f"got type {type(value)}. Did you mean to set out_dims= to None for output?")
                results.append(value)
                continue
            if d is None:
                if batching.is_batched(value):
                    raise ValueError(f"vmap({_name(self.func)}, ...): `{_name(self.func)}` can not return a "
                                     "BatchedTensor when out_dim is None")
                results.append(value)
                continue
            value = batching.batch(value)
            d = d % value.ndim
            results.append(value if d == 0 else call(torch.movedim, (value, 0, d), {}))
        return pytree.tree_unflatten(results, spec)

    def _per_sample(self) -> Any:
        """`func` traced once per sample, the results stacked: for a function that writes into its inputs."""
        if isinstance(self.size, NumberProxy):
            raise UnsupportedSyntaxError(
                f"torch.func.vmap over a dimension of symbolic size {self.size}{where_now()} of a function that writes "
                "into its inputs: minijit runs it once per sample, so the size must be known; use "
                "cache='constant values' for this function")
        results = []
        for i in range(self.size):
            leaves = [x if d is None else call(torch.select, (x, d, i), {}) for x, d in zip(self.leaves, self.dims)]
            results.append(call(self.func, tuple(pytree.tree_unflatten(leaves, self.spec)), self.kwargs))
        flat0, spec = pytree.tree_flatten(results[0])
        columns = [pytree.tree_flatten(r)[0] for r in results]
        outs = _flat_dims(self.out_dims, results[0], "out_dims", self.func)
        stacked = [call(torch.stack, ([c[j] for c in columns], outs[j]), {}) for j in range(len(flat0))]
        return pytree.tree_unflatten(stacked, spec)


def _mapped_size(leaves: list[Any], dims: list[Any]) -> Any:
    sizes: list[Any] = []  # (not a set: hashing a symbolic size relies on its value)
    for x, d in zip(leaves, dims):
        if d is not None and not any(s is x.shape[d] or s == x.shape[d] for s in sizes):  # compared as guarded
            sizes.append(x.shape[d])
    if not sizes:
        raise ValueError("vmap(f, in_dims)(*args): at least one argument must be mapped over (in_dims all None)")
    if len(sizes) > 1:
        raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sorted(str(s) for s in sizes)} for the mapped dimension")
    return sizes[0]


@lookaside(torch.func.vmap, torch.vmap)
def vmap(func: Callable[..., Any], in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable[..., Any]:
    """torch.func.vmap: `func` traced once on a sample, its ops batched (see the module docstring)."""
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")

    def mapped(*args: Any, **kwargs: Any) -> Any:
        return _VmapCall(func, in_dims, out_dims, randomness, args, kwargs).run()

    return _eager_outside_traces(mapped, torch.func.vmap(func, in_dims, out_dims, randomness, chunk_size=chunk_size))


@lookaside(torch._functorch.vmap.vmap_impl)
def _vmap_impl(func: Callable[..., Any], in_dims: Any, out_dims: Any, randomness: str, chunk_size: int | None,
               *args: Any, **kwargs: Any) -> Any:
    """The call of a `torch.func.vmap` transform made outside the jitted function."""
    return _VmapCall(func, in_dims, out_dims, randomness, args, kwargs).run()


__all__ = ["func_grad", "func_grad_and_value", "vmap"]
