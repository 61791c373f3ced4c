"""`torch.func.grad`, `grad_and_value` and `vmap` called by traced code, written with what the trace already has.

- `grad(f)(x)`: `f` is traced on a fresh leaf standing for `x` (its value, requiring grad), and the gradient
  is taken inside the trace as `torch.autograd.grad` is (`minijit/frontend/backward.py`: one `autograd.grad_of`,
  expanded into the backward's ops after functionalization).
- `vmap(f, in_dims)(...)`: `f` is traced once per element of the mapped dimension, on that element, and the
  results are stacked along `out_dims`: the batching of every op is its own per-element call. The size mapped
  over must be known while tracing (a symbolic size is refused by name), and so must the function's randomness.

Refused by name where eager would give something else: a gradient of a tensor that requires grad outside (eager's
result is then differentiable again; minijit's inline gradients are not), and `randomness="different"`/`"same"`.
`chunk_size` is accepted and means nothing here (every element is its own call).

The function a transform returns may leave the jitted call (returned, or stored on an object): called outside a
trace, it is torch's own transform of the same function, as eager would have returned it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.backward import grad as autograd_grad
from minijit.frontend.calls import call
from minijit.frontend.lookasides import lookaside
from minijit.ir import NumberProxy, TensorProxy, current_trace
from minijit.ir.context import where_now


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
    with torch.enable_grad():
        out = call(func, tuple(args), kwargs)
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


def _eager_outside_traces(traced: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
    """`traced`, except where it is called outside any trace (it escaped the jitted call): then `eager`."""
    def transformed(*args: Any, **kwargs: Any) -> Any:
        return (traced if current_trace() is not None else eager)(*args, **kwargs)

    return transformed


@lookaside(torch.func.grad)
def func_grad(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable[..., Any]:
    """torch.func.grad: a function returning the gradient of `func`'s scalar result (and its aux)."""
    def grad_of_func(*args: Any, **kwargs: Any) -> Any:
        grads, _, aux = _differentiated(func, argnums, has_aux, "torch.func.grad", args, kwargs)
        return (grads, aux) if has_aux else grads

    return _eager_outside_traces(grad_of_func, torch.func.grad(func, argnums, has_aux))


@lookaside(torch.func.grad_and_value)
def func_grad_and_value(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0,
                        has_aux: bool = False) -> Callable[..., Any]:
    """torch.func.grad_and_value: a function returning the gradient of `func`'s scalar result and that result."""
    def grad_and_value_of_func(*args: Any, **kwargs: Any) -> Any:
        grads, value, aux = _differentiated(func, argnums, has_aux, "torch.func.grad_and_value", args, kwargs)
        return (grads, (value, aux)) if has_aux else (grads, value)

    return _eager_outside_traces(grad_and_value_of_func, torch.func.grad_and_value(func, argnums, has_aux))


def _mapped_size(args: tuple[Any, ...], in_dims: tuple[Any, ...]) -> int:
    sizes = set()
    for arg, dim in zip(args, in_dims):
        if dim is None:
            continue
        for leaf in pytree.tree_leaves(arg):
            if isinstance(leaf, TensorProxy | torch.Tensor):
                sizes.add(leaf.shape[dim])
    if not sizes:
        raise ValueError("vmap(f, in_dims)(*args): at least one argument must be mapped over (in_dims all None)")
    if len(sizes) > 1:
        raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sorted(str(s) for s in sizes)} for the mapped dimension")
    size = sizes.pop()
    if isinstance(size, NumberProxy):
        raise UnsupportedSyntaxError(
            f"torch.func.vmap over a dimension of symbolic size {size}{where_now()}: minijit maps by tracing the "
            "function once per element, so the size must be known; use cache='constant values' for this function")
    return size


@lookaside(torch.func.vmap, torch.vmap)
def vmap(func: Callable[..., Any], in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable[..., Any]:
    """torch.func.vmap: `func` traced once per element of the mapped dimension, the results stacked."""
    if randomness != "error":
        raise UnsupportedSyntaxError(f"torch.func.vmap(randomness={randomness!r}){where_now()} is not supported by "
                                     "minijit; call it outside the jitted function")

    def mapped(*args: Any, **kwargs: Any) -> Any:
        dims = tuple(in_dims) if isinstance(in_dims, tuple | list) else (in_dims,) * len(args)
        if len(dims) != len(args):
            raise ValueError(f"vmap: in_dims is not compatible with the structure of inputs: expected {len(args)} "
                             f"in_dims, got {len(dims)}")
        size = _mapped_size(args, dims)
        trace = current_trace()
        draws_before = _draws(trace)
        results = []
        for i in range(size):
            element = [arg if dim is None else pytree.tree_map(
                lambda x, dim=dim, i=i: call(torch.select, (x, dim, i), {}) if isinstance(x, TensorProxy | torch.Tensor)
                else x, arg) for arg, dim in zip(args, dims)]
            results.append(call(func, tuple(element), kwargs))
        if _draws(trace) != draws_before:
            raise RuntimeError("vmap: called random operation while in randomness error mode. Please either use the "
                               "'same' or 'different' randomness flags on vmap or perform the randomness operation "
                               "out of vmap")
        flat0, spec = pytree.tree_flatten(results[0])
        columns = [pytree.tree_flatten(r)[0] for r in results]
        outs = out_dims if isinstance(out_dims, tuple | list) else (out_dims,) * len(flat0)
        stacked = [call(torch.stack, ([c[j] for c in columns], outs[j]), {}) for j in range(len(flat0))]
        return pytree.tree_unflatten(stacked, spec)

    return mapped


def _draws(trace: Any) -> int:
    return sum(1 for b in trace.bound_symbols if b.is_random()) if trace is not None else 0


__all__ = ["func_grad", "func_grad_and_value", "vmap"]
