"""Ops that mixture-of-experts layers route tokens with: F.one_hot, torch.histc, torch._grouped_mm.

`one_hot` compares each index with an iota of the classes; `histc` and `grouped_mm`
run torch's kernels (minijit/ops/aten_prims.py). histc has no gradient in torch: its
decomposition detaches its input, so the grad pass treats it as a constant.
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir import NumberProxy, TensorProxy
from minijit.ir.proxies import rule_compare
from minijit.ops import aten_prims, prims
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import fail, to_dtype, unsqueeze_at

F = torch.nn.functional


@ltorch_op(torch_fns=[F.one_hot])
def one_hot(tensor: TensorProxy, num_classes: int = -1) -> TensorProxy:
    """F.one_hot: int64 indices (...,) -> (..., num_classes) with a 1 at each index."""
    if not isinstance(tensor, TensorProxy) or tensor.dtype != torch.int64:
        raise fail("one_hot", f"is only applicable to int64 index tensors, got {getattr(tensor, 'dtype', tensor)}")
    if rule_compare(num_classes, "==", -1):
        raise fail("one_hot", "num_classes=-1 takes the number of classes from the data (its max + 1), which a "
                              "trace cannot depend on; pass num_classes")
    if rule_compare(num_classes, "<", 0):
        raise fail("one_hot", f"num_classes must be -1 or non-negative, got {num_classes}")
    classes = prims.iota(num_classes, start=0, step=1, dtype=torch.int64, device=tensor.device)
    x = unsqueeze_at(tensor, (tensor.ndim,))
    shape = (*tensor.shape, num_classes)
    hit = prims.eq(prims.broadcast_in_dim(x, shape, tuple(range(len(shape)))),
                   prims.broadcast_in_dim(classes, shape, (len(shape) - 1,)))
    return to_dtype(hit, torch.int64)


@ltorch_op(torch_fns=[torch.histc, torch.Tensor.histc], methods=["histc"])
def histc(input: TensorProxy, bins: int = 100, min: Any = 0, max: Any = 0) -> TensorProxy:  # noqa: A002
    """torch.histc: counts in `bins` equal bins over [min, max] (over the data's range when min == max)."""
    if not isinstance(input, TensorProxy):
        raise fail("histc", f"expected a tensor, got {type(input).__name__}")
    if isinstance(bins, TensorProxy) or not isinstance(bins, int | NumberProxy):
        raise fail("histc", f"bins must be int, not {'Tensor' if isinstance(bins, TensorProxy) else type(bins).__name__}")
    if rule_compare(bins, "<=", 0):
        raise fail("histc", f"bins must be > 0, got {bins}")
    if rule_compare(min, ">", max):
        raise fail("histc", f"max ({max}) must be larger than or equal to min ({min})")
    return aten_prims.histc(prims.detach(input), bins, min, max)


@ltorch_op(torch_fns=[torch._grouped_mm, F.grouped_mm])
def grouped_mm(mat_a: TensorProxy, mat_b: TensorProxy, offs: TensorProxy | None = None,
               bias: TensorProxy | None = None, out_dtype: torch.dtype | None = None) -> TensorProxy:
    """torch._grouped_mm: a @ b per group; a 2-d operand is split into groups along its ragged dim by `offs`."""
    for x, what in ((mat_a, "mat_a"), (mat_b, "mat_b")):
        if not isinstance(x, TensorProxy) or x.ndim not in (2, 3):
            raise fail("grouped_mm", f"{what} must be a 2-d or 3-d tensor, got {getattr(x, 'shape', x)}")
    if (mat_a.ndim == 3 and mat_b.ndim == 3) != (offs is None):
        raise fail("grouped_mm", "offs must be given exactly when one operand is 2-d")
    return aten_prims.grouped_mm(mat_a, mat_b, offs, bias, out_dtype)
