"""Tokens per second of Hugging Face `generate()` with a jitted forward, against eager, in one run.

A small Llama (random weights, no download) generates greedily from a batch of prompts with
a dynamic cache and with a static cache. For each cache, eager and `model.forward =
minijit.jit(model.forward, cache="symbolic values")` are timed interleaved (repeat r times:
one generate() of each) and the median is reported as tokens/second and its ratio to eager
(>1 is faster), by wall-clock time and by the process's CPU time (steadier on a shared machine).
The first jitted generate() (tracing included) is reported apart, with the token ids' equality
to eager's and the jitted forward's cache_info (traces, hits, rebinds).

Run: python scripts/bench_generate.py [--repeats N] [--new-tokens N] [--hidden N] [--layers N] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig  # noqa: E402

import minijit  # noqa: E402


def build_model(hidden: int, layers: int) -> torch.nn.Module:
    config = AutoConfig.for_model("llama", hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                  vocab_size=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def generate(model: torch.nn.Module, forward: Any, prompt: dict[str, torch.Tensor], new_tokens: int,
             cache: str) -> tuple[torch.Tensor, float, float]:
    """(token ids, wall seconds, CPU seconds) of one greedy generate() with `forward` (None: the model's own)."""
    if forward is None:
        vars(model).pop("forward", None)
    else:
        model.forward = forward
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        ids = model.generate(**prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             **extra)
    return ids, time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args.hidden, args.layers)
    torch.manual_seed(1)
    ids = torch.randint(3, 512, (args.batch, 16))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    prompt = {"input_ids": ids, "attention_mask": mask}
    tokens = args.batch * args.new_tokens
    print(f"Llama hidden {args.hidden}, {args.layers} layers; batch {args.batch}, prompt 16, {args.new_tokens} new "
          f"tokens, greedy; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'cache':<8} {'eager tok/s':>12} {'minijit tok/s':>14} {'ratio':>6} {'CPU-time ratio':>15} "
          f"{'first jitted call':>18}  ids equal  cache_info")
    for cache in ("dynamic", "static"):
        jitted = minijit.jit(model.forward, cache="symbolic values")
        want, _, _ = generate(model, None, prompt, args.new_tokens, cache)
        have, first, _ = generate(model, jitted, prompt, args.new_tokens, cache)
        equal = torch.equal(have, want)
        eager, jit = [], []
        for _ in range(args.repeats):
            eager.append(generate(model, None, prompt, args.new_tokens, cache)[1:])
            jit.append(generate(model, jitted, prompt, args.new_tokens, cache)[1:])
        e, j = statistics.median(w for w, _ in eager), statistics.median(w for w, _ in jit)
        e_cpu, j_cpu = statistics.median(c for _, c in eager), statistics.median(c for _, c in jit)
        info = minijit.cache_info(jitted)
        print(f"{cache:<8} {tokens / e:>12.1f} {tokens / j:>14.1f} {e / j:>6.2f} {e_cpu / j_cpu:>15.2f} "
              f"{first:>17.2f}s  {equal!s:<9}  {info.misses} traces, {info.hits} hits, {info.rebound} rebound")


if __name__ == "__main__":
    main()
