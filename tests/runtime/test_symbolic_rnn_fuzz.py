"""Differential fuzzing of nn.LSTM / nn.GRU / nn.RNN under cache="symbolic values" over changing lengths and batches.

Each seed draws a layer (bidirectional or not, 1-2 layers, batch_first or not, proj_size for
LSTM, bias or not), whether an initial state is passed, whether grad is on and what the function
does with the output; one compiled function is called with several (length, batch) pairs, and the
outputs, final states and gradients (input, state, every parameter) must match eager PyTorch.
`MINIJIT_RNN_FUZZ_SEEDS` sets how many layers are drawn.
"""

from __future__ import annotations

import copy
import os
import random
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import minijit

SEEDS = int(os.environ.get("MINIJIT_RNN_FUZZ_SEEDS", "8"))
CALLS = [[(3, 2), (5, 2), (4, 3)], [(2, 2), (3, 2), (2, 3)], [(1, 2), (3, 2), (1, 3)], [(3, 3), (3, 1), (5, 2)]]


def _close(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, eager {expected.shape}"
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def _layer(rng: random.Random) -> tuple[nn.Module, dict[str, Any]]:
    kind = rng.choice(["LSTM", "GRU", "RNN_tanh", "RNN_relu"])
    config = {"kind": kind, "num_layers": rng.choice([1, 2]), "bidirectional": rng.random() < 0.5,
              "batch_first": rng.random() < 0.5, "bias": rng.random() < 0.8, "hidden": rng.choice([3, 4]),
              "proj_size": rng.choice([0, 2]) if kind == "LSTM" else 0}
    kw = {k: config[k] for k in ("num_layers", "bidirectional", "batch_first", "bias")}
    if kind == "LSTM":
        layer: nn.Module = nn.LSTM(2, config["hidden"], proj_size=config["proj_size"], **kw)
    elif kind == "GRU":
        layer = nn.GRU(2, config["hidden"], **kw)
    else:
        layer = nn.RNN(2, config["hidden"], nonlinearity=kind[4:], **kw)
    return layer, config


@pytest.mark.parametrize("seed", range(SEEDS))
def test_recurrent_layers_match_eager_over_changing_lengths_and_batches(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    layer, config = _layer(rng)
    ours = copy.deepcopy(layer)
    initial_state, grad = rng.random() < 0.5, rng.random() < 0.6
    after = rng.choice(["output", "sum over time", "last step", "scaled"])
    time_dim = 1 if config["batch_first"] else 0
    lstm = config["kind"] == "LSTM"

    def run(module: nn.Module, x: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = ((tuple(state) if lstm else state[0]),) if state else ()
        out, final = module(x, *args)
        if after == "sum over time":
            out = out.sum(time_dim)
        elif after == "last step":
            out = out.select(time_dim, -1)
        elif after == "scaled":
            out = out * 2 + 1
        return (out, *(final if isinstance(final, tuple) else (final,)))

    jf = minijit.jit(lambda x, *state: run(ours, x, *state), cache="symbolic values")
    directions = 2 if config["bidirectional"] else 1
    for length, batch in rng.choice(CALLS):
        where = f"seed {seed} {config}, initial state {initial_state}, grad {grad}, {after}, T={length} B={batch}"
        g = torch.Generator().manual_seed(seed * 100 + length * 10 + batch)
        x = torch.randn((batch, length, 2) if config["batch_first"] else (length, batch, 2), generator=g)
        states = []
        if initial_state:
            states.append(torch.randn(config["num_layers"] * directions, batch, config["proj_size"] or config["hidden"],
                                      generator=g))
            if lstm:
                states.append(torch.randn(config["num_layers"] * directions, batch, config["hidden"], generator=g))
        eager_args = [t.clone().requires_grad_(grad) for t in (x, *states)]
        jit_args = [t.clone().requires_grad_(grad) for t in (x, *states)]
        with torch.set_grad_enabled(grad), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "LSTM with projections is not supported with oneDNN"
            expected = run(layer, *eager_args)
            got = jf(*jit_args)
        assert len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            _close(a, b, f"{where}: output {i}")
        if not grad:
            continue
        weights = [torch.randn(e.shape, generator=g) for e in expected]
        sum((e * w).sum() for e, w in zip(expected, weights, strict=True)).backward()
        sum((o * w).sum() for o, w in zip(got, weights, strict=True)).backward()
        for i, (a, b) in enumerate(zip(jit_args, eager_args, strict=True)):
            _close(a.grad, b.grad, f"{where}: gradient of argument {i}")
        for (name, p), q in zip(ours.named_parameters(), layer.parameters(), strict=True):
            _close(p.grad, q.grad, f"{where}: gradient of {name}")
        layer.zero_grad()
        ours.zero_grad()
