"""A held-out zoo: Hugging Face architectures and configurations that tests/models/test_zoo.py does not use,
each under minijit.jit against eager. Not part of CI; run it to see where minijit stands on models it was
not tuned on.

For each model (a tiny random-init config, no download): two training-mode calls with the same seed before
each side's call, inputs padded by an attention mask where the model takes one; every tensor of the output,
every parameter's gradient of the loss and every buffer is compared with eager (rtol 1e-4, atol 1e-5). The
verdict is one of

- `matches eager` (with the cache figures of the calls),
- `MinijitError: <type>: <first line>`: minijit refused, naming what,
- `WRONG: <what differs>`: a silently wrong answer (a bug),
- `error: <type>: <first line>`: anything else (a crash in minijit),
- `eager fails too`: the config is wrong, not minijit.

Run: python scripts/heldout_zoo.py [--only name,name] [--verbose]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig  # noqa: E402

import minijit  # noqa: E402

VOCAB, BATCH, SEQ = 96, 2, 12
IDS = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
SMALL = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 48, **IDS}


def auto(kind: str, model_type: str, **config: Any) -> Callable[[], torch.nn.Module]:
    return lambda: getattr(transformers, kind).from_config(AutoConfig.for_model(model_type, **config))


def tokens(left_pad: bool) -> Callable[[bool], dict[str, Any]]:
    """Token ids and labels; with `masked`, sequence 1 padded (left or right) and its padding unscored."""

    def make(masked: bool) -> dict[str, Any]:
        ids = torch.randint(3, VOCAB, (BATCH, SEQ))
        out: dict[str, Any] = {"input_ids": ids}
        labels = ids.clone()
        if masked:
            mask = torch.ones(BATCH, SEQ, dtype=torch.long)
            mask[1, :4] = 0 if left_pad else 1
            if not left_pad:
                mask[1, -4:] = 0
            ids[mask == 0] = 0
            labels[mask == 0] = -100
            out["attention_mask"] = mask
        out["labels"] = labels
        return out

    return make


def classify(num_labels: int, **extra: Callable[[], torch.Tensor]) -> Callable[[bool], dict[str, Any]]:
    """Inputs made by `extra`'s factories, and class labels."""
    def make(masked: bool) -> dict[str, Any]:
        return {**{k: f() for k, f in extra.items()}, "labels": torch.randint(0, num_labels, (BATCH,))}

    return make


def seq_classify(num_labels: int) -> Callable[[bool], dict[str, Any]]:
    def make(masked: bool) -> dict[str, Any]:
        out = tokens(False)(masked)
        out["labels"] = torch.randint(0, num_labels, (BATCH,))
        return out

    return make


def _with_eos(ids: torch.Tensor) -> torch.Tensor:
    ids = ids.clone()
    ids[:, -1] = IDS["eos_token_id"]  # one eos per sequence, where BART's classifier reads it
    return ids


def whisper_inputs(masked: bool) -> dict[str, Any]:
    ids = torch.randint(3, VOCAB, (BATCH, 6))
    return {"input_features": torch.randn(BATCH, 16, 32), "decoder_input_ids": ids, "labels": ids}


def ctc_inputs(masked: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"input_values": torch.randn(BATCH, 400), "labels": torch.randint(1, 20, (BATCH, 5))}
    if masked:
        out["attention_mask"] = torch.ones(BATCH, 400, dtype=torch.long)
        out["attention_mask"][1, 300:] = 0
        out["labels"][1, 3:] = -100
    return out


