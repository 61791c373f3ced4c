"""A hand-written decode loop whose jitted step samples (temperature, top-k, top-p changing between calls, a
DynamicCache passed in): python sweep/step.py NAME."""

from __future__ import annotations

import sys

import torch
from common import build, prompt
from transformers import DynamicCache

import minijit

name = sys.argv[1]
model = build(name, sys.argv[2] if len(sys.argv) > 2 else "eager")


def step(ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache, temp: float, k: int, p: float,
         rep: float) -> torch.Tensor:
    """One decoding step: forward, repetition penalty, temperature, top-k, top-p, multinomial."""
    out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    logits = out.logits[:, -1, :] / temp
    seen = torch.gather(logits, 1, mask.new_zeros(ids.shape[0], 1) + ids[:, -1:])
    seen = torch.where(seen < 0, seen * rep, seen / rep)
    logits = logits.scatter(1, ids[:, -1:], seen)
    if k > 0:
        kth = torch.topk(logits, k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) > p
    logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1)


def loop(fn, seed: int, b: int, t: int, n: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    pr = prompt(b, t, pad=1, seed=seed)
    ids, mask = pr["input_ids"], pr["attention_mask"]
    cache = DynamicCache(config=model.config)
    toks = []
    cur = ids
    for i in range(n):
        nxt = fn(cur, mask, cache, 0.5 + 0.1 * i, [0, 5, 10][i % 3], 0.8 + 0.05 * (i % 2), 1.0 + 0.2 * (i % 2))
        toks.append(nxt)
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        cur = nxt
    return toks


jstep = minijit.jit(step)
bad = 0
with torch.no_grad():
    for seed, (b, t, n) in enumerate([(2, 5, 6), (3, 4, 5), (1, 6, 4), (2, 7, 6)]):
        want = torch.cat(loop(step, seed, b, t, n), 1)
        have = torch.cat(loop(jstep, seed, b, t, n), 1)
        ok = torch.equal(want, have)
        bad += not ok
        detail = "" if ok else f"{want.tolist()} {have.tolist()}"
        print(f"seed {seed} {b}x{t}: {'ok' if ok else 'FAIL'} {detail}")
print(minijit.cache_info(jstep))
print(name, "FAILURES:", bad)
