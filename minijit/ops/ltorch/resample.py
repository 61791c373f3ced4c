"""Resampling: F.interpolate (and the F.upsample* wrappers), F.pixel_shuffle, F.pixel_unshuffle.

`interpolate` resolves its size and scale arguments as torch's F.interpolate does
(an output size from `size`, or floor(input size * scale_factor) with the scale kept
for the source positions unless `recompute_scale_factor`), then makes one
`prims.upsample` call (torch's upsample kernel for the mode); 'area' is adaptive
average pooling. Pixel shuffles are reshapes and one permutation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import IntegerProxy, NumberProxy, TensorProxy
from minijit.ops import aten_prims, prims
from minijit.ops.ltorch.pooling import adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import fail, reshape_to, unsupported

F = torch.nn.functional

# mode -> the number of spatial dims it works on (None: any of 1, 2, 3)
_MODE_DIMS = {"nearest": None, "nearest-exact": None, "area": None, "linear": 1, "bilinear": 2, "bicubic": 2,
              "trilinear": 3}


def _spatial(op: str, value: Any, dim: int, what: str) -> list[Any]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != dim:
            raise fail(op, f"{what} {tuple(value)} needs one entry per spatial dim ({dim})")
        return list(value)
    return [value] * dim


@ltorch_op(torch_fns=[F.interpolate])
def interpolate(input: TensorProxy, size: Any = None, scale_factor: Any = None, mode: str = "nearest",  # noqa: A002
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> TensorProxy:
    """F.interpolate in the modes nearest, nearest-exact, linear, bilinear, bicubic, trilinear and area."""
    op = "interpolate"
    if not isinstance(input, TensorProxy) or input.ndim not in (3, 4, 5):
        raise fail(op, f"expects a 3-d, 4-d or 5-d input (N, C, spatial...), got {getattr(input, 'shape', input)}")
    if not input.dtype.is_floating_point:  # torch's kernels take uint8 images in some modes
        raise unsupported(op, f"a {input.dtype} input is not supported; only floating point ones")
    if mode not in _MODE_DIMS:
        raise fail(op, f"mode {mode!r} is not supported; use one of {', '.join(_MODE_DIMS)}")
    dim = input.ndim - 2
    if _MODE_DIMS[mode] not in (None, dim):
        raise fail(op, f"mode {mode!r} needs a {_MODE_DIMS[mode] + 2}-d input, got {input.ndim}-d")
    if "nearest" in mode or mode == "area":
        if align_corners is not None:
            raise fail(op, "align_corners can only be set with the modes linear, bilinear, bicubic and trilinear")
    elif align_corners is None:
        align_corners = False
    if antialias:
        raise unsupported(op, "antialias=True is not supported")
    if (size is None) == (scale_factor is None):
        raise fail(op, "give exactly one of size and scale_factor")
    if recompute_scale_factor and size is not None:
        raise fail(op, "recompute_scale_factor is not meaningful with an explicit size")
    if size is not None:
        output_size = _spatial(op, size, dim, "size")
        scales: list[Any] = [None] * dim
    else:
        scales = _spatial(op, scale_factor, dim, "scale_factor")
        output_size = [_floor(input.shape[2 + i] * s) for i, s in enumerate(scales)]
        if recompute_scale_factor or mode == "area":
            scales = [None] * dim
    if mode == "area":
        return (adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d)[dim - 1](input, output_size)
    return aten_prims.upsample(input, mode, output_size, align_corners if "nearest" not in mode else None, scales)


def _floor(x: Any) -> int:
    return math.floor(float(x) if isinstance(x, NumberProxy) else x)


@ltorch_op(torch_fns=[F.upsample])
def upsample(input: TensorProxy, size: Any = None, scale_factor: Any = None, mode: str = "nearest",  # noqa: A002
             align_corners: bool | None = None) -> TensorProxy:
    """F.upsample: F.interpolate (deprecated name)."""
    return interpolate(input, size, scale_factor, mode, align_corners)


@ltorch_op(torch_fns=[F.upsample_nearest])
def upsample_nearest(input: TensorProxy, size: Any = None, scale_factor: Any = None) -> TensorProxy:  # noqa: A002
    """F.upsample_nearest: F.interpolate in nearest mode."""
    return interpolate(input, size, scale_factor, mode="nearest")


@ltorch_op(torch_fns=[F.upsample_bilinear])
def upsample_bilinear(input: TensorProxy, size: Any = None, scale_factor: Any = None) -> TensorProxy:  # noqa: A002
    """F.upsample_bilinear: F.interpolate in bilinear mode with align_corners=True."""
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def _shuffle_input(op: str, input: Any, factor: Any) -> TensorProxy:  # noqa: A002
    if not isinstance(input, TensorProxy) or input.ndim < 3:
        raise fail(op, f"expects an input of at least 3 dims, got {getattr(input, 'shape', input)}")
    # A symbolic factor (an outside int under symbolic values) is kept: its comparisons record constraints.
    if not (type(factor) is int or isinstance(factor, IntegerProxy)) or factor <= 0:
        raise fail(op, f"the factor must be a positive int, got {factor!r}")
    return input


@ltorch_op(torch_fns=[F.pixel_shuffle, torch.pixel_shuffle])
def pixel_shuffle(input: TensorProxy, upscale_factor: int) -> TensorProxy:  # noqa: A002
    """F.pixel_shuffle: (*, C r^2, H, W) -> (*, C, H r, W r)."""
    x = _shuffle_input("pixel_shuffle", input, upscale_factor)
    r = upscale_factor
    *batch, c, h, w = x.shape
    if c % (r * r):
        raise fail("pixel_shuffle", f"the channels {c} are not divisible by upscale_factor^2 = {r * r}")
    b = len(batch)
    x = reshape_to(x, (*batch, c // (r * r), r, r, h, w))
    x = prims.transpose(x, (*range(b), b, b + 3, b + 1, b + 4, b + 2))
    return prims.clone(reshape_to(x, (*batch, c // (r * r), h * r, w * r)))


@ltorch_op(torch_fns=[F.pixel_unshuffle, torch.pixel_unshuffle])
def pixel_unshuffle(input: TensorProxy, downscale_factor: int) -> TensorProxy:  # noqa: A002
    """F.pixel_unshuffle: (*, C, H r, W r) -> (*, C r^2, H, W)."""
    x = _shuffle_input("pixel_unshuffle", input, downscale_factor)
    r = downscale_factor
    *batch, c, hr, wr = x.shape
    if hr % r or wr % r:
        raise fail("pixel_unshuffle", f"the spatial size ({hr}, {wr}) is not divisible by downscale_factor {r}")
    b = len(batch)
    x = reshape_to(x, (*batch, c, hr // r, r, wr // r, r))
    x = prims.transpose(x, (*range(b), b, b + 2, b + 4, b + 1, b + 3))
    return prims.clone(reshape_to(x, (*batch, c * r * r, hr // r, wr // r)))
