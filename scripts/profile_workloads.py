"""Profiles behind docs/profiles.md: where the time of a bench.py workload goes.

Modes (each prints a table; the workloads and variants are bench.py's):

- `first-call WORKLOAD [VARIANT]`: in a fresh process (imports excluded), the first call of
  the workload split into jit(), compile (per pass, from last_traces), execution and the
  cyclic GC's pauses; then, in another fresh process, the cProfile entries of that call by
  own time. The profiler's clock is the main thread's CPU time, so other processes on the
  machine do not inflate it (torch's worker threads are not counted either). minijit's
  modules load from compiled bytecode, as in bench.py (`--no-pyc`: compiled from source).
- `ops WORKLOAD VARIANT[,VARIANT...]`: steady state, the torch.profiler operator table (self
  CPU time, all threads) of a few iterations per variant, after warm-up.
- `calls WORKLOAD`: a loop workload (generate-*, lr-schedule, serving) call by call: each call of the
  wrapped function in eager and under minijit (default), the least CPU time of the main thread over
  `--repeats` loops, and what minijit did (hit, rebind, miss).
- `pointwise`: the 9-op chain on 4M float32 taken apart: the fused kernel (torch.compile and
  minijit+inductor), the same chain with one transcendental op replaced by a multiply, a
  memory-only chain, single-op kernels and eager's per-op times.

Run: python scripts/profile_workloads.py first-call mlp | ops gpt eager,minijit | calls generate-llama-dynamic |
     pointwise  [--top N]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "scripts")):
    if p not in sys.path:
        sys.path.insert(0, p)

import bench  # noqa: E402
import torch  # noqa: E402

import minijit  # noqa: E402


def _workload(key: str) -> bench.Workload:
    return next(w for w in bench.workloads() if w.key == key)


def first_call(key: str, variant: str, top: int, pyc: bool) -> None:
    """The first call of a workload, twice in fresh processes: timed plainly, then under cProfile.

    With `pyc`, minijit's modules load from compiled bytecode (as bench.py's first-call
    figures do); without, each is compiled from source as it is imported.
    """
    with tempfile.TemporaryDirectory(prefix="minijit_pyc_") as pycache:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPYCACHEPREFIX", None)
        if pyc:
            env["PYTHONPYCACHEPREFIX"] = bench.compiled_bytecode_cache(pycache)
        for extra in ([], ["--cprofile"]):
            cmd = [sys.executable, __file__, "first-call-here", key, variant, "--top", str(top), *extra]
            print(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env).stdout)


def first_call_here(key: str, variant: str, top: int, with_cprofile: bool) -> None:
    """Time (or profile) the first call of a workload in this process, imports excluded."""
    import minijit.runtime.jit as jit_module

    work = _workload(key)
    args = work.args(0)
    compile_s: list[float] = []
    original = jit_module.compile_for

    def timed_compile(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            compile_s.append(time.perf_counter() - start)

    jit_module.compile_for = timed_compile
    pauses: list[tuple[int, float]] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append((info["generation"], time.perf_counter() - started.pop()))

    gc.callbacks.append(on_gc)
    profiler = cProfile.Profile(time.thread_time) if with_cprofile else None
    t0 = time.perf_counter()
    if profiler:
        profiler.enable()
    fn = bench.build(variant, work.fn)
    t1 = time.perf_counter()
    work.step(fn, args)
    if profiler:
        profiler.disable()
    t2 = time.perf_counter()
    gc.callbacks.remove(on_gc)
    jit_module.compile_for = original

    if profiler:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        print(f"cProfile of the first call of {key} with {variant} (main-thread CPU time {stats.total_tt * 1e3:.1f} ms; "
              "the profiler inflates Python-heavy parts), by own time:")
        stats.sort_stats("tottime").print_stats(top)
        print("\n".join(_stats_table(out.getvalue())))
        return
    compiled = sum(compile_s)
    print(f"first call of {key} with {variant}: {(t2 - t0) * 1e3:.1f} ms wall")
    print(f"  jit() (resolving executors)        {(t1 - t0) * 1e3:8.1f} ms")
    print(f"  compile (capture and passes)       {compiled * 1e3:8.1f} ms")
    print(f"  execution (forward, backward)      {(t2 - t1 - compiled) * 1e3:8.1f} ms")
    print(f"  cyclic GC pauses in the window     {sum(d for _, d in pauses) * 1e3:8.1f} ms "
          f"({', '.join(f'gen{g} {d * 1e3:.1f}' for g, d in pauses if d > 5e-4) or 'none over 0.5 ms'})")
    if hasattr(fn, "last_traces"):
        print("  passes (ms): " + ", ".join(f"{t.pass_name} {t.elapsed_ms:.2f}" for t in fn.last_traces()))
        if fn.last_backward_traces():
            print("  backward passes (ms): " + ", ".join(f"{t.pass_name} {t.elapsed_ms:.2f}"
                                                       for t in fn.last_backward_traces()))


def _stats_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    root = str(ROOT) + "/"
    return [line.replace(root, "") for line in lines[start:] if line.strip()]


def ops(key: str, variants: list[str], top: int, iters: int = 5) -> None:
    """torch.profiler's operator table for steady-state iterations of each variant."""
    work = _workload(key)
    for variant in variants:
        fn = bench.build(variant, work.fn)
        args = work.args(1)
        for _ in range(3):
            work.step(fn, args)
        with torch.profiler.profile():  # the profiler's own start-up, kept out of the figures
            work.step(fn, args)
        start = time.perf_counter()
        with torch.profiler.profile() as prof:
            for _ in range(iters):
                work.step(fn, args)
        wall = (time.perf_counter() - start) / iters
        print(f"\n== {key} / {variant}: {wall * 1e3:.1f} ms per iteration under the profiler ({iters} iterations)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def _median_ms(fn: Any, n: int = 10, repeats: int = 7) -> float:
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples) * 1e3


