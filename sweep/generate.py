"""Sweep: HF greedy generate() with model.forward jitted under executors=["inductor"] against eager (not a test)."""

from __future__ import annotations

import os
import sys
import traceback
import warnings

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers
from transformers import AutoConfig

import minijit

EXTRA = {"mistral": {"sliding_window": 8}, "gemma2": {"head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 8},
         "gpt2": {}}


def build(arch: str):
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    else:
        cfg = AutoConfig.for_model(arch, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, **EXTRA.get(arch, {}))
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def gen(model, ids, mask, **extra):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12,
                              do_sample=False, **extra)


def sweep(arch: str, extra: dict) -> None:
    model = build(arch)
    jf = minijit.jit(model.forward, executors=None if os.environ.get("EXEC") == "torch" else ["inductor"])
    from torch._dynamo.utils import counters
    for round_, (b, s) in enumerate([(2, 8), (2, 8), (2, 11)]):
        torch.manual_seed(round_)
        ids = torch.randint(3, 128, (b, s))
        mask = torch.ones_like(ids)
        mask[1, :3] = 0  # left padding
        vars(model).pop("forward", None)
        want = gen(model, ids, mask, **extra)
        model.forward = jf
        before = minijit.cache_info(jf).misses
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            have = gen(model, ids, mask, **extra)
        vars(model).pop("forward", None)
        for w in ws:
            if "minijit" in str(w.message):
                print(f"  WARN {str(w.message)[:400]}")
        info = minijit.cache_info(jf)
        same = torch.equal(have, want)
        print(f"{arch} {extra} round {round_} {b}x{s}: equal={same} traces this generate={info.misses - before} "
              f"total misses={info.misses} hits={info.hits} unique_graphs={counters['stats']['unique_graphs']}",
              flush=True)
        if not same:
            print("   want", want.tolist())
            print("   have", have.tolist())
    print("   miss reasons:", [r[:400] for r in info.miss_reasons])


if __name__ == "__main__":
    for arch in sys.argv[1:] or ["llama", "qwen2", "mistral", "gemma2", "gpt2"]:
        for extra in ({}, {"cache_implementation": "static"}):
            try:
                sweep(arch, extra)
            except Exception:
                print(f"{arch} {extra}: CRASH", traceback.format_exc()[-2500:], flush=True)
