"""Training edge cases on one jit(model): eval/train switching, grad accumulation, gradient checkpointing with
dropout; python sweep/train2.py NAME [ATTN] [ckpt]."""

from __future__ import annotations

import sys

import torch
from common import VOCAB, build

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
ckpt = "ckpt" in sys.argv[3:]
DROP = 0.1


def make(jit: bool):
    model = build(name, attn).train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = DROP
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = DROP
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    call = minijit.jit(model) if jit else model
    step = minijit.jit(lambda: opt.step()) if jit else opt.step
    return model, call, opt, step


def data(i: int, b: int, t: int):
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(3, VOCAB, (b, t), generator=g)
    labels = ids.clone()
    labels[:, :1] = -100
    return {"input_ids": ids, "labels": labels}


plan = [("train", 2, 5), ("accum", 3, 6), ("eval", 2, 4), ("train", 1, 7), ("eval", 3, 3), ("accum", 2, 8),
        ("train", 4, 4)]
ref, jit = make(False), make(True)
bad = 0
for i, (kind, b, t) in enumerate(plan):
    outs = []
    for model, call, opt, step in (ref, jit):
        kw = data(i, b, t)
        torch.manual_seed(1000 + i)
        if kind == "eval":
            model.eval()
            with torch.no_grad():
                outs.append((call(**kw).logits, None))
            model.train()
            continue
        if kind == "train":
            opt.zero_grad()
        loss = call(**kw).loss
        loss.backward()
        if kind == "accum":
            loss2 = call(**data(i + 50, b, t + 1)).loss
            loss2.backward()
            loss = loss + loss2
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        step()
        outs.append((loss, grads))
    (a, ga), (b_, gb) = outs
    msg = []
    if not torch.allclose(a, b_, rtol=1e-5, atol=1e-6):
        msg.append(f"value max diff {(a - b_).abs().max().item()}")
    if ga is not None and (len(ga) != len(gb) or any(not torch.allclose(x, y, rtol=1e-5, atol=1e-6)
                                                     for x, y in zip(ga, gb))):
        msg.append("grads differ")
    for (n, p), q in zip(ref[0].named_parameters(), jit[0].parameters()):
        if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
            msg.append(f"param {n}")
            break
    bad += bool(msg)
    print(f"{i} {kind} {b}x{t}: {'ok' if not msg else 'FAIL ' + '; '.join(msg)}")
print(minijit.cache_info(jit[1]))
print(name, attn, "ckpt" if ckpt else "", "FAILURES:", bad)