def checkpointed(build: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """The model with gradient checkpointing on (its layers recompute their activations in backward)."""
    def make() -> torch.nn.Module:
        model = build()
        model.gradient_checkpointing_enable()
        return model

    return make


def with_outputs(make: Callable[[bool], dict[str, Any]]) -> Callable[[bool], dict[str, Any]]:
    """The inputs, asking for every hidden state and attention map too."""
    return lambda masked: {**make(masked), "output_hidden_states": True, "output_attentions": True}


def clip_inputs(masked: bool) -> dict[str, Any]:
    out = tokens(False)(masked)
    out.pop("labels")
    return {**out, "pixel_values": torch.randn(BATCH, 3, 16, 16), "return_loss": True}


# name -> (builder, input maker, whether the inputs take a padding mask)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[bool], dict[str, Any]], bool]] = {
    "distilbert (masked LM)": (auto("AutoModelForMaskedLM", "distilbert", dim=48, hidden_dim=96, n_layers=2,
                                    n_heads=4, max_position_embeddings=48, **IDS), tokens(False), True),
    "albert (seq. classification)": (auto("AutoModelForSequenceClassification", "albert", embedding_size=16,
                                          num_labels=3, **SMALL), seq_classify(3), True),
    "electra (token classification)": (auto("AutoModelForTokenClassification", "electra", embedding_size=16,
                                            num_labels=3, **SMALL),
                                       lambda m: {**tokens(False)(m), "labels": torch.randint(0, 3, (BATCH, SEQ))},
                                       True),
    "qwen3": (auto("AutoModelForCausalLM", "qwen3", num_key_value_heads=2, head_dim=12, **SMALL), tokens(True), True),
    "gemma": (auto("AutoModelForCausalLM", "gemma", num_key_value_heads=1, head_dim=12, **SMALL), tokens(True), True),
    "gemma3_text": (auto("AutoModelForCausalLM", "gemma3_text", num_key_value_heads=2, head_dim=12, sliding_window=4,
                         **SMALL), tokens(True), True),
    "phi (partial rotary)": (auto("AutoModelForCausalLM", "phi", partial_rotary_factor=0.5, **SMALL), tokens(True),
                             True),
    "gptj": (auto("AutoModelForCausalLM", "gptj", n_embd=48, n_layer=2, n_head=4, rotary_dim=6, n_positions=48, **IDS),
             tokens(True), True),
    "bloom (alibi)": (auto("AutoModelForCausalLM", "bloom", hidden_size=48, n_layer=2, n_head=4, **IDS), tokens(True),
                      True),
    "mpt": (auto("AutoModelForCausalLM", "mpt", d_model=48, n_layers=2, n_heads=4, max_seq_len=48, expansion_ratio=2,
                 **IDS), tokens(True), True),
    "stablelm": (auto("AutoModelForCausalLM", "stablelm", num_key_value_heads=2, partial_rotary_factor=0.5, **SMALL),
                 tokens(True), True),
    "llama (llama3 rope scaling, eager attention)": (
        auto("AutoModelForCausalLM", "llama", num_key_value_heads=2, attn_implementation="eager",
             rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, **SMALL),
        tokens(True), True),
    "mixtral (default experts: grouped_mm)": (
        auto("AutoModelForCausalLM", "mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
             **SMALL), tokens(True), True),
    "mixtral (eager experts: a loop over the experts that got tokens)": (
        auto("AutoModelForCausalLM", "mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
             experts_implementation="eager", **SMALL), tokens(True), True),
    "qwen3_moe": (auto("AutoModelForCausalLM", "qwen3_moe", num_key_value_heads=2, head_dim=12, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, **SMALL), tokens(True), True),
    "t5 (gated-gelu, v1.1)": (auto("AutoModelForSeq2SeqLM", "t5", d_model=48, d_ff=96, d_kv=12, num_layers=2,
                                   num_heads=4, feed_forward_proj="gated-gelu", decoder_start_token_id=0, **IDS),
                              tokens(False), True),
    "whisper": (auto("AutoModelForSpeechSeq2Seq", "whisper", d_model=48, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96,
                     num_mel_bins=16, max_source_positions=16, max_target_positions=16, decoder_start_token_id=1,
                     **IDS), whisper_inputs, False),
    "deit": (lambda: transformers.DeiTForImageClassification(transformers.DeiTConfig(
        image_size=16, patch_size=4, num_labels=3, **{k: v for k, v in SMALL.items() if k not in IDS})),
                         classify(3, pixel_values=lambda: torch.randn(BATCH, 3, 16, 16)), False),
    "swin": (auto("AutoModelForImageClassification", "swin", image_size=16, patch_size=2, embed_dim=16, depths=[1, 1],
                  num_heads=[2, 4], window_size=4, num_labels=3),
             classify(3, pixel_values=lambda: torch.randn(BATCH, 3, 16, 16)), False),
    "convnext": (auto("AutoModelForImageClassification", "convnext", hidden_sizes=[8, 16], depths=[1, 1],
                      num_stages=2, num_labels=3), classify(3, pixel_values=lambda: torch.randn(BATCH, 3, 32, 32)),
                 False),
    "wav2vec2 (CTC loss)": (auto("AutoModelForCTC", "wav2vec2", hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, conv_dim=(16, 16), conv_stride=(5, 4),
                                 conv_kernel=(10, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                 vocab_size=24, pad_token_id=0, mask_time_prob=0.0, ctc_loss_reduction="mean"),
                            ctc_inputs, True),
    # Hubert and SEW's CTC loss first checks `labels.max() >= vocab_size` (a branch on data): refused there;
    # tests/models/test_zoo.py runs them on their logits.
    "hubert (CTC loss)": (auto("AutoModelForCTC", "hubert", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=24,
                               pad_token_id=0, mask_time_prob=0.0, layerdrop=0.0, ctc_loss_reduction="mean"),
                          ctc_inputs, True),
    # Longformer branches on whether any token has global attention (`is_global_attn`, from the mask's values).
    "longformer": (auto("AutoModelForMaskedLM", "longformer", attention_window=4, **{**SMALL, "pad_token_id": 1}),
                   tokens(False), True),
    "mamba (selective scan: associative_scan)": (
        auto("AutoModelForCausalLM", "mamba", hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
             conv_kernel=4, **IDS), lambda m: {k: v for k, v in tokens(False)(m).items() if k != "attention_mask"},
        False),
    "llama (gradient checkpointing)": (checkpointed(auto("AutoModelForCausalLM", "llama", num_key_value_heads=2,
                                                         **SMALL)), tokens(True), True),
    "gpt2 (eager attention, all hidden states and attentions)": (
        auto("AutoModelForCausalLM", "gpt2", n_embd=48, n_layer=2, n_head=4, n_positions=48, attn_implementation="eager",
             **IDS), with_outputs(tokens(True)), True),
    "bert (seq. classification, all hidden states and attentions)": (
        auto("AutoModelForSequenceClassification", "bert", num_labels=3, attn_implementation="eager", **SMALL),
        with_outputs(seq_classify(3)), True),
    "bart (seq. classification: pools at the eos token)": (
        auto("AutoModelForSequenceClassification", "bart", d_model=48, encoder_ffn_dim=96, decoder_ffn_dim=96,
             encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             max_position_embeddings=48, num_labels=3, **IDS),
        lambda m: {**seq_classify(3)(m), "input_ids": _with_eos(seq_classify(3)(m)["input_ids"])}, True),
    "clip (contrastive loss)": (
        lambda: transformers.CLIPModel(transformers.CLIPConfig(
            text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "max_position_embeddings": 48, **IDS},
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "image_size": 16, "patch_size": 4},
            projection_dim=16)),
        clip_inputs, True),
}


