"""Draws from an explicit `torch.Generator` (`generator=g`), against eager: bit-equal values over several calls,
the generator's state advanced as eager advances it, the default generator untouched where eager leaves it,
a different generator a new trace, and a generator made or seeded inside the function refused."""

from __future__ import annotations

import pytest
import torch

import minijit


def _draws(x, g):
    return (x + torch.rand(3, generator=g), torch.randn(2, 3, generator=g),
            torch.multinomial(x.abs() + 0.1, 5, replacement=True, generator=g),
            torch.randint(0, 10, (4,), generator=g), torch.randperm(6, generator=g),
            torch.empty(3).uniform_(-2, 2, generator=g), torch.empty(3).normal_(1.0, 0.5, generator=g),
            torch.bernoulli(torch.full((4,), 0.3), generator=g), torch.normal(x, 2.0, generator=g),
            torch.rand_like(x, generator=g), torch.rand(2))  # the last from the default generator


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
def test_generator_argument_matches_eager(cache):
    jf = minijit.jit(_draws, cache=cache)
    mine, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for call in range(4):
        x = torch.randn(3)
        torch.manual_seed(call)
        got = jf(x, mine)
        default_after = torch.get_rng_state()
        torch.manual_seed(call)
        want = _draws(x, theirs)
        _equal(got, want)
        assert torch.equal(mine.get_state(), theirs.get_state())
        assert torch.equal(default_after, torch.get_rng_state())
    assert minijit.cache_info(jf).misses == 1


def test_another_generator_is_a_new_trace():
    jf = minijit.jit(lambda g: torch.rand(3, generator=g))
    a, b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    ea, eb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    for _ in range(2):
        assert torch.equal(jf(a), torch.rand(3, generator=ea))
        assert torch.equal(jf(b), torch.rand(3, generator=eb))
    info = minijit.cache_info(jf)
    assert info.misses == 2 and "Generator" in info.miss_reasons[1]


def test_generator_from_a_closure_and_in_a_module():
    mine, theirs = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)

    class Noisy(torch.nn.Module):
        def __init__(self, g):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)
            self.g = g

        def forward(self, x):
            return self.fc(x) + 0.1 * torch.randn(x.shape, generator=self.g)

    torch.manual_seed(0)
    model = Noisy(mine)
    twin = Noisy(theirs)
    twin.load_state_dict(model.state_dict())
    jm = minijit.jit(model)
    for _ in range(3):
        x = torch.randn(2, 3)
        got, want = jm(x), twin(x)
        assert torch.equal(got, want)
        got.sum().backward()
        want.sum().backward()
        assert torch.equal(model.fc.weight.grad, twin.fc.weight.grad)
    assert torch.equal(mine.get_state(), theirs.get_state())


def test_generator_made_or_seeded_inside_is_refused():
    def made(x):
        return x + torch.rand(2, generator=torch.Generator())

    def seeded(x, g):
        g.manual_seed(3)
        return x + torch.rand(2, generator=g)

    with pytest.raises(minijit.FrozenValueError, match=r"torch.Generator\(\)"):
        minijit.jit(made)(torch.zeros(2))
    with pytest.raises(minijit.MinijitError, match="manual_seed"):
        minijit.jit(seeded)(torch.zeros(2), torch.Generator())


def test_runtime_raise_in_try_sets_the_generator_back():
    def f(a, g):
        noise = torch.rand(3, dtype=torch.float64, generator=g)
        try:
            return torch.linalg.cholesky(a) + noise
        except RuntimeError:
            return a + noise

    jf = minijit.jit(f)
    mine, theirs = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    good = torch.eye(3, dtype=torch.float64) * 2
    bad = -good
    for a in (good, bad, good, bad):
        assert torch.equal(jf(a, mine), f(a, theirs))
        assert torch.equal(mine.get_state(), theirs.get_state())
