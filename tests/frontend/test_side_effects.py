"""Writes that outlive a jitted call are replayed on every call, as eager does them; never silently dropped."""

import torch

import minijit

COUNTER = 0


class Config:
    scale = 2.0


def _bump_global(x):
    global COUNTER
    COUNTER += 1
    return x + COUNTER


def _set_attribute(x, cfg):
    cfg.last = x.sum()
    cfg.calls = getattr(cfg, "calls", 0) + 1
    return x * cfg.scale


def test_assigning_a_global_is_replayed():
    global COUNTER
    x = torch.ones(2)
    jf = minijit.jit(_bump_global)
    COUNTER = 0
    expected = [_bump_global(x) for _ in range(3)]
    assert COUNTER == 3
    COUNTER = 0
    for want in expected:
        torch.testing.assert_close(jf(x), want)
    assert COUNTER == 3


def test_setting_attributes_of_an_argument_is_replayed():
    eager_cfg, jit_cfg = Config(), Config()
    jf = minijit.jit(_set_attribute)
    for i in range(3):
        x = torch.randn(2) + i
        torch.testing.assert_close(jf(x, jit_cfg), _set_attribute(x, eager_cfg))
        assert jit_cfg.calls == eager_cfg.calls == i + 1
        assert isinstance(jit_cfg.last, torch.Tensor) and not isinstance(jit_cfg.last, minijit.ir.Proxy)
        torch.testing.assert_close(jit_cfg.last, eager_cfg.last)


def test_a_module_caching_a_tensor_in_forward():
    class Caching(torch.nn.Module):
        def forward(self, x):
            self.cache = x * 3
            return x * 2

    m = Caching()
    jm = minijit.jit(m)
    for i in range(3):
        x = torch.randn(2) + i
        torch.testing.assert_close(jm(x), x * 2)
        torch.testing.assert_close(m.cache, x * 3)


def test_appending_to_a_captured_list_is_replayed():
    log = []

    def f(x):
        log.append(x.sum())
        return x + 1

    jf = minijit.jit(f)
    xs = [torch.randn(3) for _ in range(3)]
    for x in xs:
        jf(x)
    assert len(log) == 3
    for got, x in zip(log, xs):
        torch.testing.assert_close(got, x.sum())


def test_mutating_a_list_passed_in_is_replayed():
    def append(x, out):
        out.append(1)
        return x + 1

    jf = minijit.jit(append)
    for _ in range(3):  # tests/semantics/test_argument_mutation.py has the cases
        mine, theirs = [], []
        torch.testing.assert_close(jf(torch.ones(2), mine), append(torch.ones(2), theirs))
        assert mine == theirs == [1]


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
