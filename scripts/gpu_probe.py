"""Where a jitted call's host time goes on a GPU: per-call cost of `a + 1` and a profile of a Llama step.

For issue 27's "cheap launches" part: prints, for the Triton executor, whether kernels launch through
their compiled launcher, the host microseconds per call of a one-kernel function, and the functions
taking the most host time in one HF Llama training step (cProfile, sorted by own time).

    PYTHONPATH=. python scripts/gpu_probe.py [--small]      # --small: a tiny Llama (a CPU rehearsal)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import CausalLMLoss  # noqa: E402

import minijit  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call(dev: str) -> None:
    """Host microseconds per call of `a + 1` on one element, eager and jitted (torch and triton executors)."""
    a = torch.randn(1, device=dev)
    for name, fn in (("eager", lambda a: a + 1), ("minijit", minijit.jit(lambda a: a + 1)),
                     ("minijit+triton", minijit.jit(lambda a: a + 1, executors=["triton"]))):
        for _ in range(5):
            fn(a)
        sync()
        start = time.perf_counter()
        for _ in range(2000):
            fn(a)
        sync()
        print(f"per call, a + 1, {name}: {(time.perf_counter() - start) / 2000 * 1e6:.1f} µs")
    from executors.triton import executor

    kernels = [k for k in _all_kernels(executor)]
    print(f"triton kernels made: {len(kernels)}, with a compiled launcher cached: "
          f"{sum(1 for k in kernels if k.compiled)}")


def _all_kernels(executor_module: object) -> list[object]:
    import gc

    return [o for o in gc.get_objects() if isinstance(o, executor_module._Kernel)]


def llama_profile(dev: str, small: bool, executors: list[str] | None) -> None:
    """cProfile of one Llama fwd+bwd step (after warm-up): the top functions by own time."""
    step = llama_step(dev, small, executors)
    for _ in range(3):
        step()
    sync()
    start = time.perf_counter()
    step()
    host = time.perf_counter() - start
    sync()
    print(f"\nLlama step, executors={executors}: host {host * 1e3:.1f} ms (issuing, before the device finishes)")
    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    sync()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])
    if torch.cuda.is_available():
        kernel_times(step, f"Llama step, executors={executors}")


def kernel_times(step: object, title: str) -> None:
    """The device time of one call of `step` by kernel name (torch.profiler), the largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=70)
    print(f"\n{title}: device time by kernel\n{table[:7000]}")


def adam_kernels(dev: str, small: bool) -> None:
    """Device time by kernel of jit(opt.step) with the Triton executor, torch.optim.Adam over 20 parameters."""
    params = [torch.nn.Parameter(torch.randn(64 if small else 1 << 22, device=dev)) for _ in range(20)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-3)
    step = minijit.jit(opt.step, executors=["triton"])
    with torch.no_grad():
        for _ in range(4):
            step()
        sync()
        start = time.perf_counter()
        step()
        print(f"\nAdam step, triton: host {(time.perf_counter() - start) * 1e3:.2f} ms")
        if torch.cuda.is_available():
            kernel_times(step, "Adam step, triton")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", default=not torch.cuda.is_available())
    parser.add_argument("--only", default="calls,llama,adam", help="comma-separated: calls, llama, adam")
    opts = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    parts = opts.only.split(",")
    if "calls" in parts:
        per_call(dev)
    if "adam" in parts:
        adam_kernels(dev, opts.small)
    if "llama" in parts:
        for executors in (None, ["triton"]):
            llama_profile(dev, opts.small, executors)
        if torch.cuda.is_available():
            eager_llama_kernels(opts.small)


def eager_llama_kernels(small: bool) -> None:
    """Eager's device time by kernel on the same Llama step, for comparison."""
    step = llama_step("cuda", small, "eager")
    for _ in range(3):
        step()
    kernel_times(step, "Llama step, eager")


def llama_step(dev: str, small: bool, executors: list[str] | str | None) -> Callable[[], None]:
    """One fwd+bwd step of a bf16 HF Llama (8 layers, hidden 1024; tiny with `small`), jitted with `executors`
    ("eager": not jitted)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    size = (dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2) if small else
            dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=8))
    model = CausalLMLoss(LlamaForCausalLM(LlamaConfig(**size, max_position_embeddings=1024, pad_token_id=0,
                                                      bos_token_id=1, eos_token_id=2)).train())
    model = model.to(device=dev, dtype=torch.bfloat16)
    ids = torch.randint(3, size["vocab_size"], (2, 32) if small else (4, 512), device=dev)
    run = model if executors == "eager" else minijit.jit(model, executors=executors)

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        run(ids, ids).backward()

    return step


if __name__ == "__main__":
    main()
