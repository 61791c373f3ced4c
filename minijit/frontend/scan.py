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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._prims_common import canonicalize_dim

from minijit.errors import UnsupportedOpError
from minijit.frontend.lookasides import _call, lookaside
from minijit.ir import TensorProxy
from minijit.ir.context import where_now

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
        length = int(leaves[0].shape[dim])
        order = range(length - 1, -1, -1) if reverse else range(length)

        def element(i: int) -> list[Any]:
            return [_call(torch.select, (x, dim, i), {}) for x in leaves]

        steps: dict[int, list[Any]] = {}
        carry: list[Any] | None = None
        for i in order:
            current = element(i)
            if carry is not None:
                combined = _call(combine_fn, (pytree.tree_unflatten(carry, spec), pytree.tree_unflatten(current, spec)),
                                 {})
                current = pytree.tree_leaves(combined)
                if len(current) != len(leaves):
                    raise ValueError(f"The number of leaves of the combine_fn output ({len(current)}) does not "
                                     f"match the number of leaves of xs ({len(leaves)})")
            carry = steps[i] = current
        outs = [_call(torch.stack, ([steps[i][k] for i in range(length)], dim), {}) for k in range(len(leaves))]
        return pytree.tree_unflatten(outs, spec)