def calls(key: str, variant: str, repeats: int) -> None:
    """Per call of a loop workload: the least thread CPU time over `repeats` loops (after two to warm up) of eager,
    the minijit `variant` (minijit or minijit+inductor) and torch.compile, and what minijit's cache did."""
    work = _workload(key)
    jitted = bench.build(variant, work.fn)
    variants = {"eager": work.fn, variant: jitted, "torch.compile": bench.build("torch.compile", work.fn)}
    times: dict[str, list[list[int]]] = {name: [] for name in variants}
    outcomes: list[str] = []

    def timed(fn: Any, log: list[int]) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            start = time.thread_time_ns()
            out = fn(*a, **k)
            log.append(time.thread_time_ns() - start)
            if fn is jitted:
                info = minijit.cache_info(jitted)
                now = (info.hits, info.misses, info.rebound)
                outcomes.append("hit" if now[0] > seen[0] else "miss" if now[1] > seen[1] else "rebind")
                seen[:] = now
            return out
        return call

    seen = [0, 0, 0]
    for i in range(repeats + 2):
        for name, fn in variants.items():
            log: list[int] = []
            if fn is jitted:
                outcomes.clear()
            work.step(timed(fn, log), work.args(i))
            if i >= 2:
                times[name].append(log)
    n = min(len(x) for runs in times.values() for x in runs)
    best = {name: [min(run[k] for run in runs) / 1e3 for k in range(n)] for name, runs in times.items()}
    print(f"{work.title}: per call, least thread CPU time of {repeats} loops (µs)")
    print(f"  {'call':>4} {'eager':>9} {variant:>16} {'torch.compile':>14}  {variant} did")
    for k in range(n):
        print(f"  {k:>4} {best['eager'][k]:9.0f} {best[variant][k]:16.0f} {best['torch.compile'][k]:14.0f}  "
              f"{outcomes[k] if k < len(outcomes) else ''}")
    print(f"  {'all':>4} {sum(best['eager']):9.0f} {sum(best[variant]):16.0f} {sum(best['torch.compile']):14.0f}")


def pointwise() -> None:
    """The pointwise chain's time taken apart into its kernels."""
    x = torch.randn(4 * 2**20)
    out = torch.empty_like(x)

    def chain(x: torch.Tensor, sin: Any = torch.sin, exp: Any = torch.exp, tanh: Any = torch.tanh) -> torch.Tensor:
        y = sin(x)
        y = y * 2.0
        y = y + 1.0
        y = exp(y)
        y = y - x
        y = tanh(y)
        y = y * 0.5
        y = y + x
        return y.relu()

    def halve(t: torch.Tensor) -> torch.Tensor:
        return t * 0.5

    rows: list[tuple[str, float]] = []
    rows.append(("eager chain (9 kernels)", _median_ms(lambda: bench.pointwise_chain(x))))
    compiled = torch.compile(bench.pointwise_chain)
    rows.append(("torch.compile chain (1 fused kernel)", _median_ms(lambda: compiled(x))))
    jitted = minijit.jit(bench.pointwise_chain, executors=["inductor"])
    rows.append(("minijit+inductor chain (1 fused region)", _median_ms(lambda: jitted(x))))
    for name, kwargs in (("sin", {"sin": halve}), ("exp", {"exp": halve}), ("tanh", {"tanh": halve}),
                         ("sin, exp and tanh", {"sin": halve, "exp": halve, "tanh": halve})):
        variant = torch.compile(lambda x, kwargs=kwargs: chain(x, **kwargs))
        rows.append((f"fused chain with {name} replaced by a multiply", _median_ms(lambda v=variant: v(x))))
    for name, op in (("sin", torch.sin), ("exp", torch.exp), ("tanh", torch.tanh)):
        single = torch.compile(lambda x, op=op: op(x))
        rows.append((f"inductor kernel of {name} alone", _median_ms(lambda s=single: s(x))))
        rows.append((f"eager {name} alone (out=)", _median_ms(lambda op=op: op(x, out=out))))
    rows.append(("eager x * 2.0 (out=)", _median_ms(lambda: torch.mul(x, 2.0, out=out))))
    rows.append(("eager copy of 16 MB (out.copy_(x))", _median_ms(lambda: out.copy_(x))))
    print(f"pointwise chain pieces, 4M float32, {torch.get_num_threads()} threads (median ms per call):")
    for name, ms in rows:
        print(f"  {name:<55} {ms:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["first-call", "ops", "calls", "pointwise", "first-call-here"])
    parser.add_argument("workload", nargs="?", default="mlp")
    parser.add_argument("variants", nargs="?", default="minijit")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7, help="calls: loops timed per variant")
    parser.add_argument("--cprofile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-pyc", action="store_true", help="first-call: minijit's modules without compiled bytecode")
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    if opts.mode == "first-call":
        first_call(opts.workload, opts.variants, opts.top, not opts.no_pyc)
    elif opts.mode == "first-call-here":
        first_call_here(opts.workload, opts.variants, opts.top, opts.cprofile)
    elif opts.mode == "ops":
        ops(opts.workload, opts.variants.split(","), opts.top)
    elif opts.mode == "calls":
        calls(opts.workload, opts.variants, opts.repeats)
    else:
        pointwise()


if __name__ == "__main__":
    main()
