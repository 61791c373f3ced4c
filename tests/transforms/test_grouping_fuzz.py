"""Random programs of pointwise ops over a few tensors, some of them views of others, written in place and read
in turn: what the grouping pass gathers into one multi-tensor call must leave every result and every input as
eager leaves them (minijit/transforms/grouping.py: no call moves past one it depends on, in values or memory)."""

from __future__ import annotations

import os
import random

import pytest
import torch

import minijit
from tests.lanes import lane_seeds

PROGRAMS = int(os.environ.get("MINIJIT_GROUPING_FUZZ_PROGRAMS", "60"))
_UNARY = ("sqrt", "exp", "neg", "abs", "sigmoid")


def _program(rng: random.Random) -> list[tuple]:
    """Steps over the names t0..t3 (inputs), v0/v1 (views of t0 and t1) and r* (results)."""
    steps = []
    results = 0
    for _ in range(rng.randint(4, 14)):
        target = rng.choice(["t0", "t1", "t2", "t3", "v0", "v1"] + [f"r{i}" for i in range(results)])
        other = rng.choice(["t0", "t1", "t2", "t3", "v0", "v1"])
        kind = rng.choice(["mul_", "add_", "lerp_", "addcmul_", "unary", "mul", "add", "copy_"])
        number = rng.choice([0.5, 2.0, -1.5])
        if kind in ("mul", "add", "unary"):
            steps.append((kind, f"r{results}", target, other, number, rng.choice(_UNARY)))
            results += 1
        else:
            steps.append((kind, None, target, other, number, None))
    return steps


def _run(steps: list[tuple], t0, t1, t2, t3):
    env = {"t0": t0, "t1": t1, "t2": t2, "t3": t3, "v0": t0[1:3], "v1": t1[:2]}
    for kind, name, target, other, number, unary in steps:
        a, b = env[target], env[other]
        if a.shape != b.shape:
            b = b.sum() * 0.25  # a number-like 0-d tensor: broadcasts into any shape
        if kind == "mul_":
            a.mul_(number)
        elif kind == "add_":
            a.add_(b, alpha=number)
        elif kind == "lerp_":
            a.lerp_(b.expand_as(a), 0.25)
        elif kind == "addcmul_":
            a.addcmul_(b, b, value=number)
        elif kind == "copy_":
            a.copy_(b * number)
        elif kind == "mul":
            env[name] = a * number
        elif kind == "add":
            env[name] = a + b
        else:
            env[name] = getattr(torch, unary)(a.abs() + 0.5) if unary == "sqrt" else getattr(torch, unary)(a)
    return [env[k] for k in sorted(k for k in env if k.startswith("r"))]


@pytest.mark.parametrize("seed", lane_seeds(PROGRAMS, start=7000))
def test_grouped_programs_equal_eager(seed):
    rng = random.Random(seed)
    steps = _program(rng)
    jf = minijit.jit(lambda *ts: _run(steps, *ts))
    for call in range(2):
        torch.manual_seed(seed * 10 + call)
        inputs = [torch.randn(4) for _ in range(4)]
        mine = [t.clone() for t in inputs]
        want = _run(steps, *inputs)
        got = jf(*mine)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        for m, t in zip(mine, inputs, strict=True):
            torch.testing.assert_close(m, t, rtol=0, atol=0, equal_nan=True)
