"""Attention on CUDA as eager's fused kernels: flash, memory-efficient and cuDNN attention, forward and backward.

`F.scaled_dot_product_attention` on CUDA picks one kernel family for its inputs
(`torch._fused_sdp_choice`) and its autograd saves that kernel's residuals (the output,
the logsumexp, the dropout RNG's seed and offset) for the family's backward kernel.
`sdpa_cuda` and `sdpa_cuda_backward` are those kernels as prims, the family an argument:

    out, logsumexp, seed, offset = prims.sdpa_cuda(q, k, v, mask, is_causal, scale, "flash")
    gq, gk, gv = prims.sdpa_cuda_backward(g, q, k, v, mask, out, logsumexp, seed, offset, is_causal, scale, "flash")

The torch executor runs each as the family's aten op, preparing the mask as eager's
dispatcher does (the memory-efficient kernel wants its bias expanded to (B, H, L, S) with
rows aligned to 16 elements). Their metadata comes from torch's meta kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.errors import MetaError
from minijit.ir import TensorProxy
from minijit.ir.context import where_now
from minijit.ops.aten_prims import aten_prim

aten = torch.ops.aten

# torch._fused_sdp_choice's answers (torch.nn.attention.SDPBackend) -> the family's name here
FAMILIES = {1: "flash", 2: "efficient", 3: "cudnn"}
# The families that take an attention mask (as a float bias); flash takes none.
MASKED_FAMILIES = {"efficient", "cudnn"}
_ALIGNMENT = 16  # the memory-efficient kernel's bias row alignment, in elements


def _aligned_bias(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The mask as eager hands it to the memory-efficient kernel: rows padded to aligned strides, then expanded."""
    if bias is None:
        return None
    if any(s % _ALIGNMENT for s in bias.stride()[:-1]):
        size = bias.shape[-1]
        bias = torch.nn.functional.pad(bias, (0, _ALIGNMENT - size % _ALIGNMENT))[..., :size]
    return bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
             is_causal: bool, scale: float | None, family: str) -> tuple[torch.Tensor, ...]:
    if family == "flash":
        out, lse, _, _, _, _, seed, offset, _ = aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, is_causal, False, scale=scale)
    elif family == "efficient":
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            query, key, value, _aligned_bias(attn_mask, query, key), True, 0.0, is_causal, scale=scale)
    else:
        out, lse, _, _, _, _, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            query, key, value, attn_mask, True, 0.0, is_causal, False, scale=scale)
    # Without dropout the kernels return the RNG seed and offset uninitialised (0-dim tensors that the backward
    # does not read); zeros in their place keep the saved values the same on every call (a CUDA graph's
    # backward is captured per value of such a CPU scalar).
    if seed.device.type == "cpu":
        seed, offset = torch.zeros_like(seed), torch.zeros_like(offset)
    return out, lse, seed, offset


def _backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None, out: torch.Tensor, logsumexp: torch.Tensor, philox_seed: torch.Tensor,
              philox_offset: torch.Tensor, is_causal: bool, scale: float | None,
              family: str) -> tuple[torch.Tensor, ...]:
    length_q, length_k = query.shape[2], key.shape[2]
    if family == "flash":
        grads = aten._scaled_dot_product_flash_attention_backward(
            grad_out, query, key, value, out, logsumexp, None, None, length_q, length_k, 0.0, is_causal,
            philox_seed, philox_offset, scale=scale)
    elif family == "efficient":
        grads = aten._scaled_dot_product_efficient_attention_backward(
            grad_out, query, key, value, _aligned_bias(attn_mask, query, key), out, logsumexp, philox_seed,
            philox_offset, 0.0, [True, True, True, False], is_causal, scale=scale)
    else:
        grads = aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_mask, None, None,
            length_q, length_k, 0.0, is_causal, scale=scale)
    return tuple(grads[:3])


def _check(op: str, q: Any, k: Any, v: Any, attn_mask: Any, family: Any) -> None:
    if family not in FAMILIES.values():
        raise MetaError(f"prims.{op}: family must be one of {sorted(FAMILIES.values())}, got {family!r}{where_now()}")
    if attn_mask is not None and family not in MASKED_FAMILIES:
        raise MetaError(f"prims.{op}: the {family} kernel takes no attention mask{where_now()}")
    for name, t in (("query", q), ("key", k), ("value", v), ("attn_mask", attn_mask)):
        if name == "attn_mask" and t is None:
            continue
        if not isinstance(t, TensorProxy) or t.device.type != "cuda" or t.dtype != q.dtype:
            raise MetaError(f"prims.{op}: {name} must be a CUDA tensor of the query's dtype{where_now()}")
    if any(t.ndim != 4 for t in (q, k, v)):
        raise MetaError(f"prims.{op}: query, key and value must have 4 dims (batch, heads, length, head size)"
                        f"{where_now()}")


@aten_prim(_forward)
def sdpa_cuda(query: TensorProxy, key: TensorProxy, value: TensorProxy, attn_mask: TensorProxy | None,
              is_causal: bool, scale: float | None, family: str) -> None:
    """Attention without dropout as one CUDA kernel of `family` (flash, efficient, cudnn): the output, the
    logsumexp of each query row, and the RNG seed and offset the backward kernel takes."""
    _check("sdpa_cuda", query, key, value, attn_mask, family)


@aten_prim(_backward)
def sdpa_cuda_backward(grad_out: TensorProxy, query: TensorProxy, key: TensorProxy, value: TensorProxy,
                       attn_mask: TensorProxy | None, out: TensorProxy, logsumexp: TensorProxy,
                       philox_seed: TensorProxy, philox_offset: TensorProxy, is_causal: bool, scale: float | None,
                       family: str) -> None:
    """The gradients of query, key and value of `sdpa_cuda`, by the same family's backward kernel."""
    _check("sdpa_cuda_backward", query, key, value, attn_mask, family)


def eager_family(query: TensorProxy, key: TensorProxy, value: TensorProxy, attn_mask: Any, dropout_p: float,
                 is_causal: bool, scale: Any, enable_gqa: bool) -> str | None:
    """The fused family eager's dispatcher picks for a CUDA call with inputs like these, or None (math).

    Asks `torch._fused_sdp_choice` on uninitialised CUDA tensors of the proxies' shapes and dtypes,
    contiguous, with their requires_grad (the choice also reads the `torch.nn.attention.sdpa_kernel`
    settings in force, as eager's does).
    """
    def like(p: TensorProxy) -> torch.Tensor:
        return torch.empty(tuple(p.shape), dtype=p.dtype, device=p.device).requires_grad_(p.requires_grad)

    mask = like(attn_mask) if isinstance(attn_mask, TensorProxy) else None
    choice = torch._fused_sdp_choice(like(query), like(key), like(value), mask, dropout_p, is_causal,
                                     scale=scale, enable_gqa=enable_gqa)
    return FAMILIES.get(int(choice))
