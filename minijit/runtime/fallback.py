"""Calls that run eagerly instead: a compiled call raising where the user's code would catch the error, and a
call whose code raises while it is traced.

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

A call whose code raises while it is traced (a `raise`, a user's callback failing, an error of Python
code or of a value read's run of the trace so far, a KeyboardInterrupt a `raise` statement makes)
would, eagerly, have made every write and every effect before the raise; the capture made none of them
(tensor writes are recorded, effects on outside objects undone once it ends and replayed only by a
finished trace, prints deferred, value reads run functionally with the random generators put back).
So `compile_for` raises `RaisedWhileTracing`, nothing is cached, and the call runs eagerly, once:
eager's writes, effects, draws and exception (its type, its message, the user's frames in its
traceback). A `MinijitError` standing for eager's error (`MetaError[T]`: an op refusing its shapes)
does the same where the capture so far did something eager would have shown, and is raised in place
of eager's `T` at its line (its message names the op); where nothing was, it is raised as it is (it
may be minijit's limitation, not eager's error: a refusal). A later call that takes the same path
traces again and does the same. Where eager returns instead (the capture raised where eager does not:
minijit's limitation), the call gives eager's result with a `TracingRaisedWarning`. A `MinijitError`
refusing the code propagates as it is, and so does a KeyboardInterrupt no `raise` of the code made:
Ctrl-C abandons the compile wherever it is.

Why not run the trace recorded up to the raise, then replay the effects logged so far: a raise comes
from anywhere (inside an op's decomposition or a traced `autograd.Function`, a container method
logged before it failed), and the recorded prefix would need a compile of its own; eager is exact.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError, where
from minijit.frontend.code import short_filename
from minijit.ir.symbol import SourceLocation


class RaisedInTry(Exception):
    """Raised by a compiled computation whose op inside a user's `try` raised: the call must run eagerly.

    Never reaches the user: the jitted function catches it (minijit.runtime.jit).
    """

    def __init__(self, error: BaseException, reason: str):
        super().__init__(reason)
        self.error = error
        self.reason = reason


class RaisedWhileTracing(Exception):
    """Raised by `compile_for` where the code being traced raised `error` of its own at `at`: the call must run
    eagerly. Never reaches the user: the jitted function catches it (minijit.runtime.jit) and runs the call with
    `eager_after_raise`.
    """

    def __init__(self, error: BaseException, at: SourceLocation | None):
        reason = f"tracing raised {type(error).__name__}{where(at)}: this call ran eagerly"
        super().__init__(reason)
        self.error = error
        self.at = at
        self.reason = reason


class TracingRaisedWarning(UserWarning):
    """Tracing a call raised where the function run eagerly returns: the call ran eagerly (a limitation of minijit)."""


def eager_after_raise(raised: RaisedWhileTracing, run: Callable[[], Any], name: str) -> Any:
    """`run()`, the call of the function `name` run eagerly in place of its capture, which raised: eager's result or
    exception. Where eager raises at the line the capture raised a MinijitError standing for that very error
    (`minijit.errors.as_eager`: an op refusing its shapes), that error is raised: its message names the op. Where
    eager returns, the capture's error was minijit's own: a `TracingRaisedWarning` says so."""
    try:
        result = run()
    except BaseException as eager_error:
        if not _stands_for(raised, eager_error):
            raise
    else:
        error = raised.error
        warnings.warn(f"minijit: tracing {name} raised {type(error).__name__} ({error}){where(raised.at)}, but the "
                      "function returns without error when run eagerly: this call ran eagerly", TracingRaisedWarning,
                      stacklevel=6)  # the user's call, on the path of a first call
        return result
    raise raised.error


def _stands_for(raised: RaisedWhileTracing, eager_error: BaseException) -> bool:
    """Whether the capture's error stands for `eager_error`: eager's type, raised at the same line."""
    eager_type = getattr(type(raised.error), "eager_type", None)
    at = raised.at
    if eager_type is None or not isinstance(eager_error, eager_type) or at is None:
        return False
    return any(lineno == at.lineno and short_filename(frame.f_code.co_filename) == at.filename
               for frame, lineno in traceback.walk_tb(eager_error.__traceback__))


def describe(ops_in_try: Sequence[tuple[str, SourceLocation]]) -> str:
    """`torch.linalg.cholesky at f.py:12 (L = torch.linalg.cholesky(a))`, for each distinct op and line."""
    seen = dict.fromkeys(f"{op} at {where}" for op, where in ops_in_try)
    listed = list(seen)
    more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
    return "; ".join(listed[:3]) + more


@dataclass(frozen=True)
class Fallback:
    """How a call whose entry has ops inside a user's `try` (`ops_in_try`) turns an error they raise at run time into
    an eager run (`RaisedInTry`), or refuses where the entry writes into inputs (`writes_inputs`, their names)
    (the epilogue's `try`, minijit.runtime.epilogue). `random`: the entry draws random numbers, from torch's default
    generators and `generators`: set back before the eager run draws again."""

    ops_in_try: Sequence[tuple[str, SourceLocation]]
    writes_inputs: Sequence[str]
    random: bool
    generators: Sequence[torch.Generator] = ()

    def states(self) -> Any:
        """The random generators' states before the call, when it draws (else None)."""
        return (rng_states(), [g.get_state() for g in self.generators]) if self.random else None

    def instead(self, error: Exception, states: Any) -> Exception:
        """What to raise for `error`, raised by the compiled call (the generators put back to `states`)."""
        what = f"{type(error).__name__} at run time, with ops inside a try block ({describe(self.ops_in_try)})"
        if self.writes_inputs:
            return UnsupportedSyntaxError(
                f"the compiled call raised {what}; minijit cannot run the call eagerly instead because the "
                f"compiled call may already have written into its inputs ({', '.join(self.writes_inputs)}). Move "
                "the try block out of the jitted function, or leave the inputs unwritten")
        if states is not None:
            set_rng_states(states[0])
            for g, state in zip(self.generators, states[1], strict=True):
                g.set_state(state)
        return RaisedInTry(error, f"{what}: this call ran eagerly")


def rng_states() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def set_rng_states(states: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
