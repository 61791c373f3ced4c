"""Serving over changing batch sizes and lengths under `cache="symbolic values"` (issue 28 part 3).

Small models of the classes that re-traced per size: mixture-of-experts routing (by gathering, an
in-place `index_add_`, an in-place normalisation before a reshape), relative-position buckets written
in place (T5), recurrent layers (nn.LSTM, nn.GRU) over changing lengths, with and without grad.
Every output (and gradient) is compared with eager's; the trace counts are asserted.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import minijit

F = nn.functional
SIZES = [(2, 5), (3, 7), (2, 9), (4, 6)]  # (batch, length), none of them 1


class TinyMoe(nn.Module):
    """Top-2 routing over 4 experts: routing weights normalised in place, then reshaped (as Mixtral does);
    each token's two expert outputs gathered by the routing and added in place by `index_add_`. (Routing by
    `nonzero` per expert, as Mixtral's eager path does, reads data-dependent sizes: a value guard each.)"""

    def __init__(self, width: int = 8, experts: int = 4):
        super().__init__()
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        flat = x.reshape(-1, width)
        weights, chosen = torch.topk(F.softmax(self.gate(flat), dim=-1), 2, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        scale = weights.reshape(-1)  # written before, not after: its copy-or-view need not be decided
        every = torch.stack([expert(flat) for expert in self.experts])  # (experts, tokens, width)
        order = chosen.reshape(-1).argsort(stable=True)  # the slots grouped by expert
        token = order // 2
        routed = every[chosen.reshape(-1)[order], token] * scale[order, None]
        out = torch.zeros_like(flat)
        out.index_add_(0, token, routed)
        return out.reshape(batch, length, width)


def relative_buckets(q: torch.Tensor, k: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """T5's bidirectional relative-position buckets (written with `+=`), looked up and added to q @ k^T."""
    qlen, klen = q.shape[1], k.shape[1]
    relative = torch.arange(klen)[None, :] - torch.arange(qlen)[:, None]
    buckets = torch.zeros_like(relative)
    buckets += (relative > 0).to(torch.long) * 4
    distance = relative.abs()
    large = 2 + (torch.log(distance.float().clamp(min=1) / 2) / 2 * 2).to(torch.long)
    buckets += torch.where(distance < 2, distance, torch.clamp(large, max=3))
    bias = table[buckets].permute(2, 0, 1)  # (heads, q, k)
    scores = q.unsqueeze(1) @ k.unsqueeze(1).transpose(-1, -2)
    return (scores + bias).reshape(q.shape[0], -1)


def _same(have: Any, want: Any) -> None:
    torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6)


def _serve(fn: Any, make: Any, traces: int, grad_of: list[torch.Tensor] = ()) -> minijit.JitFunction:
    """Call `fn` jitted over SIZES, matching eager (values, and gradients of `grad_of`); assert the traces."""
    jf = minijit.jit(fn, cache="symbolic values")
    for batch, length in SIZES:
        inputs = make(batch, length)
        want, have = fn(*inputs), jf(*inputs)
        for h, w in zip(have if isinstance(have, tuple) else (have,), want if isinstance(want, tuple) else (want,),
                        strict=True):
            _same(h, w)
        if grad_of:
            loss = lambda out: sum(o.float().square().sum() for o in (out if isinstance(out, tuple) else (out,)))
            _same(torch.autograd.grad(loss(have), grad_of), torch.autograd.grad(loss(want), grad_of))
    assert minijit.cache_info(jf).misses == traces, str(minijit.cache_info(jf))
    return jf


def test_moe_routing_traces_once_over_batches_and_lengths() -> None:
    torch.manual_seed(0)
    moe = TinyMoe().eval()
    with torch.no_grad():
        _serve(moe, lambda b, s: (torch.randn(b, s, 8),), traces=1)


def test_relative_position_buckets_trace_once_over_lengths() -> None:
    torch.manual_seed(0)
    table = torch.randn(8, 3)
    _serve(lambda q, k: relative_buckets(q, k, table), lambda b, s: (torch.randn(b, s, 4), torch.randn(b, s + 1, 4)),
           traces=1)


def test_a_reshape_written_through_after_it_still_views_or_copies_as_eager() -> None:
    # `t.reshape` of a transposed tensor copies, of a contiguous one views: the later write must land (or not)
    # in `x` as eager's does, so this decision still depends on the sizes (a trace per layout seen).
    def f(x: torch.Tensor, transpose: bool) -> torch.Tensor:
        t = (x * 1).transpose(0, 1) if transpose else x * 1
        flat = t.reshape(-1)
        flat.add_(1)
        return t.sum(dim=0) + flat[:3].sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n, m in [(2, 3), (3, 4), (4, 5)]:
        for transpose in (False, True):
            x = torch.randn(n, m)
            _same(jf(x, transpose), f(x, transpose))


@pytest.mark.parametrize("kind", ["lstm", "gru", "lstm_proj_bidirectional"])
def test_recurrent_layer_traces_once_over_lengths_without_grad(kind: str) -> None:
    torch.manual_seed(0)
    layer = {"lstm": lambda: nn.LSTM(6, 5, num_layers=2, batch_first=True, dropout=0.5),
             "gru": lambda: nn.GRU(6, 5, num_layers=2),
             "lstm_proj_bidirectional": lambda: nn.LSTM(6, 5, bidirectional=True, proj_size=3, batch_first=True),
             }[kind]().eval()
    batch_first = layer.batch_first
    with torch.no_grad():
        _serve(layer, lambda b, s: (torch.randn(b, s, 6) if batch_first else torch.randn(s, b, 6),), traces=1)


def test_recurrent_layer_with_initial_state_under_grad_matches_eager_gradients() -> None:
    torch.manual_seed(0)
    layer = nn.LSTM(6, 5, num_layers=2, batch_first=True)

    def make(b: int, s: int) -> tuple[torch.Tensor, ...]:
        x = torch.randn(b, s, 6, requires_grad=True)
        h, c = torch.randn(2, b, 5), torch.randn(2, b, 5, requires_grad=True)
        make.grad_of = [x, c, *layer.parameters()]
        return x, h, c

    def fn(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, (hn, cn) = layer(x, (h, c))
        return out, hn, cn

    jf = minijit.jit(fn, cache="symbolic values")
    for batch, length in SIZES:
        inputs = make(batch, length)
        want, have = fn(*inputs), jf(*inputs)
        for h, w in zip(have, want, strict=True):
            _same(h, w)
        loss = lambda out: sum(o.square().sum() for o in out)
        _same(torch.autograd.grad(loss(have), make.grad_of), torch.autograd.grad(loss(want), make.grad_of))
    assert minijit.cache_info(jf).misses == 1, str(minijit.cache_info(jf))


def test_recurrent_layer_with_dropout_in_training_keeps_the_unrolled_form() -> None:
    # Dropout between layers draws per step: one trace per length, each matching eager for the same seed.
    torch.manual_seed(0)
    layer = nn.GRU(4, 3, num_layers=2, dropout=0.5).train()
    jf = minijit.jit(layer, cache="symbolic values")
    for length in (3, 4):
        x = torch.randn(length, 2, 4)
        torch.manual_seed(1)
        want = layer(x)
        torch.manual_seed(1)
        have = jf(x)
        for h, w in zip(have, want, strict=True):
            _same(h, w)
    assert minijit.cache_info(jf).misses == 2, str(minijit.cache_info(jf))


def test_zoo_lstm_language_model_traces_once_over_batches_and_lengths() -> None:
    from tests.models.test_zoo import NN_MODELS

    torch.manual_seed(0)
    model = NN_MODELS["LSTM_language_model"][0]().eval()
    jm = minijit.jit(model, cache="symbolic values")
    with torch.no_grad():
        for batch, length in SIZES:
            inputs = {"input_ids": torch.randint(3, 128, (batch, length)), "labels": torch.randint(3, 128, (batch, length))}
            want, have = model(**inputs), jm(**inputs)
            _same(have["logits"], want["logits"])
            _same(have["loss"], want["loss"])
            _same(have["state"], want["state"])
    assert minijit.cache_info(jm).misses == 1, str(minijit.cache_info(jm))
