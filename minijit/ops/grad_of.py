"""`autograd.grad_of`: gradients taken by the traced code itself, as one bound symbol until they are expanded.

`loss.backward()` and `torch.autograd.grad` in traced code (minijit/frontend/backward.py) record it; the pass
`minijit.transforms.inline_grad.expand_inline_grads` replaces it, after functionalization, by the backward it
stands for. No executor ever runs it.
"""

from __future__ import annotations

from minijit.errors import MinijitError
from minijit.ir import Symbol, TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import rule_same_shape

__all__ = ["GRAD_OF"]


def _grad_of_meta(outputs: tuple[TensorProxy, ...], cotangents: tuple[TensorProxy, ...],
                  inputs: tuple[TensorProxy, ...], retain_graph: bool = False) -> tuple[TensorProxy, ...]:
    for out, ct in zip(outputs, cotangents, strict=True):
        if not isinstance(out, TensorProxy) or not isinstance(ct, TensorProxy) or not rule_same_shape(
                out.shape, ct.shape):
            raise MinijitError(f"autograd.grad_of: a cotangent does not match its output{where_now()}")
    return tuple(TensorProxy.like(x, requires_grad=False) for x in inputs)


# The gradients of `outputs` (each weighted by its cotangent) with respect to `inputs`: one fresh tensor each.
# `retain_graph`: the code asked to keep the graph (so tensors computed before may be differentiated again).
GRAD_OF = Symbol("grad_of", _grad_of_meta, namespace="autograd", is_prim=True)


