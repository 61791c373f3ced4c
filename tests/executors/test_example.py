"""examples/custom_executor.py runs as a script, and a plugin's operator differentiates with its own rule."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import pytest
import torch

import minijit
from minijit.extend import OperatorExecutor, TensorProxy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_executor.py"


def _traces_torch_calls() -> bool:
    try:
        minijit.jit(lambda x: torch.neg(x))(torch.ones(1))
    except TypeError:  # the frontend passes proxies straight to torch
        return False
    return True


@pytest.mark.skipif(not _traces_torch_calls(), reason="needs the bytecode interpreter (torch calls on proxies)")
def test_custom_executor_example_runs(capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "fastnormex.fused_rms_norm(" in out
    assert "custom executor: results match eager" in out


@pytest.mark.skipif(importlib.util.find_spec("minijit.transforms.vjp") is None,
                    reason="the grad transform (minijit.transforms.vjp) is not part of this build")
def test_operator_grad_transform_runs_in_backward():
    ex = OperatorExecutor("cubeex")
    calls = []

    def cube_bwd_kernel(g, x):
        calls.append("backward")
        return g * 3 * x * x

    cube_bwd = ex.register_operator("cube_bwd", meta=lambda g, x: TensorProxy.like(x, requires_grad=False), fn=cube_bwd_kernel)
    cube = ex.register_operator(
        "cube", meta=lambda x: TensorProxy.like(x), fn=lambda x: x * x * x,
        grad_transform=(lambda x: (cube(x), (x,)), lambda saved, g: (cube_bwd(g, saved[0]),)))

    x = torch.randn(5, requires_grad=True)
    jf = minijit.jit(lambda x: cube(x) * 2, executors=[ex])
    out = jf(x)
    (gx,) = torch.autograd.grad(out.sum(), (x,))
    torch.testing.assert_close(gx, 6 * x.detach() ** 2)
    assert calls == ["backward"]
