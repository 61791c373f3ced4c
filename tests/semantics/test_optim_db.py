"""torch.optim optimizers from PyTorch's own OptimizerInfo database (`common_optimizers.optim_db`) against eager.

For every optimizer and every configuration the database lists (lr, weight decay, momentum, amsgrad, maximize,
capturable, ...), `minijit.jit(opt.step)` takes four steps beside an eager twin, over parameters of mixed shapes
(one large enough that the grouping pass leaves it in place), one of them without a gradient on one step; after
each step, the parameters and the optimizer's state must equal eager's. `MINIJIT_OPTIM_DB_IMPLS=all` also takes
each configuration with `foreach=True` and `foreach=False`, and with the database's lr schedulers stepped between.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

import minijit

ALL = os.environ.get("MINIJIT_OPTIM_DB_IMPLS") == "all"
SHAPES = [(3, 4), (5,), (64, 40), (7,), (1,), (2, 3, 4)]
MATRICES = [(3, 4), (5, 2), (64, 40), (7, 3), (1, 1), (2, 6)]  # for Muon, which takes 2-d parameters only
NO_GRAD_AT = (4, 1)  # (parameter, step): a parameter without a gradient on that step, which optimizers skip


def _cases() -> list[Any]:
    cases = []
    for info in optim_db:
        if info.only_supports_sparse_grads or info.step_requires_closure:
            continue  # SparseAdam takes sparse gradients only, LBFGS a closure
        for config in info.optim_inputs_func(device="cpu"):
            impls = ["default", "foreach", "single"] if ALL and "foreach" in info.supported_impls else ["default"]
            schedules = [None, *info.scheduler_inputs[:2]] if ALL and info.scheduler_inputs else [None]
            cases += [pytest.param(info, config, impl, schedule, id=f"{info.name}-{config.desc}-{impl}"
                                   f"{'-scheduled' if schedule else ''}") for impl in impls for schedule in schedules]
    return cases


def _parameters(shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(shape, requires_grad=True) for shape in shapes]


def _set_gradients(params: list[torch.Tensor], step: int) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        p.grad = None if (i, step) == NO_GRAD_AT else torch.randn(p.shape, generator=generator)


def _state(opt: torch.optim.Optimizer) -> list[tuple[str, Any]]:
    return [(k, v) for state in opt.state.values() for k, v in sorted(state.items())]


@pytest.mark.parametrize(("info", "config", "impl", "schedule"), _cases())
def test_optimizer_step_matches_eager(info: Any, config: Any, impl: str, schedule: Any) -> None:
    kwargs = dict(config.kwargs)
    if impl != "default":
        kwargs["foreach"] = impl == "foreach"
    shapes = MATRICES if info.name == "Muon" else SHAPES
    params_e, params_j = _parameters(shapes), _parameters(shapes)
    try:
        opt_e = info.optim_cls(params_e, **kwargs)
    except (ValueError, RuntimeError) as error:  # a configuration torch refuses on the CPU (fused, say)
        pytest.skip(f"torch refuses it here: {error}")
    opt_j = info.optim_cls(params_j, **kwargs)
    schedulers = [[make(opt) for make in schedule] for opt in (opt_e, opt_j)] if schedule else [[], []]
    step = minijit.jit(opt_j.step)
    for n in range(4):
        _set_gradients(params_e, n)
        _set_gradients(params_j, n)
        opt_e.step()
        step()
        for scheduler in schedulers[0] + schedulers[1]:
            plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            scheduler.step(*([1.0] if plateau else []))
        for p, q in zip(params_j, params_e, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"parameters after step {n}: {m}")
        state_j, state_e = _state(opt_j), _state(opt_e)
        assert [k for k, _ in state_j] == [k for k, _ in state_e]
        for (key, a), (_, b) in zip(state_j, state_e, strict=True):
            if isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, key=key: f"state {key!r}: {m}")
            else:
                assert a == b, f"state {key!r} after step {n}: {a!r} != {b!r}"
        assert [g["lr"] for g in opt_j.param_groups] == [g["lr"] for g in opt_e.param_groups]
