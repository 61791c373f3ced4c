"""Library calls training code makes inside a jitted function, against eager: torch.distributions, and gradient
clipping over parameters read from outside (torch groups their tensors by device and dtype natively)."""

import copy

import pytest
import torch
from torch.distributions import Categorical, Normal

import minijit


def _categorical(logits, actions):
    d = Categorical(logits=logits)
    return d.log_prob(actions), d.entropy(), d.sample()


def _normal(mean, log_std):
    d = Normal(mean, log_std.exp())
    x = d.rsample()
    return x, d.log_prob(x).sum(-1)


@pytest.mark.parametrize("program", [_categorical, _normal], ids=["categorical", "normal"])
def test_distributions_equal_eager_with_the_same_draws(program):
    jf = minijit.jit(program)
    for seed in range(3):
        args = (torch.randn(4, 5), torch.randint(0, 5, (4,))) if program is _categorical \
            else (torch.randn(4, 3), torch.randn(4, 3) * 0.1)
        torch.manual_seed(seed)
        want = program(*args)
        eager_state = torch.get_rng_state()
        torch.manual_seed(seed)
        got = jf(*args)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        assert torch.equal(torch.get_rng_state(), eager_state)


@pytest.mark.parametrize("clip", ["norm", "value"])
def test_gradient_clipping_of_parameters_read_from_outside_equals_eager(clip):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2).double())
    twin = copy.deepcopy(model)

    def step(m):
        if clip == "norm":
            return torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        torch.nn.utils.clip_grad_value_(m.parameters(), 0.01)
        return None

    jitted = minijit.jit(lambda: step(model))
    for _ in range(3):
        for m in (model, twin):
            for p in m.parameters():
                p.grad = torch.randn_like(p)
        with torch.no_grad():
            for p, q in zip(model.parameters(), twin.parameters()):
                q.grad.copy_(p.grad)
        got, want = jitted(), step(twin)
        if want is not None:
            torch.testing.assert_close(got, want)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