def tensors_of(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor reachable from a model's output (fields, tuples, caches), in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 8 or value is None or isinstance(value, int | float | str | bool | torch.nn.Module):
        return []
    if isinstance(value, dict):
        items: list[Any] = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = list(getattr(value, "__dict__", {}).values())
    return [t for v in items for t in tensors_of(v, depth + 1)]


def first_difference(have: list[torch.Tensor], want: list[torch.Tensor], what: str) -> str | None:
    if len(have) != len(want):
        return f"{what}: {len(have)} tensors, eager has {len(want)}"
    for i, (h, w) in enumerate(zip(have, want)):
        if h is None or w is None:
            if (h is None) != (w is None):
                return f"{what} {i}: {'missing' if h is None else 'present where eager has none'}"
            continue
        try:
            torch.testing.assert_close(h, w, rtol=1e-4, atol=1e-5)
        except AssertionError as e:
            return f"{what} {i}: {' '.join(str(e).split())[:120]}"
    return None


def loss_of(out: Any) -> torch.Tensor:
    return out["loss"] if isinstance(out, dict) else out.loss


def run_model(build: Callable[[], torch.nn.Module], make: Callable[[bool], dict[str, Any]], masked: bool) -> str:
    """The verdict for one model and input kind, after three calls (a model's first call may change the model
    itself, as the classification losses set config.problem_type: the third call is then the first cache hit)."""
    torch.manual_seed(0)
    eager = build().train()
    jitted = copy.deepcopy(eager)
    jm = minijit.jit(jitted)
    for call in range(3):
        inputs = make(masked)
        torch.manual_seed(100 + call)
        try:
            want = eager(**inputs)
        except Exception as e:
            return f"eager fails too (a bad config): {type(e).__name__}: {' '.join(str(e).split())[:120]}"
        torch.manual_seed(100 + call)
        try:
            have = jm(**inputs)
        except minijit.MinijitError as e:
            return f"MinijitError: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        problem = first_difference(tensors_of(have), tensors_of(want), f"call {call}: output tensor")
        if problem is None:
            loss_of(want).backward()
            loss_of(have).backward()
            grads = [(n, p.grad, q.grad) for (n, p), q in zip(eager.named_parameters(), jitted.parameters())]
            problem = first_difference([g[2] for g in grads], [g[1] for g in grads], f"call {call}: grad")
            if problem is not None:
                index = int(problem.split(":")[1].split()[-1])
                problem = problem.replace(f"grad {index}", f"grad of {grads[index][0]}")
        if problem is None:
            problem = first_difference([b for _, b in jitted.named_buffers()], [b for _, b in eager.named_buffers()],
                                       f"call {call}: buffer")
        if problem is not None:
            return f"WRONG: {problem}"
        eager.zero_grad()
        jitted.zero_grad()
    info = minijit.cache_info(jm)
    return f"matches eager ({info.misses} trace(s), {info.hits} hit(s))"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="comma-separated substrings of model names")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of unexpected errors")
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    names = [n for n in MODELS if opts.only is None or any(s in n for s in opts.only.split(","))]
    rows = []
    for name in names:
        build, make, takes_mask = MODELS[name]
        for masked in ((False, True) if takes_mask else (False,)):
            start = time.perf_counter()
            try:
                verdict = run_model(build, make, masked)
            except Exception as e:  # a crash: reported, the zoo goes on
                verdict = f"error: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
                if opts.verbose:
                    traceback.print_exc()
            label = f"{name}{', padded' if masked else ''}"
            rows.append((label, verdict))
            print(f"{label:55s} {time.perf_counter() - start:5.1f} s  {verdict}", flush=True)
    summary = {k: sum(v.startswith(k) for _, v in rows) for k in ("matches", "MinijitError", "WRONG", "error", "eager")}
    print(f"\n{len(rows)} runs: " + ", ".join(f"{n} {k}" for k, n in summary.items()))


if __name__ == "__main__":
    main()
