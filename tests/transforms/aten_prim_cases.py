"""Gradient cases of the aten-backed prims (minijit/ops/aten_prims.py), run by test_grad_prims.py.

Each case calls the prim directly; test_grad_prims compares the VJP rule's gradients
with torch autograd through the aten op the torch executor runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

F64 = torch.float64


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=F64)


def _distinct(*shape: int) -> torch.Tensor:
    """Values without ties, so max pooling's gradient is defined."""
    return torch.randperm(int(torch.tensor(shape).prod())).to(F64).reshape(shape) / 7


CASES: list[tuple[str, Callable[[], tuple[Any, ...]]]] = [
    ("convolution", lambda: (_t(2, 3, 6, 5), _t(4, 3, 3, 2), _t(4), [1, 2], [1, 0], [1, 1], False, [0, 0], 1)),
    ("convolution", lambda: (_t(2, 4, 5), _t(4, 3, 3), None, [2], [1], [2], True, [1], 2)),
    ("convolution", lambda: (_t(1, 2, 4, 4, 3), _t(2, 1, 2, 2, 2), _t(2), [1, 1, 1], [0, 1, 0], [1, 1, 1], False,
                             [0, 0, 0], 2)),
    ("max_pool", lambda: (_distinct(2, 3, 7, 6), [3, 2], [2, 2], [1, 0], [1, 1], True)),
    ("max_pool", lambda: (_distinct(2, 2, 5, 5, 4), [2, 2, 2], [1, 2, 2], [0, 1, 0], [2, 1, 1], False)),
    ("adaptive_max_pool", lambda: (_distinct(2, 3, 7, 5), [3, 2])),
    ("avg_pool", lambda: (_t(2, 3, 7, 6), [3, 2], [2, 2], [1, 1], True, False, None)),
    ("avg_pool", lambda: (_t(2, 2, 4, 5, 4), [2, 2, 2], [2, 1, 2], [0, 1, 1], False, True, 3)),
    ("adaptive_avg_pool", lambda: (_t(2, 3, 7, 5), [3, 2])),
    ("adaptive_avg_pool", lambda: (_t(3, 5, 4, 6), [2, 3, 4])),
    ("upsample", lambda: (_t(2, 3, 4, 5), "bicubic", [7, 9], False, [None, None])),
    ("upsample", lambda: (_t(2, 3, 4, 5), "bilinear", [8, 7], True, [2.0, 1.5])),
    ("upsample", lambda: (_t(2, 3, 4), "nearest", [10], None, [2.5])),
    ("upsample", lambda: (_t(1, 2, 3, 2, 3), "trilinear", [5, 4, 6], False, [None, None, None])),
]

# Prims that need no rule: backward kernels that only VJP rules record, histc (torch defines no
# gradient; ltorch.histc detaches its input) and item (its output is a Python number).
NOT_DIFFERENTIABLE = {"convolution_backward", "avg_pool_backward", "adaptive_avg_pool_backward", "upsample_backward",
                      "batch_norm_backward", "histc", "item",
                      "check_value",  # a check of a value read while tracing: no tensor result
                      "size"}  # a size of a tensor the trace made (minijit/ops/unbacked.py): a number, no gradient

# Prims whose gradient is tested in tests/transforms/test_grad_modelops.py: the generic harness makes
# every floating point argument require grad and differentiates every floating point output, but eager's
# batch norm refuses running statistics that require grad and gives its saved statistics no gradient,
# and grouped_mm has no float64 kernel.
TESTED_ELSEWHERE = {"batch_norm_training", "batch_norm_no_stats", "grouped_mm"}
