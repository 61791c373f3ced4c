"""GPTs with executors=["triton"]: examples/gpt.py, and the grad branch's functional GPT, against eager.

Runs on CUDA where there is one (the executor fuses only CUDA tensors there), else through Triton's
interpreter on CPU (tiny sizes); parts are skipped where triton or the grad transform is missing. Results
are compared within `minijit.testing.tolerance` (rounding: sums may add in another order).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'minijit[triton]' to run these tests)", allow_module_level=True)
# TRITON_INTERPRET is set for the whole session in tests/conftest.py when there is no GPU.
import minijit
from minijit.testing import tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")
HAS_GRAD = importlib.util.find_spec("minijit.transforms.grad") is not None


def load_gpt_example():
    path = Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
    if not path.exists():
        pytest.skip("examples/gpt.py is not here")
    spec = importlib.util.spec_from_file_location("gpt_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gpt_example_forward_with_triton_matches_eager():
    gpt = load_gpt_example()
    config = gpt.GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = gpt.GPT(config).to(DEVICE)
    jmodel = minijit.jit(model, executors=["triton"])
    idx, targets = torch.randint(0, 16, (2, 8), device=DEVICE), torch.randint(0, 16, (2, 8), device=DEVICE)
    with torch.no_grad():
        logits, loss = jmodel(idx, targets)
        want_logits, want_loss = model(idx, targets)
    tol = tolerance(torch.float32, reduction_length=config.n_embd * 4)  # the MLP's inner size
    torch.testing.assert_close(logits, want_logits, **tol)
    torch.testing.assert_close(loss, want_loss, **tol)
    src = minijit.last_traces(jmodel)[-1].python()
    # Residual add + layer norm (one row kernel each), and gelu, are fused.
    assert src.count("tritonex.fusion_") >= 4 and "triton_red_add_mul_sub_var_mean_rsqrt" in src, src


@pytest.mark.skipif(not HAS_GRAD, reason="the grad transform (minijit.transforms.grad) is not part of this build")
def test_gpt_example_trains_with_triton_like_eager():
    gpt = load_gpt_example()
    config = gpt.GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)
    gpt.train(steps=2, executors=["triton"], config=config, batch=2, seq=8, verbose=False,
              device=DEVICE)  # asserts equality


@pytest.mark.skipif(not HAS_GRAD, reason="the grad transform (minijit.transforms.grad) is not part of this build")
def test_functional_gpt_forward_backward_with_triton_matches_eager():
    models = pytest.importorskip("tests.transforms.test_grad_models", reason="the grad branch's GPT model test is not here")
    init = [p.to(DEVICE) for p in models._init(torch.float32)]
    jit_params = [p.clone().requires_grad_() for p in init]
    eager_params = [p.clone().requires_grad_() for p in init]
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, models.VOCAB, (2, models.CTX), generator=gen).to(DEVICE)
    targets = torch.randint(0, models.VOCAB, (2, models.CTX), generator=gen).to(DEVICE)
    pos = torch.arange(models.CTX, device=DEVICE).expand(2, models.CTX)

    jf = minijit.jit(lambda *a: models.gpt_loss(models.LTORCH, *a), executors=["triton"])
    loss = jf(idx, pos, targets, *jit_params)
    want = models.gpt_loss(models.EAGER, idx, pos, targets, *eager_params)
    tol = tolerance(torch.float32, reduction_length=2 * models.CTX * models.VOCAB)
    torch.testing.assert_close(loss, want, **tol)
    grads = torch.autograd.grad(loss, jit_params)
    want_grads = torch.autograd.grad(want, eager_params)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        torch.testing.assert_close(g, w, **tol, msg=lambda m, i=i: f"param {i}: {m}")
    fwd = minijit.last_traces(jf)[-1].python()
    bwd = jf.last_backward_traces()[-1].python()
    assert "tritonex.fusion_" in fwd and "tritonex.fusion_" in bwd
