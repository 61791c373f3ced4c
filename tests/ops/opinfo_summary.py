"""The OpInfo coverage summary, printed at the end of a run that ran tests/ops/test_opinfo.py (by tests/conftest.py,
which pytest loads in the controlling process also when it runs the whole suite under xdist)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.ops.opinfo_sweep import samples_per_entry


def _opinfo_results(terminalreporter: Any) -> list[dict[str, Any]]:
    results = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == "opinfo" and getattr(report, "when", "call") == "call":
                    results.append(value)
    return results


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.1f}%)" if whole else "0/0"


def coverage_lines(results: list[dict[str, Any]], skipped: int) -> list[str]:
    """The summary of OpInfo results (`EntryResult.summary()` dicts), one line per fact."""
    forward = Counter(r["forward"] for r in results)
    grads = Counter(r["grad"] for r in results if r["grad"] is not None)
    differentiable = sum(grads.values())
    opaque = sum(1 for r in results if r["opaque"])
    declined = sum(1 for r in results if r["declined"])
    limit = samples_per_entry()
    return [
        f"OpInfo coverage ({'every sample' if limit is None else f'first {limit} sample(s) eager accepts'} "
        f"per entry and dtype): {len(results) + skipped} entries, {skipped} skipped (no CPU samples)",
        f"  forward (float32, bfloat16, an integer dtype): equal to eager {_share(forward['equal'], len(results))}; "
        f"refused {forward['refused']}, untested {forward['untested']}, wrong {forward['wrong']}, "
        f"errors {forward['error']}",
        f"  gradients (float64): equal to eager autograd {_share(grads['equal'], differentiable)}; "
        f"refused {grads['refused']}, untested {grads['untested']}, wrong {grads['wrong']}, errors {grads['error']}",
        f"  entries run with opaque torch ops: {opaque} (in {declined} an ltorch decomposition declined the call); "
        f"decomposed only: {len(results) - opaque}",
    ]


def print_summary(terminalreporter: Any) -> None:
    """Print the OpInfo coverage summary (results reach the controller through user_properties under xdist)."""
    results = _opinfo_results(terminalreporter)
    if not results:
        return
    skipped = sum(1 for r in terminalreporter.stats.get("skipped", ())
                  if "test_opinfo_entry_matches_eager" in getattr(r, "nodeid", ""))
    terminalreporter.section("OpInfo coverage")
    for line in coverage_lines(results, skipped):
        terminalreporter.write_line(line)
