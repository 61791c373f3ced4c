"""A jitted module (or a jitted function calling a module) whose tree changes between calls, against eager:
a parameter or buffer set to None, replaced by a plain tensor or added; a non-tensor attribute turned into a
tensor; a submodule wrapped (LoRA-style), removed, replaced by nn.Identity; a ModuleList appended to. Each is
a re-trace explained in cache_info, with eager's result and gradients."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import minijit


class LoRA(nn.Module):
    """A low-rank adapter around a linear layer, as PEFT's LoRA wraps one."""

    def __init__(self, base: nn.Linear, rank: int = 2):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = 2.0
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x):
        y = self.fc(x) * self.scale
        for block in self.blocks:
            y = block(y).relu()
        if hasattr(self, "gate"):
            y = y * self.gate
        return y


def _bias_none(m):
    m.fc.bias = None


def _bias_plain_tensor(m):
    del m.fc.bias
    m.fc.bias = torch.ones(4)


def _param_added(m):
    m.gate = nn.Parameter(torch.randn(4))


def _buffer_added_then_none(m):
    m.register_buffer("gate", torch.randn(4))


def _scale_tensor(m):
    m.scale = torch.tensor(3.0)


def _lora(m):
    m.fc = LoRA(m.fc)


def _identity(m):
    m.blocks[0] = nn.Identity()


def _removed(m):
    del m.blocks[0]


def _appended(m):
    m.blocks.append(nn.Linear(4, 4))


CHANGES = [_bias_none, _bias_plain_tensor, _param_added, _buffer_added_then_none, _scale_tensor, _lora,
           _identity, _removed, _appended]


def _check(model: nn.Module, jitted: Callable, change: Callable) -> None:
    twin = copy.deepcopy(model)
    for step in range(4):
        if step == 2:
            for m in (model, twin):  # the same new parameters and buffers in both
                torch.manual_seed(step)
                change(m)
        x = torch.randn(3, 4)
        got, want = jitted(x), twin(x)
        assert torch.equal(got, want), (change.__name__, step)
        got.sum().backward()
        want.sum().backward()
        for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), (change.__name__, name)
            a.grad = b.grad = None


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__)
def test_jitted_module(change):
    torch.manual_seed(0)
    model = Gated()
    jm = minijit.jit(model)
    _check(model, jm, change)
    info = minijit.cache_info(jm)
    assert info.misses == 2 and info.miss_reasons[1] != "first call"


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__)
def test_jitted_function_calling_module(change):
    torch.manual_seed(0)
    model = Gated()
    jf = minijit.jit(lambda x: model(x))
    _check(model, jf, change)
    assert minijit.cache_info(jf).misses == 2


def test_buffer_set_to_none():
    bn = nn.BatchNorm1d(4).eval()
    twin = copy.deepcopy(bn)
    jm = minijit.jit(bn)
    x = torch.randn(3, 4)
    assert torch.equal(jm(x), twin(x))
    for m in (bn, twin):
        m.running_mean = m.running_var = None
    for _ in range(2):
        x = torch.randn(3, 4)
        assert torch.equal(jm(x), twin(x))
    assert "self.running_mean: set to None" in minijit.cache_info(jm).miss_reasons[1]


def test_lora_miss_names_the_wrapped_submodule():
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    jm = minijit.jit(seq)
    x = torch.randn(3, 4)
    jm(x)
    seq[0] = LoRA(seq[0])
    assert torch.equal(jm(x), seq(x))
    reason = minijit.cache_info(jm).miss_reasons[1]
    assert "self.0: module LoRA" in reason and "self.0.down: submodule Linear added" in reason
    del seq[1]
    assert torch.equal(jm(x[:, :4]), seq(x))
    assert "self.2: submodule Linear removed" in minijit.cache_info(jm).miss_reasons[2]
