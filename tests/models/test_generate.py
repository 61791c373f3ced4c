"""Hugging Face `generate()` with a jitted forward (`model.forward = minijit.jit(model.forward)`) against eager.

`generate` creates its cache (a `DynamicCache`, a `StaticCache`, an `EncoderDecoderCache` of two)
before the first forward and passes it to every call, which writes into it (new tensors assigned,
layers added, `index_copy_` into static buffers) and returns it. The jitted forward reads the cache's
tensors afresh on each call and replays its writes with that call's values, so the token ids equal
eager's for greedy search, seeded sampling and beam search, with a dynamic and a static cache. With
`cache="symbolic values"` the prefill and the decode step trace once each, whatever the number of new
tokens, and later generate() calls reuse the traces for their new cache objects.
Models are built from tiny configs with random weights (no download).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: every model is built from a config

import transformers
from transformers import AutoConfig

import minijit

VOCAB, NEW_TOKENS = 100, 4
_TOKENS = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _build(auto: str, model_type: str, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return getattr(transformers, auto).from_config(AutoConfig.for_model(model_type, **config, **_TOKENS)).eval()

    return build


MODELS: dict[str, Callable[[], nn.Module]] = {
    "llama": _build("AutoModelForCausalLM", "llama", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64),
    "gpt2": _build("AutoModelForCausalLM", "gpt2", n_embd=16, n_layer=1, n_head=2, n_positions=64),
    "t5": _build("AutoModelForSeq2SeqLM", "t5", d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                 decoder_start_token_id=0),
}
# Generation modes, run one after the other on the same jitted forward. Beam search doubles the batch.
MODES: dict[str, dict[str, Any]] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True},
    "beam": {"num_beams": 2, "do_sample": False},
}
# Traces after each mode, one jitted forward running the modes in order. A new generate() makes a new
# cache object, in the state the last one started in: the traces are reused for it (cache_info's
# `rebound`). A dynamic cache traces the prefill and the decode step; T5's first decode step, whose
# self-attention cache holds one token, has a trace of its own: whether its attention output's
# `contiguous()` copies is worked out on fake tensors, and torch's matmul decides there on that token count
# being 1. A static cache sizes its buffers by the batch, which beam search doubles: the symbolic batch
# serves it too, except T5's, whose new encoder-decoder cache is not rebound to the traces made for the
# last one: two more traces.
TRACES = {"dynamic": (2, 2, 2), "static": (2, 2, 2)}
TRACES_T5 = {"dynamic": (3, 3, 3), "static": (2, 2, 4)}


def _prompt() -> dict[str, torch.Tensor]:
    """A left-padded batch of two prompts."""
    ids = torch.randint(3, VOCAB, (2, 5))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _generate(model: nn.Module, forward: Callable[..., Any] | None, seed: int, new_tokens: int = NEW_TOKENS,
              **kwargs: Any) -> torch.Tensor:
    """`model.generate(**kwargs)` after `torch.manual_seed(seed)`, with `forward` in place of the model's own,
    for `new_tokens` new tokens."""
    if forward is None:
        vars(model).pop("forward", None)  # the class's forward: eager
    else:
        model.forward = forward
    torch.manual_seed(seed)
    return model.generate(**kwargs, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


CASES = [(name, cache) for name in MODELS for cache in ("dynamic", "static") if (name, cache) != ("gpt2", "static")]
# (GPT-2 with a static cache runs in the default mode below.)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "cache"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_generate_matches_eager(name: str, cache: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    jitted = minijit.jit(model.forward, cache="symbolic values")
    prompt = _prompt()
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    traces = TRACES_T5[cache] if name == "t5" else TRACES[cache]
    for i, (mode, options) in enumerate(MODES.items()):
        want = _generate(model, None, seed=i, **prompt, **options, **extra)
        have = _generate(model, jitted, seed=i, **prompt, **options, **extra)
        assert torch.equal(have, want), f"{mode}: {have.tolist()} != {want.tolist()}"
        info = minijit.cache_info(jitted)
        assert info.misses == traces[i], f"{mode}: {info}"
        assert info.hits + info.misses + info.rebound == (i + 1) * NEW_TOKENS, f"{mode}: {info}"
    assert minijit.cache_info(jitted).rebound > 0


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("cache", ["constant values", "automatic"])
def test_generate_with_constant_sizes_matches_eager(cache: str) -> None:
    """With constant values the static cache keeps every size fixed: two traces for every generation, rebound
    to the next generation's cache. In the default mode the first decoding step differs from the prompt by its
    sizes only, so the sizes go symbolic there: three traces at most, for any number of generations."""
    torch.manual_seed(0)
    model = MODELS["gpt2"]()
    jitted = minijit.jit(model.forward, cache=cache)
    prompt = _prompt()
    for seed in range(2):
        want = _generate(model, None, seed=seed, **prompt, cache_implementation="static")
        have = _generate(model, jitted, seed=seed, **prompt, cache_implementation="static")
        assert torch.equal(have, want)
    info = minijit.cache_info(jitted)
    if cache == "constant values":
        assert (info.misses, info.rebound) == (2, 2), str(info)
    else:
        assert info.misses <= 3 and info.dynamic, str(info)


# Mistral's sliding-window cache layers count the tokens seen in an int attribute (`cumulative_length`).
SLIDING = _build("AutoModelForCausalLM", "mistral", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64, sliding_window=4)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "cache", "traces"), [("llama", "dynamic", 3), ("llama", "static", 2),
                                                      ("mistral", "dynamic", 2)])
def test_later_generations_trace_nothing_in_the_default_mode(name: str, cache: str, traces: int) -> None:
    """The default mode goes symbolic at the first decoding step, with the sizes and a sliding-window layer's token
    count (it changed since the prompt's call) in the same trace, as torch.compile's automatic dynamic does: the
    prompt and the decoding step, two traces (a prompt longer than the window: no branch flips while decoding).
    A dynamic cache's keys and values, first read at that step, keep their sizes constant there; the next step,
    whose cache is longer, makes their length symbolic, as torch.compile compiles a third time: three traces.
    The prompt's entry, traced before with constant sizes, still serves the next generation's prompt, and every
    entry is moved to the next generation's new cache objects, so only the first generation traces."""
    torch.manual_seed(0)
    model = SLIDING() if name == "mistral" else MODELS[name]()
    jitted = minijit.jit(model.forward)
    prompt = _prompt()
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    misses = []
    for seed in range(3):
        want = _generate(model, None, seed=seed, **prompt, **extra)
        have = _generate(model, jitted, seed=seed, **prompt, **extra)
        assert torch.equal(have, want)
        misses.append(minijit.cache_info(jitted).misses)
    info = minijit.cache_info(jitted)
    assert misses[0] == misses[-1] == traces and info.dynamic, str(info)


BART = _build("AutoModelForSeq2SeqLM", "bart", d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_layers=1,
              decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, max_position_embeddings=64,
              decoder_start_token_id=2, forced_eos_token_id=None)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_encoder_decoder_whose_cache_alone_grows_goes_symbolic_in_the_default_mode() -> None:
    """BART's decoder takes one new token per call: its arguments keep their sizes, and only the self-attention
    cache it reads from outside grows. A call failing only those tensors' sizes misses by its sizes, as one whose
    arguments changed: the default mode goes symbolic there (once a token per call: 12 traces for 12 tokens)."""
    torch.manual_seed(0)
    model = BART()
    jitted = minijit.jit(model.forward)
    misses = []
    for seed in range(2):
        prompt = _prompt()
        want = _generate(model, None, seed=seed, **prompt, new_tokens=12)
        have = _generate(model, jitted, seed=seed, **prompt, new_tokens=12)
        assert torch.equal(have, want)
        misses.append(minijit.cache_info(jitted).misses)
    info = minijit.cache_info(jitted)
    assert misses[0] == misses[-1] <= 3, str(info)
    assert "the tensor keys read from outside the call changed" in info.dynamic[0], info.dynamic


# A window two tokens longer than the prompt: decoding runs a step with the window not yet full, then the step that
# fills it, then steps past it: three branches of the sliding-window layer.
LONG_WINDOW = _build("AutoModelForCausalLM", "mistral", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                     sliding_window=7)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_window_filled_while_decoding_keeps_the_entry_of_each_side() -> None:
    """The token count goes symbolic on the step that fills the window, whose trace branches away from the step
    before it: the entry of that one stays (behind the new one), so the next generations trace nothing."""
    torch.manual_seed(0)
    model = LONG_WINDOW()
    jitted = minijit.jit(model.forward)
    prompt = {"input_ids": torch.randint(3, VOCAB, (2, 5))}  # no mask: the token count is all that changes
    misses = []
    for seed in range(3):
        want = _generate(model, None, seed=seed, **prompt)
        have = _generate(model, jitted, seed=seed, **prompt)
        assert torch.equal(have, want)
        misses.append(minijit.cache_info(jitted).misses)
    assert misses[0] == misses[-1] <= 4, str(minijit.cache_info(jitted))


def _inductor_or_skip() -> None:
    from executors.inductor import ex as inductor

    if inductor.unavailable_reason() is not None:
        pytest.skip(f"inductor is unavailable: {inductor.unavailable_reason()}")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_with_the_inductor_executor_matches_eager(cache: str) -> None:
    """With `executors=["inductor"]` the forward is one compiled region (sizes, their arithmetic and the matmuls
    inside), and the token ids equal eager's over two generations."""
    _inductor_or_skip()
    torch.manual_seed(0)
    model = MODELS["llama"]()
    jitted = minijit.jit(model.forward, executors=["inductor"])
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    for seed in range(2):
        prompt = _prompt()
        want = _generate(model, None, seed=seed, **prompt, **extra)
        have = _generate(model, jitted, seed=seed, **prompt, **extra)
        assert torch.equal(have, want), f"{have.tolist()} != {want.tolist()}"
    src = minijit.last_traces(jitted)[-1].python()
    assert src.count("inductorex.fusion_") == 1, src


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_generate_with_the_inductor_executor_traces_as_the_default_executors_do() -> None:
    """Three traces for two generations (the prompt, the first step, then every step: the cache's length went
    symbolic), as with the default executors: Inductor laid out the keys put after the empty cache transposed, the
    next call's guard saw a layout the trace did not, and each generation traced once more. (Two key/value heads:
    with one, its stride is Inductor's to choose, and a trace more is still made.)"""
    _inductor_or_skip()
    torch.manual_seed(0)
    model = _build("AutoModelForCausalLM", "llama", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)()
    jitted = minijit.jit(model.forward, executors=["inductor"])
    for seed in range(2):
        prompt = _prompt()
        assert torch.equal(_generate(model, jitted, seed=seed, **prompt), _generate(model, None, seed=seed, **prompt))
    assert minijit.cache_info(jitted).misses == 3, str(minijit.cache_info(jitted))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_many_generations_rebind_from_the_recipe_and_match_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each generate() makes a new DynamicCache: after the first rebind of each entry, the later ones reuse its
    recipe's words (minijit.runtime.rebind._Recipe). Every generation equals eager token for token, two rebinds each,
    and the checks made from the recipe read the generation's own cache."""
    from minijit.runtime import rebind as rebinding

    made: list[Any] = []
    original = rebinding.moved_read_check
    monkeypatch.setattr(rebinding, "moved_read_check", lambda *a: made.append(a[1]) or original(*a))
    torch.manual_seed(0)
    model = MODELS["llama"]()
    jitted = minijit.jit(model.forward)
    caches: list[Any] = []
    original_forward = jitted.__call__

    def forward(*args: Any, **kwargs: Any) -> Any:
        caches.append(kwargs.get("past_key_values"))
        return original_forward(*args, **kwargs)

    for seed in range(5):
        prompt = _prompt()
        want = _generate(model, None, seed=seed, **prompt)
        made.clear()
        have = _generate(model, forward, seed=seed, **prompt)
        assert torch.equal(have, want), f"{have.tolist()} != {want.tolist()}"
        if seed >= 2:
            layers = {id(layer) for layer in caches[-1].layers}
            assert any(id(g.namespace) in layers for g in made), "no recipe check read this generation's cache"
    info = minijit.cache_info(jitted)
    assert info.misses == 3 and info.decisions["rebind"] == 4 * 2, str(info)
