"""The loop workloads of scripts/bench.py: work that changes on every call (issue 39).

Each iteration of these workloads is a whole loop whose calls differ: one `generate()` (a prompt, then
one decoding step per new token, each a longer cache), one optimizer step under a learning-rate
schedule (a new lr every step), one sweep of a serving loop over batch sizes and lengths. bench.py
times them as its other workloads (variants interleaved, the median per iteration, the ratio to eager)
and reports, for minijit's variants, how many traces the jitted function made over all the calls the
run made (warm-up and samples included): the figure the issue's targets bound.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

NEW_TOKENS = 16
# The serving sweep: batch sizes 1-8 and lengths 5-64, in an order no two neighbours share.
SERVING_SHAPES = [(1, 5), (8, 64), (3, 17), (5, 33), (2, 48), (7, 9), (4, 64), (6, 23)]


def _config(arch: str, **extra: Any) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config: nothing to download
    from transformers import AutoConfig

    return AutoConfig.for_model(arch, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                num_attention_heads=4, vocab_size=512, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2, **extra)


def generate_loop(arch: str, cache: str) -> tuple[Callable[..., Any], Callable[[], list[Any]], Callable[..., Any]]:
    """(the function each variant wraps: a tiny model's forward, fresh arguments, the loop): greedy generate()
    of NEW_TOKENS tokens for a batch of two prompts, with a dynamic or a static cache. "bart" is an encoder-decoder:
    its decoder takes one new token per call, and only its cache grows."""
    import transformers

    torch.manual_seed(0)
    if arch == "bart":
        config = _config(arch, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                         encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=256,
                         decoder_start_token_id=2, forced_eos_token_id=None)
        model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    else:
        config = _config(arch, num_key_value_heads=2, max_position_embeddings=256)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    extra = {"cache_implementation": "static"} if cache == "static" else {}

    def make() -> list[Any]:
        ids = torch.randint(3, 512, (2, 8))
        return [ids, torch.ones_like(ids)]

    def loop(forward: Callable[..., Any], args: list[Any]) -> list[torch.Tensor]:
        if getattr(forward, "__func__", None) is type(model).forward:
            vars(model).pop("forward", None)  # eager: the class's own
        else:
            model.forward = forward
        with torch.no_grad():
            return [model.generate(input_ids=args[0], attention_mask=args[1], max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, do_sample=False, **extra)]

    return model.forward, make, loop


def scheduled_step(opt: torch.optim.Optimizer) -> None:
    """One optimizer step (the function each variant wraps; the schedule's step runs outside it, as in training)."""
    opt.step()


# A small transformer's parameters: per layer two weights, their biases and a norm's weight and bias.
TRANSFORMER_SHAPES = [(128, 128), (128,), (512, 128), (512,), (128,), (128,)] * 10


def lr_schedule_loop(shapes: list[tuple[int, ...]] | None = None
                     ) -> tuple[Callable[..., Any], Callable[[], list[Any]], Callable[..., Any]]:
    """AdamW over parameters of `shapes` (default: 8 of 256 x 256), a cosine lr schedule stepped after every optimizer
    step: a new lr on every call."""
    def make() -> list[Any]:
        params = [torch.randn(*shape, requires_grad=True) for shape in shapes or [(256, 256)] * 8]
        for p in params:
            p.grad = torch.randn(p.shape) * 0.01
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
        return [opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)]

    def loop(step: Callable[..., Any], args: list[Any]) -> list[torch.Tensor]:
        opt, schedule = args
        with torch.no_grad():
            step(opt)
        schedule.step()
        return [*(p for group in opt.param_groups for p in group["params"]),
                *(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))]

    return scheduled_step, make, loop


def serving_loop() -> tuple[Callable[..., Any], Callable[[], list[Any]], Callable[..., Any]]:
    """A tiny BERT encoder serving one request of each shape of SERVING_SHAPES (batch 1-8, length 5-64)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(_config("bert", max_position_embeddings=128)).eval()

    def make() -> list[Any]:
        return [[torch.randint(3, 512, shape) for shape in SERVING_SHAPES]]

    def loop(forward: Callable[..., Any], args: list[Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [forward(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state for ids in args[0]]

    return model, make, loop


class TinyClassifier(torch.nn.Module):
    """Two transformer encoder layers (width 128, 4 heads, no biases, no dropout), mean-pooled, and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.TransformerEncoderLayer(
            128, 4, 512, dropout=0.0, batch_first=True, bias=False) for _ in range(2)))
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x).mean(1))


def whole_train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
                     ) -> torch.Tensor:
    """One training step, whole: forward, backward, gradient clipping, AdamW's step, zero_grad."""
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return loss.detach()


def forward_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The forward and the loss of `whole_train_step` (the part a compiler of forwards takes)."""
    return torch.nn.functional.cross_entropy(model(x), y)


# (id of the variant's forward, id of the optimizer) -> the same variant of `opt.step`
_STEPS: dict[tuple[int, int], Callable[..., Any]] = {}


def _step_like(forward: Callable[..., Any], opt: torch.optim.Optimizer) -> Callable[..., Any]:
    """`opt.step` wrapped as `forward` was: jitted by minijit, compiled by torch.compile, or as it is."""
    import minijit

    key = (id(forward), id(opt))
    if key not in _STEPS:
        try:
            minijit.cache_info(forward)
            _STEPS[key] = minijit.jit(opt.step)
        except (TypeError, AttributeError, ValueError):
            compiled = getattr(forward, "_torchdynamo_orig_callable", None) is not None
            _STEPS[key] = torch.compile(opt.step) if compiled else opt.step
    return _STEPS[key]


def train_step_loop(whole: bool) -> tuple[Callable[..., Any], Callable[[], list[Any]], Callable[..., Any]]:
    """A training step of TinyClassifier on a batch of 8 x 64 tokens: the whole step as one function (`whole`),
    or its forward and loss as one function with backward, clipping and the optimizer's step around it (the
    optimizer's step wrapped the same way: `jit(model)` plus `jit(opt.step)`, as before whole steps)."""
    def make() -> list[Any]:
        torch.manual_seed(0)
        model = TinyClassifier()
        return [model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01),
                torch.randn(8, 64, 128), torch.randint(0, 10, (8,))]

    def loop(fn: Callable[..., Any], args: list[Any]) -> list[torch.Tensor]:
        model, opt, x, y = args
        if whole:
            loss = fn(model, opt, x, y)
        else:
            loss = fn(model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            _step_like(fn, opt)()
            opt.zero_grad()
            loss = loss.detach()
        return [loss, *model.parameters()]

    return (whole_train_step if whole else forward_loss), make, loop


def traces_note(fn: Callable[..., Any]) -> str | None:
    """"N traces / M calls" for a minijit-jitted `fn`, else None."""
    import minijit

    try:
        info = minijit.cache_info(fn)
    except (TypeError, AttributeError, ValueError):
        return None
    calls = info.hits + info.misses + info.rebound + info.eager_calls
    return f"{info.misses} traces / {calls} calls"
