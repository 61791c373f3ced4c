"""VJP rules of ltorch ops whose direct backward is cheaper than differentiating their decomposition.

With a rule, the op keeps one bound symbol in the forward trace (the torch executor
runs it as one call: one `linear`, one `layer_norm`) and gets a compact backward.
A rule's forward has the op's torch signature; the grad pass uses the rule only
when the op's decomposition has the same parameter names (after the first), and
the forward declines (`NotImplemented`) calls with arguments it does not handle.
Half-precision backward formulas compute in float32 like torch's kernels and cast
the gradient back to the input's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import TensorProxy
from minijit.ir.proxies import rule_compare, rule_same_shape
from minijit.ops import cuda_attention, prims
from minijit.ops.ltorch.backward import (
    REDUCTIONS,
    _sum_keep,
    embedding_dense_backward,
    fused_rms_norm,
    fused_rms_norm_backward,
    gelu_backward,
    log_softmax_backward,
    native_layer_norm,
    native_layer_norm_backward,
    nll_loss_backward,
    nll_loss_forward,
    silu_backward,
    softmax_backward,
    threshold_backward,
)
from minijit.ops.registry import ALL_LTORCH
from minijit.ops.utils import expand_to, restore_reduced
from minijit.transforms.vjp.registry import (
    cast_like,
    compute_dtype,
    matrix_transpose,
    reshape_to,
    sum_to_shape,
    vjp,
    zeros_like,
)

P = prims
Saved = tuple[Any, ...]


def _op(name: str) -> Any:
    return ALL_LTORCH[name]


def _up(x: TensorProxy, dtype: torch.dtype) -> TensorProxy:
    return x if x.dtype == dtype else P.convert_element_type(x, dtype)


@vjp("ltorch.linear")
def linear_fwd(a: TensorProxy, weight: TensorProxy, bias: TensorProxy | None = None) -> Any:
    if weight.ndim != 2:
        return NotImplemented
    return _op("linear")(a, weight, bias), (a, weight, bias)


@linear_fwd.backward
def linear_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, w, bias = saved
    out_features, in_features = w.shape
    gx = P.matmul(g, w)
    g2 = reshape_to(g, (_leading(g.shape), out_features))
    x2 = reshape_to(x, (_leading(x.shape), in_features))
    gw = P.matmul(P.transpose(g2, (1, 0)), x2)
    gb = sum_to_shape(g, bias.shape) if isinstance(bias, TensorProxy) else None
    return gx, gw, gb


def _leading(shape: tuple[Any, ...]) -> Any:
    """The number of rows when all dims but the last are flattened."""
    n = 1
    for s in shape[:-1]:
        n = n * s
    return n


@vjp("ltorch.gelu")
def gelu_fwd(a: TensorProxy, approximate: str = "none") -> Any:
    return _op("gelu")(a, approximate), (a, approximate)


@gelu_fwd.backward
def gelu_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    a, approximate = saved
    return gelu_backward(g, a, approximate=approximate), None


@vjp("ltorch.relu")
def relu_fwd(input: TensorProxy, inplace: bool = False) -> Any:  # noqa: A002 - torch's name
    if inplace:
        return NotImplemented
    out = _op("relu")(input, inplace)
    return out, (out,)


@relu_fwd.backward
def relu_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    (out,) = saved
    return threshold_backward(g, out, 0), None


@vjp("ltorch.sigmoid")
def sigmoid_fwd(input: TensorProxy) -> Any:  # noqa: A002 - torch's name
    out = _op("sigmoid")(input)
    return out, (out,)


@sigmoid_fwd.backward
def sigmoid_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    (out,) = saved
    return (P.mul(g, P.mul(out, P.sub(1, out))),)


@vjp("ltorch.silu")
def silu_fwd(input: TensorProxy, inplace: bool = False) -> Any:  # noqa: A002 - torch's name
    if inplace:
        return NotImplemented
    return _op("silu")(input, inplace), (input,)


@silu_fwd.backward
def silu_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    (a,) = saved
    return silu_backward(g, a), None


def _softmax_like(name: str, log: bool) -> None:
    @vjp(f"ltorch.{name}")
    def forward(input: TensorProxy, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:  # noqa: A002
        if dim is None:
            return NotImplemented
        out = _op(name)(input, dim, _stacklevel, dtype)
        return out, (input, out, dim % max(input.ndim, 1))

    @forward.backward
    def backward(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
        x, out, dim = saved
        grad = (log_softmax_backward if log else softmax_backward)(g, out, dim, out.dtype)
        return cast_like(grad, x), None, None, None


_softmax_like("softmax", log=False)
_softmax_like("log_softmax", log=True)


@vjp("ltorch.layer_norm")
def layer_norm_fwd(input: TensorProxy, normalized_shape: Any, weight: Any = None, bias: Any = None,  # noqa: A002
                   eps: float = 1e-5) -> Any:
    # Eager's autograd runs aten.native_layer_norm and keeps its mean and rstd for the backward kernel.
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _layer_norm_shapes_ok(input, shape, weight, bias):
        return NotImplemented  # the op's decomposition raises eager's error
    out, mean, rstd = native_layer_norm(input, shape, weight, bias, eps)
    return out, (input, weight, bias, shape, mean, rstd)


def _same_list(shape: Sequence[Any], given: list[Any]) -> bool:
    """`list(shape) == given` as an op's rules compare it: the lengths first, as a list's `==` does."""
    return len(shape) == len(given) and rule_same_shape(shape, given)


def _layer_norm_shapes_ok(x: Any, shape: list[Any], weight: Any, bias: Any) -> bool:
    """Whether F.layer_norm accepts these shapes (where they are known numbers)."""
    if not isinstance(x, TensorProxy) or not 0 < len(shape) <= x.ndim:
        return False
    known = all(type(d) is int for d in (*shape, *x.shape))
    if known and not rule_same_shape(x.shape[x.ndim - len(shape):], shape):
        return False
    for p in (weight, bias):
        if p is not None and not (isinstance(p, TensorProxy) and (not known or _same_list(p.shape, shape))):
            return False
    return True


@layer_norm_fwd.backward
def layer_norm_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    a, weight, bias, normalized_shape, mean, rstd = saved
    mask = [True, isinstance(weight, TensorProxy), isinstance(bias, TensorProxy)]
    gx, gw, gb = native_layer_norm_backward(g, a, normalized_shape, mean, rstd, weight, bias, mask)
    return gx, None, gw, gb, None


@vjp("ltorch.embedding")
def embedding_fwd(input: TensorProxy, weight: TensorProxy, padding_idx: Any = None, max_norm: Any = None,  # noqa: A002
                  norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    if max_norm is not None or sparse or weight.ndim != 2:
        return NotImplemented
    out = _op("embedding")(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    return out, (input, weight, padding_idx, scale_grad_by_freq)


@embedding_fwd.backward
def embedding_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    index, weight, padding_idx, scale_grad_by_freq = saved
    rows = weight.shape[0]
    pad = padding_idx % rows if padding_idx is not None else -1
    return None, embedding_dense_backward(g, index, rows, pad, bool(scale_grad_by_freq)), None, None, None, None, None


def _nll_args_ok(input: Any, target: Any, weight: Any, size_average: Any, reduce: Any,  # noqa: A002
                 reduction: Any) -> bool:
    """Calls aten's nll_loss kernels take as they are: (C,) or (N, C) inputs, class-index targets, fixed weights."""
    if not (isinstance(input, TensorProxy) and isinstance(target, TensorProxy) and input.dtype.is_floating_point):
        return False
    if size_average is not None or reduce is not None or reduction not in REDUCTIONS or input.ndim not in (1, 2):
        return False
    if target.dtype not in (torch.int64, torch.int32, torch.uint8) or target.ndim != input.ndim - 1:
        return False
    if input.ndim == 2 and not (type(input.shape[0]) is int and rule_same_shape(target.shape, (input.shape[0],))):
        return False
    # eager gives no gradient for the class weights (its derivative is not implemented)
    return weight is None or (isinstance(weight, TensorProxy) and not weight.requires_grad
                              and rule_same_shape(weight.shape, (input.shape[-1],)))


