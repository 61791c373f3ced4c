"""Batch statistics normalization: F.batch_norm, F.instance_norm, F.local_response_norm.

In training, batch norm normalizes with the batch's statistics and updates the
running statistics in place, as eager does: the decomposition computes the new
statistics functionally (`prims.batch_norm_training`, one aten call giving the
output, the saved statistics and the new running ones) and writes them into the
running-stat tensors with `prims.copy_`. The functionalize pass turns those writes
into `copy_to_out_` into the module's buffers (docs/design.md, invariant 1). In eval, or
without running statistics, nothing is written and the op runs as one `F.batch_norm`.
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir import TensorProxy
from minijit.ir.proxies import number_value, rule_compare, rule_same_shape
from minijit.ops import aten_prims, prims
from minijit.ops.ltorch.elementwise import add, div, mul, pow, rsqrt, sub  # noqa: A004 - torch.pow
from minijit.ops.ltorch.nn import pad
from minijit.ops.ltorch.pooling import avg_pool2d, avg_pool3d
from minijit.ops.ltorch.reductions import mean
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import compute_dtype_for, expand_to, fail, numel_of, reshape_to, to_dtype, unsqueeze_at

F = torch.nn.functional


def _per_channel(op: str, x: Any, c: Any, what: str) -> None:
    if x is not None and (not isinstance(x, TensorProxy) or not rule_same_shape(x.shape, (c,))):
        got = tuple(x.shape) if isinstance(x, TensorProxy) else type(x).__name__
        raise fail(op, f"{what} must be a tensor of shape ({c},), got {got}")


def _channel_view(x: TensorProxy, ndim: int) -> TensorProxy:
    """A (C,) tensor shaped (C, 1, ...) to broadcast along dim 1 of an ndim-d input."""
    return reshape_to(x, (x.shape[0],) + (1,) * (ndim - 2))


def normalize_with(input: TensorProxy, mean_: TensorProxy, var: TensorProxy, weight: Any, bias: Any,  # noqa: A002
                   eps: Any) -> TensorProxy:
    """(x - mean) / sqrt(var + eps) * weight + bias with (C,) statistics along dim 1, in the compute dtype."""
    dtype = compute_dtype_for(input.dtype)
    x = to_dtype(input, dtype)
    scale = rsqrt(add(to_dtype(var, dtype), eps))
    if weight is not None:
        scale = mul(scale, to_dtype(weight, dtype))
    out = mul(sub(x, _channel_view(to_dtype(mean_, dtype), x.ndim)), _channel_view(scale, x.ndim))
    if bias is not None:
        out = add(out, _channel_view(to_dtype(bias, dtype), x.ndim))
    return to_dtype(out, input.dtype)


def _eager_eps_check(training: bool, eps: Any) -> None:
    """F.batch_norm's own check of `eps` (Python in torch, whose condition and words differ between torch builds),
    asked of it on stand-ins: its ValueError, as the op's."""
    try:
        F.batch_norm(torch.zeros(2, 1), torch.zeros(1), torch.ones(1), training=training, eps=number_value(eps))
    except ValueError as refused:
        raise fail("batch_norm", str(refused)) from None


@ltorch_op(torch_fns=[F.batch_norm])
def batch_norm(input: TensorProxy, running_mean: TensorProxy | None, running_var: TensorProxy | None,  # noqa: A002
               weight: TensorProxy | None = None, bias: TensorProxy | None = None, training: bool = False,
               momentum: Any = 0.1, eps: float = 1e-5) -> TensorProxy:
    """F.batch_norm over dim 1; in training the running statistics (if given) are updated in place."""
    if rule_compare(eps, "<=", 0):
        _eager_eps_check(training, eps)
    if isinstance(input, TensorProxy) and input.ndim >= 1 and rule_compare(numel_of(input.shape), "==", 0):
        # As eager: nothing to normalize, no statistics to update; the weight and bias still take part, so that
        # their gradients are zeros (as eager's), not None, and no kernel runs on an empty batch.
        out = prims.clone(input)
        if weight is not None:
            out = mul(out, weight[0])
        return out if bias is None else add(out, bias[0])
    if not isinstance(input, TensorProxy) or input.ndim < 2:
        raise fail("batch_norm", f"expects an input with a channel dim 1, got {getattr(input, 'shape', input)}")
    c = input.shape[1]
    for x, what in ((running_mean, "running_mean"), (running_var, "running_var"), (weight, "weight"), (bias, "bias")):
        _per_channel("batch_norm", x, c, what)
    if (running_mean is None) != (running_var is None):
        raise fail("batch_norm", "running_mean and running_var must both be given or both be None")
    if training:
        if rule_compare(numel_of(input.shape), "==", c):
            raise fail("batch_norm", f"expected more than 1 value per channel when training, got input size "
                                     f"{list(input.shape)}")
        if running_mean is None:
            return aten_prims.batch_norm_no_stats(input, weight, bias, True, momentum, eps)[0]
        out, _, _, new_mean, new_var = aten_prims.batch_norm_training(input, weight, bias, running_mean, running_var,
                                                                      True, momentum, eps)
        with torch.no_grad():  # eager's kernel updates the running statistics without history
            prims.copy_(new_mean, running_mean)
            prims.copy_(new_var, running_var)
        return out
    if running_mean is None:
        raise fail("batch_norm", "running_mean and running_var must be given in evaluation mode (training=False)")
    return normalize_with(input, running_mean, running_var, weight, bias, eps)


