"""`torch._higher_order_ops.associative_scan`: traced as the scan it computes, one combine per step.

Under torch.compile the higher-order op is lowered by Dynamo and Inductor; eagerly (on the CPU,
`combine_mode="generic"`) torch runs it as a log-depth Python scan through `torch.vmap`. Code reaches
it where it gates on `torch.compiler.is_compiling()` (Hugging Face Mamba's selective scan), which is
True while minijit traces. The lookaside records the scan's definition instead: the first element of
each leaf along `dim`, then `combine_fn(previous, element)` for each next element, called through the
interpreter (so the combine function is traced like any user code, its ops fused by executors like
any others), and the results stacked along `dim`. The combine function sees single elements (the
scan dimension removed), exactly what its contract promises, so any associative function works,
pointwise or not. The trace grows with the length of the scan, as a Python loop over it would.

Where the length is a symbolic size (`cache="symbolic values"`), unrolling would specialise it: one
trace per length, as Mamba served over sequence lengths showed. There the scan is recorded as one
opaque op, `opaque.associative_scan`, that runs torch's own generic scan (the combine function
`torch.vmap`-ed over log-depth steps, as eager runs `combine_mode="generic"`) with the combine
function as a constant of the trace; its results have the shapes of `xs`, whatever the length, and
its gradient is torch's (the opaque rule: `torch.autograd.grad` of the same call). This needs a
combine function the trace can keep: a plain Python function that holds no traced value (in its
closure or defaults), whose result, traced once on two elements, has the elements' structure, shapes
and dtypes; otherwise the scan is unrolled as above. That trial run must also show it pure (no write in
place, no random draw, no change to state outside the call): an impure one is refused by name, since
its trial's effects are already part of the capture (with constant sizes it is unrolled).
The association order differs from the unrolled scan's (pairs, then pairs of pairs): equal up to
floating-point rounding, as the op's contract allows.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._prims_common import canonicalize_dim

from minijit.errors import UnsupportedOpError, where
from minijit.frontend.calls import call
from minijit.frontend.frame import current_state
from minijit.frontend.lookasides import lookaside
from minijit.ir import BoundSymbol, Effects, NumberProxy, Symbol, TensorProxy, current_trace, tree_flatten
from minijit.ir.containers import contains_proxy
from minijit.ir.context import where_now
from minijit.ops.opaque import OPAQUE

__all__: list[str] = []  # nothing public: the module registers a lookaside

try:
    from torch._higher_order_ops.associative_scan import associative_scan as _associative_scan
except ImportError:  # pragma: no cover - torch without the op
    _associative_scan = None


def _check(leaves: list[Any], dim: Any, reverse: Any, combine_mode: Any) -> int:
    """The scan dimension, validated in the order torch's own entry point validates; eager's errors."""
    if leaves and isinstance(leaves[0], torch.Tensor | TensorProxy) and isinstance(dim, int):
        dim = canonicalize_dim(leaves[0].ndim, dim)
    if not isinstance(dim, int):
        raise ValueError("Dim must be an int, but got " + str(type(dim)))
    if not isinstance(reverse, bool):
        raise RuntimeError("Reverse must be a bool, but got " + str(type(reverse)))
    if combine_mode not in ("pointwise", "generic"):
        raise ValueError(f"Combine_mode must either 'pointwise' or 'generic', but got {combine_mode}")
    if not leaves:
        raise ValueError("Expected at least 1 xs leaf")
    if not all(isinstance(x, torch.Tensor | TensorProxy) for x in leaves):
        raise ValueError("xs leaves must be a Tensor")
    if any(x.ndim <= dim or x.shape[dim] == 0 for x in leaves):
        raise ValueError("All xs leaves must at least have 'dim' number of dimensions and scan dimension > 0")
    if any(x.shape != leaves[0].shape for x in leaves):
        raise ValueError("All xs leaves must have the same shape")
    if not all(isinstance(x, TensorProxy) for x in leaves):
        raise UnsupportedOpError(f"associative_scan over tensors the trace did not see{where_now()}")
    return dim


if _associative_scan is not None:
    @lookaside(_associative_scan)
    def associative_scan(combine_fn: Callable[..., Any], xs: Any, dim: int, reverse: bool = False,
                         combine_mode: str = "pointwise") -> Any:
        """The inclusive scan of `xs` along `dim` with `combine_fn`: `ys[0] = xs[0]`, `ys[i] = combine_fn(ys[i-1], xs[i])`."""
        leaves, spec = pytree.tree_flatten(xs)
        dim = _check(leaves, dim, reverse, combine_mode)
        # At length 1 eager combines nothing (the result is `xs`, which a gradient then sees): traced apart.
        if _symbolic(leaves[0].shape[dim]) and leaves[0].shape[dim] >= 2 and _keepable(combine_fn, leaves, spec, dim):
            return pytree.tree_unflatten(list(SCAN(combine_fn, spec, leaves, dim, reverse)), spec)
        length = int(leaves[0].shape[dim])
        if length == 1:
            # Eager's scan returns each leaf as it is (a view): nothing is combined, so `xs` is not in
            # the result's history beyond that view (a leaf whose result is unused gets no gradient).
            return pytree.tree_unflatten([call(torch.movedim, (call(torch.movedim, (x, dim, 0), {}), 0, dim), {})
                                          for x in leaves], spec)
        order = range(length - 1, -1, -1) if reverse else range(length)

        def element(i: int) -> list[Any]:
            return [call(torch.select, (x, dim, i), {}) for x in leaves]

        steps: dict[int, list[Any]] = {}
        carry: list[Any] | None = None
        for i in order:
            current = element(i)
            if carry is not None:
                combined = call(combine_fn, (pytree.tree_unflatten(carry, spec), pytree.tree_unflatten(current, spec)),
                                 {})
                current = pytree.tree_leaves(combined)
                if len(current) != len(leaves):
                    raise ValueError(f"The number of leaves of the combine_fn output ({len(current)}) does not "
                                     f"match the number of leaves of xs ({len(leaves)})")
            carry = steps[i] = current
        outs = [call(torch.stack, ([steps[i][k] for i in range(length)], dim), {}) for k in range(len(leaves))]
        return pytree.tree_unflatten(outs, spec)



def _symbolic(length: Any) -> bool:
    """Whether the scan's length is a symbolic size (unrolling would specialise it)."""
    return isinstance(length, NumberProxy) and length.expr is not None


