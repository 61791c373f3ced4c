"""Embeddings with `max_norm`: eager renormalises the looked-up rows of `weight.detach()` in place, unseen by
autograd, then looks up. Jitted, the weight must end as eager leaves it, with the same outputs and gradients.

Each case runs an eager deep copy side by side with the jitted one over several calls (the renorm accumulates),
comparing outputs, the weights after each call and the gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minijit


def _indices(i: int, high: int = 10) -> torch.Tensor:
    # Repeated indices in every call: a row renormalised once, however often it is looked up.
    g = torch.Generator().manual_seed(100 + i)
    idx = torch.randint(0, high, (2, 4), generator=g)
    idx[0, 1] = idx[1, 2] = idx[0, 0]
    return idx


def _assert_close(got: torch.Tensor | None, want: torch.Tensor | None, what: str) -> None:
    assert (got is None) == (want is None), f"{what}: {got} vs {want}"
    if want is not None:
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def _big_weights(module: nn.Module) -> nn.Module:
    # Rows of norm well above 1, so that the renorm changes them.
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(3)
    return module


def _calls_match(eager: nn.Module, calls: int, loss) -> nn.Module:
    """`eager` and a jitted copy called alike: outputs, renormalised weights and accumulated gradients equal.
    Returns the jitted copy."""
    module = copy.deepcopy(eager)
    jitted = minijit.jit(module)
    for i in range(calls):
        idx = _indices(i)
        want, got = eager(idx), jitted(idx)
        _assert_close(got, want, f"call {i}: output")
        _assert_close(module.weight, eager.weight, f"call {i}: weight")
        loss(want).backward()
        loss(got).backward()
        _assert_close(module.weight.grad, eager.weight.grad, f"call {i}: weight.grad")
    return jitted


@pytest.mark.parametrize("kwargs", [dict(max_norm=1.0), dict(max_norm=1.5, norm_type=1.0),
                                    dict(max_norm=1.0, padding_idx=3), dict(max_norm=1.0, scale_grad_by_freq=True)])
def test_embedding_module_renormalises_its_weight_as_eager(kwargs: dict) -> None:
    torch.manual_seed(0)
    eager = _big_weights(nn.Embedding(10, 4, **kwargs))
    assert minijit.cache_info(_calls_match(eager, 4, lambda out: out.square().sum())).misses == 1


def test_training_steps_with_an_optimizer_between_calls() -> None:
    torch.manual_seed(0)
    eager = _big_weights(nn.Sequential(nn.Embedding(12, 6, max_norm=1.0), nn.Linear(6, 3)))
    model = copy.deepcopy(eager)
    jitted = minijit.jit(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (eager, model)]
    for i in range(5):
        idx = _indices(i, 12)
        for m, opt in zip((eager, jitted), opts):
            opt.zero_grad()
            m(idx).pow(2).mean().backward()
            opt.step()
        for (name, want), got in zip(eager.named_parameters(), model.parameters()):
            _assert_close(got, want, f"step {i}: {name}")
        for want, got in zip(opts[0].state.values(), opts[1].state.values()):
            _assert_close(got["exp_avg"], want["exp_avg"], f"step {i}: exp_avg")


def test_functional_embedding_on_a_weight_passed_as_argument() -> None:
    def lookup(idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, w, max_norm=0.8) * 2

    torch.manual_seed(0)
    eager_w = (torch.randn(10, 5) * 3).requires_grad_()
    jit_w = eager_w.detach().clone().requires_grad_()
    jitted = minijit.jit(lookup)
    for i in range(3):
        idx = _indices(i)
        want, got = lookup(idx, eager_w), jitted(idx, jit_w)
        _assert_close(got, want, f"call {i}: output")
        _assert_close(jit_w, eager_w, f"call {i}: weight")
        (gw,), (ew,) = torch.autograd.grad(got.sum(), [jit_w]), torch.autograd.grad(want.sum(), [eager_w])
        _assert_close(gw, ew, f"call {i}: weight gradient")
        assert jit_w.is_leaf and jit_w.grad_fn is None


@pytest.mark.parametrize("grad", [False, True])
def test_without_grad_and_on_a_weight_that_needs_none(grad: bool) -> None:
    torch.manual_seed(0)
    eager = _big_weights(nn.Embedding(10, 4, max_norm=1.0)).requires_grad_(grad)
    module = copy.deepcopy(eager)
    jitted = minijit.jit(module)
    for i in range(3):
        idx = _indices(i)
        with torch.no_grad():
            _assert_close(jitted(idx), eager(idx), f"call {i} under no_grad: output")
        _assert_close(jitted(idx), eager(idx), f"call {i}: output")
        _assert_close(module.weight, eager.weight, f"call {i}: weight")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_with_max_norm(mode: str) -> None:
    torch.manual_seed(0)
    eager = _big_weights(nn.EmbeddingBag(10, 4, max_norm=1.0, mode=mode))
    _calls_match(eager, 3, lambda out: out.sum())


def test_opinfo_max_norm_samples_through_jit() -> None:
    # The samples the op sweep (tests/ops/opinfo_util.py) leaves to this file: the symbol declines them.
    from tests.ops.opinfo_util import no_test_fn_lookup, opinfo

    with no_test_fn_lookup():
        made = opinfo("nn.functional.embedding").sample_inputs("cpu", torch.float32)
    samples = [s for s in made if s.kwargs.get("max_norm") is not None or s.kwargs.get("sparse")]
    assert samples
    for sample in samples:
        eager_w, jit_w = sample.input.clone().mul_(3), sample.input.clone().mul_(3)
        idx = sample.args[0]
        kwargs = sample.kwargs

        def lookup(i: torch.Tensor, w: torch.Tensor, kwargs: dict = kwargs) -> torch.Tensor:
            return F.embedding(i, w, **kwargs)

        jitted = minijit.jit(lookup)
        for call in range(2):
            _assert_close(jitted(idx, jit_w), lookup(idx, eager_w), f"{kwargs} call {call}: output")
            _assert_close(jit_w, eager_w, f"{kwargs} call {call}: weight")


@pytest.mark.parametrize("write", [lambda w: w.detach().mul_(0.5), lambda w: w.data.add_(1.0),
                                   lambda w: w.detach()[1:3].zero_()])
def test_writes_through_a_detached_alias_of_a_leaf(write: Callable[[torch.Tensor], None]) -> None:
    # What max_norm relies on, written by hand (old optimizers' `p.data.add_(...)`): autograd does not see the
    # write, the leaf keeps its identity, and gradients reach it.
    def step(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        write(w)
        return (w * x).sum()

    eager_w = torch.randn(4, 3, requires_grad=True)
    jit_w = eager_w.detach().clone().requires_grad_()
    jitted = minijit.jit(step)
    for i in range(3):
        x = torch.randn(4, 3)
        want, got = step(eager_w, x), jitted(jit_w, x)
        _assert_close(got, want, f"call {i}: result")
        _assert_close(jit_w, eager_w, f"call {i}: weight")
        want.backward()
        got.backward()
        _assert_close(jit_w.grad, eager_w.grad, f"call {i}: grad")