@vjp("ltorch.nll_loss")
def nll_loss_fwd(input: TensorProxy, target: TensorProxy, weight: Any = None, size_average: Any = None,  # noqa: A002
                 ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> Any:
    if not _nll_args_ok(input, target, weight, size_average, reduce, reduction):
        return NotImplemented
    red = REDUCTIONS[reduction]
    out, total_weight = nll_loss_forward(input, target, weight, red, ignore_index)
    return out, (input, target, weight, red, ignore_index, total_weight)


@nll_loss_fwd.backward
def nll_loss_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    logp, target, weight, red, ignore_index, total_weight = saved
    return nll_loss_backward(g, logp, target, weight, red, ignore_index, total_weight), None, None, None, None, None, None


@vjp("ltorch.cross_entropy")
def cross_entropy_fwd(input: TensorProxy, target: TensorProxy, weight: Any = None, size_average: Any = None,  # noqa: A002
                      ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                      label_smoothing: float = 0.0) -> Any:
    # As eager's autograd: log_softmax over the class dim, then nll_loss; the backward runs their two kernels.
    if label_smoothing != 0.0 or not _nll_args_ok(input, target, weight, size_average, reduce, reduction):
        return NotImplemented
    class_dim = input.ndim - 1
    logp = _op("log_softmax")(input, class_dim)
    red = REDUCTIONS[reduction]
    out, total_weight = nll_loss_forward(logp, target, weight, red, ignore_index)
    return out, (input, logp, target, weight, red, ignore_index, total_weight, class_dim)


@cross_entropy_fwd.backward
def cross_entropy_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, logp, target, weight, red, ignore_index, total_weight, class_dim = saved
    g_logp = nll_loss_backward(g, logp, target, weight, red, ignore_index, total_weight)
    grad = log_softmax_backward(g_logp, logp, class_dim, logp.dtype)
    return cast_like(grad, x), None, None, None, None, None, None, None


@vjp("ltorch.scaled_dot_product_attention")
def sdpa_fwd(query: TensorProxy, key: TensorProxy, value: TensorProxy, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
    # Key/value heads shared among query heads (GQA): each repeated for its group of query heads, as eager's
    # kernels do; the backward sums each group's gradients back onto its head.
    groups = _gqa_groups(query, key, value) if enable_gqa else 1
    family = _cuda_family(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if family is None and dropout_p == 0.0 and _flash_supported(query, key, value, attn_mask, is_causal, scale, groups):
        # torch's CPU flash kernels take shared key/value heads as they are, forward and backward, as eager runs them.
        mask = _float_mask(attn_mask, query)
        out, logsumexp = P.sdpa_flash(query, key, value, mask, is_causal, scale)
        return out, ("flash", query, key, value, out, logsumexp, mask, is_causal, scale, 1)
    if groups > 1:
        key, value, enable_gqa = _repeat_heads(key, groups), _repeat_heads(value, groups), False
    if family is not None:  # on CUDA: the fused kernel eager's dispatcher picks, and its backward
        mask = _float_mask(attn_mask, query)
        out, logsumexp, seed, offset = cuda_attention.sdpa_cuda(query, key, value, mask, is_causal, scale, family)
        return out, ("cuda", query, key, value, mask, out, logsumexp, seed, offset, is_causal, scale, groups, family)
    same_batch = rule_same_shape(query.shape[:-2], key.shape[:-2]) and rule_same_shape(key.shape[:-2], value.shape[:-2])
    if dropout_p != 0.0 or enable_gqa or not same_batch or query.ndim < 2:
        return NotImplemented
    out = _op("scaled_dot_product_attention")(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    scale = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
    return out, (query, key, value, attn_mask, is_causal, scale, groups)


def _float_mask(mask: Any, query: TensorProxy) -> Any:
    """A boolean mask as the additive float mask eager's kernels take (0 where kept, -inf where masked)."""
    if not isinstance(mask, TensorProxy) or mask.dtype != torch.bool:
        return mask
    zeros = P.full(mask.shape, 0.0, dtype=query.dtype, device=query.device)
    return P.where(mask, zeros, float("-inf"))


def _cuda_family(q: Any, k: Any, v: Any, mask: Any, dropout_p: Any, is_causal: Any, scale: Any,
                 enable_gqa: Any) -> str | None:
    """The fused CUDA kernel family (flash, efficient, cudnn) eager runs this call with, where `prims.sdpa_cuda`
    computes it as eager does; None elsewhere (the CPU, math, dropout, a mask that needs a gradient)."""
    tensors = (q, k, v)
    if not all(isinstance(t, TensorProxy) and t.ndim == 4 and t.device.type == "cuda" for t in tensors):
        return None
    if not all(type(d) is int and d > 0 for t in tensors for d in t.shape) or dropout_p != 0.0:
        return None
    if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device or not isinstance(is_causal, bool):
        return None
    if scale is not None and type(scale) not in (int, float):
        return None
    if mask is not None and not (isinstance(mask, TensorProxy) and not mask.requires_grad and mask.device == q.device
                                 and mask.dtype in (torch.bool, q.dtype) and all(type(d) is int for d in mask.shape)):
        return None
    family = cuda_attention.eager_family(q, k, v, mask, dropout_p, is_causal, scale, bool(enable_gqa))
    if family is None or (mask is not None and family not in cuda_attention.MASKED_FAMILIES):
        return None
    if family == "flash" and q.shape[-1] % 8:
        return None  # eager pads the head size for this kernel; the math formula stands in
    return family


def _gqa_groups(q: Any, k: Any, v: Any) -> int:
    """How many query heads share each key/value head (1 where they do not, or the shapes are not GQA's)."""
    if not all(isinstance(t, TensorProxy) and t.ndim >= 3 and type(t.shape[-3]) is int for t in (q, k, v)):
        return 1
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if kv_heads == 0 or heads % kv_heads or rule_compare(v.shape[-3], "!=", kv_heads):
        return 1  # not GQA: the decomposition raises eager's error
    return heads // kv_heads


def _repeat_heads(x: TensorProxy, groups: int) -> TensorProxy:
    """(..., H, S, E) -> (..., H * groups, S, E), each head repeated `groups` times in a row."""
    *batch, h, s, e = x.shape
    n = len(batch)
    wide = P.broadcast_in_dim(x, (*batch, h, groups, s, e), (*range(n), n, n + 2, n + 3))
    return P.reshape(wide, (*batch, h * groups, s, e))


def _sum_groups(g: TensorProxy, groups: int) -> TensorProxy:
    """The gradient of `_repeat_heads`: each group of `groups` heads summed onto its head."""
    if groups == 1:
        return g
    *batch, hg, s, e = g.shape
    return P.sum(P.reshape(g, (*batch, hg // groups, groups, s, e)), (len(batch) + 1,))


def _flash_supported(q: Any, k: Any, v: Any, mask: Any, is_causal: Any, scale: Any, groups: int) -> bool:
    """True where `prims.sdpa_flash` (torch's CPU flash-attention kernel) computes this call, `groups` query heads
    sharing each key/value head."""
    tensors = (q, k, v)
    if not all(isinstance(t, TensorProxy) and t.ndim == 4 for t in tensors):
        return False
    if not all(type(d) is int and d > 0 for t in tensors for d in t.shape):
        return False  # symbolic sizes, or empty inputs (the kernel fails on those)
    if not q.dtype == k.dtype == v.dtype or q.dtype not in P._FLASH_DTYPES:
        return False
    if not q.device == k.device == v.device or q.device.type != "cpu":
        return False
    if not (rule_compare(q.shape[0], "==", k.shape[0]) and rule_compare(k.shape[0], "==", v.shape[0])) \
            or rule_compare(q.shape[1], "!=", k.shape[1] * groups) or rule_compare(k.shape[1], "!=", v.shape[1]) \
            or rule_compare(k.shape[2], "!=", v.shape[2]):
        return False  # broadcast batch dims, or heads shared otherwise than `groups` says
    if not (rule_compare(q.shape[3], "==", k.shape[3]) and rule_compare(k.shape[3], "==", v.shape[3])) \
            or not isinstance(is_causal, bool):
        return False
    if scale is not None and type(scale) not in (int, float):
        return False
    if mask is None:
        return True
    # The kernel gives no gradient for the mask, and takes 2-d or 4-d masks that broadcast.
    if not isinstance(mask, TensorProxy) or mask.requires_grad or mask.ndim not in (2, 4) or is_causal:
        return False
    if mask.dtype not in (torch.bool, q.dtype) or mask.device != q.device:
        return False
    full = (*q.shape[:3], k.shape[2])
    return all(type(m) is int and m in (1, f) for m, f in zip(reversed(mask.shape), reversed(full), strict=False))


@sdpa_fwd.backward
def sdpa_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    if isinstance(saved[0], str) and saved[0] == "cuda":  # the forward ran prims.sdpa_cuda
        _, q, k, v, mask, out, logsumexp, seed, offset, is_causal, scale, groups, family = saved
        gq, gk, gv = cuda_attention.sdpa_cuda_backward(cast_like(g, out), q, k, v, mask, out, logsumexp, seed, offset,
                                                       is_causal, scale, family)
        return gq, _sum_groups(gk, groups), _sum_groups(gv, groups), None
    if isinstance(saved[0], str):  # ("flash", ...): the forward ran prims.sdpa_flash
        _, q, k, v, out, logsumexp, mask, is_causal, scale, groups = saved
        gq, gk, gv = P.sdpa_flash_backward(cast_like(g, out), q, k, v, out, logsumexp, mask, is_causal, scale)
        return gq, _sum_groups(gk, groups), _sum_groups(gv, groups), None
    # Recompute the attention probabilities from q, k and the mask rather than saving them.
    q_, k_, v_, mask, is_causal, scale, groups = saved
    dtype = compute_dtype(q_.dtype)
    q, k, v, gg = (_up(t, dtype) for t in (q_, k_, v_, g))
    s = P.mul(P.matmul(q, matrix_transpose(k)), scale)
    big_l, big_s = s.shape[-2], s.shape[-1]
    if is_causal:
        rows = P.broadcast_in_dim(P.iota(big_l, start=0, step=1, dtype=torch.int64, device=s.device), (big_l, big_s), (0,))
        cols = P.broadcast_in_dim(P.iota(big_s, start=0, step=1, dtype=torch.int64, device=s.device), (big_l, big_s), (1,))
        keep = P.broadcast_in_dim(P.ge(rows, cols), s.shape, (s.ndim - 2, s.ndim - 1))
        s = P.where(keep, s, float("-inf"))
    if isinstance(mask, TensorProxy):
        m = expand_to(mask, s.shape)
        s = P.where(m, s, float("-inf")) if mask.dtype == torch.bool else P.add(s, _up(m, dtype))
    last = (s.ndim - 1,)
    row_max = restore_reduced(P.amax(s, last), s.shape, last)
    e = P.exp(P.sub(s, row_max))
    # A query that sees no key (a padded position under a causal mask) attends to nothing in eager's kernels,
    # flash and math (a safe softmax): its probabilities are 0, not the nan of -inf - -inf.
    p = P.where(P.eq(row_max, float("-inf")), 0.0, P.div(e, _sum_keep(e, last)))
    gv = P.matmul(matrix_transpose(p), gg)
    gp = P.matmul(gg, matrix_transpose(v))
    gs = P.mul(p, P.sub(gp, _sum_keep(P.mul(gp, p), last)))
    gq = P.mul(P.matmul(gs, k), scale)
    gk = P.mul(P.matmul(matrix_transpose(gs), q), scale)
    gmask = None
    if isinstance(mask, TensorProxy) and mask.dtype != torch.bool:
        gmask = cast_like(sum_to_shape(gs, mask.shape), mask)
    return cast_like(gq, q_), _sum_groups(cast_like(gk, k_), groups), _sum_groups(cast_like(gv, v_), groups), gmask


@vjp("ltorch.index_fill")
def index_fill_fwd(input: TensorProxy, dim: int, index: TensorProxy, value: Any) -> Any:  # noqa: A002
    # A direct rule because the decomposition writes with index_copy, whose gradient counts a
    # repeated index once per repeat; index_fill fills each position once.
    out = _op("index_fill")(input, dim, index, value)
    return out, (dim, index, value)


@index_fill_fwd.backward
def index_fill_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    dim, index, value = saved
    g_input = _op("index_fill")(g, dim, index, 0)
    g_value = None
    if isinstance(value, TensorProxy):
        filled = P.sub(g, g_input)  # g where the fill landed, 0 elsewhere
        g_value = cast_like(P.sum(filled, tuple(range(filled.ndim))), value)
    return g_input, None, None, g_value


@vjp("ltorch.rms_norm")
def rms_norm_fwd(input: TensorProxy, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:  # noqa: A002
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if input.device.type == "cuda" and input.dtype.is_floating_point and _rms_shapes_ok(input, shape, weight):
        # On CUDA eager's autograd runs aten._fused_rms_norm and its backward kernel on the saved rstd
        # (on the CPU it differentiates the composite, which the formula below stands for).
        out, rstd = fused_rms_norm(input, shape, weight, eps)
        return out, ("fused", input, weight, shape, rstd)
    out = _op("rms_norm")(input, normalized_shape, weight, eps)
    return out, (input, weight, len(shape), eps)


def _rms_shapes_ok(x: TensorProxy, shape: list[Any], weight: Any) -> bool:
    """Whether the shapes are F.rms_norm's (known numbers only: the op's decomposition raises otherwise)."""
    if not 0 < len(shape) <= x.ndim or not all(type(d) is int for d in (*shape, *x.shape)):
        return False
    if not rule_same_shape(x.shape[x.ndim - len(shape):], shape):
        return False
    return weight is None or (isinstance(weight, TensorProxy) and _same_list(weight.shape, shape))


@rms_norm_fwd.backward
def rms_norm_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    if isinstance(saved[0], str):  # ("fused", ...): the forward ran aten._fused_rms_norm
        _, a, weight, shape, rstd = saved
        gx, gw = fused_rms_norm_backward(g, a, shape, rstd, weight, [True, isinstance(weight, TensorProxy)])
        return gx, None, gw, None
    a, weight, n, eps = saved
    dtype = compute_dtype(a.dtype)
    x, gg = _up(a, dtype), _up(g, dtype)
    dims = tuple(range(a.ndim - n, a.ndim))
    count = 1
    for d in dims:
        count *= a.shape[d]
    eps = torch.finfo(dtype).eps if eps is None else eps  # as the op: the compute dtype's epsilon
    r = restore_reduced(P.rsqrt(P.add(P.div(P.sum(P.mul(x, x), dims), count), eps)), x.shape, dims)
    y = P.mul(x, r)
    dy = P.mul(gg, P.broadcast_in_dim(_up(weight, dtype), x.shape, dims)) if isinstance(weight, TensorProxy) else gg
    gx = P.mul(r, P.sub(dy, P.mul(y, P.div(_sum_keep(P.mul(dy, y), dims), count))))
    gw = None
    if isinstance(weight, TensorProxy):
        batch = tuple(range(a.ndim - n))
        gw = cast_like(P.sum(P.mul(gg, y), batch) if batch else P.mul(gg, y), weight)
    return cast_like(gx, a), None, gw, None


# -- the root that ends std and the norms -------------------------------------------------------------------

@vjp("ltorch.root_of_nonnegative")
def root_of_nonnegative_fwd(s: TensorProxy, n: Any) -> Any:
    out = ALL_LTORCH["root_of_nonnegative"](s, n)
    return out, (out, n)


@root_of_nonnegative_fwd.backward
def root_of_nonnegative_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    out, n = saved
    # d(s ** (1/n))/ds = 1 / (n * out ** (n - 1)); eager's std and norm backward make it 0 where out is 0.
    slope = prims.mul(out if n == 2 else prims.pow(out, n - 1), n)
    return prims.where(prims.eq(out, 0), zeros_like(g), prims.div(g, slope)), None
