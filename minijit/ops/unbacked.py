"""Sizes known only when the trace runs: the results of `nonzero`, `torch.where(mask)`, `x[mask]`, `unique`.

Such an op's result has as many elements as its input has True (or distinct) values. Rather than a trace
per count, the capture records it with each size that depends on the values as a fresh `IntegerProxy` (what
torch calls an *unbacked* symbolic int), defined in the trace by a `prims.size` of the first result holding
it, right after the op:

    t2 = torch.nonzero(mask)  # t2: cpu i64[i7, 2]
    i7 = prims.size(t2, 0)

- **Which sizes, and which are one size**, come from torch's own kernel run on fake tensors
  (`symbolic_sizes.derive`): `torch.where(mask)` gives two results of the same size `u0`, so one proxy; an
  input's symbolic sizes stay the expressions they are (`x[mask]` of a `(b, t, c)` x by a `(b, t)` mask is
  `(u0, c)`), and a size only the trace knows among the inputs is an unbacked symbol of the run too.
- **Its value is never a guard.** Nothing keys or guards on it: it is a number the trace computes, like
  `Tensor.item()` (`data_dependent`). Ops compute with it as they do with any symbolic size (a size is the
  same size only as itself: `same_size`). A decision that needs its value (a Python `if n > 0:`, a
  broadcast against it) is read on the capture's real values and checked by the trace (`prims.check_value`),
  as `.item()` is: one trace per outcome, never a wrong one.
- **The capture still runs the op on the real values**, once (`ValueReader.call_with_shapes_seen`): the
  value it sees is the proxy's `value`, so that whatever the capture decides on it agrees with the call
  traced, and is checked for later calls.

Where torch's kernel cannot follow a size (a formula of a fresh size rather than the size itself, a guard
on one) the caller checks the shapes seen instead (a trace per shape, as before).
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir import IntegerProxy, TensorProxy, tree_flatten
from minijit.ir.context import where_now
from minijit.ops import prims
from minijit.ops.symbolic_sizes import _number, _proxies, _sympy, _Unsupported, derive, record_guards

__all__ = ["bind_unbacked_sizes", "unbacked_shapes"]


def unbacked_shapes(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], what: str,
                    real: list[torch.Tensor]) -> tuple[list[tuple[Any, ...]], list[IntegerProxy]] | None:
    """Per tensor of `real` (the results of `fn(*args, **kwargs)` on the real values, flattened), its shape with
    a fresh `IntegerProxy` for each size that depends on the values, and those proxies; None where torch's kernel
    cannot say which sizes those are (the caller checks the shapes seen). `what` names the op in their origin."""
    found = derive(fn, args, kwargs)
    outputs = [shape for shape in found.outputs if shape is not None] if found is not None else None
    if outputs is None or len(outputs) != len(real) or len(found.outputs) != len(real):
        return None
    leaves = tree_flatten((args, kwargs))
    env = _proxies(found, leaves)
    fresh: dict[Any, IntegerProxy] = {}
    origin = f"a size of {what}'s result{where_now()}, known only when the trace runs"
    for shape, tensor in zip(outputs, real, strict=True):
        if len(shape) != tensor.ndim:
            return None
        for d, size in zip(shape, tensor.shape, strict=True):
            new = d.free_symbols - set(env)
            if not new:
                continue
            if not isinstance(d, _sympy().Symbol):
                return None  # a formula of a fresh size: its value is not the size seen
            if d not in fresh:
                fresh[d] = IntegerProxy(int(size))
                fresh[d].origin = origin
            elif fresh[d].value != size:
                return None
    if not fresh or any(g.free_symbols & set(fresh) for g in found.guards):
        return None
    try:
        shapes = [tuple(_number(d, {**env, **fresh}) for d in shape) for shape in outputs]
        record_guards(found, env)  # on the inputs' sizes, as for any op
    except _Unsupported:
        return None
    if any(tuple(getattr(d, "value", d) for d in s) != tuple(t.shape) for s, t in zip(shapes, real, strict=True)):
        return None
    return shapes, list(fresh.values())


def bind_unbacked_sizes(out: Any, fresh: list[IntegerProxy]) -> None:
    """Record, for each of the `fresh` sizes, a `prims.size` of the first result in `out` (a tree) holding it:
    the trace computes the size there, from the tensor the op made."""
    unbound = {id(d): d for d in fresh}
    for t in tree_flatten(out):
        if isinstance(t, TensorProxy):
            for dim, d in enumerate(t.shape):
                if unbound.pop(id(d), None) is not None:
                    prims.size(t, dim)
