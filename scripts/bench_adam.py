"""The Adam step of issue 5 (in-place ops, 20 parameters of 1M float32): minijit.jit against eager, in one run.

Uses the `adam` workload of scripts/bench.py (`adam_step`: `exp_avg.lerp_`,
`exp_avg_sq.mul_().addcmul_`, `p.addcdiv_`) under `torch.no_grad()`, and reports:

- correctness: after one and two steps from the same state, every parameter, exp_avg
  and exp_avg_sq is `torch.equal` to eager's, and the jitted step updated the very
  tensors passed in (same storage, version counter bumped);
- the first call (tracing and compiling included) in a fresh process (target ≤ 0.5 s);
- the steady-state time per step, eager and jit interleaved (each repeat times both,
  in alternating order), as medians, with the ratio **jit time / eager time**
  (≤ 1.0: the jitted step is no slower than eager; the issue's target), both as the
  ratio of the medians and as the median of each repeat's own ratio (steadier when the
  machine's load changes during the run);
- the final trace, and whether every write into a parameter or optimizer state goes
  straight into its memory (every `copy_to_out_` in place, no real copy).

Exits with status 1 if the results differ from eager or a real copy is left.

Run: python scripts/bench_adam.py [--repeats 15] [--steps 3] [--no-first-call] [--no-trace]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(SCRIPTS.parent), str(SCRIPTS)]  # this checkout's minijit, and bench.py beside this file

import torch  # noqa: E402
from bench import adam_step, compiled_bytecode_cache, first_call_in_subprocess, fmt_time, workloads  # noqa: E402

import minijit  # noqa: E402

WORKLOAD = next(w for w in workloads() if w.key == "adam")


def flat(args: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for group in args for t in group]


def check_against_eager(jf: minijit.runtime.JitFunction) -> list[str]:
    """Two steps eagerly and jitted from the same state; the problems found (empty: all equal, all in place)."""
    problems = []
    want, got = WORKLOAD.args(0), WORKLOAD.args(0)
    tensors = flat(got)
    ptrs = [t.data_ptr() for t in tensors]
    versions = [t._version for t in tensors]
    names = ("params", "exp_avgs", "exp_avg_sqs")
    for step in (1, 2):
        with torch.no_grad():
            adam_step(*want)
            jf(*got)
        for name, i in zip(names, (0, 2, 3), strict=True):
            bad = [k for k, (g, w) in enumerate(zip(got[i], want[i], strict=True)) if not torch.equal(g, w)]
            if bad:
                problems.append(f"step {step}: {name}[{bad[0]}] (and {len(bad) - 1} more) differ from eager")
    if [t.data_ptr() for t in tensors] != ptrs:
        problems.append("the jitted step replaced a tensor's memory instead of updating it in place")
    bumped = [t._version > v for t, v in zip(tensors, versions, strict=True)]
    if not all(bumped[:20] + bumped[40:]):
        problems.append("a mutated tensor's version counter was not bumped")
    return problems


def copy_report(trace: minijit.ir.Trace) -> tuple[list[str], int]:
    """(the copies that are real copies, how many tensors the step allocates) in the final trace."""
    real, allocations = [], 0
    for bsym in trace.bound_symbols:
        if bsym.sym.name == "copy_to_out_" and not bsym.note.startswith("in place"):
            real.append(f"{bsym.kwargs['out'].name}: {bsym.note}")
        elif bsym.sym.name == "copy_":
            real.append(f"copy_ into {bsym.args[1].name}")
        elif bsym.sym.name not in ("copy_to_out_", "python_del") and "out" not in bsym.kwargs \
                and not bsym.sym.name.endswith("_"):
            allocations += 1
    return real, allocations


def time_steps(fn, args: list[list[torch.Tensor]], steps: int) -> float:
    """Seconds per step over `steps` consecutive steps."""
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            fn(*args)
    return (time.perf_counter() - start) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15, help="interleaved samples per variant")
    parser.add_argument("--steps", type=int, default=3, help="Adam steps per sample")
    parser.add_argument("--no-first-call", action="store_true", help="skip the fresh-process first-call figure")
    parser.add_argument("--no-trace", action="store_true", help="do not print the final trace")
    opts = parser.parse_args()
    load_start = os.getloadavg()[0]
    print(f"Adam step, 20 x 1M float32, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} cores")

    jf = minijit.jit(adam_step)
    problems = check_against_eager(jf)
    print("matches eager (torch.equal on params, exp_avgs, exp_avg_sqs after 1 and 2 steps; updated in place):",
          "yes" if not problems else "NO")
    for p in problems:
        print("  " + p)
    final = minijit.last_traces(jf)[-1]
    real, allocations = copy_report(final)
    copies = sum(b.sym.name == "copy_to_out_" for b in final.bound_symbols)
    print(f"writes straight into the inputs: {'yes' if not real else 'NO'} ({copies} copy_to_out_, "
          f"{copies - len(real)} in place, {len(real)} real copies); tensors allocated per step: jit {allocations}, "
          "eager 40")
    for r in real:
        print("  real copy: " + r)

    if not opts.no_first_call:
        with tempfile.TemporaryDirectory(prefix="minijit_pyc_") as pycache:
            # Compiled bytecode, as an installed package has it (this checkout may run without).
            seconds, note, _ = first_call_in_subprocess("adam", "minijit", 120, compiled_bytecode_cache(pycache))
        print("first call (fresh process, tracing and compiling included; target <= 0.5 s):",
              fmt_time(seconds) if seconds is not None else note)

    eager_args, jit_args = WORKLOAD.args(1), WORKLOAD.args(1)
    time_steps(adam_step, eager_args, 1)
    time_steps(jf, jit_args, 1)
    samples: dict[str, list[float]] = {"eager": [], "jit": []}
    runners = {"eager": (adam_step, eager_args), "jit": (jf, jit_args)}
    for r in range(opts.repeats):
        for name in ("eager", "jit") if r % 2 == 0 else ("jit", "eager"):
            fn, args = runners[name]
            samples[name].append(time_steps(fn, args, opts.steps))
    eager, jit = statistics.median(samples["eager"]), statistics.median(samples["jit"])
    print(f"steady state, median of {opts.repeats} interleaved samples of {opts.steps} steps: "
          f"eager {fmt_time(eager)}, jit {fmt_time(jit)} per step (min: eager {fmt_time(min(samples['eager']))}, "
          f"jit {fmt_time(min(samples['jit']))})")
    # Each repeat times both back to back: the ratio within a repeat sees the same load.
    paired = statistics.median(j / e for j, e in zip(samples["jit"], samples["eager"], strict=True))
    print(f"ratio jit time / eager time = {jit / eager:.2f} (medians); {paired:.2f} (median of the per-repeat "
          "ratios) (target <= 1.0: jit no slower than eager)")
    print(f"load average (1 min) at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f}")
    if not opts.no_trace:
        print("\nfinal trace (minijit.last_traces(jf)[-1]):")
        print(final.python())
    return 1 if problems or real else 0


if __name__ == "__main__":
    sys.exit(main())
