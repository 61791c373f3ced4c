"""Decoding strategies on one model: python sweep/decode.py NAME [ATTN]."""

from __future__ import annotations

import sys

from common import SEQ2SEQ, build, prompt, run_case

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
model = build(name, attn)
jitted = minijit.jit(model.forward)
print(name, attn, minijit.__file__)
N = dict(max_new_tokens=6)
SC = dict(output_scores=True, output_logits=True, return_dict_in_generate=True)
p = prompt(2, 5, pad=2)
cases = [
    ("greedy", 0, dict(**p, **N, **SC, do_sample=False)),
    ("sample topk/topp/temp", 1, dict(**p, **N, **SC, do_sample=True, top_k=10, top_p=0.9, temperature=0.7)),
    ("beam3", 2, dict(**p, **N, **SC, num_beams=3, do_sample=False)),
    ("beam3 early", 3, dict(**p, **N, **SC, num_beams=3, do_sample=False, early_stopping=True)),
    ("beam3 sample", 3, dict(**p, **N, num_beams=3, do_sample=True)),
    ("rep penalty", 4, dict(**p, **N, **SC, repetition_penalty=1.5)),
    ("no_repeat_ngram", 5, dict(**p, **N, **SC, no_repeat_ngram_size=2)),
    ("min_new_tokens", 6, dict(**p, max_new_tokens=8, min_new_tokens=5, **SC)),
    ("eos stop", 7, dict(**p, max_new_tokens=10, eos_token_id=[2, 5, 7, 9, 11, 13], **SC)),
    ("batch3 len7", 8, dict(**prompt(3, 7, pad=3, seed=3), **N, **SC)),
    ("batch1 len4", 9, dict(**prompt(1, 4, seed=4), **N, **SC)),
    ("static", 10, dict(**p, **N, **SC, cache_implementation="static")),
    ("static batch1 len3", 11, dict(**prompt(1, 3, seed=5), **N, **SC, cache_implementation="static")),
    ("greedy again len9", 12, dict(**prompt(2, 9, pad=1, seed=6), **N, **SC)),
    ("sample again", 13, dict(**prompt(2, 6, pad=1, seed=7), **N, **SC, do_sample=True)),
]
if name not in SEQ2SEQ:
    cases.append(("prompt lookup", 14, dict(**{"input_ids": prompt(1, 12, seed=8)["input_ids"].repeat(1, 2)},
                                             **N, prompt_lookup_num_tokens=3)))
    cases.append(("use_cache=False", 15, dict(**p, **N, **SC, use_cache=False)))
    cases.append(("output attn/hidden", 16, dict(**p, **N, **SC, output_attentions=True,
                                                  output_hidden_states=True)))
only = sys.argv[3:]
bad = 0
for label, seed, kw in cases:
    if only and not any(o in label for o in only):
        continue
    bad += not run_case(label, model, jitted, seed, **kw)
print(name, attn, "FAILURES:", bad)
