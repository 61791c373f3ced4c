"""Writes that would outlive a jitted call are refused with a clear error, never silently dropped."""

import pytest
import torch

import minijit

COUNTER = 0


class Config:
    scale = 2.0


def _bump_global(x):
    global COUNTER
    COUNTER += 1
    return x + 1


def _set_attribute(x, cfg):
    cfg.last = 3
    return x * cfg.scale


def _append(x, out):
    out.append(1)
    return x + 1


def test_assigning_a_global_is_refused():
    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"assigning the global 'COUNTER' at .*test_side_effects.py"):
        minijit.jit(_bump_global)(torch.ones(2))
    assert COUNTER == 0


def test_setting_an_attribute_of_an_argument_is_refused():
    with pytest.raises(minijit.UnsupportedSyntaxError, match="setting the attribute 'last' of a Config"):
        minijit.jit(_set_attribute)(torch.ones(2), Config())


def test_setting_a_module_attribute_in_forward_is_refused():
    class Caching(torch.nn.Module):
        def forward(self, x):
            self.cache = x
            return x * 2

    with pytest.raises(minijit.UnsupportedSyntaxError, match="setting the attribute 'cache' of a Caching"):
        minijit.jit(Caching())(torch.ones(2))


def test_mutating_a_list_passed_in_is_refused():
    with pytest.raises(minijit.UnsupportedSyntaxError, match="modified the list passed as argument 'out'"):
        minijit.jit(_append)(torch.ones(2), [])


def test_objects_created_inside_may_be_changed():
    def f(x):
        acc = []
        for i in range(3):
            acc.append(x * i)
        cfg = Config()
        cfg.scale = 5.0
        return sum(acc) * cfg.scale

    x = torch.randn(3)
    torch.testing.assert_close(minijit.jit(f)(x), f(x))
