"""Many calls with varying sizes, dtypes, Python values and aliasing: every result equals eager."""

import random

import pytest
import torch

import minijit


def _program(x, y, k, flag, mode):
    z = x * k + y
    if flag:
        z = z - x.sum(dim=0, keepdim=True) if x.ndim == 2 else z * 2
    if mode == "exp":
        z = z.exp()
    elif mode == "neg":
        z = -z
    return z.sum(dim=-1) if z.ndim > 1 else z


@pytest.mark.parametrize("cache", ["constant values", "symbolic values", "no caching"])
def test_random_calls_match_eager(cache):
    rng = random.Random(1234)
    jf = minijit.jit(_program, cache=cache)
    shapes = [(3,), (2, 3), (4, 3), (1, 3), (2, 1)]
    dtypes = [torch.float32, torch.float64]
    for _ in range(120):
        shape = rng.choice(shapes)
        dtype = rng.choice(dtypes)
        x = torch.randn(shape, dtype=dtype)
        y = x if rng.random() < 0.2 else torch.randn(shape[-1:], dtype=rng.choice(dtypes))  # aliasing, broadcasting
        k = rng.choice([1, 2, 0.5, -1.5, True])
        flag = rng.random() < 0.5
        mode = rng.choice(["exp", "neg", "none"])
        torch.testing.assert_close(jf(x, y, k, flag, mode), _program(x, y, k, flag, mode))
    info = minijit.cache_info(jf)
    assert info.hits + info.misses == 120
    if cache == "no caching":
        assert info.hits == 0
    else:
        assert info.hits > 0 and info.entries == info.misses
