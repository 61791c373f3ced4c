"""Cache-entry guards: an entry's list of checks (minijit.runtime.checks), compiled into its prologue.

The cache key already fixes tensor metadata and Python values among the arguments; the
guard checks the rest: the constraints a "symbolic values" trace relied on, the globals
and closure values the interpreter saw (`minijit.frontend.guards`), the tensors it read
from outside the call, and how the inputs share memory when the trace writes into them.
"""

from __future__ import annotations

import re
from typing import Any

from minijit.frontend import GuardEntry
from minijit.frontend.guards import Source, TensorSeen
from minijit.runtime.arguments import InputAliasing
from minijit.runtime.checks import Check, Prologue, guard_checks
from minijit.runtime.inputs import input_names

# A symbolic input size compared with 0 or 1, either way round; the constraint of a size's kind.
_SIZE_VS_LITERAL = re.compile(r"^(?:(0|1) (==|!=|<=|>=|<|>) (\w+\.shape\[\d+\])|(\w+\.shape\[\d+\]) (==|!=|<=|>=|<|>) (0|1))$")
_KIND = re.compile(r"^(\w+\.shape\[\d+\]) (>|>=|==) (\d+)$")
_HOLDS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
          "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def drop_implied(constraints: list[str]) -> list[str]:
    """The constraints without those that the per-size constraints already imply.

    Every input size starts with the constraint of its kind (the first one recorded on it):
    `x.shape[i] > 1`, `x.shape[i] >= 1` (a symbolic size traced at 1) or `x.shape[i] == n`. A
    comparison of that size with 0 or 1 true for every size of its kind need not be checked again
    (`x.shape[i] != 0` where it is `>= 1`); one that is not (`x.shape[i] <= 1` where it is `>= 1`) stays.
    """
    kinds: dict[str, tuple[str, tuple[int, ...]]] = {}  # size -> (its kind constraint, sizes of that kind)
    for c in constraints:
        m = _KIND.match(c)
        if m is not None and m.group(1) not in kinds:
            op, n = m.group(2), int(m.group(3))
            # Comparisons with 0 or 1 hold for all sizes >= 1 (>= 2) where they hold for the first three.
            kinds[m.group(1)] = (c, (n,) if op == "==" else tuple(range(n + (op == ">"), n + (op == ">") + 3)))
    kept = []
    for c in constraints:
        m = _SIZE_VS_LITERAL.match(c)
        size = m.group(3) or m.group(4) if m is not None else None
        if m is None or size not in kinds or kinds[size][0] == c:
            kept.append(c)
            continue
        if m.group(1) is not None:
            holds = all(_HOLDS[m.group(2)](int(m.group(1)), v) for v in kinds[size][1])
        else:
            holds = all(_HOLDS[m.group(5)](v, int(m.group(6))) for v in kinds[size][1])
        if not holds:
            kept.append(c)
    return kept


def specialised_facts(entry: Any) -> tuple[list[GuardEntry], list[tuple[str, Source, TensorSeen | int | float]],
                                         InputAliasing | None]:
    """What capture and functionalization recorded that the guard must check: the values read from
    outside, the tensors read from outside (name, source, tensor), and how the inputs share memory
    when the trace writes into inputs (else None). The one place that reads them off the entry's records."""
    return list(entry.capture.guards), list(entry.capture.captured_inputs), entry.aliasing


def compile_prologue(entry: Any, call: tuple[list[str], list[Check]], keywords: tuple[str, ...],
                     constraints: list[str], kept: tuple[dict[str, Any], dict[int, Check]] | None = None) -> Prologue:
    """The entry's prologue: the call's checks and the guard's (constraints, values read, captured tensors,
    aliasing), compiled from one generated source. `kept`: (the environment to start from, the checks of values
    read kept by position), where an entry is rebound (`runtime/rebind.py`)."""
    values, captured, aliases = specialised_facts(entry)
    traces = entry.traces
    names = input_names(traces[0])
    env, kept_checks = kept if kept is not None else ({}, None)
    checks = call[1] + guard_checks(constraints, values, captured, aliases, names, env,
                                    entry.capture.symbolic_captured, kept_checks, entry.capture.identities)
    reads = [(name, source.expression(env)) for name, source, _ in captured]
    own = names[: len(names) - len(captured)]
    value_guards = [c.describe() for c in entry.capture.value_checks]
    prologue = Prologue(traces[0].fn_name, call[0], keywords, checks, own, reads, env, value_guards,
                        previous=entry.prologue if kept is not None else None)
    prologue.reads_at = len(call[1]) + len(constraints)
    return prologue
