"""torch.nn modules from PyTorch's own ModuleInfo database (`common_modules.module_db`) against eager.

Each module is built from a constructor input of the database, once in eager and once under `minijit.jit`, and
fed every sample of that constructor in turn, twice round: shapes and ranks change from call to call, so the
default cache's entries, misses and symbolic sizes all serve. Each call compares the outputs, the gradients of
the inputs and parameters, and the buffers (running statistics) with eager's; an error must be raised by both.

Every constructor input is taken (edge cases such as an empty batch have one of their own), except for the few
modules whose traces take seconds each: `MINIJIT_MODULE_DB_CONSTRUCTORS` of theirs (default 2; 0: all of them too,
~3.5 minutes on one core against ~1.5), spread over the list from its first to its last.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch
from torch.testing._internal.common_modules import module_db
from torch.utils._pytree import tree_flatten, tree_map

import minijit

CONSTRUCTORS = int(os.environ.get("MINIJIT_MODULE_DB_CONSTRUCTORS", "2"))
SLOW = {"nn.Transformer", "nn.TransformerEncoder", "nn.TransformerDecoderLayer", "nn.LinearCrossEntropyLoss"}
INFOS = [info for info in module_db if not info.is_lazy]


def _copied(inputs: Any) -> Any:
    return tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor)
                    else t, inputs)


def _assert_same(actual: Any, expected: Any, what: str) -> None:
    actual_leaves, expected_leaves = tree_flatten(actual)[0], tree_flatten(expected)[0]
    assert len(actual_leaves) == len(expected_leaves), what
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), what
            torch.testing.assert_close(a.detach(), e.detach(), rtol=1e-4, atol=1e-5, equal_nan=True, msg=lambda m: f"{what}: {m}")
        else:
            assert a == e or (a != a and e != e), f"{what}: {a!r} != {e!r}"


def _grads_of(outputs: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(outputs)[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _backward(outputs: list[torch.Tensor]) -> None:
    # A weighted sum, so that each element's gradient differs (a plain sum hides permutations).
    sum((t * torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype).view(t.shape)).sum() for t in outputs).backward()


def _constructor_groups(info: Any, training: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    samples = info.module_inputs_func(info, device="cpu", dtype=torch.float64, requires_grad=True, training=training)
    groups: dict[str, list[Any]] = {}
    for sample in samples:
        if sample.forward_input is not None:
            key = repr((sample.constructor_input.args, sample.constructor_input.kwargs))
            groups.setdefault(key, []).append(sample)
    found = list(groups.values())
    if info.name not in SLOW or not CONSTRUCTORS or len(found) <= CONSTRUCTORS:
        return found
    if CONSTRUCTORS == 1:
        return found[:1]
    step = (len(found) - 1) / (CONSTRUCTORS - 1)
    return [found[round(i * step)] for i in range(CONSTRUCTORS)]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("info", INFOS, ids=[info.name for info in INFOS])
def test_module_matches_eager_as_samples_change(info: Any, training: bool) -> None:
    for group in _constructor_groups(info, training):
        made = group[0].constructor_input
        torch.manual_seed(0)
        module = info.module_cls(*made.args, **made.kwargs).double().train(training)
        eager, traced = copy.deepcopy(module), copy.deepcopy(module)
        jitted = minijit.jit(traced)
        for call, sample in enumerate(group * 2):
            where = f"{info.name}({made.args}, {made.kwargs}), call {call}"
            args_e, kwargs_e = _copied((sample.forward_input.args, sample.forward_input.kwargs))
            args_j, kwargs_j = _copied((sample.forward_input.args, sample.forward_input.kwargs))
            for m in (eager, traced):
                m.zero_grad(set_to_none=True)
            torch.manual_seed(call)
            try:
                out_e = eager(*args_e, **kwargs_e)
            except Exception as error:  # any error eager raises, minijit must raise too
                with pytest.raises(type(error)):
                    torch.manual_seed(call)
                    jitted(*args_j, **kwargs_j)
                continue
            torch.manual_seed(call)
            out_j = jitted(*args_j, **kwargs_j)
            _assert_same(out_j, out_e, f"{where}: output")
            leaves_e, leaves_j = _grads_of(out_e), _grads_of(out_j)
            assert len(leaves_j) == len(leaves_e), f"{where}: outputs requiring grad"
            if leaves_e:
                _backward(leaves_e)
                _backward(leaves_j)
                inputs_e = [t.grad for t in tree_flatten((args_e, kwargs_e))[0] if isinstance(t, torch.Tensor)]
                inputs_j = [t.grad for t in tree_flatten((args_j, kwargs_j))[0] if isinstance(t, torch.Tensor)]
                _assert_same(inputs_j, inputs_e, f"{where}: input gradients")
                _assert_same([p.grad for p in traced.parameters()], [p.grad for p in eager.parameters()],
                             f"{where}: parameter gradients")
            _assert_same(list(traced.buffers()), list(eager.buffers()), f"{where}: buffers")
