"""From a function and example arguments to a compiled trace: capture, then the passes in order."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.errors import AliasError
from minijit.frontend import interpret
from minijit.ir import Trace, tracing
from minijit.ir.context import recording_constraints
from minijit.runtime.autocast import any_autocast_enabled, without_autocast
from minijit.runtime.autograd import CompiledGrad, autograd_callable
from minijit.runtime.call_plan import CallPlan, finish_capture
from minijit.runtime.guards import compile_guard, drop_implied
from minijit.runtime.inputs import (
    alias_groups,
    alias_layout,
    alias_pattern,
    check_containers_unchanged,
    flat_inputs,
    proxify_arguments,
    snapshot_containers,
    synthetic_base_layout,
    tensor_capturer,
)
from minijit.runtime.module import ModuleForward
from minijit.transforms import check_copies, claim_executors, dce, functionalize, write_copies_in_place
from minijit.transforms.buffer_reuse import reuse_buffers
from minijit.transforms.copy_analysis import CHECK_COPIES
from minijit.transforms.functionalize import SyntheticBase
from minijit.transforms.grad import release_dead_values, requires_grad_inputs, split_forward_backward
from minijit.transforms.simplify import remove_cast_round_trips
from minijit.transforms.verify import TraceChecker, checking_traces


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
    # The backward traces, one per pass, when the entry differentiates (else empty).
    backward_traces: list[Trace] = field(default_factory=list)


def _timed(trace_fn: Callable[[], Trace], traces: list[Trace], check: TraceChecker | None) -> Trace:
    start = time.perf_counter()
    trace = trace_fn()
    trace.elapsed_ms = (time.perf_counter() - start) * 1e3
    traces.append(trace)
    if check is not None:
        check.check(trace)
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
    entry.guard = compile_guard(entry.traces[0], entry.constraints, entry.value_guards,
                                entry.traces[-1].info.get("alias_pattern"), call_plan(entry.traces[0]).captured,
                                entry.traces[-1].info.get("alias_layout", ()),
                                entry.traces[-1].info.get("alias_layout_also", ()))
    if any_autocast_enabled():
        # The trace holds the casts autocast made while it was captured; the cache key keeps
        # calls under another autocast state away from this entry.
        entry.computation = without_autocast(entry.computation)
    return entry


def _compile(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             executors: Sequence[Any], symbolic: bool) -> CompiledEntry:
    traces: list[Trace] = []
    check = TraceChecker() if checking_traces() else None

    def capture() -> Trace:
        trace = Trace(getattr(fn, "__name__", "computation").replace("<lambda>", "lambda_fn"))
        if not trace.fn_name.isidentifier():
            trace.fn_name = "computation"
        trace.capture_tensor = tensor_capturer(trace)
        trace.captures_user_code = True
        with tracing(trace):
            pargs, pkwargs = proxify_arguments(trace, fn, args, kwargs, symbolic)
            containers = snapshot_containers(fn, pargs, pkwargs)
            finish = functools.partial(finish_capture, trace, _describe_function(fn))
            if isinstance(fn, ModuleForward):
                params, _flags, *user_args = pargs
                with fn.swapped_in(params) as keyed:
                    trace.output = interpret(fn.module, tuple(user_args), pkwargs, guard_roots=fn.module.modules(),
                                             finish=finish, placed=params, keyed=keyed)
            else:
                trace.output = interpret(fn, pargs, pkwargs, finish=finish)
            check_containers_unchanged(containers)
        trace.capture_tensor = None
        trace.captures_user_code = False
        return trace

    # The passes, in order. Each is a pure Trace -> Trace function.
    trace = _timed(capture, traces, check)
    flat = flat_inputs(args, kwargs, symbolic) + [t for _, _, t in trace.info.get("captured_inputs", ())]
    trace = _timed(lambda: functionalize_for_call(trace, flat), traces, check)
    trace = _timed(lambda: dce(trace, keep_sizes=True), traces, check)  # the grad pass may save them
    trace = _timed(lambda: remove_cast_round_trips(trace), traces, check)

    if torch.is_grad_enabled() and requires_grad_inputs(trace):
        return _compile_with_grad(trace, traces, executors, check)

    trace = _timed(lambda: claim_executors(trace, executors), traces, check)
    trace = _timed(lambda: dce(trace), traces, check)
    trace = _timed(lambda: write_copies_in_place(trace, executors), traces, check)
    trace = _timed(lambda: reuse_buffers(trace, executors), traces, check)
    if CHECK_COPIES:
        check_copies(trace)

    start = time.perf_counter()
    computation = with_synthetic_bases(bumping_versions(trace.python_callable(), trace), trace)
    traces[-1].elapsed_ms += (time.perf_counter() - start) * 1e3
    return CompiledEntry(call_plan(traces[0]).wrap(computation), traces)


def _compile_with_grad(trace: Trace, traces: list[Trace], executors: Sequence[Any],
                       check: TraceChecker | None) -> CompiledEntry:
    """Grad is needed: split into forward and backward, run the passes on both, compile both."""
    start = time.perf_counter()
    fwd, bwd = split_forward_backward(trace, executors)
    fwd.elapsed_ms = bwd.elapsed_ms = (time.perf_counter() - start) * 1e3
    traces.append(fwd)
    bwd_traces = [bwd]
    if check is not None:
        check.check(fwd)
        check.check(bwd)
    bwd = _timed(lambda: remove_cast_round_trips(bwd), bwd_traces, check)
    positions = {p.name: i for i, p in enumerate(trace.args)}
    # A traced custom Function's backward may write into forward inputs.
    mutated_by_backward = tuple(positions[p.name] for b in bwd.bound_symbols if b.sym.effects.copies
                                for p in b.written() if p.name in positions)
    for passes, t in ((traces, fwd), (bwd_traces, bwd)):
        t = _timed(lambda t=t: dce(t), passes, check)
        t = _timed(lambda t=t: claim_executors(t, executors), passes, check)
        t = _timed(lambda t=t: dce(t), passes, check)
        if passes is traces or mutated_by_backward:
            t = _timed(lambda t=t: write_copies_in_place(t, executors), passes, check)
            # Only where the trace runs inside autograd.Function, with grad mode off: a forward
            # with nothing to differentiate runs as is, and `out=` refuses arguments requiring grad.
            if passes is bwd_traces or fwd.info["differentiable_outputs"] or fwd.info["dirty_inputs"]:
                t = _timed(lambda t=t: reuse_buffers(t, executors), passes, check)
            if CHECK_COPIES:
                check_copies(t)
        _timed(lambda t=t: release_dead_values(t), passes, check)
    compiled = CompiledGrad(
        forward=bumping_versions(traces[-1].python_callable(), traces[-1]),
        # A backward called under autocast must not cast again: its trace holds eager's casts.
        backward=without_autocast(bwd_traces[-1].python_callable()),
        differentiable_outputs=fwd.info["differentiable_outputs"],
        name=trace.fn_name,
        input_names=tuple(p.name for p in trace.args),
        dirty_inputs=fwd.info["dirty_inputs"],
        overwritten_saved=fwd.info["overwritten_saved"],
        backward_mutated_inputs=mutated_by_backward,
    )
    computation = with_synthetic_bases(autograd_callable(compiled), trace)
    return CompiledEntry(call_plan(trace).wrap(computation), traces, backward_traces=bwd_traces)



def _describe_function(fn: Any) -> str:
    """`name (file:line)` of the function being traced, for messages."""
    target = fn.module.forward if isinstance(fn, ModuleForward) else fn
    code = getattr(target, "__code__", None)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code is not None else name


def call_plan(trace: Trace) -> CallPlan:
    """The captured trace's `CallPlan`, with the tensors it captured from outside in input order."""
    plan: CallPlan = trace.info.get("call_plan") or CallPlan()
    plan.captured = [(source, t) for _, source, t in trace.info.get("captured_inputs", ())]
    return plan


