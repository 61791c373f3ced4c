"""Forward+backward time and memory of a training step under `minijit.jit` against eager, as ratios in one run.

Models: a two-layer MLP and a GPT block (attention + MLP, pre-norm), written against a
namespace of ops so that the same code runs eagerly (torch.nn.functional) and under jit
(ltorch symbols, called on proxies). Memory is the peak allocated during the step on
CUDA, and the bytes saved for backward (distinct storages) on CPU, where torch does
not track a peak.

Run: python scripts/bench_train.py [--device cuda] [--dtype bfloat16] [--iters 50]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

import minijit
from minijit.ops import ltorch

LTORCH = SimpleNamespace(layer_norm=ltorch.layer_norm, linear=ltorch.linear, gelu=ltorch.gelu,
                         sdpa=ltorch.scaled_dot_product_attention, relu=ltorch.relu, mse=ltorch.mse_loss)
EAGER = SimpleNamespace(layer_norm=F.layer_norm, linear=F.linear, gelu=F.gelu,
                        sdpa=F.scaled_dot_product_attention, relu=F.relu, mse=F.mse_loss)


def mlp_loss(ops: Any, x: Any, target: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """A two-layer MLP with a mean squared error."""
    return ops.mse(ops.linear(ops.relu(ops.linear(x, w1, b1)), w2, b2), target)


def gpt_block_loss(ops: Any, x: Any, heads: int, ln1_w: Any, ln1_b: Any, attn_w: Any, attn_b: Any, proj_w: Any,
                   proj_b: Any, ln2_w: Any, ln2_b: Any, fc_w: Any, fc_b: Any, fc2_w: Any, fc2_b: Any) -> Any:
    """One pre-norm transformer block with causal attention; the loss is the mean of its output."""
    b, t, c = x.shape
    h = ops.layer_norm(x, (c,), ln1_w, ln1_b)
    q, k, v = ops.linear(h, attn_w, attn_b).split(c, dim=2)
    q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
    y = ops.sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
    x = x + ops.linear(y, proj_w, proj_b)
    h = ops.layer_norm(x, (c,), ln2_w, ln2_b)
    x = x + ops.linear(ops.gelu(ops.linear(h, fc_w, fc_b), approximate="tanh"), fc2_w, fc2_b)
    return x.mean()


def _step(loss_fn: Callable[..., Any], args: tuple[Any, ...], params: list[torch.Tensor]) -> None:
    loss = loss_fn(*args)
    torch.autograd.grad(loss, params)


def _time_ms(fn: Callable[[], None], iters: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(3):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / iters)
    return best * 1e3


def _memory_bytes(fn: Callable[[], None], device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _models(device: torch.device, dtype: torch.dtype) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], int]]:
    def p(*shape: int, scale: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_()

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype, requires_grad=True)

    batch, width = 256, 512
    x = torch.randn(batch, width, device=device, dtype=dtype)
    target = torch.randn(batch, 64, device=device, dtype=dtype)
    mlp = (mlp_loss, (x, target, p(4 * width, width), p(4 * width), p(64, 4 * width), p(64)), 2)

    b, t, c = 8, 128, 256
    xb = torch.randn(b, t, c, device=device, dtype=dtype)
    block_params = (ones(c), p(c), p(3 * c, c), p(3 * c), p(c, c), p(c), ones(c), p(c), p(4 * c, c), p(4 * c),
                    p(c, 4 * c), p(c))
    gpt = (gpt_block_loss, (xb, 4, *block_params), 3)
    return {"mlp": mlp, "gpt block": gpt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--iters", type=int, default=20)
    opts = parser.parse_args()
    device, dtype = torch.device(opts.device), getattr(torch, opts.dtype)
    torch.manual_seed(0)
    memory_kind = "peak" if device.type == "cuda" else "saved"
    print(f"device {device}, dtype {dtype}; memory: {memory_kind} MiB")
    print(f"{'model':<10} {'eager ms':>9} {'jit ms':>9} {'ratio':>6} {'eager MiB':>10} {'jit MiB':>9} {'ratio':>6}")
    for name, (loss_fn, args, first_param) in _models(device, dtype).items():
        params = [a for a in args[first_param:] if isinstance(a, torch.Tensor)]
        eager = functools.partial(loss_fn, EAGER)
        jitted = minijit.jit(functools.partial(loss_fn, LTORCH))
        runs = {
            "eager": functools.partial(_step, eager, args, params),
            "jit": functools.partial(_step, jitted, args, params),
        }
        for run in runs.values():  # warm up (and compile)
            run()
        assert minijit.cache_info(jitted).misses == 1
        ms = {k: _time_ms(run, opts.iters, device) for k, run in runs.items()}
        mib = {k: _memory_bytes(run, device) / 2**20 for k, run in runs.items()}
        print(f"{name:<10} {ms['eager']:9.2f} {ms['jit']:9.2f} {ms['jit'] / ms['eager']:6.2f} "
              f"{mib['eager']:10.1f} {mib['jit']:9.1f} {mib['jit'] / max(mib['eager'], 1e-9):6.2f}")


if __name__ == "__main__":
    main()