def _keepable(combine_fn: Any, leaves: list[TensorProxy], spec: Any, dim: int) -> bool:
    """Whether the trace can keep `combine_fn` as a constant and run it on every call: a plain function
    holding no traced value, whose result on two elements (traced once, here) is like an element."""
    if not isinstance(combine_fn, types.FunctionType) or _holds_traced(combine_fn, 4):
        return False
    element = pytree.tree_unflatten([call(torch.select, (x, dim, 0), {}) for x in leaves], spec)
    trace, outside = current_trace(), current_state().outside
    recorded, effects = len(trace.bound_symbols), len(outside.effects)
    result, result_spec = pytree.tree_flatten(call(combine_fn, (element, element), {}))
    _refuse_effects(combine_fn, trace.bound_symbols[recorded:], outside.effects[effects:])
    return result_spec == spec and all(
        isinstance(r, TensorProxy) and r.dtype == x.dtype and r.device == x.device and r.ndim == x.ndim - 1
        and all(a is b or a == b for a, b in zip(r.shape, x.shape[:dim] + x.shape[dim + 1:], strict=True))
        for r, x in zip(result, leaves, strict=True))


def _refuse_effects(combine_fn: Any, recorded: list[BoundSymbol], effects: list[Any]) -> None:
    """Refuse a combine function whose trial run wrote in place, drew random numbers or changed state outside
    the call: kept as a constant, torch's scan would run it at its own times, and the trial's effects are
    already part of the capture (the unrolled scan, with constant sizes, takes such a function)."""
    op = next((b for b in recorded if b.written() or b.is_random() or b.sym.effects.has_side_effects), None)
    what = f"{op.sym.id}{where(op.source)}" if op is not None else effects[0].describe() if effects else None
    if what is not None:
        name = getattr(combine_fn, "__qualname__", "combine_fn")
        raise UnsupportedOpError(
            f"associative_scan{where_now()}: its length is a symbolic size, so its combine_fn {name} is kept and run "
            f"by torch's generic scan, which needs a pure function; it has an effect beyond its result ({what}). "
            "Make it pure, or use cache='constant values' (the scan is then traced step by step)")


def _holds_traced(fn: types.FunctionType, depth: int) -> bool:
    """Whether a traced value may be reachable from `fn`'s closure, defaults or the globals it names (nested
    functions followed `depth` deep; True where the search gives up: the trace would keep a proxy)."""
    if depth == 0:
        return True
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    names = [fn.__globals__[n] for n in fn.__code__.co_names if n in fn.__globals__]
    for value in (*cells, *names, *(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()):
        if isinstance(value, types.FunctionType):
            if value is not fn and _holds_traced(value, depth - 1):
                return True
        elif contains_proxy(value):
            return True
    return False


def run_scan(combine_fn: Callable[..., Any], spec: Any, leaves: list[torch.Tensor], dim: int,
             reverse: bool) -> tuple[torch.Tensor, ...]:
    """The inclusive scan of the tensors `leaves` (a tree of structure `spec`) along `dim`: torch's generic scan."""
    out = _associative_scan(combine_fn, pytree.tree_unflatten(list(leaves), spec), dim, reverse=reverse,
                            combine_mode="generic")
    return tuple(pytree.tree_leaves(out))


def _scan_meta(combine_fn: Any, spec: Any, leaves: list[TensorProxy], dim: int, reverse: bool
               ) -> tuple[TensorProxy, ...]:
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in leaves)
    return tuple(TensorProxy(x.shape, x.dtype, x.device, grad) for x in tree_flatten(leaves))


SCAN = Symbol("associative_scan", _scan_meta, namespace="opaque", is_prim=True, tags=frozenset({OPAQUE}),
              fn=run_scan, effects=Effects())
