"""Torch arithmetic on Python numbers only, folded at trace time and readable as a size (Longformer's chunking)."""

from __future__ import annotations

import torch

import minijit


def chunk(x, w):
    """transformers' Longformer: chunk counts computed with torch.div on Python ints, then used as sizes."""
    seq = x.size(1)
    chunks = torch.div(seq, w, rounding_mode="trunc") - 1
    blocks = x.view(x.size(0), torch.div(seq, 2 * w, rounding_mode="trunc"), 2 * w, x.size(2))
    size = list(blocks.size())
    size[1] = size[1] * 2 - 1
    stride = list(blocks.stride())
    stride[1] = stride[1] // 2
    overlapping = blocks.as_strided(size=size, stride=stride)
    out = overlapping.new_zeros((x.size(0), chunks + 1, w, 2)) + overlapping.sum()
    return out, x.new_ones(size=(2, chunks)).sum() * x.mean(), x * torch.div(seq, 4)


def test_folded_sizes_match_eager() -> None:
    x = torch.randn(2, 8, 3, requires_grad=True)
    want = chunk(x, 2)
    xj = x.detach().clone().requires_grad_()
    have = minijit.jit(chunk)(xj, 2)
    for h, w in zip(have, want, strict=True):
        assert h.dtype == w.dtype
        torch.testing.assert_close(h, w)
    sum(t.sum() for t in want).backward()
    sum(t.sum() for t in have).backward()
    torch.testing.assert_close(xj.grad, x.grad)


def test_a_new_length_is_a_new_trace_not_a_stale_size() -> None:
    jf = minijit.jit(chunk)
    for seq in (8, 12):
        x = torch.randn(2, seq, 3)
        for h, w in zip(jf(x, 2), chunk(x, 2), strict=True):
            torch.testing.assert_close(h, w)
    assert minijit.cache_info(jf).misses == 2
