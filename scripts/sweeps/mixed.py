"""Assisted decoding, past_key_values from an eager call, several generations: python sweep/mixed.py NAME [ATTN]."""

from __future__ import annotations

import copy
import sys

import torch
from common import build, compare, gen, prompt

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
model = build(name, attn)
small = {"llama": dict(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                       num_key_value_heads=1)}.get(name, dict(num_hidden_layers=1))
assistant = build(name, attn, **small)
jitted = minijit.jit(model.forward)
ajitted = minijit.jit(assistant.forward)
bad = 0
SC = dict(output_scores=True, return_dict_in_generate=True)
for i, (b, t) in enumerate([(1, 5), (1, 8), (1, 3)]):
    p = prompt(b, t, seed=20 + i)
    vars(assistant).pop("forward", None)
    torch.manual_seed(0)
    with torch.no_grad():
        want = gen(model, None, 0, **p, max_new_tokens=8, assistant_model=assistant, **SC)
    assistant.forward = ajitted
    try:
        have = gen(model, jitted, 0, **p, max_new_tokens=8, assistant_model=assistant, **SC)
        probs = compare(want, have)
    except Exception as e:
        probs = [f"raised {type(e).__name__}: {e}"]
    bad += bool(probs)
    print(f"  {'ok' if not probs else 'FAIL'} assisted {b}x{t}: main misses {minijit.cache_info(jitted).misses}"
          f" assistant misses {minijit.cache_info(ajitted).misses} {probs}")
vars(assistant).pop("forward", None)

# sampling assisted
p = prompt(1, 6, seed=30)
want = gen(model, None, 5, **p, max_new_tokens=8, assistant_model=assistant, do_sample=True, **SC)
assistant.forward = ajitted
have = gen(model, jitted, 5, **p, max_new_tokens=8, assistant_model=assistant, do_sample=True, **SC)
probs = compare(want, have)
bad += bool(probs)
print(f"  {'ok' if not probs else 'FAIL'} assisted sample {probs}")
vars(assistant).pop("forward", None)

# past_key_values from an eager call
for i, (b, t) in enumerate([(2, 6), (1, 4), (2, 9)]):
    full = prompt(b, t + 3, seed=40 + i)
    pre = {"input_ids": full["input_ids"][:, :t], "attention_mask": full["attention_mask"][:, :t]}
    vars(model).pop("forward", None)
    with torch.no_grad():
        pkv = model(**pre, use_cache=True).past_key_values
    pkv2 = copy.deepcopy(pkv)
    want = gen(model, None, 0, **full, past_key_values=pkv, max_new_tokens=5, **SC)
    try:
        have = gen(model, jitted, 0, **full, past_key_values=pkv2, max_new_tokens=5, **SC)
        probs = compare(want, have)
        for le, lj in zip(pkv.layers, pkv2.layers):
            if not (torch.equal(le.keys, lj.keys) and torch.equal(le.values, lj.values)):
                probs.append("cache contents differ after")
                break
    except Exception as e:
        probs = [f"raised {type(e).__name__}: {e}"]
    bad += bool(probs)
    print(f"  {'ok' if not probs else 'FAIL'} eager pkv {b}x{t}: {probs} misses {minijit.cache_info(jitted).misses}")

# jitted prefill of the pkv, eager generate after
full = prompt(2, 9, seed=50)
pre = {"input_ids": full["input_ids"][:, :6], "attention_mask": full["attention_mask"][:, :6]}
vars(model).pop("forward", None)
with torch.no_grad():
    pkv = model(**pre, use_cache=True).past_key_values
    pkv2 = minijit.jit(type(model).forward)(model, **pre, use_cache=True).past_key_values
want = gen(model, None, 0, **full, past_key_values=pkv, max_new_tokens=5, **SC)
have = gen(model, None, 0, **full, past_key_values=pkv2, max_new_tokens=5, **SC)
probs = compare(want, have)
bad += bool(probs)
print(f"  {'ok' if not probs else 'FAIL'} jit pkv then eager generate {probs}")
print(name, attn, "FAILURES:", bad)
