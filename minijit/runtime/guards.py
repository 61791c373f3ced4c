"""Cache-entry guards: one compiled function per entry that says whether its trace still holds.

The cache key already fixes tensor metadata and Python values among the arguments; the
guard checks the rest: the constraints a "symbolic values" trace relied on, and the
globals and closure values the interpreter saw (`minijit.frontend.guards`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from minijit.frontend import GuardEntry, build_guard
from minijit.ir import Trace
from minijit.runtime.inputs import alias_pattern, input_names

# A symbolic input size (> 1) compared with 0 or 1: implied by the `x.shape[i] > 1` constraint
# every symbolic size starts with, so the guard need not check it again.
_IMPLIED = re.compile(r"^(0|1) (==|!=|<=|>=|<|>) \w+\.shape\[\d+\]$|^\w+\.shape\[\d+\] (==|!=|<=|>=|<|>) (0|1)$")


def drop_implied(constraints: list[str]) -> list[str]:
    """The constraints without those that the per-size constraints already imply."""
    return [c for c in constraints if not _IMPLIED.match(c) or c.endswith(("== 0", "== 1", "> 1"))]


def compile_guard(trace: Trace, constraints: list[str], values: list[GuardEntry],
                  aliases: tuple[int, ...] | None = None) -> Callable[..., bool] | None:
    """One function of the trace inputs, True while every constraint and read value still holds.

    `aliases` is the storage-sharing pattern of the inputs the trace was functionalized
    for, when it writes into inputs: a call whose inputs alias differently misses.
    """
    value_guard = build_guard(values)
    if not constraints and value_guard is None and aliases is None:
        return None
    names = input_names(trace)
    terms = list(constraints) + (["_values_unchanged()"] if value_guard is not None else [])
    if aliases is not None:
        terms.append(f"_alias_pattern({', '.join(names)}) == _expected_aliases")
    body = " and ".join(terms)
    # Read each input's shape once: `x.shape` costs more than indexing the tuple it gives.
    shaped = [n for n in names if f"{n}.shape[" in body]
    for n in shaped:
        body = body.replace(f"{n}.shape[", f"{n}_shape[")
    reads = "".join(f"    {n}_shape = {n}.shape\n" for n in shaped)
    source = f"def guard({', '.join(names)}):\n{reads}    return {body}\n"
    env: dict[str, Any] = {"_values_unchanged": value_guard, "_alias_pattern": alias_pattern,
                           "_expected_aliases": aliases}
    exec(compile(source, f"<minijit guard {trace.fn_name}>", "exec"), env)
    guard = env["guard"]
    guard.__minijit_source__ = source
    return guard


def explain_guard_failure(entry: Any, flat: list[Any]) -> str:
    """Which constraints or read values of `entry` no longer hold for these inputs, in words."""
    params = ", ".join(input_names(entry.traces[0]))
    # The constraints are our own generated source over the input names.
    broken = [c for c in entry.constraints if not eval(f"lambda {params}: {c}")(*flat)]
    failed = ["constraint failed: " + "; ".join(broken)] if broken else []
    expected = entry.traces[-1].info.get("alias_pattern")
    if expected is not None and alias_pattern(*flat) != expected:
        failed.append(f"inputs share memory differently: {alias_pattern(*flat)} != {expected}")
    for value in entry.value_guards:
        check = build_guard([value])
        if check is not None and not check():
            failed.append(f"{value} changed")
    return "; ".join(failed) if failed else "a guard failed"
