"""Gradients of batch norm, grouped_mm, histc and checkpointed code under minijit.jit, against eager autograd.

(The other new ops' gradients run on OpInfo samples in test_grad_opinfo.py, and on their
prims in test_grad_prims.py.)
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.checkpoint as checkpoint

import minijit
from tests.oputil import assert_same_grads

F = torch.nn.functional
F64 = torch.float64


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def _compare(fn, inputs: list[torch.Tensor], extra=(), atol=1e-7, rtol=1e-7) -> None:
    """fn(*inputs, *extra) under jit and eager: outputs and gradients of `inputs` for a random cotangent."""
    want_in, have_in = _leaves(*inputs), _leaves(*inputs)
    want_extra = [e.clone() if isinstance(e, torch.Tensor) else e for e in extra]
    have_extra = [e.clone() if isinstance(e, torch.Tensor) else e for e in extra]
    want = fn(*want_in, *want_extra)
    have = minijit.jit(fn)(*have_in, *have_extra)
    torch.testing.assert_close(have, want, atol=atol, rtol=rtol)
    for w, h in zip(want_extra, have_extra):  # running statistics written in place
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(h, w, atol=atol, rtol=rtol)
    ct = torch.randn_like(want)
    assert_same_grads(torch.autograd.grad(want, want_in, ct), torch.autograd.grad(have, have_in, ct), have_in,
                      atol=atol, rtol=rtol)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("running", [True, False])
def test_batch_norm_training(affine: bool, running: bool) -> None:
    x = torch.randn(4, 3, 5, dtype=F64)
    params = [torch.randn(3, dtype=F64), torch.randn(3, dtype=F64)] if affine else []
    stats = [torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5] if running else [None, None]

    def fn(x, *rest):
        w, b = rest[:2] if affine else (None, None)
        m, v = rest[-2:] if running else (None, None)
        return F.batch_norm(x, m, v, w, b, training=True, momentum=0.2, eps=1e-3)

    _compare(fn, [x, *params], extra=[s for s in stats if s is not None])


def test_batch_norm_eval() -> None:
    x, w, b = torch.randn(4, 3, 2, 2, dtype=F64), torch.randn(3, dtype=F64), torch.randn(3, dtype=F64)
    m, v = torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5
    _compare(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=False), [x, w, b], extra=[m, v])


def test_instance_norm_updates_running_stats() -> None:
    x, w = torch.randn(3, 2, 6, dtype=F64), torch.randn(2, dtype=F64)
    m, v = torch.randn(2, dtype=F64), torch.rand(2, dtype=F64) + 0.5
    _compare(lambda x, w, m, v: F.instance_norm(x, m, v, w, None, use_input_stats=True, momentum=0.3),
             [x, w], extra=[m, v])


@pytest.mark.parametrize("shapes", [((6, 8), (2, 8, 4), [2, 6]), ((2, 3, 8), (2, 8, 4), None)], ids=["2d-3d", "3d-3d"])
def test_grouped_mm(shapes) -> None:
    a_shape, b_shape, offs = shapes
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    _compare(lambda a, b: torch._grouped_mm(a, b, offs=offs), [a, b], atol=1e-5, rtol=1e-5)


def test_grouped_mm_of_two_2d_operands_refuses_grad_clearly() -> None:
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(8, 4)
    offs = torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(minijit.UnsupportedOpError, match=r"differentiating torch\._grouped_mm"):
        minijit.jit(lambda a, b: torch._grouped_mm(a, b, offs=offs))(a, b)


def test_histc_has_no_gradient_like_eager() -> None:
    x = torch.randn(20, dtype=F64)
    _compare(lambda x: x * 2 + torch.histc(x, bins=20).sum(), [x])


def test_conv_gradient_keeps_bfloat16() -> None:
    x = torch.randn(2, 3, 6, 6, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.bfloat16, requires_grad=True)
    def fn(x, w):
        return F.max_pool2d(F.conv2d(x, w, padding=1), 2)

    have = torch.autograd.grad(minijit.jit(fn)(x, w).sum(), (x, w))
    want = torch.autograd.grad(fn(x, w).sum(), (x, w))
    assert_same_grads(want, have, [x, w], atol=0.05, rtol=0.02)


class Block(torch.nn.Module):
    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)
        self.use_reentrant = use_reentrant

    def inner(self, x, scale):
        return self.b(torch.tanh(self.a(x))) * scale

    def forward(self, x):
        return checkpoint.checkpoint(self.inner, x, 2.0, use_reentrant=self.use_reentrant).sum(-1)


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_checkpointed_block_matches_eager(use_reentrant: bool, input_requires_grad: bool) -> None:
    torch.manual_seed(0)
    eager, jitted = Block(use_reentrant), Block(use_reentrant)
    jitted.load_state_dict(eager.state_dict())
    x = torch.randn(3, 4, requires_grad=input_requires_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's reentrant checkpoint warns when no input requires grad
        want = eager(x)
        have = minijit.jit(jitted)(x)
    torch.testing.assert_close(have, want)
    assert have.requires_grad == want.requires_grad
    if want.requires_grad:
        want.sum().backward()
        have.sum().backward()
    for p, q in zip(eager.parameters(), jitted.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad)
