"""The compiled backward runs the kernels eager's autograd runs: one native backward kernel per op, not a decomposition.

For each op, torch.profiler records the aten kernels (the leaf ops: those that call no other
aten op) of a forward and backward under eager autograd and under minijit.jit with the
default executors; the two sets must be equal, once bookkeeping ops (allocations, views,
copies, the gradient accumulation) are set aside. Values and gradients equal eager's too.
The `cuda` versions run the same cases on a GPU, where SDPA picks flash, memory-efficient
or cuDNN attention and rms_norm has a fused kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import minijit

# Ops that allocate, view, copy or accumulate: set aside, since where a tensor is made or how
# a gradient is summed into .grad is not what this file checks.
BOOKKEEPING = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones_like", "fill_", "zero_", "resize_",
    "detach", "detach_", "view", "reshape", "_reshape_alias", "as_strided", "expand", "select", "slice", "t",
    "transpose", "permute", "unsqueeze", "squeeze", "contiguous", "clone", "copy_", "to", "_to_copy",
    "lift_fresh", "add_", "alias", "_unsafe_view", "new_empty_strided", "scalar_tensor", "item",
    "_local_scalar_dense", "result_type",
}


def _kernels(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> set[str]:
    """The aten kernels one forward and backward of `fn(*args)` runs (after a first, untimed call)."""
    fn(*args).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args).sum().backward()
    names = set()
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        if any(c.name.startswith("aten::") for c in e.cpu_children):
            continue  # a composite: its kernels are its children
        name = e.name.removeprefix("aten::")
        if name not in BOOKKEEPING and name != "sum":  # the sum is the test's own
            names.add(name)
    return names


def _t(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)


def _index(high: int, *shape: int, device: str = "cpu") -> torch.Tensor:
    return torch.randint(0, high, shape, device=device)


def _cases(device: str, dtype: torch.dtype) -> dict[str, tuple[Callable[..., torch.Tensor], Callable[[], tuple]]]:
    def t(*shape: int) -> torch.Tensor:
        return _t(*shape, dtype=dtype, device=device)

    def idx(high: int, *shape: int) -> torch.Tensor:
        return _index(high, *shape, device=device)

    qkv = lambda: (t(2, 4, 16, 8), t(2, 4, 16, 8), t(2, 4, 16, 8))
    return {
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), lambda: (t(4, 16), t(16), t(16))),
        "layer_norm_no_affine": (lambda x: F.layer_norm(x, (3, 16)), lambda: (t(2, 3, 16),)),
        "rms_norm": (lambda x, w: F.rms_norm(x, (16,), w, 1e-6), lambda: (t(4, 16), t(16))),
        "softmax": (lambda x: F.softmax(x, -1), lambda: (t(4, 16),)),
        "log_softmax": (lambda x: F.log_softmax(x, 0), lambda: (t(4, 16),)),
        "cross_entropy": (lambda x, y: F.cross_entropy(x, y), lambda: (t(4, 16), idx(16, 4))),
        "cross_entropy_weight_sum": (lambda x, y, w: F.cross_entropy(x, y, w, ignore_index=3, reduction="sum"),
                                     lambda: (t(6, 5), idx(5, 6), torch.rand(5, dtype=dtype, device=device))),
        "cross_entropy_none_unbatched": (lambda x, y: F.cross_entropy(x, y, reduction="none"),
                                         lambda: (t(7,), idx(7))),
        "nll_loss": (lambda x, y: F.nll_loss(x, y, ignore_index=1), lambda: (t(6, 5), idx(5, 6))),
        "embedding": (lambda i, w: F.embedding(i, w, padding_idx=2), lambda: (idx(10, 3, 4), t(10, 8))),
        "gelu": (F.gelu, lambda: (t(4, 16),)),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: (t(4, 16),)),
        "silu": (F.silu, lambda: (t(4, 16),)),
        "sdpa": (F.scaled_dot_product_attention, qkv),
        "sdpa_causal_scale": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2), qkv),
        "sdpa_bool_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
                           lambda: (*qkv(), torch.rand(16, 16, device=device) > 0.3)),
        "sdpa_float_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
                            lambda: (*qkv(), torch.randn(2, 1, 16, 16, dtype=dtype, device=device))),
        "sdpa_gqa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True),
                     lambda: (t(2, 4, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))),
    }


CPU_CASES = _cases("cpu", torch.float32)
# Eager has no rms_norm backward kernel on the CPU (autograd differentiates its composite): values only there.
NO_CPU_KERNEL = {"rms_norm"}


def _check(fn: Callable[..., torch.Tensor], make: Callable[[], tuple], *, atol: float, rtol: float,
           kernels: bool = True) -> None:
    args = make()
    jfn = minijit.jit(fn)
    if kernels:
        want_kernels = _kernels(fn, args)
        got_kernels = _kernels(jfn, args)
        assert got_kernels == want_kernels, f"eager runs {sorted(want_kernels)}, minijit {sorted(got_kernels)}"

    grads_of = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    out = fn(*args)
    g = torch.randn_like(out)
    want = (out, *torch.autograd.grad(out, grads_of, g))
    out = jfn(*args)
    got = (out, *torch.autograd.grad(out, grads_of, g))
    for w, h in zip(want, got, strict=True):
        assert h.dtype == w.dtype and h.shape == w.shape
        torch.testing.assert_close(h, w, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", list(CPU_CASES))
def test_backward_runs_eagers_kernels_on_cpu(name):
    fn, make = CPU_CASES[name]
    _check(fn, make, atol=1e-5, rtol=1e-5, kernels=name not in NO_CPU_KERNEL)


def test_the_kernel_comparison_sees_a_decomposition():
    # The check itself: a backward written as elementwise ops is told apart from silu_backward.
    x = _t(4, 16)
    manual = lambda x: x * torch.sigmoid(x)
    assert _kernels(F.silu, (x,)) != _kernels(manual, (x,))


def test_the_forward_keeps_layer_norms_statistics():
    # The backward reads the mean and rstd of the forward's kernel instead of computing them again.
    jfn = minijit.jit(lambda x, w, b: F.layer_norm(x, (16,), w, b))
    jfn(_t(4, 16), _t(16), _t(16)).sum().backward()
    names = [b.sym.name for b in minijit.last_backward_traces(jfn)[-1].bound_symbols]
    assert "native_layer_norm" not in names and "native_layer_norm_backward" in names


def test_nll_loss_bad_target_still_raises_a_minijit_error():
    jfn = minijit.jit(lambda x, y: F.nll_loss(x, y))
    with pytest.raises(minijit.MinijitError):
        jfn(_t(4, 5), _index(5, 3))


@pytest.mark.parametrize("weight", [True, False])
def test_fused_rms_norm_decompositions_match_torchs(weight):
    # The CUDA path's ops (aten._fused_rms_norm and its backward have no CPU kernel): their prims against
    # torch's own decompositions of the two aten ops.
    from torch._decomp import decomposition_table

    from minijit.ops.ltorch.backward import fused_rms_norm, fused_rms_norm_backward
    from tests.oputil import run_decomposed

    aten = torch.ops.aten
    x, g = torch.randn(3, 4, 6, dtype=torch.float64), torch.randn(3, 4, 6, dtype=torch.float64)
    w = torch.randn(4, 6, dtype=torch.float64) if weight else None
    want_out, want_rstd = decomposition_table[aten._fused_rms_norm.default](x, [4, 6], w, 1e-5)
    got_out, got_rstd = run_decomposed(lambda x, w: fused_rms_norm(x, [4, 6], w, 1e-5), x, w)
    torch.testing.assert_close(got_out, want_out, equal_nan=True)
    torch.testing.assert_close(got_rstd, want_rstd)
    mask = [True, weight]
    want = decomposition_table[aten._fused_rms_norm_backward.default](g, x, [4, 6], want_rstd, w, mask)
    got = run_decomposed(lambda g, x, r, w: fused_rms_norm_backward(g, x, [4, 6], r, w, mask), g, x, want_rstd, w)
    for h, e in zip(got, want, strict=True):
        assert (h is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(h, e)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("batched", [True, False])
def test_nll_loss_decompositions_match_the_aten_kernels(reduction, weighted, batched):
    # For fusion executors: the prims of nll_loss_forward / nll_loss_backward equal aten's kernels.
    from minijit.ops.ltorch.backward import REDUCTIONS, nll_loss_backward, nll_loss_forward
    from tests.oputil import run_decomposed

    aten = torch.ops.aten
    red = REDUCTIONS[reduction]
    x = torch.randn(6, 5, dtype=torch.float64).log_softmax(-1)
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    if not batched:
        x, t = x[0], t[3]
    w = torch.rand(5, dtype=torch.float64) if weighted else None
    want_out, want_total = aten.nll_loss_forward(x, t, w, red, 2)
    got_out, _ = run_decomposed(lambda x, t, w: nll_loss_forward(x, t, w, red, 2), x, t, w)
    torch.testing.assert_close(got_out, want_out, equal_nan=True)
    g = torch.randn_like(want_out)
    want = aten.nll_loss_backward(g, x, t, w, red, 2, want_total)
    got = run_decomposed(lambda g, x, t, w, tw: nll_loss_backward(g, x, t, w, red, 2, tw), g, x, t, w, want_total)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("shape", [(4,), (2, 3), (0,)])
def test_layer_norm_over_every_dim_with_grads_taken_inside(shape):
    """Over every dim the bias's gradient is grad_out itself: native_layer_norm_backward's decomposition returned its
    input as its result, and a `torch.autograd.grad` in the traced function then read a value never assigned
    (UnboundLocalError). Values and gradients against eager."""
    def f(x, w, b):
        out = F.layer_norm(x, shape, w, b)
        return out.detach(), torch.autograd.grad(out, (x, w, b), torch.ones_like(out))

    args = [torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    (want, want_grads), (got, got_grads) = f(*args), minijit.jit(f)(*args)
    torch.testing.assert_close(got, want, equal_nan=True)
    for h, e in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(h, e, equal_nan=True)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)")


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CPU_CASES))
def test_backward_runs_eagers_kernels_on_cuda(name, dtype):
    fn, make = _cases("cuda", dtype)[name]
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    # Where eager's dispatcher picks no fused attention kernel (math: GQA in float32, say), eager's autograd
    # differentiates a composite and there is no one kernel to match: values only.
    _check(fn, make, atol=tol, rtol=tol, kernels=not (name.startswith("sdpa") and _eager_math(fn, make)))


def _eager_math(fn: Callable[..., torch.Tensor], make: Callable[[], tuple]) -> bool:
    """Whether eager ran this attention as math (no fused flash, efficient or cuDNN kernel among its ops)."""
    args = make()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    fused = ("_flash_attention", "_efficient_attention", "_cudnn_attention")
    return not any(f in e.name for e in prof.events() for f in fused)


@pytest.mark.cuda
@CUDA
def test_sdpa_gpt_block_shapes_run_a_fused_backward_on_cuda():
    # The case of issue 26: bf16 (B, H, T, E) = (8, 8, 1024, 128), causal. No float32 scores in the backward.
    q, k, v = (_t(8, 8, 1024, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = _kernels(fn, (q, k, v))
    got = _kernels(minijit.jit(fn), (q, k, v))
    assert got == want
    assert not {"mm", "bmm", "_softmax", "_softmax_backward_data"} & got
