"""The backward formulas of the ltorch VJP rules, run on prims, against torch.autograd.

Each rule's backward is traced on proxies of the residuals its forward saves and
run through the torch executor's prims, so the math is checked even before the op
itself is declared; the end-to-end tests in test_grad.py cover the ops that exist.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from minijit.ops.registry import ALL_LTORCH
from minijit.transforms.vjp import VJP_RULES
from tests.oputil import run_decomposed

F64 = torch.float64


def _bwd(name):
    return VJP_RULES[ALL_LTORCH[name]].bwd


def _check(got, want, atol=1e-10, rtol=1e-8):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("name", "fn"), [("softmax", F.softmax), ("log_softmax", F.log_softmax)])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_like_backward(name, fn, dim):
    x = torch.randn(3, 4, 5, dtype=F64, requires_grad=True)
    out = fn(x, dim)
    g = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, x, g)
    got = run_decomposed(lambda x, o, g: _bwd(name)((x, o, dim % 3), g)[0], x.detach(), out.detach(), g)
    _check([got], [want])


def test_softmax_backward_bf16_keeps_dtype():
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    out = F.softmax(x, -1)
    g = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, x, g)
    got = run_decomposed(lambda x, o, g: _bwd("softmax")((x, o, 1), g)[0], x.detach(), out.detach(), g)
    _check([got], [want], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("normalized", [(6,), (4, 6)])
def test_layer_norm_backward(affine, normalized):
    x = torch.randn(3, 4, 6, dtype=F64, requires_grad=True)
    w = torch.randn(normalized, dtype=F64, requires_grad=True) if affine else None
    b = torch.randn(normalized, dtype=F64, requires_grad=True) if affine else None
    out = F.layer_norm(x, normalized, w, b, 1e-5)
    g = torch.randn_like(out)
    inputs = [x] + ([w, b] if affine else [])
    want = torch.autograd.grad(out, inputs, g)

    _, mean, rstd = torch.ops.aten.native_layer_norm(x.detach(), normalized, w.detach() if affine else None,
                                                     b.detach() if affine else None, 1e-5)

    def bwd(x, w, b, mean, rstd, g):
        gx, _, gw, gb, _ = _bwd("layer_norm")((x, w, b, list(normalized), mean, rstd), g)
        return (gx, gw, gb) if affine else (gx,)

    got = run_decomposed(bwd, x.detach(), w.detach() if affine else None, b.detach() if affine else None, mean, rstd,
                         g)
    _check(got, want)


def test_silu_backward():
    x = torch.randn(5, 7, dtype=F64, requires_grad=True)
    out = F.silu(x)
    g = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, x, g)
    got = run_decomposed(lambda x, g: _bwd("silu")((x,), g)[0], x.detach(), g)
    _check([got], [want])


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_backward(padding_idx, scale_grad_by_freq):
    w = torch.randn(6, 3, dtype=F64, requires_grad=True)
    idx = torch.tensor([[0, 2, 5], [2, 2, 1]])
    out = F.embedding(idx, w, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq)
    g = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, w, g)
    got = run_decomposed(lambda i, w, g: _bwd("embedding")((i, w, padding_idx, scale_grad_by_freq), g)[1],
                         idx, w.detach(), g)
    _check([got], [want])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_backward(reduction):
    x = torch.randn(5, 4, dtype=F64, requires_grad=True)
    target = torch.tensor([0, 3, -100, 1, 3])
    out = F.cross_entropy(x, target, reduction=reduction)
    g = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, x, g)
    logp = F.log_softmax(x.detach(), 1)
    red = {"none": 0, "mean": 1, "sum": 2}[reduction]
    total = (target != -100).sum().to(F64)

    def bwd(x, logp, t, total, g):
        return _bwd("cross_entropy")((x, logp, t, None, red, -100, total, 1), g)[0]

    got = run_decomposed(bwd, x.detach(), logp, target, total, g)
    _check([got], [want])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_backward(reduction):
    x = torch.randn(5, 4, dtype=F64).log_softmax(1).requires_grad_()
    target = torch.tensor([0, 3, -100, 1, 3])
    w = torch.rand(4, dtype=F64)
    out = F.nll_loss(x, target, w, reduction=reduction)
    g = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, x, g)
    red = {"none": 0, "mean": 1, "sum": 2}[reduction]
    total = torch.ops.aten.nll_loss_forward(x.detach(), target, w, red, -100)[1]
    got = run_decomposed(lambda x, t, w, total, g: _bwd("nll_loss")((x, t, w, red, -100, total), g)[0],
                         x.detach(), target, w, total, g)
    _check([got], [want])


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_backward(mask, is_causal):
    if mask is not None and is_causal:
        pytest.skip("torch does not take both a mask and is_causal")
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=F64, requires_grad=True) for _ in range(3))
    attn_mask = None
    if mask == "bool":
        attn_mask = torch.rand(5, 5) > 0.3
        attn_mask[:, 0] = True  # no fully masked rows
    elif mask == "float":
        attn_mask = torch.randn(5, 5, dtype=F64, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    g = torch.randn_like(out)
    inputs = [q, k, v] + ([attn_mask] if mask == "float" else [])
    want = torch.autograd.grad(out, inputs, g)

    def bwd(q, k, v, m, g):
        gq, gk, gv, gm = _bwd("scaled_dot_product_attention")((q, k, v, m, is_causal, 0.5, 1), g)  # 1: no GQA
        return (gq, gk, gv, gm) if mask == "float" else (gq, gk, gv)

    m = attn_mask.detach() if attn_mask is not None else None
    got = run_decomposed(bwd, q.detach(), k.detach(), v.detach(), m, g)
    _check(got, want)


@pytest.mark.parametrize(("name", "torch_fn"), [
    ("softmax", F.softmax), ("log_softmax", F.log_softmax), ("layer_norm", F.layer_norm), ("silu", F.silu),
    ("embedding", F.embedding), ("cross_entropy", F.cross_entropy), ("nll_loss", F.nll_loss), ("linear", None),
    ("gelu", None), ("rms_norm", F.rms_norm),
])
def test_rule_forward_has_the_torch_signature(name, torch_fn):
    # The grad pass uses a rule only where the op's decomposition has the rule's parameter
    # names; rules follow torch's signatures, as decompositions must.
    rule_params = list(inspect.signature(VJP_RULES[ALL_LTORCH[name]].forward).parameters)
    if torch_fn is not None:
        assert rule_params[1:] == list(inspect.signature(torch_fn).parameters)[1:]
    if name in ALL_LTORCH:
        assert rule_params[1:] == list(inspect.signature(ALL_LTORCH[name].meta).parameters)[1:]
