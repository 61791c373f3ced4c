"""Explaining cache misses in words: the checks of the closest cache entry that a call fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minijit.runtime.checks import Prologue

# A miss is explained against this many entries, the most recently used: explaining each check of an entry
# runs generated code, so against every entry a miss would cost more the more entries there are.
EXPLAINED_AGAINST = 8


def explain_miss(previous: Sequence[Prologue], same_key: Sequence[Prologue], args: tuple[Any, ...],
                 kwargs: dict[str, Any], flat: list[Any]) -> str:
    """Why a call missed the cache: the failing checks, first first, of the entry it comes closest to.

    An entry under the same key failed its guard: its guard's failing checks (of the last of
    `same_key`). Otherwise the entry of `previous` whose key checks the call fails fewest of; the
    runtime passes the EXPLAINED_AGAINST most recently used entries, so the cost stays the same
    however many entries the cache holds.
    """
    if same_key:
        return "; ".join(same_key[-1].failures(args, kwargs, flat)) or "a guard failed"
    if not previous:
        return "first call"
    # Closest: the fewest differences (a failing check may name several: hooks added on two modules).
    closest = min((p.failures(args, kwargs, None) for p in previous), key=lambda found: "; ".join(found).count("; "))
    if not closest:
        return "a guard on a value the trace read (not an argument) failed"
    return "; ".join(closest)
