"""Shared helpers for the hfgen sweep: tiny models from configs, generate() under eager and a jitted forward."""

from __future__ import annotations

import os
import traceback
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers
from transformers import AutoConfig

import minijit

VOCAB = 64
TOKENS = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CAUSAL = {
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128),
    "qwen2": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=128),
    "mistral": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, max_position_embeddings=128, sliding_window=6),
    "gemma2": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, max_position_embeddings=128, sliding_window=6),
    "gemma3_text": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, sliding_window=6,
                        layer_types=["sliding_attention", "full_attention"]),
}
SEQ2SEQ = {
    "bart": dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=4, max_position_embeddings=128,
                 decoder_start_token_id=2, forced_eos_token_id=None),
    "t5": dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, decoder_start_token_id=0),
}


DTYPE = getattr(torch, os.environ.get("DTYPE", "float32"))


def build(name: str, attn: str = "eager", **over: Any) -> torch.nn.Module:
    """A tiny model with random weights (seed 0), in the dtype named by $DTYPE."""
    torch.manual_seed(0)
    over.setdefault("dtype", DTYPE)
    if name in CAUSAL:
        cfg = AutoConfig.for_model(name, **{**CAUSAL[name], **over}, **TOKENS)
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()
    cfg = AutoConfig.for_model(name, **{**SEQ2SEQ[name], **over}, **TOKENS)
    return transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation=attn).eval()


def prompt(batch: int, length: int, pad: int = 0, seed: int = 1) -> dict[str, torch.Tensor]:
    """A batch of prompts, the first left-padded by `pad` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if pad:
        mask[0, :pad] = 0
        ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def gen(model: torch.nn.Module, forward: Any, seed: int, **kw: Any) -> Any:
    """generate() after manual_seed(seed) with `forward` (None: eager) as the model's forward."""
    if forward is None:
        vars(model).pop("forward", None)
    else:
        model.forward = forward
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(**kw)


def compare(out_e: Any, out_j: Any) -> list[str]:
    """Differences between two generate() outputs (ids exactly, scores/logits close)."""
    probs = []
    se = out_e.sequences if hasattr(out_e, "sequences") else out_e
    sj = out_j.sequences if hasattr(out_j, "sequences") else out_j
    if se.shape != sj.shape or not torch.equal(se, sj):
        probs.append(f"ids differ: eager {se.tolist()} jit {sj.tolist()}")
        return probs
    for field in ("scores", "logits", "sequences_scores", "beam_indices"):
        a, b = getattr(out_e, field, None), getattr(out_j, field, None)
        if a is None and b is None:
            continue
        if (a is None) != (b is None):
            probs.append(f"{field}: one is None")
            continue
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        if len(a) != len(b):
            probs.append(f"{field}: lengths {len(a)} vs {len(b)}")
            continue
        for i, (x, y) in enumerate(zip(a, b)):
            if x.shape != y.shape or not torch.allclose(x, y, rtol=1e-5, atol=1e-5, equal_nan=True):
                d = (x - y).abs().nan_to_num(0).max().item() if x.shape == y.shape else "shape"
                probs.append(f"{field}[{i}] differ (max {d})")
                break
    probs += compare_cache(getattr(out_e, "past_key_values", None), getattr(out_j, "past_key_values", None))
    return probs


def _state(obj: Any, depth: int = 0) -> Any:
    """A comparable picture of an object's state: tensors, numbers, nested objects."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (int, float, bool, str, type(None), torch.dtype, torch.device)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [_state(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {k: _state(v, depth + 1) for k, v in obj.items()}
    if depth < 4 and hasattr(obj, "__dict__"):
        return {"__type__": type(obj).__name__, **{k: _state(v, depth + 1) for k, v in vars(obj).items()}}
    return type(obj).__name__


def _diff(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        if a.shape != b.shape or a.dtype != b.dtype:
            return [f"{path}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"]
        if not torch.allclose(a.double() if a.is_floating_point() else a, b.double() if b.is_floating_point() else b,
                              rtol=1e-5, atol=1e-5, equal_nan=True):
            return [f"{path}: values differ"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} vs {sorted(b)}"]
        return [d for k in a for d in _diff(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: len {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def compare_cache(a: Any, b: Any) -> list[str]:
    """Differences between two caches' states after generate()."""
    return _diff(_state(a), _state(b), "cache")[:5]


def run_case(label: str, model: torch.nn.Module, jitted: Any, seed: int, **kw: Any) -> bool:
    """Run generate() eager then jitted, print the outcome; True when equal."""
    before = minijit.cache_info(jitted).misses
    try:
        want = gen(model, None, seed, **kw)
    except Exception as e:
        print(f"  SKIP {label}: eager raised {type(e).__name__}: {str(e)[:150]}")
        return True
    try:
        have = gen(model, jitted, seed, **kw)
    except Exception as e:
        print(f"  FAIL {label}: jit raised {type(e).__name__}: {str(e)[:300]}")
        traceback.print_exc(limit=-6)
        return False
    probs = compare(want, have)
    info = minijit.cache_info(jitted)
    status = "ok  " if not probs else "FAIL"
    print(f"  {status} {label}: +{info.misses - before} traces (misses {info.misses}, hits {info.hits},"
          f" rebound {info.rebound})" + ("" if not probs else "\n      " + "\n      ".join(probs)))
    return not probs
