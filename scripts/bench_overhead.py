"""Per-call overhead of a cache hit: `jit(f)` against eager `f` for `f = lambda a, b: a + b` on 2x2 float32,
in the "constant values" (default) and "symbolic values" cache modes.

Run: python scripts/bench_overhead.py   (prints microseconds per call and the ratio jit / eager)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import minijit


def per_call_us(fn: Callable[..., Any], args: tuple[Any, ...], calls: int, repeats: int) -> float:
    """The best of `repeats` runs of `calls` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()

    def f(a, b):
        return a + b

    a, b = torch.randn(2, 2), torch.randn(2, 2)
    modes = ("constant values", "symbolic values")
    jitted = {mode: minijit.jit(f, cache=mode) for mode in modes}
    for jf in jitted.values():
        torch.testing.assert_close(jf(a, b), f(a, b))
    # Interleave the measurements so that machine noise hits every variant alike.
    best = {name: float("inf") for name in ("eager", *modes)}
    for _ in range(opts.repeats):
        best["eager"] = min(best["eager"], per_call_us(f, (a, b), opts.calls, 1))
        for mode, jf in jitted.items():
            best[mode] = min(best[mode], per_call_us(jf, (a, b), opts.calls, 1))
    for jf in jitted.values():
        assert minijit.cache_info(jf).misses == 1, "every measured call must be a cache hit"
    rows = [(mode, best["eager"], best[mode]) for mode in modes]
    print(f"{'mode':<18} {'eager µs':>9} {'jit µs':>9} {'ratio':>7}")
    for mode, e, j in rows:
        print(f"{mode:<18} {e:9.2f} {j:9.2f} {j / e:7.2f}")


if __name__ == "__main__":
    main()
