"""Sweep: zoo models forward+backward under executors=["inductor"] against eager (not a test)."""

from __future__ import annotations

import copy
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
import test_zoo as zoo

import minijit

RTOL, ATOL = 1e-4, 1e-5


def diff(have: torch.Tensor, want: torch.Tensor) -> str | None:
    """A description of a difference beyond tolerance, or None."""
    if have.shape != want.shape or have.dtype != want.dtype:
        return f"shape/dtype {tuple(have.shape)} {have.dtype} vs {tuple(want.shape)} {want.dtype}"
    if not have.is_floating_point():
        return None if torch.equal(have, want) else f"int mismatch {(have != want).sum().item()} elems"
    bad = ~torch.isclose(have, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    if bad.any():
        d = (have - want).abs().max().item()
        return f"{bad.sum().item()}/{have.numel()} beyond tol, max abs {d:.3g}, size {tuple(have.shape)}"
    return None


def run(name: str, eager: torch.nn.Module, makers: list, cache: str) -> None:
    jitted = copy.deepcopy(eager)
    jm = minijit.jit(jitted, executors=["inductor"], cache=cache)
    from torch._dynamo.utils import counters
    for call, make in enumerate(makers):
        inputs = make()
        torch.manual_seed(call)
        want = eager(**inputs)
        torch.manual_seed(call)
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            have = jm(**inputs)
            zoo._loss(have).backward()
        zoo._loss(want).backward()
        for w in ws:
            if "minijit" in str(w.message) and "inductor" in str(w.message):
                print(f"  WARN {name} {cache} call {call}: {str(w.message)[:400]}")
        problems = []
        wt, ht = zoo.tensors_in(want), zoo.tensors_in(have)
        if len(wt) != len(ht):
            problems.append(f"{len(ht)} outputs vs {len(wt)}")
        for i, (h, w) in enumerate(zip(ht, wt)):
            if (d := diff(h.detach(), w.detach())):
                problems.append(f"out {i}: {d}")
        for (pn, p), (_, q) in zip(eager.named_parameters(), jitted.named_parameters()):
            if (p.grad is None) != (q.grad is None):
                problems.append(f"grad presence {pn}")
            elif p.grad is not None and (d := diff(q.grad, p.grad)):
                problems.append(f"grad {pn}: {d}")
        for (bn, b), (_, c) in zip(eager.named_buffers(), jitted.named_buffers()):
            if (d := diff(c, b)):
                problems.append(f"buffer {bn}: {d}")
        eager.zero_grad()
        jitted.zero_grad()
        info = minijit.cache_info(jm)
        print(f"  {name} {cache} call {call}: misses={info.misses} hits={info.hits} "
              f"unique_graphs={counters['stats']['unique_graphs']} problems={len(problems)}", flush=True)
        for p in problems[:8]:
            print(f"    PROBLEM {p}")
    info = minijit.cache_info(jm)
    print(f"  {name} {cache}: {info.miss_reasons}")


def makers_for(name: str) -> tuple[Any, list]:
    if name in zoo.HF_MODELS:
        build, kind = zoo.HF_MODELS[name]
        if kind == "image":
            return build, [zoo._image_inputs] * 3
        masked = kind in ("causal", "masked", "seq2seq")

        def text(seq: int):
            def make():
                old = zoo.SEQ
                zoo.SEQ = seq
                try:
                    return zoo._text_inputs(kind, masked)
                finally:
                    zoo.SEQ = old
            return make
        return build, [text(16), text(16), text(12)]
    build, variants = zoo.NN_MODELS[name]
    first = next(iter(variants.values()))
    return build, [first, first, first]


def main() -> None:
    names = sys.argv[1:] or ["llama", "mistral", "gpt2", "bert", "t5", "vit", "TransformerEncoder"]
    for cache in os.environ.get("CACHES", "automatic,symbolic values").split(","):
        for name in names:
            build, makers = makers_for(name)
            torch.manual_seed(0)
            model = build().train()
            print(f"== {name} cache={cache}", flush=True)
            try:
                run(name, model, makers, cache)
            except Exception:
                print("  CRASH", traceback.format_exc()[-2500:], flush=True)


if __name__ == "__main__":
    main()
