"""A large sweep of tests/runtime/test_dimension_fuzz.py's programs: each mismatch, told apart by whether a new
jitted function per call (constant sizes) mismatches too. `python sweep/dimension_sweep.py FIRST LAST`."""

from __future__ import annotations

import sys
import time
import warnings
from collections import Counter

import tests.runtime.test_dimension_fuzz as fuzz
from tests.runtime.test_dimension_fuzz import run_one


def main(first: int, last: int) -> None:
    """Run seeds [first, last), printing each mismatch and a summary (CALLS calls each: argv[3], else the test's)."""
    if len(sys.argv) > 3:
        fuzz.CALLS = int(sys.argv[3])
    warnings.simplefilter("ignore")
    start, outcomes, kinds = time.time(), Counter(), Counter()
    for seed in range(first, last):
        try:
            found = run_one(seed, outcomes)
        except Exception as e:  # the fuzzer's own failure: reported, the sweep goes on
            found = f"CRASH seed {seed}: {type(e).__name__}: {e}"
        if found is None:
            continue
        constant = run_one(seed, Counter(), jit_each_call=True) if not found.startswith("CRASH") else None
        kind = "also with constant sizes" if constant is not None else "automatic dynamic only"
        kinds[kind] += 1
        print(f"=== [{kind}] {found}\n", flush=True)
    print(f"{time.time() - start:.0f}s {dict(outcomes)} {dict(kinds)}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
