"""Cache-entry guards: an entry's list of checks (minijit.runtime.checks), compiled into its prologue.

The cache key already fixes tensor metadata and Python values among the arguments; the
guard checks the rest: the constraints a "symbolic values" trace relied on, the globals
and closure values the interpreter saw (`minijit.frontend.guards`), the tensors it read
from outside the call, and how the inputs share memory when the trace writes into them.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from minijit.frontend import GuardEntry
from minijit.frontend.guards import Source
from minijit.runtime.arguments import InputAliasing
from minijit.runtime.checks import Check, Prologue, guard_checks
from minijit.runtime.inputs import input_names

# A symbolic input size (> 1) compared with 0 or 1: implied by the `x.shape[i] > 1` constraint
# every symbolic size starts with, so the guard need not check it again.
_IMPLIED = re.compile(r"^(0|1) (==|!=|<=|>=|<|>) \w+\.shape\[\d+\]$|^\w+\.shape\[\d+\] (==|!=|<=|>=|<|>) (0|1)$")


def drop_implied(constraints: list[str]) -> list[str]:
    """The constraints without those that the per-size constraints already imply."""
    return [c for c in constraints if not _IMPLIED.match(c) or c.endswith(("== 0", "== 1", "> 1"))]


def specialised_facts(entry: Any) -> tuple[list[GuardEntry], list[tuple[str, Source, torch.Tensor]],
                                         InputAliasing | None]:
    """What capture and functionalization recorded that the guard must check: the values read from
    outside, the tensors read from outside (name, source, tensor), and how the inputs share memory
    when the trace writes into inputs (else None). The one place that reads them off the entry's records."""
    return list(entry.capture.guards), list(entry.capture.captured_inputs), entry.aliasing


def compile_prologue(entry: Any, call: tuple[list[str], list[Check]], keywords: tuple[str, ...],
                     constraints: list[str]) -> Prologue:
    """The entry's prologue: the call's checks and the guard's (constraints, values read, captured tensors,
    aliasing), compiled from one generated source."""
    values, captured, aliases = specialised_facts(entry)
    traces = entry.traces
    names = input_names(traces[0])
    env: dict[str, Any] = {}
    checks = call[1] + guard_checks(constraints, values, captured, aliases, names, env,
                                    entry.capture.symbolic_captured)
    reads = [(name, source.expression(env)) for name, source, _ in captured]
    own = names[: len(names) - len(captured)]
    value_guards = [c.describe() for c in entry.capture.value_checks]
    return Prologue(traces[0].fn_name, call[0], keywords, checks, own, reads, env, value_guards)
