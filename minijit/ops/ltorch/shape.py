"""Shape and layout ops: views, reshapes, permutations, indexing, cat/stack/split."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minijit.ir import TensorProxy
from minijit.ops import prims
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import canonical_dim

VIEW = "view"  # the output may alias the input (functionalization tracks it)


@ltorch_op(torch_fns=[torch.transpose, torch.swapaxes, torch.Tensor.transpose], methods=["transpose", "swapaxes"], tags=[VIEW])
def transpose(a: TensorProxy, dim0: int, dim1: int) -> TensorProxy:
    """torch.transpose: swaps two dims."""
    perm = list(range(a.ndim))
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return prims.transpose(a, tuple(perm)) if a.ndim > 1 and d0 != d1 else a


@ltorch_op(torch_fns=[torch.t, torch.Tensor.t], methods=["t"], tags=[VIEW])
def t(a: TensorProxy) -> TensorProxy:
    """torch.t: transposes a matrix (0-d and 1-d tensors are returned as they are)."""
    if a.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return transpose(a, 0, 1) if a.ndim == 2 else a


@ltorch_op(torch_fns=[torch.permute, torch.Tensor.permute], methods=["permute"], tags=[VIEW])
def permute(a: TensorProxy, *dims: int | Sequence[int]) -> TensorProxy:
    """torch.permute (dims as one sequence or as separate ints)."""
    if len(dims) == 1 and not isinstance(dims[0], int):
        dims = tuple(dims[0])
    perm = tuple(canonical_dim(d, a.ndim) for d in dims)
    return prims.transpose(a, perm) if perm != tuple(range(a.ndim)) else a
