"""Time the misses of a jitted function called with thousands of distinct shapes (issue 38, part 5).

Each call `jf(torch.randn(n))` (or `jf(torch.randn(n), torch.randn(n))`) with a new `n` misses the
cache under cache="constant values" and traces again. The cost of a miss must not grow with the number
of entries the function already has: this prints the mean time per miss over windows of calls, the
entries held and the misses' explanation time, and the process's memory.

Run: PYTHONPATH=. python scripts/many_shapes.py [--calls 2000] [--every 250] [--args 1|2] [--max-entries N | --unbounded]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import minijit
from minijit.runtime import jit as jit_module


def one(x):
    return (x * 2 + 1).sin()


def two(x, y):
    return (x * y + x).sum(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--args", type=int, choices=(1, 2), default=1)
    parser.add_argument("--max-entries", type=int, default=None, help="jit's max_entries (default: its default)")
    parser.add_argument("--unbounded", action="store_true", help="max_entries=None: every entry kept")
    options = parser.parse_args()
    kwargs = {} if options.max_entries is None else {"max_entries": options.max_entries}
    if options.unbounded:
        kwargs["max_entries"] = None
    jf = minijit.jit(one if options.args == 1 else two, cache="constant values", **kwargs)
    explaining = [0.0]
    explain = jit_module.explain_miss

    def timed_explain(*a, **k):  # how much of a miss is spent explaining it
        start = time.perf_counter()
        try:
            return explain(*a, **k)
        finally:
            explaining[0] += time.perf_counter() - start

    jit_module.explain_miss = timed_explain
    print(f"{'calls':>6} {'ms/miss':>8} {'explain ms':>10} {'entries':>7} {'maxrss MiB':>10}")
    start, explained = time.perf_counter(), 0.0
    for n in range(1, options.calls + 1):
        jf(*(torch.randn(n) for _ in range(options.args)))
        if n % options.every == 0:
            now = time.perf_counter()
            info = jf.cache_info()
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{n:>6} {(now - start) * 1e3 / options.every:>8.2f} "
                  f"{(explaining[0] - explained) * 1e3 / options.every:>10.2f} {info.entries:>7} {rss:>10.0f}")
            start, explained = time.perf_counter(), explaining[0]
    info = jf.cache_info()
    print(f"{info.misses} misses, {info.entries} entries, {getattr(info, 'evictions', 0)} evicted, "
          f"{len(info.miss_reasons)} miss reasons kept")


if __name__ == "__main__":
    main()
