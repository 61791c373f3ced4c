"""Training under the default mode: jit(model) forward+backward with labels, batch and length changing every step,
AdamW (jitted separately) with a cosine schedule; python sweep/train.py NAME [ATTN]."""

from __future__ import annotations

import sys

import torch
from common import SEQ2SEQ, VOCAB, build

import minijit

name = sys.argv[1]
attn = sys.argv[2] if len(sys.argv) > 2 else "eager"
STEPS = 6
AUTOCAST = bool(__import__("os").environ.get("AUTOCAST"))
DROP = float(__import__("os").environ.get("DROP", "0"))
SHAPES = [(2, 5), (3, 7), (1, 4), (2, 9), (4, 6), (3, 3)]


def batch(step: int) -> dict[str, torch.Tensor]:
    """Step `step`'s inputs and labels (some -100)."""
    g = torch.Generator().manual_seed(100 + step)
    b, t = SHAPES[step]
    ids = torch.randint(3, VOCAB, (b, t), generator=g)
    mask = torch.ones_like(ids)
    mask[0, : min(2, t - 1)] = 0 if step % 2 else 1
    labels = ids.clone()
    labels[mask == 0] = -100
    out = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if name in SEQ2SEQ:
        out["labels"] = torch.randint(3, VOCAB, (b, t + 1), generator=g)
    return out


def make(jit: bool):
    """(model, forward-backward, optimizer step, scheduler)."""
    model = build(name, attn, **({"dropout": 0.0} if name == "bart" else {})).train()
    if name == "gpt2":
        model.config.attn_pdrop = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = DROP
    for block in model.modules():
        if hasattr(block, "attention_dropout"):
            block.attention_dropout = DROP
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + __import__("math").cos(s / STEPS * 3.14159)))

    def fwd_bwd(**kw):
        loss = model(**kw).loss
        loss.backward()
        return loss

    def step():
        opt.step()

    if jit:
        jm = minijit.jit(model)

        def fwd_bwd(**kw):
            loss = jm(**kw).loss
            loss.backward()
            return loss

        step = minijit.jit(step)
        return model, fwd_bwd, step, opt, sched, jm
    return model, fwd_bwd, step, opt, sched, None


ref = make(False)
jit = make(True)
bad = 0
for s in range(STEPS):
    kw = batch(s)
    losses = []
    for model, fb, st, opt, sched, _ in (ref, jit):
        torch.manual_seed(7 + s)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
            losses.append(fb(**kw))
        grads = [p.grad for p in model.parameters()]
        losses.append(grads)
        st()
        sched.step()
    le, ge, lj, gj = losses
    msg = []
    if not torch.allclose(le, lj, rtol=1e-5, atol=1e-6):
        msg.append(f"loss {le.item()} vs {lj.item()}")
    for (n, _), a, b in zip(ref[0].named_parameters(), ge, gj):
        if (a is None) != (b is None) or (a is not None and not torch.allclose(a, b, rtol=1e-5, atol=1e-6)):
            msg.append(f"grad {n}")
            break
    for (n, a), b in zip(ref[0].named_parameters(), jit[0].parameters()):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
            msg.append(f"param {n} max {(a - b).abs().max().item()}")
            break
    bad += bool(msg)
    print(f"step {s} {SHAPES[s]} loss {le.item():.6f} {'ok' if not msg else 'FAIL ' + '; '.join(msg)}")
print("model", minijit.cache_info(jit[5]))
print("step", minijit.cache_info(jit[2]))
print(name, attn, "FAILURES:", bad)
if bad:
    for (n, a), b in zip(ref[0].named_parameters(), jit[0].parameters()):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
            idx = ((a - b).abs() > 1e-6).nonzero()
            print("  differs:", n, tuple(a.shape), "at", idx[:, -1].unique().tolist()[:12], "of", a.numel())
    g = [p.grad for n, p in ref[0].named_parameters() if n.endswith(("c_attn.bias", "k_proj.bias"))]
    print("  eager grad of those biases max |g|:", [x.abs().max().item() for x in g][:4])
