"""Held-out torch ops (none in PyTorch's OpInfo database) under `minijit.jit`, against eager.

Each case calls one torch op the way a user would; the script runs it jitted and eagerly
(same seed) and reports `equal`, `refused` (a MinijitError), `wrong` (a value differs) or
`error` (another exception), for the forward and, where the op is differentiable, for the
float64 gradients of a random cotangent. It uses only `minijit.jit`, so it runs on any
minijit checkout:

Run: python scripts/held_out_ops.py                 (this checkout)
     PYTHONPATH=/path/to/other/checkout python scripts/held_out_ops.py
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

import minijit
from minijit.errors import MinijitError

warnings.filterwarnings("ignore")
F64 = torch.float64


def _r(*shape: int, dtype: torch.dtype = F64, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _cell_args(gates: int) -> list[torch.Tensor]:
    return [_r(3, 4), _r(3, 5, seed=1), _r(gates * 5, 4, seed=2), _r(gates * 5, 5, seed=3), _r(gates * 5, seed=4),
            _r(gates * 5, seed=5)]


# name -> (function of tensors, make the tensors, differentiable)
CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]], bool]] = {
    "affine_grid_generator": (lambda t: torch.affine_grid_generator(t, [2, 1, 3, 4], False), lambda: [_r(2, 2, 3)], True),
    "hann_window": (lambda x: x * torch.hann_window(6, dtype=F64), lambda: [_r(6)], True),
    "kaiser_window": (lambda x: x + torch.kaiser_window(6, periodic=False, beta=8.0, dtype=F64), lambda: [_r(6)], True),
    "frobenius_norm": (lambda x: torch.frobenius_norm(x, (0, 1)), lambda: [_r(3, 4)], True),
    "nuclear_norm": (lambda x: torch.nuclear_norm(x), lambda: [_r(3, 4)], True),
    "gru_cell": (lambda *a: torch.gru_cell(*a), lambda: _cell_args(3), True),
    "lstm_cell": (lambda x, h, wi, wh, bi, bh: torch.lstm_cell(x, (h, h * 0.5), wi, wh, bi, bh), lambda: _cell_args(4),
                  True),
    "rnn_tanh_cell": (lambda *a: torch.rnn_tanh_cell(*a), lambda: _cell_args(1), True),
    "rnn_relu_cell": (lambda *a: torch.rnn_relu_cell(*a), lambda: _cell_args(1), True),
    "grid_sampler": (lambda x, g: torch.grid_sampler(x, g, 0, 0, False), lambda: [_r(1, 2, 4, 5), _r(1, 3, 3, 2) * 0.5],
                     True),
    "conv_tbc": (lambda x, w, b: torch.conv_tbc(x, w, b, 1), lambda: [_r(6, 2, 3), _r(3, 3, 4, seed=1), _r(4, seed=2)],
                 True),
    # no derivative in eager either
    "native_channel_shuffle": (lambda x: torch.native_channel_shuffle(x, 2), lambda: [_r(1, 4, 3, 3)], False),
    "norm_except_dim": (lambda v: torch.norm_except_dim(v, 2, 0), lambda: [_r(4, 3)], True),
    "max_pool1d_with_indices": (lambda x: torch.max_pool1d_with_indices(x, 2), lambda: [_r(2, 3, 8)], True),
    "select_copy": (lambda x: torch.select_copy(x, 0, 1) * 2, lambda: [_r(3, 4)], True),
    "slice_copy": (lambda x: torch.slice_copy(x, 1, 1, 3), lambda: [_r(3, 4)], True),
    "split_copy": (lambda x: torch.split_copy(x, 2), lambda: [_r(5, 2)], True),
    "view_as_real_copy": (lambda x: torch.view_as_real_copy(torch.complex(x, x * 2)), lambda: [_r(3)], True),
    "fake_quantize_per_tensor_affine": (lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127),
                                        lambda: [_r(8, dtype=torch.float32)], False),
    "embedding_renorm_": (lambda w, i: torch.embedding_renorm_(w, i, 1.0, 2.0) + 0,
                          lambda: [_r(5, 3), torch.tensor([0, 2, 2])], False),
    "binomial": (lambda n, p: torch.binomial(n, p), lambda: [torch.full((6,), 10.0), torch.rand(6)], False),
    "native_dropout": (lambda x: torch.native_dropout(x, 0.5, True), lambda: [_r(8)], False),
}


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _tensors(o)]
    return []


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and torch.allclose(
        x.detach(), y.detach(), rtol=1e-6, atol=1e-6, equal_nan=True) for x, y in zip(a, b))


def run_case(fn: Callable[..., Any], make: Callable[[], list[torch.Tensor]], grad: bool) -> tuple[str, str]:
    """(forward status, grad status or '-') of one case."""
    args = make()
    eager_args, jit_args = [a.clone() for a in args], [a.clone() for a in args]
    torch.manual_seed(0)
    want = _tensors(fn(*eager_args))
    try:
        torch.manual_seed(0)
        got = _tensors(minijit.jit(fn)(*jit_args))
    except MinijitError:
        return "refused", "-"
    except Exception:
        return "error", "-"
    forward = "equal" if _close(got, want) and _close(jit_args, eager_args) else "wrong"
    if not grad:
        return forward, "-"
    leaves = [a.clone().requires_grad_() for a in args if a.dtype.is_floating_point]
    it = iter(leaves)
    call_args = [next(it) if a.dtype.is_floating_point else a for a in args]
    try:
        torch.manual_seed(0)
        want = [t for t in _tensors(fn(*call_args)) if t.requires_grad]
        cts = [torch.randn_like(t) for t in want]
        want_g = torch.autograd.grad(want, leaves, cts, allow_unused=True)
        torch.manual_seed(0)
        got = [t for t in _tensors(minijit.jit(fn)(*call_args)) if t.requires_grad]
        got_g = torch.autograd.grad(got, leaves, cts, allow_unused=True)
    except MinijitError:
        return forward, "refused"
    except Exception:
        return forward, "error"
    same = all((w is None and (g is None or not g.any())) or (g is not None and w is not None and torch.allclose(
        g, w, rtol=1e-6, atol=1e-6)) for w, g in zip(want_g, got_g))
    return forward, "equal" if same else "wrong"


def main() -> None:
    results = {name: run_case(*case) for name, case in CASES.items()}
    width = max(map(len, results))
    for name, (forward, grad) in results.items():
        print(f"{name:<{width}}  forward {forward:<8} grad {grad}")
    fwd_equal = sum(f == "equal" for f, _ in results.values())
    grads = [g for _, g in results.values() if g != "-"]
    wrong = sum(f == "wrong" for f, _ in results.values()) + grads.count("wrong")
    print(f"forward equal to eager: {fwd_equal}/{len(results)}; gradients equal: {grads.count('equal')}/{len(grads)}; "
          f"wrong values: {wrong}")


if __name__ == "__main__":
    main()
