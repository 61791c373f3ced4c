"""From a function and example arguments to a compiled trace: capture, then the passes in order."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minijit.frontend import interpret
from minijit.ir import Trace, tracing
from minijit.ir.context import recording_constraints
from minijit.runtime.guards import compile_guard, drop_implied
from minijit.runtime.inputs import proxify_arguments, tensor_capturer
from minijit.runtime.module import ModuleForward
from minijit.transforms import claim_executors, dce


@dataclass
class CompiledEntry:
    """One cache entry: the compiled computation and the traces that led to it."""

    computation: Callable[..., Any]
    traces: list[Trace] = field(default_factory=list)
    # The checks a call must pass to use this entry, as Python source (for minijit.show).
    prologue: str = ""
    # "symbolic values" mode: a function of the flat inputs checking the trace's constraints.
    # A function of the flat inputs that is True when the trace still holds for them: the
    # constraints on symbolic values, and the values (globals, closures) the trace read. None
    # when there is nothing to check beyond the cache key.
    guard: Callable[..., bool] | None = None
    constraints: list[str] = field(default_factory=list)
    value_guards: list[Any] = field(default_factory=list)


def _timed(trace_fn: Callable[[], Trace], traces: list[Trace]) -> Trace:
    start = time.perf_counter()
    trace = trace_fn()
    trace.elapsed_ms = (time.perf_counter() - start) * 1e3
    traces.append(trace)
    return trace


def compile_for(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                executors: Sequence[Any], symbolic: bool = False) -> CompiledEntry:
    """Capture `fn` on proxies of `args`, run the passes, and compile the final trace.

    With `symbolic`, sizes and Python numbers are traced as symbolic values, and the
    entry's guard checks the constraints the trace relied on.
    """
    with recording_constraints() as constraints:
        entry = _compile(fn, args, kwargs, executors, symbolic)
    entry.constraints = drop_implied(constraints)
    entry.value_guards = list(entry.traces[0].info.get("guards", ()))
    entry.guard = compile_guard(entry.traces[0], entry.constraints, entry.value_guards)
    return entry


def _compile(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             executors: Sequence[Any], symbolic: bool) -> CompiledEntry:
    traces: list[Trace] = []

    def capture() -> Trace:
        trace = Trace(getattr(fn, "__name__", "computation").replace("<lambda>", "lambda_fn"))
        if not trace.fn_name.isidentifier():
            trace.fn_name = "computation"
        trace.capture_tensor = tensor_capturer(trace)
        with tracing(trace):
            pargs, pkwargs = proxify_arguments(trace, fn, args, kwargs, symbolic)
            if isinstance(fn, ModuleForward):
                params, _flags, *user_args = pargs
                with fn.swapped_in(params):
                    trace.output = interpret(fn.module, tuple(user_args), pkwargs, guard_roots=fn.module.modules())
            else:
                trace.output = interpret(fn, pargs, pkwargs)
        trace.capture_tensor = None
        return trace

    # The passes, in order. Each is a pure Trace -> Trace function.
    trace = _timed(capture, traces)
    trace = _timed(lambda: dce(trace), traces)
    trace = _timed(lambda: claim_executors(trace, executors), traces)
    trace = _timed(lambda: dce(trace), traces)

    start = time.perf_counter()
    computation = trace.python_callable()
    traces[-1].elapsed_ms += (time.perf_counter() - start) * 1e3
    return CompiledEntry(computation, traces)
