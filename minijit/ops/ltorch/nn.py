"""torch.nn.functional ops: linear, activations, normalization, attention, losses, ..."""

from __future__ import annotations

import math

import torch

from minijit.ir import TensorProxy
from minijit.ops import prims
from minijit.ops.ltorch.elementwise import add, erf, mul, tanh
from minijit.ops.ltorch.shape import transpose
from minijit.ops.registry import ltorch_op

F = torch.nn.functional


@ltorch_op(torch_fns=[torch.matmul, torch.Tensor.matmul], methods=["matmul"])
def matmul(a: TensorProxy, b: TensorProxy) -> TensorProxy:
    """torch.matmul (batch dims broadcast)."""
    return prims.matmul(a, b)


@ltorch_op(torch_fns=[F.linear])
def linear(input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None = None) -> TensorProxy:  # noqa: A002
    """F.linear: input @ weight.T + bias."""
    out = matmul(input, transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    return add(out, bias) if bias is not None else out


@ltorch_op(torch_fns=[F.gelu])
def gelu(a: TensorProxy, approximate: str = "none") -> TensorProxy:
    """F.gelu, exact (erf) or approximate='tanh'."""
    if approximate == "tanh":
        inner = mul(add(a, mul(mul(mul(a, a), a), 0.044715)), math.sqrt(2 / math.pi))
        return mul(mul(a, 0.5), add(tanh(inner), 1))
    return mul(mul(a, 0.5), add(erf(mul(a, 1 / math.sqrt(2))), 1))