def bumping_versions(computation: Callable[..., Any], trace: Trace) -> Callable[..., Any]:
    """`computation`, followed by a bump of the autograd version counter of each input it writes.

    Torch's own in-place ops bump it; a kernel writing memory directly (Triton, a custom
    executor) does not. Either way eager autograd must see the write (DESIGN.md, invariant 3):
    a node that saved the tensor then raises "modified by an inplace operation".
    """
    mutated = set(trace.info.get("mutated_inputs", ()))
    positions = [i for i, p in enumerate(trace.args) if p.name in mutated]
    if not positions:
        return computation
    bump = torch.autograd.graph.increment_version

    def run(*inputs: Any) -> Any:
        out = computation(*inputs)
        bump([inputs[i] for i in positions])
        return out

    return run


def with_synthetic_bases(computation: Callable[..., Any], trace: Trace) -> Callable[..., Any]:
    """`computation`, given after the call's inputs the synthetic base of each group of overlapping inputs.

    A base is the 1-D view of its storage's first elements, made from the group's first
    input (`functionalize`'s `SyntheticBase`); entries without one run `computation` as it is.
    """
    bases: list[tuple[int, int]] = trace.info.get("synthetic_bases", [])
    if not bases:
        return computation
    as_strided = torch.as_strided

    def run(*inputs: Any) -> Any:
        return computation(*inputs, *(as_strided(inputs[lead], (length,), (1,), 0) for lead, length in bases))

    return run


