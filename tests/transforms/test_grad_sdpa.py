"""Gradients of F.scaled_dot_product_attention under minijit.jit: the flash-attention prims, and their fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minijit
from minijit.errors import MetaError
from minijit.ir import TensorProxy
from minijit.ops import prims
from tests.oputil import run_decomposed

CPU = torch.device("cpu")


def _qkv(shape_q=(2, 3, 5, 8), shape_kv=(2, 3, 7, 8), dtype=torch.float32):
    q = torch.randn(shape_q, dtype=dtype, requires_grad=True)
    k = torch.randn(shape_kv, dtype=dtype, requires_grad=True)
    v = torch.randn(shape_kv, dtype=dtype, requires_grad=True)
    return q, k, v


def _grads(fn, inputs, g):
    out = fn(*inputs)
    return (out, *torch.autograd.grad(out, inputs, g))


def _backward_ops(jfn):
    return [b.sym.name for b in minijit.last_backward_traces(jfn)[-1].bound_symbols]


def _forward_ops(jfn):
    return [b.sym.name for b in minijit.last_traces(jfn)[-1].bound_symbols]


def _compare(fn, inputs, *, atol=1e-5, rtol=1e-5):
    """Output and input gradients of `fn` under minijit.jit against eager autograd; returns the jitted fn."""
    jfn = minijit.jit(fn)
    g = torch.randn_like(fn(*inputs))
    want = _grads(fn, inputs, g)
    got = _grads(jfn, inputs, g)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    return jfn


_MASKS = {
    "none": lambda dtype: None,
    "causal": lambda dtype: None,
    "bool": lambda dtype: torch.rand(5, 7) > 0.3,
    "bool_fully_masked_row": lambda dtype: torch.zeros(5, 7, dtype=torch.bool).index_fill_(1, torch.tensor([2, 4]), True)
    .index_fill_(0, torch.tensor([1]), False),
    "float": lambda dtype: torch.randn(5, 7, dtype=dtype),
    "float_4d": lambda dtype: torch.randn(2, 1, 5, 7, dtype=dtype),
    "float_row": lambda dtype: torch.randn(1, 3, 1, 7, dtype=dtype),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", list(_MASKS))
@pytest.mark.parametrize("scale", [None, 0.3])
def test_flash_grads_match_eager(mask, dtype, scale):
    torch.manual_seed(0)
    attn_mask = _MASKS[mask](dtype)
    causal = mask == "causal"

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale)

    jfn = _compare(fn, _qkv(dtype=dtype))
    assert "sdpa_flash" in _forward_ops(jfn)
    assert "sdpa_flash_backward" in _backward_ops(jfn)


def test_flash_grads_bf16():
    torch.manual_seed(0)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    jfn = _compare(fn, _qkv(dtype=torch.bfloat16), atol=2e-2, rtol=2e-2)
    assert "sdpa_flash_backward" in _backward_ops(jfn)


def test_flash_causal_query_longer_than_keys():
    torch.manual_seed(0)
    jfn = _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                   _qkv(shape_q=(1, 2, 9, 4), shape_kv=(1, 2, 6, 4)))
    assert "sdpa_flash_backward" in _backward_ops(jfn)


def test_backward_trace_is_one_flash_call_without_matmuls():
    torch.manual_seed(0)

    def fn(q, k, v):
        # q, k, v come out of a transpose, as in a GPT block: non-contiguous inputs and gradient
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2) * 2

    jfn = _compare(fn, _qkv(shape_q=(2, 6, 3, 8), shape_kv=(2, 6, 3, 8)))
    ops = _backward_ops(jfn)
    assert ops.count("sdpa_flash_backward") == 1
    assert not any("matmul" in op or "bmm" in op or "exp" in op for op in ops), ops


def test_mask_requiring_grad_falls_back_and_matches_eager():
    torch.manual_seed(0)
    q, k, v = _qkv(dtype=torch.float64)
    mask = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    jfn = _compare(fn, (q, k, v, mask), atol=1e-10, rtol=1e-8)
    assert "sdpa_flash_backward" not in _backward_ops(jfn)


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float_requiring_grad"])
def test_shared_key_value_heads_match_eager(mask):
    """GQA (4 query heads on 2 key/value heads, as in Llama): flash attention on repeated heads, each group's
    gradients summed onto its head; a mask requiring grad takes the recomputing backward, summed the same way."""
    torch.manual_seed(0)
    q, k, v = _qkv(shape_q=(2, 4, 5, 8), shape_kv=(2, 2, 7, 8), dtype=torch.float64)
    inputs, kwargs = (q, k, v), {"enable_gqa": True, "is_causal": mask == "causal"}
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(5, 7) > 0.3
    if mask == "float_requiring_grad":
        inputs = (q, k, v, torch.randn(5, 7, dtype=torch.float64, requires_grad=True))

    def fn(q, k, v, m=None):
        return F.scaled_dot_product_attention(q, k, v, **({"attn_mask": m} if m is not None else {}), **kwargs)

    jfn = _compare(fn, inputs, atol=1e-10, rtol=1e-8)
    assert ("sdpa_flash_backward" in _backward_ops(jfn)) == (mask != "float_requiring_grad")


@pytest.mark.parametrize("case", ["3d", "broadcast_batch", "value_head_size", "mask_3d", "mask_other_dtype"])
def test_unsupported_calls_fall_back_and_match_eager(case):
    torch.manual_seed(0)
    q_shape, kv_shape, v_shape, kwargs = (2, 4, 5, 8), (2, 4, 7, 8), None, {}
    if case == "3d":
        q_shape, kv_shape = (4, 5, 8), (4, 7, 8)
    elif case == "broadcast_batch":
        kv_shape = (1, 4, 7, 8)
    elif case == "value_head_size":
        v_shape = (2, 4, 7, 6)
    elif case == "mask_3d":
        kwargs = {"attn_mask": torch.randn(4, 5, 7)}
    elif case == "mask_other_dtype":
        kwargs = {"attn_mask": torch.randn(5, 7, dtype=torch.float64)}
    q = torch.randn(q_shape, requires_grad=True)
    k = torch.randn(kv_shape, requires_grad=True)
    v = torch.randn(v_shape or kv_shape, requires_grad=True)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    if case == "mask_other_dtype":
        with pytest.raises(RuntimeError):  # eager refuses it; so does minijit, in its own way
            fn(q, k, v)
        return
    jfn = _compare(fn, (q, k, v), atol=1e-4, rtol=1e-4)
    assert "sdpa_flash_backward" not in _backward_ops(jfn)


@pytest.mark.parametrize("case", ["symbolic_sizes", "mask_3d"])
def test_query_seeing_no_key_gets_zero_gradients_without_flash(case):
    # The math backward (symbolic sizes, masks the flash kernel does not take) computed -inf - -inf for a query
    # row that sees no key (left padding under a causal mask): nan gradients where eager's are 0.
    torch.manual_seed(0)
    q, k, v = _qkv((2, 3, 5, 8), (2, 3, 5, 8))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[0] = False
    if case == "mask_3d":
        mask = mask.expand(3, 5, 5)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    jfn = minijit.jit(fn, cache="symbolic values" if case == "symbolic_sizes" else "constant values")
    g = torch.randn(2, 3, 5, 8)
    want, got = _grads(fn, (q, k, v), g), _grads(jfn, (q, k, v), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert "sdpa_flash_backward" not in _backward_ops(jfn)


def test_dropout_still_runs_without_flash():
    torch.manual_seed(0)
    q, k, v = _qkv()
    jfn = minijit.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
    out = jfn(q, k, v)
    out.sum().backward()
    assert out.shape == q.shape and all(t.grad is not None and t.grad.isfinite().all() for t in (q, k, v))
    assert not any("sdpa_flash" in op for op in _backward_ops(jfn))


def test_prims_match_the_aten_kernels():
    torch.manual_seed(0)
    q, k, v = (t.detach() for t in _qkv())
    mask = torch.randn(5, 7)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=0.5)
    g = torch.randn_like(out)
    got = run_decomposed(lambda q, k, v, m: prims.sdpa_flash(q, k, v, m, False, 0.5), q, k, v, mask)
    torch.testing.assert_close(got, (out, lse), atol=0, rtol=0)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        g, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=0.5)
    got = run_decomposed(lambda *a: prims.sdpa_flash_backward(*a, False, 0.5), g, q, k, v, out, lse, mask)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def _proxy(shape, dtype=torch.float32):
    return TensorProxy(shape, dtype, CPU, True)


def test_meta_shapes_and_errors():
    from minijit.ir import Trace, tracing

    with tracing(Trace("t")):
        out, lse = prims.sdpa_flash(_proxy((2, 3, 5, 8)), _proxy((2, 3, 7, 8)), _proxy((2, 3, 7, 8)), None, True, None)
        assert out.shape == (2, 3, 5, 8) and out.dtype == torch.float32
        assert lse.shape == (2, 3, 5) and lse.dtype == torch.float32 and not lse.requires_grad
        _, lse16 = prims.sdpa_flash(*(_proxy((1, 1, 2, 4), torch.bfloat16) for _ in range(3)), None, False, None)
        assert lse16.dtype == torch.float32
        with pytest.raises(MetaError, match="sdpa_flash: query must have 4 dims"):
            prims.sdpa_flash(_proxy((3, 5, 8)), _proxy((3, 7, 8)), _proxy((3, 7, 8)), None, False, None)
        with pytest.raises(MetaError, match="one head size"):
            prims.sdpa_flash(_proxy((2, 3, 5, 8)), _proxy((2, 3, 7, 8)), _proxy((2, 3, 7, 6)), None, False, None)
        with pytest.raises(MetaError, match="does not broadcast"):
            prims.sdpa_flash(_proxy((2, 3, 5, 8)), _proxy((2, 3, 7, 8)), _proxy((2, 3, 7, 8)), _proxy((5, 6)),
                             False, None)
        with pytest.raises(MetaError, match="float16"):
            prims.sdpa_flash(*(_proxy((1, 1, 2, 4), torch.float16) for _ in range(3)), None, False, None)
        with pytest.raises(MetaError, match="sdpa_flash_backward: logsumexp"):
            q = _proxy((2, 3, 5, 8))
            prims.sdpa_flash_backward(q, q, q, q, q, _proxy((2, 3, 4)), None, False, None)
