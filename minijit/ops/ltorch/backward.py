"""Backward ops: what the VJP rules (minijit/transforms/vjp/) call where torch has one kernel for a whole backward formula.

Each is declared like any other ltorch op, with its decomposition into prims (the formula,
for executors that fuse prims) and the aten callable the torch executor runs in one
call (docs/design.md, lessons: claim at the right level, in the backward as in the forward).
Their signatures are those of the aten ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import TensorProxy
from minijit.ir.proxies import rule_compare
from minijit.ops import prims
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import compute_dtype_for as compute_dtype
from minijit.ops.utils import restore_reduced
from minijit.ops.utils import to_dtype as _up

P = prims
aten = torch.ops.aten


def _cast_like(g: TensorProxy, x: TensorProxy) -> TensorProxy:
    return _up(g, x.dtype)


def _zeros_like(x: TensorProxy) -> TensorProxy:
    return P.full(x.shape, 0, dtype=x.dtype, device=x.device)


def _sum_keep(x: TensorProxy, dims: tuple[int, ...]) -> TensorProxy:
    """Sum over `dims`, broadcast back to x's shape."""
    return restore_reduced(P.sum(x, dims), x.shape, dims)


@ltorch_op("gelu_backward", impl=aten.gelu_backward.default)
def gelu_backward(grad_output: TensorProxy, self: TensorProxy, *, approximate: str = "none") -> TensorProxy:
    """aten.gelu_backward: grad_output * gelu'(self)."""
    dtype = compute_dtype(self.dtype)
    x = _up(self, dtype)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        x2 = P.mul(x, x)
        t = P.tanh(P.mul(P.add(x, P.mul(P.mul(x2, x), 0.044715)), k))
        left = P.mul(P.add(t, 1), 0.5)
        right = P.mul(P.mul(P.mul(x, 0.5), P.sub(1, P.mul(t, t))), P.mul(P.add(P.mul(x2, 3 * 0.044715), 1), k))
        d = P.add(left, right)
    else:
        cdf = P.mul(P.add(P.erf(P.mul(x, 1 / math.sqrt(2))), 1), 0.5)
        pdf = P.mul(P.exp(P.mul(P.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        d = P.add(cdf, P.mul(x, pdf))
    return _cast_like(P.mul(_up(grad_output, dtype), d), self)


@ltorch_op("threshold_backward", impl=aten.threshold_backward.default)
def threshold_backward(grad_output: TensorProxy, self: TensorProxy, threshold: float) -> TensorProxy:
    """aten.threshold_backward: grad_output where self > threshold, else 0 (relu's backward)."""
    return P.where(P.gt(self, threshold), grad_output, _zeros_like(grad_output))


def _softmax_backward_meta(log: bool) -> Any:
    def decomposition(grad_output: TensorProxy, output: TensorProxy, dim: int, input_dtype: torch.dtype) -> TensorProxy:
        dtype = compute_dtype(output.dtype)
        o, g = _up(output, dtype), _up(grad_output, dtype)
        d = (dim % max(o.ndim, 1),)
        if log:
            grad = P.sub(g, P.mul(P.exp(o), _sum_keep(g, d)))
        else:
            grad = P.mul(o, P.sub(g, _sum_keep(P.mul(o, g), d)))
        return grad if grad.dtype == input_dtype else P.convert_element_type(grad, input_dtype)
    return decomposition


softmax_backward = ltorch_op("softmax_backward", impl=aten._softmax_backward_data.default)(_softmax_backward_meta(False))
log_softmax_backward = ltorch_op("log_softmax_backward", impl=aten._log_softmax_backward_data.default)(
    _softmax_backward_meta(True))


def _stats_dtype(x: TensorProxy) -> torch.dtype:
    # aten's layer norm keeps mean and rstd in float32 for half inputs on CUDA, in the input's dtype on CPU.
    return compute_dtype(x.dtype) if x.device.type == "cuda" else x.dtype


@ltorch_op("native_layer_norm", impl=aten.native_layer_norm.default)
def native_layer_norm(input: TensorProxy, normalized_shape: Sequence[int], weight: Any, bias: Any,  # noqa: A002
                      eps: float) -> tuple[TensorProxy, TensorProxy, TensorProxy]:
    """aten.native_layer_norm: the normalized output, and the mean and rstd it used (kept dims of size 1)."""
    n = len(normalized_shape)
    dims = tuple(range(input.ndim - n, input.ndim))
    dtype = compute_dtype(input.dtype)
    x = _up(input, dtype)
    var, mean = P.var_mean(x, dims, 0)
    rstd = P.rsqrt(P.add(var, eps))
    out = P.mul(P.sub(x, restore_reduced(mean, x.shape, dims)), restore_reduced(rstd, x.shape, dims))
    if isinstance(weight, TensorProxy):
        out = P.mul(out, P.broadcast_in_dim(_up(weight, dtype), x.shape, dims))
    if isinstance(bias, TensorProxy):
        out = P.add(out, P.broadcast_in_dim(_up(bias, dtype), x.shape, dims))
    kept = (*input.shape[: input.ndim - n], *(1,) * n)
    stats = _stats_dtype(input)
    return (_cast_like(out, input), _up(P.reshape(mean, kept), stats), _up(P.reshape(rstd, kept), stats))


@ltorch_op("native_layer_norm_backward", impl=aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out: TensorProxy, input: TensorProxy, normalized_shape: Sequence[int],  # noqa: A002
                               mean: TensorProxy, rstd: TensorProxy, weight: Any, bias: Any,
                               output_mask: Sequence[bool]) -> tuple[Any, Any, Any]:
    """aten.native_layer_norm_backward: the gradients of input, weight and bias (None where not asked for)."""
    n = len(normalized_shape)
    dims = tuple(range(input.ndim - n, input.ndim))
    batch = tuple(range(input.ndim - n))
    count = math.prod(input.shape[d] for d in dims)
    dtype = compute_dtype(input.dtype)
    x, g = _up(input, dtype), _up(grad_out, dtype)
    r = P.broadcast_in_dim(_up(rstd, dtype), x.shape, tuple(range(x.ndim)))
    xhat = P.mul(P.sub(x, P.broadcast_in_dim(_up(mean, dtype), x.shape, tuple(range(x.ndim)))), r)
    dxhat = P.mul(g, P.broadcast_in_dim(_up(weight, dtype), x.shape, dims)) if isinstance(weight, TensorProxy) else g
    gx = gw = gb = None
    if output_mask[0]:
        mean_dxhat = P.div(_sum_keep(dxhat, dims), count)
        mean_dxhat_xhat = P.div(_sum_keep(P.mul(dxhat, xhat), dims), count)
        gx = _cast_like(P.mul(r, P.sub(P.sub(dxhat, mean_dxhat), P.mul(xhat, mean_dxhat_xhat))), input)
    if output_mask[1] and isinstance(weight, TensorProxy):
        gw = _cast_like(P.sum(P.mul(g, xhat), batch) if batch else P.mul(g, xhat), weight)
    if output_mask[2] and isinstance(bias, TensorProxy):
        # Over every dim the bias's gradient is grad_out's values: a copy, as eager's (the op's result is never its
        # input).
        gb = _cast_like(P.sum(g, batch) if batch else P.clone(g), bias)
    return gx, gw, gb


@ltorch_op("embedding_dense_backward", impl=aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output: TensorProxy, indices: TensorProxy, num_weights: int, padding_idx: int,
                             scale_grad_by_freq: bool) -> TensorProxy:
    """aten.embedding_dense_backward: the rows of grad_output summed into a (num_weights, dim) gradient (each
    row divided by its index's count first, with scale_grad_by_freq)."""
    dim = grad_output.shape[-1]
    flat = P.reshape(indices, (math.prod(indices.shape),))
    g2 = P.reshape(grad_output, (flat.shape[0], dim))
    if rule_compare(padding_idx, ">=", 0):
        pad = P.broadcast_in_dim(P.eq(flat, padding_idx), g2.shape, (0,))
        g2 = P.where(pad, _zeros_like(g2), g2)
    if scale_grad_by_freq:  # each row's gradient divided by how often its index occurs
        ones = P.full(tuple(flat.shape), 1, dtype=grad_output.dtype, device=grad_output.device)
        counts = P.index_add(P.full((num_weights,), 0, dtype=grad_output.dtype, device=grad_output.device),
                             flat, ones, 0)
        g2 = P.div(g2, P.broadcast_in_dim(P.take(counts, flat, 0), g2.shape, (0,)))
    zeros = P.full((num_weights, dim), 0, dtype=grad_output.dtype, device=grad_output.device)
    return P.index_add(zeros, flat, g2, 0)


def _silu_backward_eager(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    """aten.silu_backward, or under grad mode (a double backward) its formula in torch ops, as eager's autograd
    computes it there: aten.silu_backward has no derivative."""
    if torch.is_grad_enabled() and (grad_output.requires_grad or self.requires_grad):
        s = torch.sigmoid(self)
        return grad_output * (s * (1 + self * (1 - s)))
    return aten.silu_backward.default(grad_output, self)


@ltorch_op("silu_backward", impl=_silu_backward_eager)
def silu_backward(grad_output: TensorProxy, self: TensorProxy) -> TensorProxy:
    """aten.silu_backward: grad_output * silu'(self), with s = sigmoid(self): s * (1 + self * (1 - s))."""
    dtype = compute_dtype(self.dtype)
    x = _up(self, dtype)
    s = P.reciprocal(P.add(P.exp(P.neg(x)), 1))
    d = P.mul(s, P.add(P.mul(x, P.sub(1, s)), 1))
    return _cast_like(P.mul(_up(grad_output, dtype), d), self)


# aten's loss reductions as the integers its loss kernels take.
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _nll_rows(self: TensorProxy, target: TensorProxy, weight: Any,
              ignore_index: int) -> tuple[TensorProxy, TensorProxy, TensorProxy, TensorProxy]:
    """The (N, C) log-probabilities, each row's target as an (N, 1) index, each row's weight (0 where ignored),
    and where the target is ignored."""
    x = self if self.ndim == 2 else P.reshape(self, (1, self.shape[0]))
    n = x.shape[0]
    t = _up(P.reshape(target, (n,)), torch.int64)
    ignored = P.eq(t, ignore_index)
    safe = P.where(ignored, P.full((n,), 0, dtype=torch.int64, device=t.device), t)
    zeros = P.full((n,), 0, dtype=x.dtype, device=x.device)
    if isinstance(weight, TensorProxy):
        w = P.where(ignored, zeros, _up(P.take(weight, safe, 0), x.dtype))
    else:
        w = P.where(ignored, zeros, P.full((n,), 1, dtype=x.dtype, device=x.device))
    return x, P.reshape(safe, (n, 1)), w, ignored


@ltorch_op("nll_loss_forward", impl=aten.nll_loss_forward.default)
def nll_loss_forward(self: TensorProxy, target: TensorProxy, weight: Any, reduction: int,
                     ignore_index: int) -> tuple[TensorProxy, TensorProxy]:
    """aten.nll_loss_forward on (C,) or (N, C) log-probabilities: the loss and the summed weights of the targets."""
    x, index, w, _ = _nll_rows(self, target, weight, ignore_index)
    # Each row's target entry, as a sum of the row masked to it (one-hot): exact, and a row reduction that a
    # fusion executor computes in the kernel of the log_softmax before it (a gather would leave that kernel).
    picked = P.sum(P.where(_one_hot(x, index), x, 0.0), (1,))
    loss = P.neg(P.mul(picked, w))
    total = P.sum(w, (0,))
    if reduction == REDUCTIONS["none"]:
        return P.reshape(loss, tuple(target.shape)), total
    summed = P.sum(loss, (0,))
    return (P.div(summed, total) if reduction == REDUCTIONS["mean"] else summed), total


@ltorch_op("nll_loss_backward", impl=aten.nll_loss_backward.default)
def nll_loss_backward(grad_output: TensorProxy, self: TensorProxy, target: TensorProxy, weight: Any, reduction: int,
                      ignore_index: int, total_weight: TensorProxy) -> TensorProxy:
    """aten.nll_loss_backward: -weight[target] * grad_output at each row's target (divided by total_weight for 'mean')."""
    x, index, w, ignored = _nll_rows(self, target, weight, ignore_index)
    n = x.shape[0]
    g = _up(grad_output, x.dtype)
    g = P.reshape(g, (n,)) if reduction == REDUCTIONS["none"] else P.broadcast_in_dim(g, (n,), ())
    if reduction == REDUCTIONS["mean"]:
        g = P.div(g, P.broadcast_in_dim(_up(total_weight, x.dtype), (n,), ()))
    # ignored rows get no gradient (not 0 / 0 where every target is ignored)
    values = P.where(ignored, P.full((n,), 0, dtype=x.dtype, device=x.device), P.neg(P.mul(w, g)))
    values = P.broadcast_in_dim(values, tuple(x.shape), (0,))
    grad = P.where(_one_hot(x, index), values, P.full(tuple(x.shape), 0, dtype=x.dtype, device=x.device))
    return P.reshape(grad, tuple(self.shape))


def _one_hot(x: TensorProxy, index: TensorProxy) -> TensorProxy:
    """Where each row of the (N, C) `x` is at its (N, 1) `index`: pointwise, so it fuses with the row's work."""
    columns = P.iota(x.shape[1], start=0, step=1, dtype=torch.int64, device=x.device)
    return P.eq(P.broadcast_in_dim(columns, tuple(x.shape), (1,)), P.broadcast_in_dim(index, tuple(x.shape), (0, 1)))


def _rms_dims(x: TensorProxy, normalized_shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


def _rms_eps(dtype: torch.dtype, eps: Any) -> float:
    return torch.finfo(dtype).eps if eps is None else eps  # as the op: the compute dtype's epsilon


@ltorch_op("fused_rms_norm", impl=aten._fused_rms_norm.default)
def fused_rms_norm(input: TensorProxy, normalized_shape: Sequence[int], weight: Any,  # noqa: A002
                   eps: Any) -> tuple[TensorProxy, TensorProxy]:
    """aten._fused_rms_norm (one kernel on CUDA): x * rstd * weight, and rstd (kept dims, the compute dtype)."""
    dims = _rms_dims(input, normalized_shape)
    dtype = compute_dtype(input.dtype)
    x = _up(input, dtype)
    count = math.prod(input.shape[d] for d in dims)
    rstd = P.rsqrt(P.add(P.div(P.sum(P.mul(x, x), dims), count), _rms_eps(dtype, eps)))
    out = P.mul(x, restore_reduced(rstd, x.shape, dims))
    if isinstance(weight, TensorProxy):
        out = P.mul(out, P.broadcast_in_dim(_up(weight, dtype), x.shape, dims))
    kept = (*input.shape[: input.ndim - len(dims)], *(1,) * len(dims))
    return _cast_like(out, input), P.reshape(rstd, kept)


@ltorch_op("fused_rms_norm_backward", impl=aten._fused_rms_norm_backward.default)
def fused_rms_norm_backward(grad_out: TensorProxy, input: TensorProxy, normalized_shape: Sequence[int],  # noqa: A002
                            rstd: TensorProxy, weight: Any, output_mask: Sequence[bool]) -> tuple[Any, Any]:
    """aten._fused_rms_norm_backward: the gradients of input and weight (None where not asked for)."""
    dims = _rms_dims(input, normalized_shape)
    batch = tuple(range(input.ndim - len(dims)))
    count = math.prod(input.shape[d] for d in dims)
    dtype = compute_dtype(input.dtype)
    x, g = _up(input, dtype), _up(grad_out, dtype)
    r = P.broadcast_in_dim(_up(rstd, dtype), x.shape, tuple(range(x.ndim)))
    xhat = P.mul(x, r)
    dxhat = P.mul(g, P.broadcast_in_dim(_up(weight, dtype), x.shape, dims)) if isinstance(weight, TensorProxy) else g
    gx = gw = None
    if output_mask[0]:
        gx = _cast_like(P.mul(P.sub(dxhat, P.mul(P.div(xhat, count), _sum_keep(P.mul(xhat, dxhat), dims))), r), input)
    if output_mask[1] and isinstance(weight, TensorProxy):
        gw = _cast_like(P.sum(P.mul(g, xhat), batch) if batch else P.mul(g, xhat), weight)
    return gx, gw