def functionalize_for_call(trace: Trace, flat: list[Any]) -> Trace:
    """`functionalize`, told which inputs of this call share memory (DESIGN.md, invariant 1).

    The same tensor passed twice (or identical views) is one memory that a write updates
    for every name; inputs that overlap differently (`t[1:3]` and `t[2:4]`, `t` and `t.t()`)
    are rebuilt, where the trace writes into one, as views of one synthetic base input.
    """
    identical, partial = alias_groups(flat)
    # Eager refuses in-place writes into leaves that require grad, not into other tensors that do.
    non_leaf = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.requires_grad and not x.is_leaf]
    functional = functionalize(trace, non_leaf_inputs=non_leaf)
    mutated = set(functional.info.get("mutated_inputs", ()))
    if not mutated:
        return functional  # aliasing cannot matter: the guard need not look at it
    # A written input that repeats elements (`o.expand(4, 4)`, which eager lets zero_ fill) is its own group.
    grouped = {i for group in identical + partial for i in group}
    partial = partial + [[i] for i, p in enumerate(trace.args) if i not in grouped and p.name in mutated
                         and isinstance(flat[i], torch.Tensor) and torch._debug_has_internal_overlap(flat[i]) == 1]
    bases = [_synthetic_base(trace, flat, group, mutated) for group in partial
             if any(trace.args[i].name in mutated for i in group)]
    if identical or bases:
        # Functionalized for this aliasing only: the guard below keeps other calls away.
        functional = functionalize(trace, input_aliases=identical, non_leaf_inputs=non_leaf, synthetic_bases=bases)
        functional.info["synthetic_bases"] = [(b.members[0], b.length) for b in bases]
    functional.info["alias_pattern"] = alias_pattern(*flat)
    functional.info["alias_layout_also"] = tuple(b.members[0] for b in bases if len(b.members) == 1)
    functional.info["alias_layout"] = alias_layout(*flat, also=functional.info["alias_layout_also"])
    return functional


def _synthetic_base(trace: Trace, flat: list[Any], group: list[int], mutated: set[str]) -> SyntheticBase:
    """The synthetic base of inputs that overlap in memory without being the same view; AliasError where unsupported."""
    names = [trace.args[i].name for i in group]
    written = next(n for n in names if n in mutated)
    tensors = [flat[i] for i in group]
    why = None
    if len({t.dtype for t in tensors}) > 1:
        why = "they view it with different dtypes"
    elif torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        why = "one of them requires grad (the gradient through the shared memory is not supported)"
    elif any(type(d) is not int for i in group for d in trace.args[i].shape):
        why = "their sizes are symbolic (cache='symbolic values')"
    if why is not None:
        raise AliasError(
            f"inputs {', '.join(names)} overlap in memory without being the same view, and the function writes "
            f"into {written} in place; minijit cannot rebuild them from their common storage because {why}. "
            "Pass a clone of one of them"
        )
    length, layouts = synthetic_base_layout(flat, group)
    return SyntheticBase(tuple(group), layouts, length)
