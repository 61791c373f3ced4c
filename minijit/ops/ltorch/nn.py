"""torch.nn.functional ops: matmul family, activations, softmax, normalization, dropout, embedding, losses, attention.

Numerically sensitive decompositions (softmax, norms, transcendental activations)
compute float16/bfloat16 inputs in float32 and cast the result back, as torch's
kernels do; the torch executor still runs each op as one eager call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.errors import MetaError, TracesEagerBody
from minijit.ir import TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import rule_compare, rule_same_shape
from minijit.ops import prims
from minijit.ops.ltorch.elementwise import (
    abs,  # noqa: A004 - torch.abs
    add,
    clamp,
    div,
    eq,
    erf,
    exp,
    expm1,
    gt,
    le,
    log,
    log1p,
    logical_not,
    maximum,
    minimum,
    mul,
    neg,
    reciprocal,
    rsqrt,
    sub,
    tanh,
    where,
)
from minijit.ops.ltorch.padding import pad_by_index
from minijit.ops.ltorch.randomness import dropout_mask_scale
from minijit.ops.ltorch.reductions import all as all_
from minijit.ops.ltorch.reductions import keep_dims, reduction_dims, vector_norm_of
from minijit.ops.ltorch.reductions import sum as sum_
from minijit.ops.registry import ALL_LTORCH, TORCH_TO_LTORCH, ltorch_op
from minijit.ops.utils import (
    broadcast_shapes,
    compute_dtype_for,
    expand_to,
    fail,
    larger,
    numel_of,
    reshape_to,
    to_dtype,
    unsqueeze_at,
    unsupported,
)

F = torch.nn.functional
RANDOM = prims.RANDOM


def _tensor(op: str, x: Any, what: str = "input") -> TensorProxy:
    if not isinstance(x, TensorProxy):
        raise fail(op, f"expected a tensor for {what}, got {type(x).__name__}")
    return x


def _no_inplace(op: str, inplace: bool) -> None:
    if inplace:
        raise unsupported(op, f"inplace=True is not supported; use the functional form (x = {op}(x))")


def _float_input(op: str, x: TensorProxy) -> TensorProxy:
    """x in the dtype that `op` computes in: float32 for half types, the default float for ints."""
    _tensor(op, x)
    dtype = x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.get_default_dtype()
    return to_dtype(x, compute_dtype_for(dtype))


def _result_dtype(x: TensorProxy) -> torch.dtype:
    return x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.get_default_dtype()


# -- matrix products ---------------------------------------------------------------

@ltorch_op(torch_fns=[torch.matmul, torch.Tensor.matmul], methods=["matmul"])
def matmul(input: TensorProxy, other: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.matmul: 1-d operands as vectors, batch dims broadcast (prims.matmul needs them equal)."""
    a, b = _tensor("matmul", input), _tensor("matmul", other, "other")
    if a.ndim == 0 or b.ndim == 0:
        raise fail("matmul", f"both arguments need at least 1 dimension, got {a.ndim}D and {b.ndim}D")
    if a.dtype != b.dtype:
        raise fail("matmul", f"expected both arguments to have the same dtype, got {a.dtype} and {b.dtype}")
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if rule_compare(a.shape[-1], "!=", k_b):
        raise fail("matmul", f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                             f"({a.shape[-1]} != {k_b})")
    if a.ndim > 2 and b.ndim > 2 and not rule_same_shape(a.shape[:-2], b.shape[:-2]):
        try:
            batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except MetaError:
            raise fail("matmul", f"batch dims of {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from None
        a = expand_to(a, (*batch, *a.shape[-2:]))
        b = expand_to(b, (*batch, *b.shape[-2:]))
    return prims.matmul(a, b)


@ltorch_op(torch_fns=[torch.mm, torch.Tensor.mm], methods=["mm"])
def mm(input: TensorProxy, mat2: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.mm: the product of two matrices."""
    if _tensor("mm", input).ndim != 2 or _tensor("mm", mat2, "mat2").ndim != 2:
        raise fail("mm", f"expects two matrices, got {input.ndim}D and {mat2.ndim}D")
    return matmul(input, mat2)


@ltorch_op(torch_fns=[torch.bmm, torch.Tensor.bmm], methods=["bmm"])
def bmm(input: TensorProxy, mat2: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.bmm: batched matrix products of two 3-d tensors with the same batch size."""
    if _tensor("bmm", input).ndim != 3 or _tensor("bmm", mat2, "mat2").ndim != 3:
        raise fail("bmm", f"expects two 3-d tensors, got {input.ndim}D and {mat2.ndim}D")
    if rule_compare(input.shape[0], "!=", mat2.shape[0]):
        raise fail("bmm", f"batch sizes differ: {input.shape[0]} and {mat2.shape[0]}")
    return matmul(input, mat2)


def _scaled_sum(op: str, input: TensorProxy, product: TensorProxy, beta: Any, alpha: Any) -> TensorProxy:  # noqa: A002
    try:
        broadcast_shapes(input.shape, product.shape)
    except MetaError:
        raise fail(op, f"input of shape {tuple(input.shape)} does not broadcast to {tuple(product.shape)}") from None
    if not (product.dtype.is_floating_point or product.dtype.is_complex):  # torch truncates the scalars
        beta, alpha = int(beta), int(alpha)
    scaled = product if rule_compare(alpha, "==", 1) else mul(product, alpha)
    if rule_compare(beta, "==", 0):  # torch ignores input then, NaNs included
        return expand_to(scaled, broadcast_shapes(input.shape, product.shape))
    return add(scaled, input if rule_compare(beta, "==", 1) else mul(input, beta))


@ltorch_op(torch_fns=[torch.addmm, torch.Tensor.addmm], methods=["addmm"])
def addmm(input: TensorProxy, mat1: TensorProxy, mat2: TensorProxy, *, beta: Any = 1, alpha: Any = 1) -> TensorProxy:  # noqa: A002
    """torch.addmm: beta * input + alpha * (mat1 @ mat2)."""
    return _scaled_sum("addmm", _tensor("addmm", input), mm(mat1, mat2), beta, alpha)


@ltorch_op(torch_fns=[torch.baddbmm, torch.Tensor.baddbmm], methods=["baddbmm"])
def baddbmm(input: TensorProxy, batch1: TensorProxy, batch2: TensorProxy, *,  # noqa: A002
            beta: Any = 1, alpha: Any = 1) -> TensorProxy:
    """torch.baddbmm: beta * input + alpha * (batch1 @ batch2), batched."""
    return _scaled_sum("baddbmm", _tensor("baddbmm", input), bmm(batch1, batch2), beta, alpha)


@ltorch_op(torch_fns=[F.linear])
def linear(input: TensorProxy, weight: TensorProxy, bias: TensorProxy | None = None) -> TensorProxy:  # noqa: A002
    """F.linear: input @ weight.T + bias."""
    _tensor("linear", input)
    if _tensor("linear", weight, "weight").ndim not in (1, 2):
        raise fail("linear", f"weight must be 1-d or 2-d, got {weight.ndim}D")
    out = matmul(input, prims.transpose(weight, (1, 0)) if weight.ndim == 2 else weight)
    return add(out, bias) if bias is not None else out


# -- activations ----------------------------------------------------------------------

def _activation(op: str, input: TensorProxy, body: Callable[[TensorProxy], TensorProxy]) -> TensorProxy:  # noqa: A002
    """body(x) computed in float32 for half types, cast back to the input's (floating) dtype."""
    return to_dtype(body(_float_input(op, input)), _result_dtype(input))


@ltorch_op(torch_fns=[torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid, torch.special.expit], methods=["sigmoid"])
def sigmoid(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """torch.sigmoid: 1 / (1 + exp(-x))."""
    return _activation("sigmoid", input, lambda x: reciprocal(add(exp(neg(x)), 1)))


@ltorch_op(torch_fns=[F.relu, torch.relu, torch.Tensor.relu], methods=["relu"])
def relu(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.relu: max(x, 0), NaN propagating."""
    _no_inplace("relu", inplace)
    if _tensor("relu", input).dtype == torch.bool:
        raise fail("relu", "does not support bool input")
    return maximum(input, 0)


@ltorch_op(torch_fns=[F.hardtanh])
def hardtanh(input: TensorProxy, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.hardtanh: x clamped to [min_val, max_val]."""
    _no_inplace("hardtanh", inplace)
    if _tensor("hardtanh", input).dtype == torch.bool:
        raise fail("hardtanh", "does not support bool input")
    if not input.dtype.is_floating_point:  # torch truncates the bounds for integer inputs
        min_val, max_val = int(min_val), int(max_val)
    return clamp(input, min_val, max_val)


@ltorch_op(torch_fns=[F.relu6])
def relu6(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.relu6: x clamped to [0, 6]."""
    _no_inplace("relu6", inplace)
    return hardtanh(input, 0.0, 6.0)


@ltorch_op(torch_fns=[F.leaky_relu])
def leaky_relu(input: TensorProxy, negative_slope: float = 0.01, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.leaky_relu: x where x > 0, else negative_slope * x."""
    _no_inplace("leaky_relu", inplace)
    return where(gt(_tensor("leaky_relu", input), 0), input, mul(input, negative_slope))


@ltorch_op(torch_fns=[F.elu])
def elu(input: TensorProxy, alpha: float = 1.0, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.elu: x where x > 0, else alpha * (exp(x) - 1)."""
    _no_inplace("elu", inplace)
    return _activation("elu", input, lambda x: where(gt(x, 0), x, mul(expm1(x), alpha)))


@ltorch_op(torch_fns=[F.gelu])
def gelu(input: TensorProxy, approximate: str = "none") -> TensorProxy:  # noqa: A002
    """F.gelu, exact (erf) or approximate='tanh'."""
    if approximate not in ("none", "tanh"):
        raise fail("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")

    def body(a: TensorProxy) -> TensorProxy:
        if approximate == "tanh":
            inner = mul(add(a, mul(mul(mul(a, a), a), 0.044715)), math.sqrt(2 / math.pi))
            return mul(mul(a, 0.5), add(tanh(inner), 1))
        return mul(mul(a, 0.5), add(erf(mul(a, 1 / math.sqrt(2))), 1))

    return _activation("gelu", input, body)


@ltorch_op(torch_fns=[F.silu])
def silu(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.silu: x * sigmoid(x)."""
    _no_inplace("silu", inplace)
    return _activation("silu", input, lambda x: div(x, add(exp(neg(x)), 1)))


@ltorch_op(torch_fns=[F.softplus])
def softplus(input: TensorProxy, beta: float = 1.0, threshold: float = 20.0) -> TensorProxy:  # noqa: A002
    """F.softplus: log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold."""
    def body(x: TensorProxy) -> TensorProxy:
        bx = mul(x, beta) if rule_compare(beta, "!=", 1) else x
        soft = log1p(exp(bx))
        return where(gt(bx, threshold), x, div(soft, beta) if rule_compare(beta, "!=", 1) else soft)

    return _activation("softplus", input, body)


@ltorch_op(torch_fns=[F.logsigmoid])
def logsigmoid(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """F.logsigmoid: log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|)), which never overflows."""
    return _activation("logsigmoid", input, lambda x: sub(minimum(x, 0), log1p(exp(neg(abs(x))))))


@ltorch_op(torch_fns=[F.hardsigmoid])
def hardsigmoid(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.hardsigmoid: relu6(x + 3) / 6."""
    _no_inplace("hardsigmoid", inplace)
    return div(clamp(add(_tensor("hardsigmoid", input), 3), 0, 6), 6)


@ltorch_op(torch_fns=[F.hardswish])
def hardswish(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.hardswish: x * relu6(x + 3) / 6."""
    _no_inplace("hardswish", inplace)
    return mul(input, hardsigmoid(input))


@ltorch_op(torch_fns=[F.mish])
def mish(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.mish: x * tanh(softplus(x))."""
    _no_inplace("mish", inplace)
    return _activation("mish", input, lambda x: mul(x, tanh(where(gt(x, 20), x, log1p(exp(x))))))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@ltorch_op(torch_fns=[F.selu, torch.selu])
def selu(input: TensorProxy, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.selu: scale * elu(x, alpha) with the self-normalizing constants."""
    _no_inplace("selu", inplace)
    return _activation("selu", input, lambda x: mul(where(gt(x, 0), x, mul(expm1(x), _SELU_ALPHA)), _SELU_SCALE))


@ltorch_op(torch_fns=[F.celu, torch.celu])
def celu(input: TensorProxy, alpha: float = 1.0, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.celu: x where x > 0, else alpha * (exp(x / alpha) - 1)."""
    _no_inplace("celu", inplace)
    return _activation("celu", input, lambda x: where(gt(x, 0), x, mul(expm1(div(x, alpha)), alpha)))


@ltorch_op(torch_fns=[F.softsign])
def softsign(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """F.softsign: x / (1 + |x|)."""
    return div(input, add(abs(_tensor("softsign", input)), 1))


@ltorch_op(torch_fns=[F.tanhshrink])
def tanhshrink(input: TensorProxy) -> TensorProxy:  # noqa: A002
    """F.tanhshrink: x - tanh(x)."""
    return sub(input, tanh(_tensor("tanhshrink", input)))


# F.tanh is its own function object; it stands for the same op as torch.tanh.
TORCH_TO_LTORCH[F.tanh] = ALL_LTORCH["tanh"]


# -- softmax ------------------------------------------------------------------------------

def _softmax_parts(op: str, input: TensorProxy, dim: Any, dtype: torch.dtype | None) -> tuple[TensorProxy, int, torch.dtype]:  # noqa: A002
    """(input minus its max along dim, in the compute dtype; the dim; the result dtype)."""
    _tensor(op, input)
    if dim is None:  # F.softmax's legacy implicit dim
        dim = 0 if input.ndim in (0, 1, 3) else 1
    (d,) = reduction_dims(op, dim, input.ndim)
    out_dtype = dtype if dtype is not None else input.dtype
    if not out_dtype.is_floating_point:
        raise fail(op, f"needs a floating point input or dtype, got {out_dtype}")
    x = to_dtype(to_dtype(input, out_dtype), compute_dtype_for(out_dtype))
    if x.ndim and rule_compare(x.shape[d], "==", 0):  # nothing to normalize, and no max to take
        return x, d, out_dtype
    shifted = sub(x, keep_dims(prims.amax(x, (d,)), x.shape, (d,)))
    return shifted, d, out_dtype


@ltorch_op(torch_fns=[F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax], methods=["softmax"])
def softmax(input: TensorProxy, dim: int | None = None, _stacklevel: int = 3,  # noqa: A002
            dtype: torch.dtype | None = None) -> TensorProxy:
    """F.softmax along dim (computed in `dtype` if given), stabilised by subtracting the max."""
    shifted, d, out_dtype = _softmax_parts("softmax", input, dim, dtype)
    e = exp(shifted)
    return to_dtype(div(e, sum_(e, d, keepdim=True)), out_dtype)


@ltorch_op(torch_fns=[F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax, torch.special.log_softmax],
           methods=["log_softmax"])
def log_softmax(input: TensorProxy, dim: int | None = None, _stacklevel: int = 3,  # noqa: A002
                dtype: torch.dtype | None = None) -> TensorProxy:
    """F.log_softmax along dim: x - max - log(sum(exp(x - max)))."""
    shifted, d, out_dtype = _softmax_parts("log_softmax", input, dim, dtype)
    return to_dtype(sub(shifted, log(sum_(exp(shifted), d, keepdim=True))), out_dtype)


# -- normalization ---------------------------------------------------------------------------

def _normalized_dims(op: str, input: TensorProxy, normalized_shape: Sequence[int],  # noqa: A002
                     *affine: TensorProxy | None) -> tuple[int, ...]:
    """The trailing dims `normalized_shape` names; the `affine` tensors given (weight, bias) must be of that shape,
    as eager checks (broadcast against the input, a weight of another size would give a value where eager raises)."""
    _tensor(op, input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(shape)
    if n == 0 or n > input.ndim or not rule_same_shape(input.shape[input.ndim - n:], shape):
        raise fail(op, f"normalized_shape {shape} does not match the trailing dims of an input of shape "
                       f"{tuple(input.shape)}")
    for name, t in zip(("weight", "bias"), affine, strict=False):
        if t is not None and not rule_same_shape(t.shape, shape):
            raise fail(op, f"{name} of shape {tuple(t.shape)} is not of normalized_shape {shape}")
    return tuple(range(input.ndim - n, input.ndim))


@ltorch_op(torch_fns=[F.layer_norm])
def layer_norm(input: TensorProxy, normalized_shape: Sequence[int], weight: TensorProxy | None = None,  # noqa: A002
               bias: TensorProxy | None = None, eps: float = 1e-5) -> TensorProxy:
    """F.layer_norm: (x - mean) / sqrt(var + eps) * weight + bias over the trailing dims."""
    dims = _normalized_dims("layer_norm", input, normalized_shape, weight, bias)
    x = _float_input("layer_norm", input)
    var, mean = prims.var_mean(x, dims, 0)
    rstd = rsqrt(add(keep_dims(var, x.shape, dims), eps))
    out = mul(sub(x, keep_dims(mean, x.shape, dims)), rstd)
    if weight is not None:
        out = mul(out, weight)
    if bias is not None:
        out = add(out, bias)
    return to_dtype(out, input.dtype)


@ltorch_op(torch_fns=[F.rms_norm, torch.rms_norm])  # torch.rms_norm: what F.rms_norm calls (Dynamo graphs)
def rms_norm(input: TensorProxy, normalized_shape: Sequence[int], weight: TensorProxy | None = None,  # noqa: A002
             eps: float | None = None) -> TensorProxy:
    """F.rms_norm: x / sqrt(mean(x^2) + eps) * weight (eps defaults to the compute dtype's epsilon)."""
    dims = _normalized_dims("rms_norm", input, normalized_shape, weight)
    x = _float_input("rms_norm", input)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    mean_sq = div(prims.sum(mul(x, x), dims), numel_of(x.shape, dims))
    out = to_dtype(mul(x, rsqrt(add(keep_dims(mean_sq, x.shape, dims), eps))), input.dtype)
    # torch scales by weight after casting back to the input dtype.
    return mul(out, weight) if weight is not None else out


def _cpu_parameter_dtypes(op: str, input: TensorProxy, *parameters: TensorProxy | None) -> None:  # noqa: A002
    """Eager's CPU norm kernels take parameters of the input's dtype, or float32 ones for a bfloat16 or float16
    input, and raise a RuntimeError for any other mix ("mixed dtype (CPU)"), where a decomposition would promote."""
    given = [p.dtype for p in parameters if isinstance(p, TensorProxy)]
    if input.device.type != "cpu" or all(d == input.dtype for d in given):
        return
    if input.dtype in (torch.bfloat16, torch.float16) and all(d == torch.float32 for d in given):
        return
    error = fail(op, f"mixed dtype (CPU): the weight and bias must be of the input's dtype {input.dtype}, or float32 "
                     f"for a bfloat16 or float16 input; got {', '.join(map(str, given))}")
    error.eager_raised = RuntimeError  # type: ignore[attr-defined]
    raise error


@ltorch_op(torch_fns=[F.group_norm])
def group_norm(input: TensorProxy, num_groups: int, weight: TensorProxy | None = None,  # noqa: A002
               bias: TensorProxy | None = None, eps: float = 1e-5) -> TensorProxy:
    """F.group_norm: each group of channels (dim 1) normalized by its mean and variance, then a per-channel affine
    map, folded into one scale and shift per sample and channel."""
    _tensor("group_norm", input)
    if input.ndim < 2 or rule_compare(input.shape[1] % num_groups, "!=", 0):
        raise fail("group_norm", f"an input of shape {tuple(input.shape)} cannot be split into {num_groups} groups")
    _cpu_parameter_dtypes("group_norm", input, weight, bias)
    n, c = input.shape[0], input.shape[1]
    x = _float_input("group_norm", input)
    var, mean = prims.var_mean(reshape_to(x, (n, num_groups, numel_of(input.shape[1:]) // num_groups)), (2,), 0)
    # As eager's kernels: one scale and shift per (sample, channel), out = x * scale + shift. The weight's gradient
    # is then each channel's sum over its positions times the group's rstd, as eager's backward computes it: nan
    # (eager's) where the positions are empty (rstd is nan), not a sum over nothing (0).
    per_group = (n, num_groups, c // num_groups)

    def each_channel(stat: TensorProxy) -> TensorProxy:  # (n, groups) -> (n, c)
        return reshape_to(expand_to(keep_dims(stat, per_group, (2,)), per_group), (n, c))

    scale = each_channel(rsqrt(add(var, eps)))
    shift = neg(mul(each_channel(mean), scale))
    if weight is not None:
        weight = reshape_to(weight, (c,))
        scale, shift = mul(scale, weight), mul(shift, weight)
    if bias is not None:
        shift = add(shift, reshape_to(bias, (c,)))
    per_channel = (n, c) + (1,) * (input.ndim - 2)
    out = add(mul(x, reshape_to(scale, per_channel)), reshape_to(shift, per_channel))
    return to_dtype(out, input.dtype)


@ltorch_op(torch_fns=[F.normalize])
def normalize(input: TensorProxy, p: float = 2.0, dim: int = 1, eps: float = 1e-12,  # noqa: A002
              out: TensorProxy | None = None) -> TensorProxy:
    """F.normalize: x / max(||x||_p along dim, eps)."""
    if out is not None:
        raise unsupported("normalize", "out= is not supported")
    norm = vector_norm_of("normalize", input, p, dim, True, None)
    return div(input, clamp(norm, min=eps))


# -- dropout and embedding ------------------------------------------------------------------------

@ltorch_op(torch_fns=[F.dropout], effects=RANDOM)
def dropout(input: TensorProxy, p: float = 0.5, training: bool = True, inplace: bool = False) -> TensorProxy:  # noqa: A002
    """F.dropout: identity unless training with p > 0; otherwise a random mask, scaled by 1 / (1 - p)."""
    _tensor("dropout", input)
    _no_inplace("dropout", inplace)
    if not (rule_compare(0, "<=", p) and rule_compare(p, "<=", 1)):
        raise fail("dropout", f"p must be between 0 and 1, got {p}")
    if not training or rule_compare(p, "==", 0):
        return input
    if rule_compare(p, "==", 1):
        return mul(input, 0)
    if rule_compare(numel_of(input.shape), "==", 0):
        return input
    return dropout_mask_scale(input, p)


@ltorch_op(torch_fns=[F.embedding])
def embedding(input: TensorProxy, weight: TensorProxy, padding_idx: int | None = None,  # noqa: A002
              max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> TensorProxy:
    """F.embedding: rows of weight picked by the (integer) indices in input (padding_idx only affects grad)."""
    _tensor("embedding", input)
    if input.dtype not in (torch.int64, torch.int32):
        raise fail("embedding", f"indices must be int64 or int32, got {input.dtype}")
    if _tensor("embedding", weight, "weight").ndim != 2:
        raise fail("embedding", f"weight must be 2-d, got {weight.ndim}D")
    if max_norm is not None:
        # Eager renormalises the looked-up rows of `weight.detach()` in place first: a write, traced from F.embedding.
        raise TracesEagerBody(f"embedding: max_norm renormalises weight in place{where_now()}")
    if sparse:
        # Eager's gradient is then a sparse tensor: torch's own kernel runs the call.
        raise unsupported("embedding", "sparse=True makes a sparse gradient")
    rows = prims.take(weight, reshape_to(input, (numel_of(input.shape),)), 0)
    return reshape_to(rows, (*input.shape, weight.shape[1]))


# -- losses -------------------------------------------------------------------------------------------------

def _reduction(op: str, size_average: Any, reduce: Any, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    if reduction not in ("none", "mean", "sum"):
        raise fail(op, f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    return reduction


def _reduce(loss: TensorProxy, reduction: str) -> TensorProxy:
    if reduction == "sum":
        return sum_(loss)
    if reduction == "mean":
        return div(sum_(loss), numel_of(loss.shape))
    return loss


def _class_targets(op: str, input: TensorProxy, target: TensorProxy) -> None:  # noqa: A002
    if target.dtype not in (torch.int64, torch.int32, torch.uint8):
        raise fail(op, f"class-index targets must be integers, got {target.dtype}")
    expected = (input.shape[0], *input.shape[2:])
    if not rule_same_shape(target.shape, expected):
        raise fail(op, f"expected a target of shape {expected} for an input of shape {tuple(input.shape)}, "
                       f"got {tuple(target.shape)}")


def _picked_weights(target: TensorProxy, ignored: TensorProxy, weight: TensorProxy | None,
                    dtype: torch.dtype) -> TensorProxy:
    """The weight of each target's class, 0 where the target is ignored."""
    if weight is None:
        return to_dtype(logical_not(ignored), dtype)
    w = reshape_to(prims.take(weight, reshape_to(target, (numel_of(target.shape),)), 0), target.shape)
    return where(ignored, 0, to_dtype(w, dtype))


def _nll(op: str, logp: TensorProxy, target: TensorProxy, weight: TensorProxy | None, ignore_index: int,
         reduction: str) -> tuple[TensorProxy, TensorProxy, TensorProxy]:
    """(reduced loss, the per-element weights, the ignore mask) of batched log-probabilities (N, C, ...)."""
    _class_targets(op, logp, target)
    if isinstance(weight, TensorProxy) and weight.requires_grad and torch.is_grad_enabled():
        # Eager's nll_loss kernels have no derivative for the class weights and refuse them (a RuntimeError); the
        # decomposition would differentiate them.
        error = fail(op, "is not differentiable with respect to the class weights: weight cannot require grad")
        error.eager_raised = RuntimeError  # type: ignore[attr-defined]
        raise error
    target = to_dtype(target, torch.int64)
    ignored = eq(target, ignore_index)
    safe = where(ignored, 0, target)
    picked = reshape_to(prims.take_along_axis(logp, unsqueeze_at(safe, (1,)), 1), target.shape)
    w = _picked_weights(safe, ignored, weight, logp.dtype)
    # An ignored target's loss is 0 by `where`, not by its weight 0: a product with 0 would make its value nan
    # where the log-probability is -inf, and its gradient nan where the mean divides by 0 (every target ignored).
    loss = where(ignored, 0, neg(mul(picked, w)))
    if reduction == "mean":
        return div(sum_(loss), sum_(w)), w, ignored
    return _reduce(loss, reduction), w, ignored


def _batched(op: str, input: TensorProxy, target: TensorProxy) -> tuple[TensorProxy, TensorProxy, bool]:  # noqa: A002
    """Unbatched (C,) inputs get a batch dim of 1 (removed from 'none' losses again)."""
    _tensor(op, input)
    _tensor(op, target, "target")
    if input.ndim == 0:
        raise fail(op, "input must have a class dimension")
    if input.ndim == 1:
        if target.ndim not in (0, 1) or (target.ndim == 1 and not target.dtype.is_floating_point):
            raise fail(op, f"for an unbatched input of shape {tuple(input.shape)} the target must be 0-d, "
                           f"got shape {tuple(target.shape)}")
        return unsqueeze_at(input, (0,)), unsqueeze_at(target, (0,)), True
    return input, target, False


def _unbatch(loss: TensorProxy, unbatched: bool) -> TensorProxy:
    return reshape_to(loss, loss.shape[1:]) if unbatched and loss.ndim > 0 else loss


@ltorch_op(torch_fns=[F.nll_loss])
def nll_loss(input: TensorProxy, target: TensorProxy, weight: TensorProxy | None = None,  # noqa: A002
             size_average: Any = None, ignore_index: int = -100, reduce: Any = None,
             reduction: str = "mean") -> TensorProxy:
    """F.nll_loss: -input[n, target[n]] * weight[target[n]], 'mean' divided by the summed weights."""
    reduction = _reduction("nll_loss", size_average, reduce, reduction)
    x, t, unbatched = _batched("nll_loss", input, target)
    return _unbatch(_nll("nll_loss", x, t, weight, ignore_index, reduction)[0], unbatched)


def _class_weights(weight: TensorProxy | None, ndim: int, c: Any) -> TensorProxy | None:
    """weight (C,) shaped to broadcast along dim 1 of an (N, C, ...) tensor."""
    return None if weight is None else reshape_to(weight, (c,) + (1,) * (ndim - 2))


@ltorch_op(torch_fns=[F.cross_entropy])
def cross_entropy(input: TensorProxy, target: TensorProxy, weight: TensorProxy | None = None,  # noqa: A002
                  size_average: Any = None, ignore_index: int = -100, reduce: Any = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> TensorProxy:
    """F.cross_entropy: log_softmax over dim 1 then nll_loss, with class-index or probability targets."""
    reduction = _reduction("cross_entropy", size_average, reduce, reduction)
    if not (rule_compare(0, "<=", label_smoothing) and rule_compare(label_smoothing, "<=", 1)):
        raise fail("cross_entropy", f"label_smoothing must be between 0 and 1, got {label_smoothing}")
    x, t, unbatched = _batched("cross_entropy", input, target)
    c = x.shape[1]
    logp = log_softmax(x, 1)
    w_c = _class_weights(weight, x.ndim, c)
    if t.dtype.is_floating_point:  # class probabilities
        if not rule_same_shape(t.shape, x.shape):
            raise fail("cross_entropy", f"probability targets must have the input's shape {tuple(input.shape)}, "
                                        f"got {tuple(target.shape)}")
        if rule_compare(label_smoothing, ">", 0):
            t = add(mul(t, 1 - label_smoothing), label_smoothing / c)
        terms = mul(logp, t) if w_c is None else mul(mul(logp, t), w_c)
        loss = neg(sum_(terms, 1))
        out = div(sum_(loss), numel_of(loss.shape)) if reduction == "mean" else _reduce(loss, reduction)
        return _unbatch(out, unbatched)
    nll, w, ignored = _nll("cross_entropy", logp, t, weight, ignore_index, reduction)
    if rule_compare(label_smoothing, "==", 0):
        return _unbatch(nll, unbatched)
    smooth = neg(sum_(logp if w_c is None else mul(logp, w_c), 1))
    smooth = where(ignored, 0, smooth)
    if reduction == "mean":
        smooth = div(sum_(smooth), sum_(w))
    else:
        smooth = _reduce(smooth, reduction)
    out = add(mul(nll, 1 - label_smoothing), mul(smooth, label_smoothing / c))
    return _unbatch(out, unbatched)


def _pointwise_loss(op: str, input: TensorProxy, target: TensorProxy, size_average: Any, reduce: Any,  # noqa: A002
                    reduction: str, weight: TensorProxy | None, fn: Callable[[TensorProxy], TensorProxy]) -> TensorProxy:
    reduction = _reduction(op, size_average, reduce, reduction)
    _tensor(op, input)
    _tensor(op, target, "target")
    loss = fn(sub(input, target))
    if weight is None:
        return _reduce(loss, reduction)
    loss = mul(loss, weight)
    if reduction == "mean":
        return div(sum_(loss), sum_(expand_to(to_dtype(weight, loss.dtype), loss.shape)))
    return _reduce(loss, reduction)


@ltorch_op(torch_fns=[F.mse_loss])
def mse_loss(input: TensorProxy, target: TensorProxy, size_average: Any = None, reduce: Any = None,  # noqa: A002
             reduction: str = "mean", weight: TensorProxy | None = None) -> TensorProxy:
    """F.mse_loss: (input - target)^2, reduced."""
    return _pointwise_loss("mse_loss", input, target, size_average, reduce, reduction, weight, lambda d: mul(d, d))


@ltorch_op(torch_fns=[F.l1_loss])
def l1_loss(input: TensorProxy, target: TensorProxy, size_average: Any = None, reduce: Any = None,  # noqa: A002
            reduction: str = "mean", weight: TensorProxy | None = None) -> TensorProxy:
    """F.l1_loss: |input - target|, reduced."""
    return _pointwise_loss("l1_loss", input, target, size_average, reduce, reduction, weight, abs)


@ltorch_op(torch_fns=[F.binary_cross_entropy_with_logits])
def binary_cross_entropy_with_logits(input: TensorProxy, target: TensorProxy,  # noqa: A002
                                     weight: TensorProxy | None = None, size_average: Any = None,
                                     reduce: Any = None, reduction: str = "mean",
                                     pos_weight: TensorProxy | None = None) -> TensorProxy:
    """F.binary_cross_entropy_with_logits: (1 - y) x + (1 + (pos_weight - 1) y) log(1 + exp(-x)), stably."""
    op = "binary_cross_entropy_with_logits"
    reduction = _reduction(op, size_average, reduce, reduction)
    _tensor(op, input)
    if not rule_same_shape(_tensor(op, target, "target").shape, input.shape):
        raise fail(op, f"target shape {tuple(target.shape)} differs from input shape {tuple(input.shape)}")
    # log(1 + exp(-x)) = log1p(exp(-|x|)) + max(-x, 0), which never overflows.
    log_sig_neg = add(log1p(exp(neg(abs(input)))), maximum(neg(input), 0))
    scale = log_sig_neg if pos_weight is None else mul(add(mul(sub(pos_weight, 1), target), 1), log_sig_neg)
    loss = add(mul(sub(1, target), input), scale)
    if weight is not None:
        loss = mul(loss, weight)
    return _reduce(loss, reduction)


# -- attention ----------------------------------------------------------------------------------------------

def _repeat_heads(x: TensorProxy, groups: int) -> TensorProxy:
    """(..., H, S, E) -> (..., H * groups, S, E), each head repeated `groups` times in a row."""
    *batch, h, s, e = x.shape
    wide = expand_to(unsqueeze_at(x, (x.ndim - 2,)), (*batch, h, groups, s, e))
    return reshape_to(wide, (*batch, h * groups, s, e))


@ltorch_op(torch_fns=[F.scaled_dot_product_attention])
def scaled_dot_product_attention(query: TensorProxy, key: TensorProxy, value: TensorProxy,
                                 attn_mask: TensorProxy | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> TensorProxy:
    """F.scaled_dot_product_attention: softmax(q k^T * scale + mask) v; fully masked rows give 0 as in torch."""
    op = "scaled_dot_product_attention"
    q, k, v = _tensor(op, query, "query"), _tensor(op, key, "key"), _tensor(op, value, "value")
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise fail(op, "query, key and value need at least 2 dims")
    if not q.dtype == k.dtype == v.dtype:
        raise fail(op, f"query, key and value must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if rule_compare(k.shape[-1], "!=", q.shape[-1]) or rule_compare(v.shape[-2], "!=", k.shape[-2]):
        raise fail(op, f"shapes do not fit: query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}")
    if is_causal and attn_mask is not None:
        raise fail(op, "give either attn_mask or is_causal, not both")
    if enable_gqa and q.ndim >= 3 and rule_compare(q.shape[-3], "!=", k.shape[-3]):
        if rule_compare(q.shape[-3] % k.shape[-3], "!=", 0) or rule_compare(k.shape[-3], "!=", v.shape[-3]):
            raise fail(op, f"{q.shape[-3]} query heads cannot be shared among {k.shape[-3]} key/value heads")
        groups = q.shape[-3] // k.shape[-3]
        k, v = _repeat_heads(k, groups), _repeat_heads(v, groups)
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    # Half types compute in float32 throughout, as torch's CPU and flash kernels accumulate.
    compute = compute_dtype_for(q.dtype)
    q, k, v = to_dtype(q, compute), to_dtype(k, compute), to_dtype(v, compute)
    perm = (*range(k.ndim - 2), k.ndim - 1, k.ndim - 2)
    # As eager's math kernel (which runs attention with dropout): q and k each scaled by sqrt(|scale|).
    negative = rule_compare(scale, "<", 0)
    root = math.sqrt(-scale if negative else scale)  # (abs is torch.abs here)
    scores = matmul(mul(q, -root if negative else root), mul(prims.transpose(k, perm), root))
    if is_causal:
        rows = prims.iota(L, start=0, step=1, dtype=torch.int64, device=q.device)
        cols = prims.iota(S, start=0, step=1, dtype=torch.int64, device=q.device)
        attn_mask = le(reshape_to(cols, (1, S)), reshape_to(rows, (L, 1)))  # key j visible to query i iff j <= i
    if attn_mask is not None:
        if _tensor(op, attn_mask, "attn_mask").dtype == torch.bool:
            scores = where(attn_mask, scores, -math.inf)
        else:
            scores = add(scores, attn_mask)
    probs = softmax(scores, -1)
    # torch's "safe softmax": a row with every score at -inf attends to nothing instead of giving NaN.
    fully_masked = all_(eq(scores, -math.inf), -1, keepdim=True)
    probs = where(fully_masked, 0, probs)
    if rule_compare(dropout_p, ">", 0):
        probs = dropout_mask_scale(probs, dropout_p)
    return to_dtype(matmul(probs, v), query.dtype)


# -- padding -------------------------------------------------------------------------------------------------

@ltorch_op(torch_fns=[F.pad, torch._C._nn.pad])  # torch._C._nn.pad: what F.pad calls (Dynamo graphs)
def pad(input: TensorProxy, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> TensorProxy:  # noqa: A002
    """F.pad: pad[2i], pad[2i + 1] elements before/after dim -1 - i (negative crops), filled with value,
    or in 'reflect', 'replicate' or 'circular' mode (minijit/ops/ltorch/padding.py)."""
    _tensor("pad", input)
    if mode != "constant":
        return pad_by_index(input, pad, mode)
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise fail("pad", f"padding {tuple(pad)} needs pairs for at most {input.ndim} dims")
    fill = 0 if value is None else value
    x = input
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        size = x.shape[d]
        if rule_compare(before, "<", 0) or rule_compare(after, "<", 0):
            start, end = larger(-before, 0), size - larger(-after, 0)
            if rule_compare(end, "<", start):
                raise fail("pad", f"cropping {-before} and {-after} from a dim of size {size}")
            starts = [start if j == d else 0 for j in range(x.ndim)]
            ends = [end if j == d else s for j, s in enumerate(x.shape)]
            x = prims.slice_prim(x, starts, ends)
        parts = []
        for amount in (before, after):
            shape = tuple(amount if j == d else s for j, s in enumerate(x.shape))
            parts.append(prims.full(shape, fill, dtype=x.dtype, device=x.device) if rule_compare(amount, ">", 0) else None)
        pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
        if len(pieces) > 1:
            x = prims.cat(pieces, d)
    # torch returns a new tensor even for zero padding; a same-dtype conversion is a copy.
    return x if x is not input else prims.convert_element_type(input, input.dtype)

