"""Values that change from call to call and do not come from torch's generator: refused, never frozen.

Python's `random` (module functions and `random.Random` instances), `numpy.random`,
clocks, `os.urandom` and `uuid` would run once, while tracing, and every later call
would reuse the value. minijit raises a `FrozenValueError` naming the call and the
user's line instead; eager runs show that the value really changes between calls.
"""

from __future__ import annotations

import datetime
import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import minijit

X = torch.ones(3, dtype=torch.float64)  # fine enough to see a clock move
_RNG = random.Random(0)
_NP_RNG = np.random.default_rng(0)

# (what the message names, a function of x reading the value). Each changes between eager calls.
CASES: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("random.random", lambda x: x * random.random()),
    ("random.uniform", lambda x: x * random.uniform(0.5, 1.5)),
    ("random.randint", lambda x: x * random.randint(1, 10**9)),
    ("random.choice", lambda x: x * random.choice(range(10**9))),
    ("random.gauss", lambda x: x + random.gauss(0, 1)),
    ("random.Random.random", lambda x: x * _RNG.random()),
    ("random.Random.getrandbits", lambda x: x * _RNG.getrandbits(30)),
    ("numpy.random.rand", lambda x: x * float(np.random.rand())),
    ("numpy.random.Generator.random", lambda x: x * float(_NP_RNG.random())),
    ("time.time", lambda x: x * time.time()),
    ("time.perf_counter", lambda x: x * time.perf_counter()),
    ("time.monotonic_ns", lambda x: x * time.monotonic_ns()),
    ("datetime.datetime.now", lambda x: x * datetime.datetime.now().microsecond),
    ("os.urandom", lambda x: x * int.from_bytes(os.urandom(4), "little")),
    ("uuid.uuid4", lambda x: x * (uuid.uuid4().int % 10**6)),
]


@pytest.mark.parametrize("name, fn", CASES, ids=[name for name, _ in CASES])
def test_value_from_outside_torch_is_refused_not_frozen(name: str, fn: Callable[[torch.Tensor], Any]) -> None:
    values = {tuple(fn(X).tolist()) for _ in range(3)}
    assert len(values) > 1, "eager gives a new value on each call"
    jf = minijit.jit(fn)
    for _ in range(3):  # refused on every call: no entry is cached
        with pytest.raises(minijit.FrozenValueError) as err:
            jf(X)
        message = str(err.value)
        assert f"{name}()" in message and "test_frozen_values.py" in message, message
        assert "pass the result in as an argument" in message


@pytest.mark.parametrize("name, fn", [
    ("random.seed", lambda x: (random.seed(0), x)[1]),
    ("random.shuffle", lambda x: (random.shuffle([1, 2, 3]), x)[1]),
    ("numpy.random.seed", lambda x: (np.random.seed(0), x)[1]),
], ids=["random.seed", "random.shuffle", "numpy.random.seed"])
def test_python_and_numpy_random_state_changes_are_refused(name: str, fn: Callable[[torch.Tensor], Any]) -> None:
    with pytest.raises(minijit.FrozenValueError, match=name.replace(".", r"\.")):
        minijit.jit(fn)(X)


def test_value_passed_as_an_argument_is_the_fix() -> None:
    jf = minijit.jit(lambda x, scale: x * scale)
    for _ in range(3):
        scale = torch.tensor(random.random())
        assert torch.equal(jf(X, scale), X * scale)
    assert minijit.cache_info(jf).misses == 1


def test_generator_seeded_inside_with_a_constant_repeats_its_draws() -> None:
    # Its draws are the same on every call, eager or not: nothing is frozen that would change.
    def fn(x: torch.Tensor, seed: int) -> torch.Tensor:
        order = list(range(3))
        random.Random(seed).shuffle(order)
        return x[order] * float(np.random.default_rng(seed).random())

    x = torch.arange(3.0)
    jf = minijit.jit(fn)
    for seed in (0, 0, 1, 1):
        assert torch.equal(jf(x, seed), fn(x, seed))
    assert minijit.cache_info(jf).misses == 2  # one trace per seed (a Python int is specialised on)


@pytest.mark.parametrize("make", [lambda: random.Random(), lambda: np.random.default_rng()],
                         ids=["random.Random", "numpy.random.default_rng"])
def test_generator_seeded_from_entropy_is_refused(make: Callable[[], Any]) -> None:
    with pytest.raises(minijit.FrozenValueError, match=r"test_frozen_values\.py"):
        minijit.jit(lambda x: (make(), x)[1])(X)
