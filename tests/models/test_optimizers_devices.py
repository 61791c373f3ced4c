"""torch.optim under minijit.jit with parameters on an accelerator, where torch keeps Adam's `step` (and the
others' scalars) on the CPU: default options (foreach on an accelerator), `capturable=True`, `fused=True`.

Without a GPU the `meta` device stands in for one (eager's results give the shapes, dtypes and devices);
the `cuda`-marked test compares values on a GPU. The fused optimizers also run on the CPU, compared by value
(fused SGD and Adagrad have no meta kernel in torch: their effects are read from their schemas).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import minijit

STEPS = 2
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "SGD momentum": lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, **kw),
    "RMSprop": torch.optim.RMSprop,
    "Adagrad": torch.optim.Adagrad,
}
# The options each optimizer has on CUDA besides the defaults.
CUDA_OPTIONS = {
    "Adam": ({"capturable": True}, {"fused": True}),
    "AdamW": ({"capturable": True}, {"fused": True}),
    "SGD momentum": ({"fused": True},),
    "RMSprop": ({"capturable": True},),
    "Adagrad": ({"fused": True},),  # where torch has it on CUDA (not in 2.11: eager refuses, the case is skipped)
}


def _run(name: str, device: str, use_jit: bool, **options: object) -> list[torch.Tensor]:
    """The parameters and state tensors after STEPS steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(device)
    opt = OPTIMIZERS[name](model.parameters(), **options)
    step = minijit.jit(lambda: opt.step()) if use_jit else opt.step
    for i in range(STEPS):
        for j, p in enumerate(model.parameters()):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * i + j)).to(device)
        step()
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [p.detach() for p in model.parameters()] + state


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_foreach_step_on_meta_matches_eager(name: str) -> None:
    """foreach is the default on an accelerator; the scalars torch keeps on the CPU meet tensors on the device."""
    want, have = (_run(name, "meta", use_jit, foreach=True) for use_jit in (False, True))
    assert [(t.shape, t.dtype, t.device) for t in have] == [(t.shape, t.dtype, t.device) for t in want]


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD momentum", "Adagrad"])
def test_fused_step_on_cpu_matches_eager(name: str) -> None:
    want, have = (_run(name, "cpu", use_jit, fused=True) for use_jit in (False, True))
    for w, h in zip(want, have, strict=True):
        torch.testing.assert_close(h, w)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_step_on_cuda_matches_eager(name: str) -> None:
    for options in ({}, *CUDA_OPTIONS[name]):
        try:
            want = _run(name, "cuda", False, **options)
        except RuntimeError as e:
            if "fused=True" not in str(e):
                raise
            continue  # this torch has no fused kernel for it on CUDA: nothing to compare
        have = _run(name, "cuda", True, **options)
        for w, h in zip(want, have, strict=True):
            assert h.device == w.device, options
            torch.testing.assert_close(h, w, msg=lambda m, o=options: f"{name} {o}: {m}")
