"""A compiled call that raises where the user's code would catch the error runs eagerly instead.

An op the user's code calls inside `try:` may raise on some data only (`torch.linalg.cholesky` of a
matrix that is not positive-definite, `torch.linalg.inv` of a singular one). The trace was recorded
on data that did not raise, so its `except` branch was never traced. The capture notes such ops
(`CaptureResult.ops_in_try`); when the compiled computation of such an entry raises, the call
runs the user's function eagerly, which takes eager's path, its `except` branch included, and
gives eager's result (or eager's exception). Nothing the compiled call did is visible by then:
writes into outside objects are replayed only after a call succeeds, the random number
generators are set back, and an entry that writes into its inputs (which a compiled call may do
before it finishes) refuses with a `MinijitError` instead of falling back.

Why not trace the `except` branch as a second variant: which variant a call needs is known only
once the op ran, so the variant would repeat the work before the raise; and each op in a `try`
would double the variants. Running the few calls that raise eagerly is exact and simple.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.errors import MinijitError, UnsupportedSyntaxError, ValueGuardMiss
from minijit.ir.symbol import SourceLocation


class RaisedInTry(Exception):
    """Raised by a compiled computation whose op inside a user's `try` raised: the call must run eagerly.

    Never reaches the user: the jitted function catches it (minijit.runtime.jit).
    """

    def __init__(self, error: BaseException, reason: str):
        super().__init__(reason)
        self.error = error
        self.reason = reason


def describe(ops_in_try: Sequence[tuple[str, SourceLocation]]) -> str:
    """`torch.linalg.cholesky at f.py:12 (L = torch.linalg.cholesky(a))`, for each distinct op and line."""
    seen = dict.fromkeys(f"{op} at {where}" for op, where in ops_in_try)
    listed = list(seen)
    more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
    return "; ".join(listed[:3]) + more


def falling_back(computation: Callable[..., Any], ops_in_try: Sequence[tuple[str, SourceLocation]],
                 writes_inputs: Sequence[str], random: bool,
                 generators: Sequence[torch.Generator] = ()) -> Callable[..., Any]:
    """`computation`, raising `RaisedInTry` where it raises an error the user's `except` might catch.

    `writes_inputs` names the inputs the entry writes (then it refuses instead); `random`: the
    entry draws random numbers, from torch's default generators and `generators` (they are set
    back before the eager run draws again).
    """
    ops = describe(ops_in_try)

    def run(*flat: Any) -> Any:
        states = (_rng_states(), [g.get_state() for g in generators]) if random else None
        try:
            return computation(*flat)
        except (MinijitError, ValueGuardMiss):  # a value guard's miss runs the call with another entry
            raise
        except Exception as e:
            what = f"{type(e).__name__} at run time, with ops inside a try block ({ops})"
            if writes_inputs:
                raise UnsupportedSyntaxError(
                    f"the compiled call raised {what}; minijit cannot run the call eagerly instead because the "
                    f"compiled call may already have written into its inputs ({', '.join(writes_inputs)}). Move "
                    "the try block out of the jitted function, or leave the inputs unwritten") from e
            if states is not None:
                _set_rng_states(states[0])
                for g, state in zip(generators, states[1], strict=True):
                    g.set_state(state)
            raise RaisedInTry(e, f"{what}: this call ran eagerly") from e

    return run


def _rng_states() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_states(states: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
