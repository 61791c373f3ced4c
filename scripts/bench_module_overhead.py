"""Per-call overhead of a cache hit on a jitted `nn.Module`: `jit(module)(x)` against eager `module(x)`.

Two modules: `Linear(4, 4)` on a 2x4 input (one module, two parameters) and a 6-layer MLP
(`Sequential` of Linear/ReLU, 13 modules) on 2x4: the jitted call fetches every parameter and
walks every submodule (training flags, hooks) on each call, so its cost grows with the tree.

Run: python scripts/bench_module_overhead.py   (prints microseconds per call and the ratio jit / eager)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import minijit


def per_call_us(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    """Microseconds per call of `calls` calls of `fn(*args)`."""
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()

    torch.manual_seed(0)
    modules = {
        "Linear(4, 4)": torch.nn.Linear(4, 4),
        "6-layer MLP": torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())]),
    }
    x = torch.randn(2, 4)
    print(f"{'module':<14} {'eager µs':>9} {'jit µs':>9} {'ratio':>7}")
    with torch.no_grad():
        for name, module in modules.items():
            jm = minijit.jit(module)
            torch.testing.assert_close(jm(x), module(x))
            # Interleave eager and jit so that machine noise hits both alike.
            eager = jit = float("inf")
            for _ in range(opts.repeats):
                eager = min(eager, per_call_us(module, (x,), opts.calls))
                jit = min(jit, per_call_us(jm, (x,), opts.calls))
            assert minijit.cache_info(jm).misses == 1, "every measured call must be a cache hit"
            print(f"{name:<14} {eager:9.2f} {jit:9.2f} {jit / eager:7.2f}")


if __name__ == "__main__":
    main()
