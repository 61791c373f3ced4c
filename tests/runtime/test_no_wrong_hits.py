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


def _scaled_sum(x, y):
    # The trace holds sizes, dtype and device as constants: a wrong hit shows.
    return ((x * SCALE + y).sum(dim=-1) + torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)).to(x.dtype)


SCALE = 2.0


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
def test_the_exact_check_of_the_hit_path_misses_no_change(cache):
    """The hit path first tries the last entry's exact check of the tensors' metadata: calls that change
    what the trace depends on right after a hit still get eager's results (and grad mode, autocast, a
    global the code read, aliasing and tensor subclasses are told apart)."""
    global SCALE
    jf = minijit.jit(_scaled_sum, cache=cache)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    calls = [
        lambda: (x, y), lambda: (x, y), lambda: (x.double(), y.double()), lambda: (x, y),
        lambda: (x.t().contiguous().t(), y), lambda: (torch.randn(4, 3), torch.randn(4, 3)), lambda: (x, y),
        lambda: (x.requires_grad_(True), y), lambda: (x.detach(), y), lambda: (x, x),
        lambda: (torch.nn.Parameter(x.detach()), y), lambda: (x.detach(), y), lambda: (x.to("meta"), y.to("meta")),
    ]
    def check(args):
        want, have = _scaled_sum(*args), jf(*args)
        torch.testing.assert_close(have, want)
        assert (have.dtype, have.device, have.requires_grad) == (want.dtype, want.device, want.requires_grad)

    for make in calls:
        args = make()
        check(args)  # right after a plain call with the previous arguments
        with torch.no_grad():
            check(args)
        check(args)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            check(args)
        check(args)
    x = x.detach()
    for SCALE in (2.0, 3.0, 2.0):
        torch.testing.assert_close(jf(x, y), _scaled_sum(x, y))
    assert minijit.cache_info(jf).hits > 0


class _Cache:
    def __init__(self):
        self.keys = torch.zeros(1, 0, 4)


def test_a_hit_with_the_same_argument_sizes_still_checks_the_sizes_of_state_read_from_outside():
    # The hit path's exact check fixes the arguments' sizes only: a constraint on a growing state tensor (a
    # decoding cache's keys) must still be checked, or the trace for one length serves another.
    state = _Cache()

    def step(x):
        state.keys = torch.cat([state.keys, x], dim=1)
        if state.keys.shape[1] == 3:
            return x * 100
        return x + state.keys.sum()

    jf = minijit.jit(step, cache="symbolic values")
    jitted_state, eager_state = _Cache(), _Cache()
    for _ in range(6):
        x = torch.ones(1, 1, 4)
        state.keys = jitted_state.keys
        got = jf(x)
        jitted_state.keys, state.keys = state.keys, eager_state.keys
        expected = step(x)
        eager_state.keys = state.keys
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(jitted_state.keys, eager_state.keys)
