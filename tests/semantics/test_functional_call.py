"""torch.func.functional_call inside a jitted function: the module run on the given tensors, as eager runs it.

Each case runs eagerly and jitted over several calls with new parameter values (a hit must read the
new ones), comparing results, gradients and the tensors written (a batch norm's running statistics).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call

import minijit


def _params(module: nn.Module, seed: int, grad: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(p.shape, generator=g).requires_grad_(grad) for name, p in module.named_parameters()}


def _compare(make: Callable[[], nn.Module], run: Callable[[nn.Module, Any, torch.Tensor], torch.Tensor],
             params_of: Callable[[nn.Module, int], Any], calls: int = 3) -> None:
    results = []
    for use_jit in (False, True):
        torch.manual_seed(0)
        module = make()
        fn = minijit.jit(lambda p, x: run(module, p, x)) if use_jit else (lambda p, x: run(module, p, x))
        history = []
        for i in range(calls):
            params = params_of(module, i)
            x = torch.randn(4, 3, generator=torch.Generator().manual_seed(50 + i))
            out = fn(params, x)
            leaves = [t for t in (params.values() if isinstance(params, dict) else []) if t.requires_grad]
            grads = torch.autograd.grad(out.sum(), leaves) if leaves else ()
            history.append((out.detach(), grads, [t.detach().clone() for t in module.state_dict().values()],
                            [t.detach().clone() for t in (params.values() if isinstance(params, dict) else [])]))
        results.append(history)
    for i, (eager, jit) in enumerate(zip(*results)):
        for a, b in zip([eager[0], *eager[1], *eager[2], *eager[3]], [jit[0], *jit[1], *jit[2], *jit[3]], strict=True):
            torch.testing.assert_close(b, a, msg=lambda m, i=i: f"call {i}: {m}")


def test_a_linear_on_given_parameters_follows_them_over_calls():
    _compare(lambda: nn.Linear(3, 2), lambda m, p, x: functional_call(m, p, (x,)), lambda m, i: _params(m, i))


def test_gradients_flow_to_the_given_parameters():
    _compare(lambda: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)),
             lambda m, p, x: functional_call(m, p, x), lambda m, i: _params(m, i, grad=True))


def test_a_partial_dict_keeps_the_modules_own_other_tensors():
    _compare(lambda: nn.Linear(3, 2), lambda m, p, x: functional_call(m, p, (x,)),
             lambda m, i: {"weight": torch.full((2, 3), float(i + 1))})


def test_given_buffers_of_a_batch_norm_in_training_are_updated_as_eager_updates_them():
    def buffers(m: nn.Module, i: int) -> dict[str, torch.Tensor]:
        return {"0.running_mean": torch.full((3,), float(i)), "0.running_var": torch.ones(3) * (i + 1),
                "0.num_batches_tracked": torch.tensor(i)}

    _compare(lambda: nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2)).train(),
             lambda m, p, x: functional_call(m, p, (x,)), buffers)


def test_several_dicts_and_keyword_arguments():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.register_buffer("scale", torch.ones(2))

        def forward(self, x, *, shift=0.0):
            return self.lin(x) * self.scale + shift

    _compare(Scaled, lambda m, p, x: functional_call(m, (p[0], p[1]), (x,), {"shift": 0.5}),
             lambda m, i: [_params(m, i), {"scale": torch.full((2,), i + 2.0)}])


def test_tied_weights_take_the_value_given_for_either_name():
    def make() -> nn.Module:
        m = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
        m[1].weight = m[0].weight
        return m

    _compare(make, lambda m, p, x: functional_call(m, p, (x,)),
             lambda m, i: {"0.weight": torch.full((3, 3), 0.1 * (i + 1))})


def test_untied_weights_are_refused_by_name():
    m = nn.Linear(3, 2)
    f = minijit.jit(lambda p, x: functional_call(m, p, (x,), tie_weights=False))
    with pytest.raises(minijit.MinijitError, match="tie_weights=False"):
        f(_params(m, 0), torch.randn(4, 3))


def test_strict_mismatch_raises_eagers_exception_type():
    m = nn.Linear(3, 2)
    for fn in (lambda p, x: functional_call(m, p, (x,), strict=True),):
        with pytest.raises(RuntimeError):
            fn({"weight": torch.randn(2, 3)}, torch.randn(4, 3))
        with pytest.raises(RuntimeError):
            minijit.jit(fn)({"weight": torch.randn(2, 3)}, torch.randn(4, 3))
