"""GPT-2 with cross attention (add_cross_attention) fed encoder_hidden_states through generate(), and bart/t5
with assisted decoding: python sweep/cross.py."""

from __future__ import annotations

import torch
from common import build, prompt, run_case

import minijit

model = build("gpt2", "eager", add_cross_attention=True)
jitted = minijit.jit(model.forward)
SC = dict(output_scores=True, output_logits=True, return_dict_in_generate=True)
bad = 0
for i, (b, t, s) in enumerate([(2, 5, 4), (2, 6, 7), (3, 4, 4), (1, 5, 3)]):
    enc = torch.randn(b, s, 32, generator=torch.Generator().manual_seed(i))
    kws = [dict(num_beams=1), dict(num_beams=2), dict(do_sample=True)]
    for kw in kws:
        bad += not run_case(f"gpt2 cross {b}x{t} enc {s} {kw}", model, jitted, i, **prompt(b, t, pad=1, seed=i),
                            encoder_hidden_states=enc, max_new_tokens=5, **kw, **SC)
for name in ("bart", "t5"):
    model = build(name)
    assistant = build(name, num_layers=1) if name == "t5" else build(name, decoder_layers=1, encoder_layers=1)
    jitted, ajitted = minijit.jit(model.forward), minijit.jit(assistant.forward)
    for i, t in enumerate((5, 8, 4)):
        p = prompt(1, t, seed=40 + i)
        vars(assistant).pop("forward", None)
        want_ok = True
        from common import compare, gen
        want = gen(model, None, i, **p, max_new_tokens=6, assistant_model=assistant, **SC)
        assistant.forward = ajitted
        have = gen(model, jitted, i, **p, max_new_tokens=6, assistant_model=assistant, **SC)
        probs = compare(want, have)
        bad += bool(probs)
        print(f"  {'ok' if not probs else 'FAIL'} {name} assisted len {t}: misses {minijit.cache_info(jitted).misses}"
              f"/{minijit.cache_info(ajitted).misses} {probs}")
print("cross FAILURES:", bad)
