"""Row kernels for rows of any width: rows wider than `ROW_BLOCK_LIMIT` are looped (one pass over the row in
chunks per level of reductions, then one computing the outputs), against eager forward and backward.

The limit is lowered here so that small tensors take the looped path under Triton's interpreter; one test
keeps the real limit. Runs on CUDA where there is one.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'minijit[triton]' to run these tests)", allow_module_level=True)

import minijit
from executors.triton import codegen, kernel_source

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
F = torch.nn.functional

ROW_OPS = {
    "softmax": lambda x, w: torch.softmax(x, -1),
    "log_softmax": lambda x, w: torch.log_softmax(x, -1),
    "layer_norm": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, w * 0.5),
    "rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w),
    "var_mean": lambda x, w: torch.var_mean(x, -1, correction=1),
    "amax amin with NaN": lambda x, w: x.amax(-1) - x.amin(-1),
}


def _looped(jf) -> bool:
    return "for start in range(" in kernel_source(jf, "fusion_0")


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(ROW_OPS))
def test_looped_rows_match_eager_forward_and_backward(monkeypatch, name, dtype, strided):
    monkeypatch.setattr(codegen, "ROW_BLOCK_LIMIT", 16)
    fn = ROW_OPS[name]
    torch.manual_seed(0)
    x = torch.randn(5, 2 * 37 if strided else 37, device=DEVICE).to(dtype)  # 37 columns: 3 chunks, the last masked
    x = x[:, ::2] if strided else x
    if name.startswith("amax"):
        x[2, 30] = float("nan")
    w = torch.randn(37, device=DEVICE, dtype=dtype)
    ins, eager_ins = ([t.detach().clone().requires_grad_() for t in (x, w)] for _ in range(2))
    jf = minijit.jit(fn, executors=["triton"])
    got, want = jf(*ins), fn(*eager_ins)
    torch.testing.assert_close(got, want, **TOL[dtype], equal_nan=True)
    assert _looped(jf)
    if not name.startswith("amax"):
        outs = got if isinstance(got, tuple) else (got,)
        wants = want if isinstance(want, tuple) else (want,)
        cot = [torch.randn_like(t) for t in wants]
        grads = torch.autograd.grad(outs, ins, cot, allow_unused=True)
        want_grads = torch.autograd.grad(wants, eager_ins, cot, allow_unused=True)
        for g, e in zip(grads, want_grads, strict=True):
            assert (g is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(g, e, **TOL[dtype])


def test_softmax_wider_than_the_limit_gets_a_looped_kernel():
    """The finding on CUDA: softmax of rows of 4k to 32k had no Triton region."""
    x = torch.randn(2, codegen.ROW_BLOCK_LIMIT + 5, device=DEVICE)
    jf = minijit.jit(lambda x: torch.softmax(x, -1), executors=["triton"])
    torch.testing.assert_close(jf(x), torch.softmax(x, -1))
    assert "tritonex.fusion_" in minijit.last_traces(jf)[-1].python() and _looped(jf)