@ltorch_op(torch_fns=[F.instance_norm])
def instance_norm(input: TensorProxy, running_mean: TensorProxy | None = None,  # noqa: A002
                  running_var: TensorProxy | None = None, weight: TensorProxy | None = None,
                  bias: TensorProxy | None = None, use_input_stats: bool = True, momentum: Any = 0.1,
                  eps: float = 1e-5) -> TensorProxy:
    """F.instance_norm: batch norm of each (sample, channel) plane; running statistics are the batch's average."""
    if not isinstance(input, TensorProxy) or input.ndim < 3:
        raise fail("instance_norm", f"expects a batched input (N, C, ...), got {getattr(input, 'shape', input)}")
    n, c = input.shape[0], input.shape[1]
    for x, what in ((running_mean, "running_mean"), (running_var, "running_var"), (weight, "weight"), (bias, "bias")):
        _per_channel("instance_norm", x, c, what)
    empty = rule_compare(numel_of(input.shape), "==", 0)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise fail("instance_norm", "expected running_mean and running_var when use_input_stats=False")
        if not empty:
            return normalize_with(input, running_mean, running_var, weight, bias, eps)
    elif rule_compare(numel_of(input.shape[2:]), "==", 1):
        raise fail("instance_norm", f"expected more than 1 spatial element when training, got input size "
                                    f"{list(input.shape)}")
    # As torch: one batch norm over an input of shape (1, N * C, ...), per-channel tensors repeated N times.
    def repeated(x: Any) -> Any:
        return None if x is None else reshape_to(expand_to(unsqueeze_at(x, (0,)), (n, c)), (n * c,))

    planes = reshape_to(input, (1, n * c, *input.shape[2:]))
    if empty:
        # An empty batch, with or without input statistics: batch norm's own path for it, which leaves the
        # (repeated) statistics as they were (and indexes the repeated weight and bias, raising eager's IndexError).
        out = batch_norm(planes, None, None, repeated(weight), repeated(bias), True, momentum, eps)
        new_mean, new_var = repeated(running_mean), repeated(running_var)
        if not use_input_stats or running_mean is None or running_var is None:
            return reshape_to(out, input.shape)
    elif running_mean is None or running_var is None:
        out = aten_prims.batch_norm_no_stats(planes, repeated(weight), repeated(bias), True, momentum, eps)[0]
        return reshape_to(out, input.shape)
    else:
        out, _, _, new_mean, new_var = aten_prims.batch_norm_training(
            planes, repeated(weight), repeated(bias), repeated(running_mean), repeated(running_var), True, momentum,
            eps)
    with torch.no_grad():  # eager's kernel updates the running statistics without history
        prims.copy_(to_dtype(mean(reshape_to(new_mean, (n, c)), 0), running_mean.dtype), running_mean)
        prims.copy_(to_dtype(mean(reshape_to(new_var, (n, c)), 0), running_var.dtype), running_var)
    return reshape_to(out, input.shape)


@ltorch_op(torch_fns=[F.local_response_norm])
def local_response_norm(input: TensorProxy, size: int, alpha: float = 1e-4, beta: float = 0.75,  # noqa: A002
                        k: float = 1.0) -> TensorProxy:
    """F.local_response_norm: x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta."""
    if not isinstance(input, TensorProxy) or input.ndim < 3:
        raise fail("local_response_norm", f"expects an input of 3 or more dims, got {getattr(input, 'shape', input)}")
    if rule_compare(numel_of(input.shape), "==", 0):
        return input
    sq = mul(input, input)
    before, after = size // 2, (size - 1) // 2
    if input.ndim == 3:
        window = pad(unsqueeze_at(sq, (1,)), [0, 0, before, after])
        avg = reshape_to(avg_pool2d(window, (size, 1), stride=1), input.shape)
    else:
        shape = input.shape
        window = pad(reshape_to(sq, (shape[0], 1, shape[1], shape[2], numel_of(shape[3:]))),
                     [0, 0, 0, 0, before, after])
        avg = reshape_to(avg_pool3d(window, (size, 1, 1), stride=1), shape)
    return div(input, pow(add(mul(avg, alpha), k), beta))
