"""F.pad's 'reflect', 'replicate' and 'circular' modes, as one gather (`prims.take`) per padded dim.

Output position i of a padded dim of size n (counting from -before) reads input
position: |i| reflected back from the far end (reflect), i clamped to [0, n - 1]
(replicate), or i mod n (circular). The indices are computed in the trace from an
iota, so the gradient is take's (an index_add). Negative pads crop (in circular mode, before the
other side wraps around what is left, as in torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import TensorProxy
from minijit.ir.proxies import rule_compare
from minijit.ops import prims
from minijit.ops.utils import fail, larger

MODES = ("reflect", "replicate", "circular")


def pad_by_index(input: TensorProxy, pad: Sequence[int], mode: str) -> TensorProxy:  # noqa: A002
    """F.pad(input, pad, mode) for a mode in MODES (pad lists (before, after) pairs from the last dim back)."""
    if mode not in MODES:
        raise fail("pad", f"mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    k = len(pad) // 2
    if len(pad) % 2 or not 1 <= k <= 3 or input.ndim not in (k + 1, k + 2):
        raise fail("pad", f"{mode} padding of {k} dims needs a {k + 1}-d or {k + 2}-d input and pairs of pads, "
                          f"got {len(pad)} pads for shape {tuple(input.shape)}")
    x = input
    for i in range(k):
        d = input.ndim - 1 - i
        x = _pad_dim(x, d, pad[2 * i], pad[2 * i + 1], mode)
    return x


def _pad_dim(x: TensorProxy, d: int, before: Any, after: Any, mode: str) -> TensorProxy:
    n = x.shape[d]
    if mode == "circular" and (rule_compare(before, "<", 0) or rule_compare(after, "<", 0)):
        # Circular padding wraps around what negative pads leave (torch crops first).
        start, end = larger(-before, 0), n - larger(-after, 0)
        if rule_compare(end, "<=", start):
            raise fail("pad", f"padding ({before}, {after}) leaves nothing of a dim of size {n}")
        x = prims.slice_prim(x, [start if i == d else 0 for i in range(x.ndim)],
                             [end if i == d else s for i, s in enumerate(x.shape)])
        n, before, after = end - start, larger(before, 0), larger(after, 0)
    if mode == "reflect" and (rule_compare(before, ">=", n) or rule_compare(after, ">=", n)):
        raise fail("pad", f"reflect padding ({before}, {after}) must be less than the dim's size {n}")
    if mode == "circular" and (rule_compare(before, ">", n) or rule_compare(after, ">", n)):
        raise fail("pad", f"circular padding ({before}, {after}) must be at most the dim's size {n}")
    length = n + before + after
    if rule_compare(length, "<=", 0):
        raise fail("pad", f"padding ({before}, {after}) leaves nothing of a dim of size {n}")
    if not before and not after:
        return x
    i = prims.iota(length, start=-before, step=1, dtype=torch.int64, device=x.device)
    if mode == "reflect":
        j = prims.abs(i)
        index = prims.where(prims.ge(j, n), prims.sub(2 * (n - 1), j), j)
    elif mode == "replicate":
        index = prims.maximum(prims.minimum(i, n - 1), 0)
    else:
        index = prims.remainder(i, n)
    return prims.take(x, index, d)
