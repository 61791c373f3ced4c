"""Two conversations continued alternately with generate(past_key_values=...) on one jitted forward; eager state
and jitted state mixed: python sweep/interleave.py NAME [ATTN] [static]."""

from __future__ import annotations

import sys

import torch
from common import build, compare, gen, prompt

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
model = build(name, attn)
jitted = minijit.jit(model.forward)
SC = dict(output_scores=True, return_dict_in_generate=True)


def run(forwards: list) -> list:
    """Turns alternating between conversations A (batch 2) and B (batch 1); each turn appends 3 tokens of user text
    and generates 4 tokens, with the turn's forward (None: eager)."""
    state = {"A": (prompt(2, 5, seed=1)["input_ids"], None), "B": (prompt(1, 7, seed=2)["input_ids"], None)}
    outs = []
    for turn, fwd in enumerate(forwards):
        conv = "AB"[turn % 2]
        ids, cache = state[conv]
        user = prompt(ids.shape[0], 3, seed=10 + turn)["input_ids"]
        ids = torch.cat([ids, user], 1)
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, **SC)
        if cache is not None:
            kw["past_key_values"] = cache
        out = gen(model, fwd, turn, **kw)
        state[conv] = (out.sequences, out.past_key_values)
        outs.append(out)
    return outs


patterns = {
    "all jit": [jitted] * 6,
    "mixed": [jitted, None, None, jitted, jitted, None, jitted, jitted],
    "mixed2": [None, jitted, jitted, None, None, jitted, jitted, None],
}
bad = 0
for label, fwds in patterns.items():
    want = run([None] * len(fwds))
    try:
        have = run(fwds)
        probs = [f"turn {i}: {p}" for i, (a, b) in enumerate(zip(want, have)) for p in compare(a, b)]
    except Exception as e:
        import traceback
        traceback.print_exc(limit=-5)
        probs = [f"raised {type(e).__name__}: {e}"]
    bad += bool(probs)
    info = minijit.cache_info(jitted)
    print(f"{label}: {'ok' if not probs else 'FAIL'} misses {info.misses} hits {info.hits} rebound {info.rebound}",
          *probs[:6], sep="\n   ")
print(name, attn, "FAILURES:", bad)
