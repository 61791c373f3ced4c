"""Threads sharing jitted code for minutes, as a server's request threads do; not part of the test suite.

Worker threads call one jitted module and one jitted function, with batch sizes drawn from a set, under
`torch.no_grad()`, `torch.inference_mode()` or with a gradient taken with respect to the input, and some
calls of the plain module eagerly; every result (and gradient) is compared with eager's. Every
`--rejit` seconds the module and the function are jitted afresh, so that compiles run all along
beside hits and eager calls, and the old caches must be freed. The resident memory (from
/proc/self/statm) is printed at intervals: past the first interval it should stay flat.

Run: python scripts/stress_threads.py --minutes 2   (prints a line per interval and a summary)
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

import minijit

BATCHES = (1, 2, 3, 5, 8, 13)
MODES = ("no_grad", "inference", "grad", "eager")


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


def function(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ w)
    return h * h.sum(dim=1, keepdim=True) + x[:, :16]


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal up to float32 rounding (the compiled trace may add and multiply in another order)."""
    return torch.allclose(got, expected, rtol=1e-4, atol=1e-5)


def rss_mib() -> float:
    """This process's resident memory, in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Shared:
    """The jitted callables every worker uses, replaced now and then by fresh ones (under a lock)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.rejit()
        self.retired: list[int] = []  # the compiles of each pair replaced
        self.freed: list[weakref.ref[Any]] = []  # the pairs replaced, which nothing should keep alive

    def rejit(self) -> None:
        with self.lock:
            if hasattr(self, "jm"):
                self.retired.append(minijit.cache_info(self.jm).misses + minijit.cache_info(self.jf).misses)
                self.freed += [weakref.ref(self.jm), weakref.ref(self.jf)]
            self.jm, self.jf = minijit.jit(self.model), minijit.jit(function)

    def current(self) -> tuple[Any, Any]:
        with self.lock:
            return self.jm, self.jf


def one_call(rng: random.Random, shared: Shared, w: torch.Tensor, counts: Counter[str]) -> None:
    """One call of the module or the function in a random mode, compared with eager; counted in `counts`."""
    jm, jf = shared.current()
    which = rng.choice(("module", "function"))
    jitted, eager = (jm, shared.model) if which == "module" else (jf, function)
    label = mode = rng.choice(MODES)
    x = torch.randn(rng.choice(BATCHES), 32)
    extra = () if which == "module" else (w,)
    if mode == "eager":  # the plain module (or function), while other threads compile and hit
        jitted = eager
        mode = "no_grad"
    if mode in ("no_grad", "inference"):
        context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
        with context:
            got, expected = jitted(x, *extra), eager(x, *extra)
        same = close(got, expected)
    else:
        x.requires_grad_()
        got = jitted(x, *extra)
        (grad,) = torch.autograd.grad(got.sum(), x)
        x_eager = x.detach().clone().requires_grad_()
        expected = eager(x_eager, *extra)
        (expected_grad,) = torch.autograd.grad(expected.sum(), x_eager)
        same = close(got, expected) and close(grad, expected_grad)
    counts["calls"] += 1
    counts[f"{which} {label}"] += 1
    if not same:
        counts["mismatches"] += 1
        counts[f"mismatch: {which} {label} batch {x.shape[0]}"] += 1


def worker(seed: int, shared: Shared, w: torch.Tensor, stop: threading.Event,
           report: Callable[[Counter[str]], None]) -> None:
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    while not stop.is_set():
        try:
            one_call(rng, shared, w, counts)
        except Exception as e:  # counted and shown: the run goes on
            counts["errors"] += 1
            counts[f"error: {type(e).__name__}: {str(e)[:120]}"] += 1
        if counts["calls"] % 50 == 0:
            report(counts)
            counts = Counter()
    report(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between memory lines")
    parser.add_argument("--rejit", type=float, default=30.0, help="seconds between fresh jits (0: never)")
    opts = parser.parse_args()
    sys.setswitchinterval(1e-4)  # threads switch often, so that calls interleave finely
    torch.set_num_threads(1)  # the Python threads are the parallelism here

    torch.manual_seed(0)
    model = Model().eval()
    w = torch.randn(32, 16)
    shared = Shared(model)
    totals: Counter[str] = Counter()
    totals_lock = threading.Lock()

    def report(counts: Counter[str]) -> None:
        with totals_lock:
            totals.update(counts)

    stop = threading.Event()
    start = time.monotonic()
    end = start + opts.minutes * 60
    rss: list[float] = []
    next_rejit = start + opts.rejit if opts.rejit else float("inf")
    with ThreadPoolExecutor(opts.threads) as pool:
        futures = [pool.submit(worker, i, shared, w, stop, report) for i in range(opts.threads)]
        while (now := time.monotonic()) < end:
            time.sleep(min(opts.interval, end - now))
            if time.monotonic() >= next_rejit:
                shared.rejit()
                next_rejit += opts.rejit
            gc.collect()
            rss.append(rss_mib())
            with totals_lock:
                print(f"{time.monotonic() - start:7.1f} s  rss {rss[-1]:7.1f} MiB  calls {totals['calls']:7d}  "
                      f"mismatches {totals['mismatches']}  errors {totals['errors']}", flush=True)
        stop.set()
        for f in futures:
            f.result()

    jm, jf = shared.current()
    misses = sum(shared.retired) + minijit.cache_info(jm).misses + minijit.cache_info(jf).misses
    gc.collect()
    alive = sum(ref() is not None for ref in shared.freed)
    for k in sorted(k for k in totals if k.startswith(("error: ", "mismatch: "))):
        print(f"  {totals[k]} x {k}")
    modes = ", ".join(f"{k} {v}" for k, v in sorted(totals.items()) if k.startswith(("module ", "function ")))
    print(f"  calls by kind: {modes}")
    growth = rss[-1] - rss[0] if len(rss) > 1 else 0.0
    print(f"summary: {opts.threads} threads, {time.monotonic() - start:.0f} s, {totals['calls']} calls, "
          f"{totals['mismatches']} mismatches, {totals['errors']} errors, {misses} compiles over "
          f"{len(shared.retired) + 1} jits ({alive} of {len(shared.freed)} replaced still alive), "
          f"rss {rss[0]:.1f} -> {rss[-1]:.1f} MiB "
          f"(max {max(rss):.1f}, {growth:+.1f} after the first interval)")
    if totals["mismatches"] or totals["errors"] or alive:
        sys.exit(1)


if __name__ == "__main__":
    main()
