"""Python numbers changing between calls of a jitted forward: logits_to_keep; python sweep/numbers.py NAME."""

from __future__ import annotations

import sys

import torch
from common import build, prompt

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
model = build(name, attn)
jitted = minijit.jit(model.forward)
bad = 0
with torch.no_grad():
    for k in [1, 2, 3, 5, 0, 1, 4, 0, 7, 2]:
        p = prompt(2, 6, pad=1, seed=k)
        want = model(**p, logits_to_keep=k).logits
        have = jitted(**p, logits_to_keep=k).logits
        ok = want.shape == have.shape and torch.allclose(want, have, atol=1e-6)
        bad += not ok
        print(f"keep {k}: {'ok' if ok else 'FAIL'} {tuple(want.shape)} {tuple(have.shape)}")
    for k in [1, 3, 0]:
        p = prompt(2, 5, seed=k)
        idx = torch.tensor([0, 2, 4][:max(k, 1)])
        want = model(**p, logits_to_keep=idx).logits
        have = jitted(**p, logits_to_keep=idx).logits
        ok = want.shape == have.shape and torch.allclose(want, have, atol=1e-6)
        bad += not ok
        print(f"keep tensor {idx.tolist()}: {'ok' if ok else 'FAIL'}")
print(minijit.cache_info(jitted))
print(name, "FAILURES:", bad)
