"""Order-only layout sources: an input that reaches a layout decision only through ops that lay out a fresh
output alike for any row-major input is guarded `_row_major`, not by its exact strides.

Assisted decoding crops a Hugging Face `DynamicCache` after each call (`keys = keys[..., :-2, :]`, a view whose
strides follow the length before the crop); the next forward concatenates onto it, and only the fresh result's
layout reaches `attn_output.transpose(1, 2).contiguous()`. The loop must not trace again per token; a call whose
input is permuted (the layout of `x + 1` follows it) must still miss and do what eager does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import minijit
from tests.oputil import assert_refused_as_eager


def _crop_loop(forward: Callable[..., object], config: object, prompt: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Logits of a prompt then `steps` calls of 3 drafted tokens, rejecting 2 of them (`cache.crop(-2)`) each time."""
    from transformers import DynamicCache

    torch.manual_seed(1)  # both runs draw the same tokens
    cache = DynamicCache(config=config)
    logits = []
    with torch.no_grad():
        logits.append(forward(input_ids=prompt, past_key_values=cache, use_cache=True).logits)
        for _ in range(steps):
            drafted = torch.randint(0, 100, (1, 3))
            logits.append(forward(input_ids=drafted, past_key_values=cache, use_cache=True).logits)
            cache.crop(-2)
    return logits


def test_cropped_dynamic_cache_does_not_trace_per_token() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 100, (1, 12))
    forward = minijit.jit(model.forward, cache="symbolic values")
    expected = _crop_loop(model.forward, config, prompt, steps=6)
    got = _crop_loop(forward, config, prompt, steps=6)
    assert len(got) == len(expected) == 7
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert forward.cache_info().misses <= 3


def _row_major_slice() -> torch.Tensor:
    """A (4, 6) tensor in row-major order with gaps: a slice of a (4, 8) one, as `cache.crop` leaves keys."""
    return torch.arange(32.0).reshape(4, 8)[:, :6]


def _transposed() -> torch.Tensor:
    return torch.arange(24.0).reshape(6, 4).t()


def test_row_major_inputs_share_a_trace_through_a_fresh_output() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x + 1).view(-1)

    jf = minijit.jit(f)
    for x in (torch.arange(24.0).reshape(4, 6), _row_major_slice(), torch.arange(24.0).reshape(4, 6) * 2):
        torch.testing.assert_close(jf(x), f(x), rtol=0, atol=0)
    assert minijit.cache_info(jf).misses == 1


def test_permuted_input_misses_where_the_fresh_output_follows_it() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x + 1).view(-1)  # x + 1 is laid out as x is: eager refuses the view of a transposed x

    jf = minijit.jit(f)
    torch.testing.assert_close(jf(_row_major_slice()), f(_row_major_slice()), rtol=0, atol=0)
    assert_refused_as_eager(jf, f, _transposed())
    assert minijit.cache_info(jf).misses == 2


def test_permuted_input_misses_where_contiguous_aliases() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        z = y.t().contiguous()  # y itself where y.t() is contiguous (x transposed), else a copy
        z.add_(1)  # so writes into y, or not
        return y

    jf = minijit.jit(f)
    for x in (_row_major_slice(), _transposed(), _row_major_slice(), _transposed()):
        torch.testing.assert_close(jf(x), f(x), rtol=0, atol=0)
    assert minijit.cache_info(jf).misses == 2


def test_permuted_input_misses_with_symbolic_sizes() -> None:
    def f(x: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        y = x * 2  # laid out as x is
        z = y.transpose(0, 1).contiguous()  # y's memory where x is transposed, else a copy
        z.add_(1)
        return torch.cat([y, new]) + x.sum()

    jf = minijit.jit(f, cache="symbolic values")
    new = torch.ones(2, 6)
    row_major = [torch.arange(40.0).reshape(5, 8)[:, :6], torch.arange(42.0).reshape(7, 6),
                 torch.arange(48.0).reshape(6, 8)[:, :6], torch.arange(36.0).reshape(6, 6)[:3]]
    for x in row_major:
        torch.testing.assert_close(jf(x, new), f(x, new), rtol=0, atol=0)
    assert minijit.cache_info(jf).misses <= 2
    x = torch.arange(30.0).reshape(6, 5).t()  # not row-major: a miss, and y written as eager writes it
    torch.testing.assert_close(jf(x, new), f(x, new), rtol=0, atol=0)


def test_the_guards_row_major_test_agrees_with_the_definition_on_every_small_layout() -> None:
    """`_row_major(x)` in a guard takes a fast path for contiguous tensors: on every layout of small sizes
    (size-0 and size-1 dims, gaps, zero and negative-free strides, transposes) it answers as `row_major` does on
    the sizes and strides torch reports."""
    import itertools

    from minijit.ir.layouts import row_major, tensor_row_major

    base = torch.zeros(64)
    seen = 0
    for ndim in range(4):
        for shape in itertools.product((0, 1, 2, 3), repeat=ndim):
            for strides in itertools.product((0, 1, 2, 3, 6, 9), repeat=ndim):
                x = base.as_strided(shape, strides)
                assert tensor_row_major(x) == row_major(tuple(x.shape), x.stride()), (shape, strides)
                seen += x.is_contiguous() and 1 not in shape and 0 not in shape
    assert seen > 10  # the fast path was taken
