"""Reductions: sum, mean, amax, amin, prod, var, std, var_mean, max/min, argmax, ..."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import TensorProxy
from minijit.ops import prims
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import canonical_dims, to_dtype


def keep_dims(out: TensorProxy, shape: Sequence[Any], dims: Sequence[int]) -> TensorProxy:
    """Re-insert reduced `dims` as size-1 dims (keepdim=True)."""
    kept = tuple(1 if i in dims else s for i, s in enumerate(shape))
    return prims.reshape(out, kept) if kept != tuple(out.shape) else out


@ltorch_op(torch_fns=[torch.sum, torch.Tensor.sum], methods=["sum"])
def sum(a: TensorProxy, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,  # noqa: A001
        dtype: torch.dtype | None = None) -> TensorProxy:
    """torch.sum; bool and integer inputs sum in int64 as torch does."""
    if dtype is None:
        dtype = torch.int64 if not (a.dtype.is_floating_point or a.dtype.is_complex) else a.dtype
    dims = canonical_dims(dim, a.ndim)
    out = prims.sum(to_dtype(a, dtype), dims)
    return keep_dims(out, a.shape, dims) if keepdim else out
