"""Convolutions: F.conv1d/2d/3d, F.conv_transpose1d/2d/3d and torch.convolution, as `prims.convolution`.

Each op normalises its arguments the way torch does (ints to per-dim tuples, an
unbatched input gets a batch dim of 1, `padding='same'`/`'valid'` become numbers,
with an extra pad on the right where 'same' is asymmetric) and makes one
`prims.convolution` call, which runs as `aten.convolution`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import Symbol, TensorProxy
from minijit.ir.proxies import rule_compare
from minijit.ops import aten_prims
from minijit.ops.ltorch.nn import pad
from minijit.ops.registry import declare_op, ltorch_op
from minijit.ops.utils import fail, reshape_to, unsqueeze_at

F = torch.nn.functional


def per_dim(op: str, value: Any, n: int, what: str) -> list[int]:
    """An int or a sequence of n ints as a list of n ints."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        values = list(value)
        if len(values) == 1 and n > 1:
            values = values * n
        if len(values) != n:
            raise fail(op, f"{what} needs {n} values, got {tuple(value)}")
        return values
    return [value] * n


def _check(op: str, input: TensorProxy, weight: TensorProxy, n: int) -> bool:  # noqa: A002
    """Check ranks; returns whether the input is batched."""
    if not isinstance(input, TensorProxy) or not isinstance(weight, TensorProxy):
        raise fail(op, "expects tensors for input and weight")
    if input.ndim not in (n + 1, n + 2):
        raise fail(op, f"expected a {n + 1}-d (unbatched) or {n + 2}-d (batched) input, got shape {tuple(input.shape)}")
    if weight.ndim != n + 2:
        raise fail(op, f"expected a {n + 2}-d weight, got shape {tuple(weight.shape)}")
    if input.dtype != weight.dtype:
        raise fail(op, f"input ({input.dtype}) and weight ({weight.dtype}) must have the same dtype")
    return input.ndim == n + 2


def _same_padding(op: str, x: TensorProxy, weight: TensorProxy, stride: list[int],
                  dilation: list[int], n: int) -> tuple[TensorProxy, list[int]]:
    """padding='same': (the input, padded on the right where the total padding is odd, the symmetric padding)."""
    if any(rule_compare(s, "!=", 1) for s in stride):
        raise fail(op, "padding='same' is not supported for strided convolutions")
    total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    left = [t // 2 for t in total]
    extra = [t - 2 * lf for t, lf in zip(total, left)]
    if any(extra):
        pad_spec: list[int] = []
        for e in reversed(extra):  # F.pad lists the last dim first
            pad_spec += [0, e]
        x = pad(x, pad_spec)
    return x, left


def _conv(op: str, n: int, input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None,  # noqa: A002
          stride: Any, padding: Any, dilation: Any, groups: int) -> TensorProxy:
    batched = _check(op, input, weight, n)
    x = input if batched else unsqueeze_at(input, (0,))
    stride_, dilation_ = per_dim(op, stride, n, "stride"), per_dim(op, dilation, n, "dilation")
    if isinstance(padding, str):
        if padding == "valid":
            padding_ = [0] * n
        elif padding == "same":
            x, padding_ = _same_padding(op, x, weight, stride_, dilation_, n)
        else:
            raise fail(op, f"padding must be 'valid', 'same' or numbers, got {padding!r}")
    else:
        padding_ = per_dim(op, padding, n, "padding")
    out = aten_prims.convolution(x, weight, bias, stride_, padding_, dilation_, False, [0] * n, groups)
    return out if batched else reshape_to(out, out.shape[1:])


def _conv_transpose(op: str, n: int, input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None,  # noqa: A002
                    stride: Any, padding: Any, output_padding: Any, groups: int, dilation: Any) -> TensorProxy:
    batched = _check(op, input, weight, n)
    if isinstance(padding, str):
        raise fail(op, f"padding must be numbers, got {padding!r}")
    x = input if batched else unsqueeze_at(input, (0,))
    out = aten_prims.convolution(x, weight, bias, per_dim(op, stride, n, "stride"), per_dim(op, padding, n, "padding"),
                                 per_dim(op, dilation, n, "dilation"), True,
                                 per_dim(op, output_padding, n, "output_padding"), groups)
    return out if batched else reshape_to(out, out.shape[1:])


def _conv_op(n: int, doc: str) -> Symbol:
    """Declares F.conv{n}d, documented as `doc`."""
    name = f"conv{n}d"

    def conv(input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None = None, stride: Any = 1,  # noqa: A002
             padding: Any = 0, dilation: Any = 1, groups: int = 1) -> TensorProxy:
        return _conv(name, n, input, weight, bias, stride, padding, dilation, groups)

    return declare_op(name, conv, doc, torch_fns=[getattr(torch, name), getattr(F, name)])


conv1d = _conv_op(1, "F.conv1d over (N, C, L) or unbatched (C, L) inputs.")
conv2d = _conv_op(2, "F.conv2d over (N, C, H, W) or unbatched (C, H, W) inputs.")
conv3d = _conv_op(3, "F.conv3d over (N, C, D, H, W) or unbatched (C, D, H, W) inputs.")


def _conv_transpose_op(n: int, doc: str) -> Symbol:
    """Declares F.conv_transpose{n}d, documented as `doc`."""
    name = f"conv_transpose{n}d"

    def conv_transpose(input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None = None,  # noqa: A002
                       stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                       dilation: Any = 1) -> TensorProxy:
        return _conv_transpose(name, n, input, weight, bias, stride, padding, output_padding, groups, dilation)

    return declare_op(name, conv_transpose, doc, torch_fns=[getattr(torch, name), getattr(F, name)])


conv_transpose1d = _conv_transpose_op(1, "F.conv_transpose1d (the gradient of conv1d with respect to its input, as an op).")
conv_transpose2d = _conv_transpose_op(2, "F.conv_transpose2d.")
conv_transpose3d = _conv_transpose_op(3, "F.conv_transpose3d.")


@ltorch_op(torch_fns=[torch.convolution])
def convolution(input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None, stride: Any,  # noqa: A002
                padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int) -> TensorProxy:
    """torch.convolution: a batched (transposed) convolution with explicit per-dim parameters."""
    n = weight.ndim - 2 if isinstance(weight, TensorProxy) else 0
    if n < 1 or not isinstance(input, TensorProxy) or input.ndim != n + 2:
        raise fail("convolution", "expects a batched input and a weight of the same rank")
    return aten_prims.convolution(input, weight, bias, per_dim("convolution", stride, n, "stride"),
                                  per_dim("convolution", padding, n, "padding"),
                                  per_dim("convolution", dilation, n, "dilation"), transposed,
                                  per_dim("convolution", output_padding, n, "output_padding"), groups)
