"""Edge cases of sizes on one jitted forward: python sweep/edges.py NAME [ATTN]."""

from __future__ import annotations

import sys

from common import build, prompt, run_case

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
model = build(name, attn)
jitted = minijit.jit(model.forward)
SC = dict(output_scores=True, output_logits=True, return_dict_in_generate=True)
full_pad = prompt(2, 6, pad=5, seed=60)
cases = [
    ("len5 greedy", dict(**prompt(2, 5, pad=1, seed=61), max_new_tokens=6, **SC)),
    ("len1 prompt", dict(**prompt(2, 1, seed=62), max_new_tokens=5, **SC)),
    ("len1 batch1", dict(**prompt(1, 1, seed=63), max_new_tokens=5, **SC)),
    ("max_new 1", dict(**prompt(2, 4, seed=64), max_new_tokens=1, **SC)),
    ("len2", dict(**prompt(2, 2, seed=65), max_new_tokens=4, **SC)),
    ("one real token", dict(**full_pad, max_new_tokens=4, **SC)),
    ("static after dynamic", dict(**prompt(2, 5, pad=1, seed=66), max_new_tokens=6, cache_implementation="static",
                                  **SC)),
    ("static longer", dict(**prompt(2, 7, pad=1, seed=67), max_new_tokens=9, cache_implementation="static", **SC)),
    ("dynamic again", dict(**prompt(2, 8, pad=2, seed=68), max_new_tokens=6, **SC)),
    ("no mask", dict(input_ids=prompt(2, 6, seed=69)["input_ids"], max_new_tokens=5, **SC)),
    ("long prompt 20", dict(**prompt(2, 20, pad=4, seed=70), max_new_tokens=5, **SC)),
    ("batch 5 beams 2", dict(**prompt(5, 4, pad=1, seed=71), max_new_tokens=4, num_beams=2, **SC)),
    ("return 2 seqs", dict(**prompt(2, 4, seed=72), max_new_tokens=4, do_sample=True, num_return_sequences=2, **SC)),
    ("beam 3 ret 3", dict(**prompt(2, 4, seed=73), max_new_tokens=4, num_beams=3, num_return_sequences=3, **SC)),
    ("len1 prompt again", dict(**prompt(3, 1, seed=74), max_new_tokens=3, **SC)),
    ("offloaded", dict(**prompt(2, 5, seed=75), max_new_tokens=4, cache_implementation="offloaded", **SC)),
    ("quantized?", dict(**prompt(2, 5, seed=76), max_new_tokens=4, cache_implementation="dynamic", **SC)),
]
only = sys.argv[3:]
bad = 0
for i, (label, kw) in enumerate(cases):
    if only and not any(o in label for o in only):
        continue
    bad += not run_case(label, model, jitted, 100 + i, **kw)
print(name, attn, "FAILURES:", bad)
