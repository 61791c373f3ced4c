"""Explaining cache misses in words: the checks of the closest cache entry that a call fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minijit.runtime.checks import Prologue


def explain_miss(previous: Sequence[Prologue], same_key: Sequence[Prologue], args: tuple[Any, ...],
                 kwargs: dict[str, Any], flat: list[Any]) -> str:
    """Why a call missed the cache: the failing checks, first first, of the entry it comes closest to.

    An entry under the same key failed its guard: its guard's failing checks. Otherwise the
    entry whose key checks the call fails fewest of.
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
