"""Sweep: jit(opt.step, executors=["inductor"]) for Adam, AdamW, SGD(momentum), RMSprop under a cosine schedule."""

from __future__ import annotations

import sys
import warnings

import torch

import minijit


def params(seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [torch.randn(16, 8, requires_grad=True), torch.randn(8, requires_grad=True), torch.randn(3, 5, requires_grad=True)]


def close(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if not torch.is_tensor(a):
        return None if a == b else f"{a} vs {b}"
    if torch.allclose(a, b, rtol=1e-5, atol=1e-6):
        return None
    return f"max abs {(a - b).abs().max().item():.3g} size {tuple(a.shape)}"


def sweep(name: str, make, foreach: bool | None) -> None:
    pe, pj = params(0), params(0)
    kw = {} if foreach is None else {"foreach": foreach}
    oe, oj = make(pe, **kw), make(pj, **kw)
    se = torch.optim.lr_scheduler.CosineAnnealingLR(oe, T_max=10)
    sj = torch.optim.lr_scheduler.CosineAnnealingLR(oj, T_max=10)
    step = minijit.jit(oj.step, executors=["inductor"])
    problems = []
    graphs: list[int] = []
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        for i in range(10):
            torch.manual_seed(100 + i)
            grads = [torch.randn_like(p) for p in pe]
            for p, q, g in zip(pe, pj, grads):
                p.grad, q.grad = g.clone(), g.clone()
            oe.step()
            step()
            se.step()
            sj.step()
            from torch._dynamo.utils import counters as c
            graphs.append(c["stats"]["unique_graphs"])
            for k, (p, q) in enumerate(zip(pe, pj)):
                if (d := close(q.detach(), p.detach())):
                    problems.append(f"step {i} param {k}: {d}")
                for key, v in oe.state[p].items():
                    if (d := close(oj.state[q][key], v)):
                        problems.append(f"step {i} param {k} state {key}: {d}")
    for w in ws:
        if "minijit" in str(w.message):
            print(f"  WARN {str(w.message)[:300]}")
    info = minijit.cache_info(step)
    from torch._dynamo.utils import counters
    print(f"{name} foreach={foreach}: misses={info.misses} hits={info.hits} "
          f"unique_graphs={counters['stats']['unique_graphs']} problems={len(problems)} graphs/step={graphs}", flush=True)
    for p in problems[:6]:
        print("   PROBLEM", p)
    if info.misses > 2:
        print("   miss reasons", info.miss_reasons)


OPTS = {
    "Adam": lambda ps, **kw: torch.optim.Adam(ps, lr=1e-2, **kw),
    "AdamW": lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, **kw),
    "SGD": lambda ps, **kw: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3, **kw),
    "RMSprop": lambda ps, **kw: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5, centered=True, **kw),
}

if __name__ == "__main__":
    for name in sys.argv[1:] or OPTS:
        for foreach in (False, True):
            try:
                sweep(name, OPTS[name], foreach)
            except Exception:
                import traceback
                print(f"{name} foreach={foreach}: CRASH", traceback.format_exc()[-2000:], flush=True)
