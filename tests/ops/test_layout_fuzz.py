"""Differential fuzzing of programs whose results depend on memory layouts, over sizes that start at 1.

Each random program chains transposes, kernels (elementwise, reductions broadcast back), `contiguous()`,
views that merge or split dims, strided slices, `expand`, copies, in-place writes through `contiguous()`,
`reshape` and `flatten` (which view or copy as eager decides from the layout), reads of strides as numbers,
and `as_strided` over a tensor's own strides. It runs eagerly and under `minijit.jit` in both cache modes on
inputs of several sizes, a size of 1 among the first, and every result must match eager's, or both raise.

Compared: the values, and the strides and contiguity the program reads as numbers, those of dims of size 1
included: eager's CPU kernels lay those out each their own way (`x.t() * 2` and `x.t().relu()` differ), and
minijit follows them (`minijit.ops.iterator_layouts`), where meta tensors, which torch.compile lays tensors out
by, differ. `MINIJIT_LAYOUT_FUZZ_PROGRAMS` sets how many programs run
(in each Python's CI lane, its own seeds: `tests.lanes`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest
import torch

import minijit
from minijit.errors import MinijitError
from tests.lanes import lane_seeds

PROGRAMS = int(os.environ.get("MINIJIT_LAYOUT_FUZZ_PROGRAMS", "40"))
STEPS = ["t01", "t12", "t02", "mul", "relu", "exp", "contiguous", "merge_view", "merge_reshape", "split_view",
         "strides", "is_contiguous", "as_strided", "clone", "sum_back", "expand", "step_slice", "write_contiguous",
         "write_reshape", "write_flatten"]


def _step(name: str, y: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if name == "t01":
        return y.transpose(0, 1), acc
    if name == "t12":
        return y.transpose(1, 2), acc
    if name == "t02":
        return y.transpose(0, 2), acc
    if name == "mul":
        return y * 2, acc
    if name == "relu":
        return y.relu(), acc
    if name == "exp":
        return (y * 0.1).exp(), acc
    if name == "contiguous":
        return y.contiguous(), acc
    if name == "merge_view":
        return y.view(y.shape[0] * y.shape[1], *y.shape[2:]).view(y.shape), acc
    if name == "merge_reshape":
        return y.reshape(y.shape[0], -1).reshape(y.shape), acc
    if name == "split_view":
        return y.view(y.shape[0], 1, *y.shape[1:]).squeeze(1), acc
    if name == "strides":
        return y, acc + sum(s * (k + 1) for k, s in enumerate(y.stride()))
    if name == "is_contiguous":
        return y, acc + (7 if y.is_contiguous() else 0)
    if name == "as_strided":
        return y.as_strided(y.shape, y.stride(), y.storage_offset()) + 0, acc
    if name == "clone":
        return y.clone(), acc
    if name == "sum_back":
        return y.sum(-1, keepdim=True) + y, acc
    if name == "expand":
        return y[:, :1].expand(y.shape[0], 3, *y.shape[2:]) * 1, acc
    if name == "step_slice":
        return y[:, ::2], acc
    y = y * 1  # the writes go into a tensor of the program's own
    if name == "write_contiguous":
        y.contiguous().add_(1)  # writes into y where contiguous() returned y itself
    elif name == "write_reshape":
        y.reshape(y.shape[0], -1).mul_(2)  # where reshape viewed y
    else:
        y.flatten().sub_(1)  # where flatten viewed y
    return y, acc + y.sum()


def _program(steps: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    def program(x: torch.Tensor) -> torch.Tensor:
        y, acc = x, x.new_zeros(())
        for name in steps:
            y, acc = _step(name, y, acc)
        return torch.cat([y.reshape(-1), acc.reshape(1)])
    return program


def _outcome(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor | str:
    try:
        return fn(x)
    except (RuntimeError, MinijitError) as e:
        return f"raised {getattr(e, 'eager_raised', type(e)).__name__}"


def _cases(seed: int) -> tuple[list[str], list[tuple[int, ...]]]:
    rng = random.Random(seed)
    steps = [rng.choice(STEPS) for _ in range(rng.randint(2, 6))]
    first = [rng.choice([1, 2, 3]) for _ in range(3)]
    shapes = [tuple(first)]
    for _ in range(4):
        shapes.append(tuple(d if rng.random() < 0.5 else rng.choice([1, 2, 3, 4, 5]) for d in first))
    return steps, shapes


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("chunk", range(4))
def test_layout_dependent_programs_match_eager(mode: str, chunk: int) -> None:
    for seed in lane_seeds(PROGRAMS)[chunk::4]:
        steps, shapes = _cases(seed)
        program = _program(steps)
        jitted = minijit.jit(program, cache=mode)
        for shape in shapes:
            x = torch.randn(shape)
            want, have = _outcome(program, x), _outcome(jitted, x)
            where = f"seed {seed}, steps {steps}, input {shape}"
            if isinstance(want, str) or isinstance(have, str):
                assert isinstance(want, str) and isinstance(have, str), f"{where}: eager {want}, minijit {have}"
                continue
            torch.testing.assert_close(have, want, msg=lambda m, where=where: f"{where}: {m}")
