"""The small GPT of tests/transforms/test_grad_models.py, forward and backward with executors=["triton"].

Runs through Triton's interpreter on CPU (tiny sizes); skipped where triton or the
grad transform's model test is missing.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'minijit[triton]' to run these tests)", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

models = pytest.importorskip("tests.transforms.test_grad_models", reason="the grad transform's GPT model test is not here")

import minijit  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def test_gpt_forward_backward_with_triton_matches_eager():
    init = models._init(torch.float32)
    jit_params = [p.clone().requires_grad_() for p in init]
    eager_params = [p.clone().requires_grad_() for p in init]
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, models.VOCAB, (2, models.CTX), generator=gen)
    targets = torch.randint(0, models.VOCAB, (2, models.CTX), generator=gen)
    pos = torch.arange(models.CTX).expand(2, models.CTX)

    jf = minijit.jit(lambda *a: models.gpt_loss(models.LTORCH, *a), executors=["triton"])
    loss = jf(idx, pos, targets, *jit_params)
    want = models.gpt_loss(models.EAGER, idx, pos, targets, *eager_params)
    torch.testing.assert_close(loss, want, atol=2e-5, rtol=2e-4)
    grads = torch.autograd.grad(loss, jit_params)
    want_grads = torch.autograd.grad(want, eager_params)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-4, msg=lambda m, i=i: f"param {i}: {m}")
    fwd = minijit.last_traces(jf)[-1].python()
    bwd = jf.last_backward_traces()[-1].python()
    assert "tritonex.fusion_" in fwd and "tritonex.fusion_" in bwd
