"""The nvFuser executor on real nvFuser and CUDA (skipped, with the reason, where they are missing)."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.extend import get_executor, prims

_reason = get_executor("nvfuser").unavailable_reason()
if _reason is not None:
    pytest.skip(f"nvFuser cannot run here: {_reason}", allow_module_level=True)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-2, atol=1e-2),
       torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pointwise_reduction_and_copy(dtype):
    x = torch.randn(8, 32, device="cuda", dtype=dtype)
    y = torch.randn(32, device="cuda", dtype=dtype)
    x_ref = x.clone()

    def f(x, y):
        a = (x * y).exp()
        s = a.sum(-1)
        m = prims.amax(a, (1,))
        x.add_(1)
        return a, s, m

    jf = minijit.jit(f, executors=["nvfuser"])
    a, s, m = jf(x, y)
    a_ref = (x_ref * y).exp()
    torch.testing.assert_close(a, a_ref, **TOL[dtype])
    torch.testing.assert_close(s, a_ref.sum(-1), **TOL[dtype])
    torch.testing.assert_close(m, a_ref.amax(-1), **TOL[dtype])
    torch.testing.assert_close(x, x_ref + 1, **TOL[dtype])
    assert "nvfuserex.fusion_0" in minijit.last_traces(jf)[-1].python()
