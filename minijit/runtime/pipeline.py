"""From a function and example arguments to a compiled trace: capture, then the passes in order."""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from minijit import environment
from minijit.errors import EnvironmentVariableError, UnsupportedSyntaxError
from minijit.extend import resolve_executors
from minijit.frontend import GuardEntry, interpret
from minijit.frontend.folding import fresh_folded
from minijit.frontend.guards import Source, TensorSeen
from minijit.frontend.interpreter import Escaped
from minijit.frontend.outside import Outside
from minijit.frontend.try_blocks import user_try_location
from minijit.ir import CaptureState, Trace, tracing
from minijit.ir.context import (
    guarding_layouts,
    knowing_constraints,
    noting_state_reads,
    reading_values,
    recording_constraints,
    running_pass,
)
from minijit.ir.rewrite import rewrite
from minijit.ir.symbol import SourceLocation
from minijit.ops import prims
from minijit.runtime.arguments import (
    AliasPlan,
    ArgumentContainers,
    CallArguments,
    InputAliasing,
    functionalize_for_call,
    object_arguments,
    plan_aliasing,
    read_arguments,
)
from minijit.runtime.autocast import any_autocast_enabled, no_autocast
from minijit.runtime.autograd import CompiledGrad
from minijit.runtime.call_plan import CallPlan, finish_capture
from minijit.runtime.checks import Prologue
from minijit.runtime.cuda_graphs import GraphedCallable, GraphFamily, graph_refusal
from minijit.runtime.double_backward import Recompute, SavedBackward, recompute_for
from minijit.runtime.dynamic import DynamicNumbers, StateSizes
from minijit.runtime.epilogue import Epilogue, around
from minijit.runtime.fallback import Fallback, RaisedWhileTracing
from minijit.runtime.guards import compile_prologue, drop_implied
from minijit.runtime.inputs import number_capturer, tensor_capturer
from minijit.runtime.iterators import refuse_escaping
from minijit.runtime.module_forward import ModuleForward
from minijit.runtime.values import (
    ValueCheck,
    ValueReader,
    check_writes_after_checks,
    value_path,
)
from minijit.transforms import check_copies, claim_executors, dce, write_copies_in_place
from minijit.transforms.buffer_reuse import reuse_buffers
from minijit.transforms.functionalize import FunctionalizeResult
from minijit.transforms.grad import SplitResult, release_dead_values, requires_grad_inputs, split_forward_backward
from minijit.transforms.grouping import group_calls
from minijit.transforms.inline_grad import (
    expand_inline_grads,
    has_inline_grads,
    refuse_made_leaves,
    refuse_outputs_requiring_grad,
)
from minijit.transforms.simplify import simplify
from minijit.transforms.verify import CheckLevel, TraceChecker, check_level, checking_traces


@dataclass
class CaptureResult:
    """What capturing the function found besides its trace."""

    # The values the code read from outside the call (globals, closures, attributes), for the guard.
    guards: list[GuardEntry] = field(default_factory=list)
    # Tensors read from outside the call, trace inputs after the call's own: (input name, source, tensor seen);
    # once the entry is compiled, only the tensor's metadata (`forget_tensors`). Numbers read from dynamic
    # sources (minijit.runtime.dynamic) are inputs among them: (input name, source, the number seen).
    captured_inputs: list[tuple[str, Source, torch.Tensor | TensorSeen | int | float]] = field(default_factory=list)
    # Names of the captured tensors traced with symbolic sizes (the guard checks their rank and constraints).
    symbolic_captured: set[str] = field(default_factory=set)
    # The sizes of the captured state tensors read from objects, by input name, as traced (symbolic ones None;
    # minijit.runtime.inputs.tensor_capturer)
    state_sizes: dict[str, StateSizes] = field(default_factory=dict)
    # Tensors made while tracing that the trace holds as constants (kept alive with the entry).
    constants: list[torch.Tensor] = field(default_factory=list)
    # Names of the values computed under torch.no_grad(): constants for grad, free to write into leaves.
    no_grad: frozenset[str] = frozenset()
    # Names of the results of in-place ops run under torch.no_grad(): the tensors they wrote, whose history stays.
    no_grad_writes: frozenset[str] = frozenset()
    # (op, why its decomposition declined the call) for each op recorded as an opaque torch call instead.
    declined: list[tuple[str, str]] = field(default_factory=list)
    # How each call fetches the captured tensors, replays the effects and rebuilds the result.
    call_plan: CallPlan = field(default_factory=CallPlan)
    # The values the code read from its tensors (`if x.sum() > 0`), in order: the trace checks each.
    value_checks: list[ValueCheck] = field(default_factory=list)
    # (input name, input name, whether one tensor object) for each `a is b` on two trace inputs (CaptureState).
    identities: list[tuple[str, str, bool]] = field(default_factory=list)
    # (op, the user's line) for each op recorded inside a user's `try` whose `except` may catch its error.
    ops_in_try: list[tuple[str, SourceLocation]] = field(default_factory=list)
    # argument position -> how many items the code took from the iterator passed there (minijit.runtime.iterators).
    iterators_consumed: dict[int, int] = field(default_factory=dict)
    # The leaves requiring grad the code made itself (`x.detach().requires_grad_()`; CaptureState.made_leaves).
    made_leaves: list[Any] = field(default_factory=list)

    def forget_tensors(self) -> None:
        """Keep only the metadata of the tensors read from outside: every call reads them again from their
        sources, and the entry must not keep alive a tensor the user let go (a global rebound to a new one)."""
        self.captured_inputs = [(name, source, TensorSeen.of(t) if isinstance(t, torch.Tensor) else t)
                                for name, source, t in self.captured_inputs]
        self.call_plan.forget_tensors()


@dataclass
class CompiledEntry:
    """One cache entry: the compiled computation, the traces that led to it, and what the passes found."""

    computation: Callable[..., Any]
    traces: list[Trace] = field(default_factory=list)
    capture: CaptureResult = field(default_factory=CaptureResult)
    functionalized: FunctionalizeResult = field(default_factory=FunctionalizeResult)
    # How the inputs of the call the trace was functionalized for share memory, when it writes
    # into inputs; None when aliasing cannot matter.
    aliasing: InputAliasing | None = None
    # The forward/backward split's facts, when the entry differentiates.
    split: SplitResult | None = None
    # The checks a call must pass to use this entry, compiled from one source (minijit.runtime.checks).
    prologue: Prologue | None = None
    # The prologue's guard: a function of the flat inputs that is True when the trace still holds
    # for them: the constraints on symbolic values, the values (globals, closures) the trace read,
    # captured tensors, aliasing. None when there is nothing to check beyond the cache key.
    guard: Callable[..., bool] | None = None
    constraints: list[str] = field(default_factory=list)
    # The backward traces, one per pass, when the entry differentiates (else empty).
    backward_traces: list[Trace] = field(default_factory=list)
    # The hit path's first try (minijit.runtime.cache_key.exact_tensor_check): True for plain tensors with
    # exactly the metadata of the call that made the entry; set by the runtime where such a check exists.
    exact_check: Callable[..., bool] | None = None
    exact_arity: int = -1
    exact_guard: Callable[..., bool] | None = None  # the guard for such a call (the prologue's exact_guard)

    @property
    def value_path(self) -> tuple[Any, ...]:
        """The values this entry's trace checks, in the order the code read them (minijit.runtime.values)."""
        return value_path(self.capture.value_checks)
    # What a call runs around the compiled trace, generated and printed (minijit.runtime.epilogue), and the
    # (subject, object) of the arguments specialised on by identity: what `rebind` needs.
    epilogue: Epilogue | None = None
    arg_objects: list[tuple[str, Any]] = field(default_factory=list)
    # With jit(cuda_graphs=True): the entry's graphed callables and how their calls ran.
    graphs: GraphFamily | None = None


@dataclass(frozen=True)
class NeedsPins:
    """What `_compile` returns instead of an entry where written inputs that share memory were traced with
    symbolic sizes: the compile must capture again with the sizes of the inputs at `positions` constant."""

    positions: frozenset[int]


@dataclass
class Compile:
    """One compile: what its passes are given, and what they found (for the passes after them and the entry)."""

    arguments: CallArguments
    constraints: list[str]  # the capture's; the split and the expansion of inline grads add theirs
    # The checker of this compile's traces, with MINIJIT_CHECK_TRACES=1 (it keeps what it learnt between traces).
    checker: TraceChecker | None
    found: CaptureResult = field(default_factory=CaptureResult)
    plan: AliasPlan = field(default_factory=lambda: AliasPlan(written=()))  # how to functionalize, needing no pins
    # The trace after each pass: the whole trace's then the forward's, and the backward's.
    traces: list[Trace] = field(default_factory=list)
    backward_traces: list[Trace] = field(default_factory=list)
    functionalized: FunctionalizeResult = field(default_factory=FunctionalizeResult)
    aliasing: InputAliasing | None = None
    # The split's facts, how a double backward recomputes, and the positions of the forward's inputs the
    # backward writes (a traced custom Function's backward may).
    split: SplitResult | None = None
    recompute: Recompute | None = None
    backward_writes: tuple[int, ...] = ()

    @property
    def no_grad(self) -> frozenset[str]:
        """The names of the values computed without grad (constants for grad), once functionalized."""
        return self.found.no_grad | self.functionalized.made_without_grad


@dataclass(frozen=True)
class PassContext:
    """What a pass or a check is given besides its trace: its compile, and the facts its condition asks."""

    # "computation" (the whole trace: without grad, or before the split), "forward" or "backward" (its halves).
    part: str
    executors: Sequence[Any]
    compile: Compile
    # Whether the trace may write into the call's inputs: every trace but a backward, which writes
    # into inputs of the forward only where a traced custom Function's backward does.
    writes_inputs: bool = True
    # Whether the forward runs inside autograd.Function with grad mode off: it has outputs to
    # differentiate or inputs it writes that are marked dirty.
    in_function: bool = False
    # Whether the trace takes gradients itself (a whole training step): a backward inside it, whose many
    # intermediates should die as early as a split backward's do.
    inline_grads: bool = False
    # Whether the whole trace is split into forward and backward: grad mode is on, an input requires grad,
    # and the code took no gradients itself.
    differentiates: bool = False
    # For the checks: the pass was the last of this trace's passes that decide how it writes memory (`Pass.writes`).
    writes_settled: bool = False

    @property
    def traces(self) -> list[Trace]:
        """Where the traces of this part are kept: the backward's, or the others'."""
        return self.compile.backward_traces if self.part == "backward" else self.compile.traces


# What a pass that splits its trace returns: each part with its context, which the passes after it run on.
Parts = tuple[tuple[Trace, PassContext], ...]


@dataclass(frozen=True)
class Pass:
    """One step run on a trace where its condition on the context holds: an entry of the pass list, which returns
    the next trace (or the parts a split makes), or a check run after each pass, which returns None or raises."""

    name: str
    run: Callable[[Trace, PassContext], Trace | Parts | None]
    when: Callable[[PassContext], bool] = lambda ctx: True
    # The pass decides how the trace writes memory: the checks of those writes run after the last such pass.
    writes: bool = False


def _verify(trace: Trace, ctx: PassContext) -> None:
    assert ctx.compile.checker is not None
    ctx.compile.checker.check(trace)


# The checks after each pass (capture's too), in order: the verifier (minijit.transforms.verify) after every pass
# with MINIJIT_CHECK_TRACES=1, and once a trace's writes are settled, its rule `check_copies` (unless
# MINIJIT_CHECK_TRACES=0) and the check that no input is written before a value check.
AFTER_PASS: tuple[Pass, ...] = (
    Pass("verify", _verify, lambda ctx: ctx.compile.checker is not None),
    Pass("check copies", lambda t, ctx: check_copies(t), lambda ctx: ctx.writes_settled and check_level() is not CheckLevel.OFF),
    Pass("check writes after checks", lambda t, ctx: check_writes_after_checks(t), lambda ctx: ctx.writes_settled),
)


def _keep(trace: Trace, elapsed_ms: float, ctx: PassContext) -> Trace:
    """`trace`, the trace a pass just made in `elapsed_ms`, timed, kept with its part's and checked by `AFTER_PASS`."""
    trace.elapsed_ms = elapsed_ms
    ctx.traces.append(trace)
    for check in AFTER_PASS:
        if check.when(ctx):
            with running_pass(check.name):
                check.run(trace, ctx)
    return trace


def _functionalize(trace: Trace, ctx: PassContext) -> Trace:
    c = ctx.compile
    captured = [t for _, _, t in c.found.captured_inputs]
    trace, c.functionalized, c.aliasing = c.arguments.functionalize(trace, captured, c.plan,
                                                                    c.found.no_grad | c.found.no_grad_writes)
    return trace


def _expand_inline_grads(trace: Trace, ctx: PassContext) -> Trace:
    # The code took gradients itself (`loss.backward()`): they are values of this one trace, which then runs
    # without autograd (docs/design.md: "A whole training step in one trace").
    with recording_constraints(ctx.compile.constraints):
        return expand_inline_grads(trace, ctx.executors, ctx.compile.no_grad)


def _split(trace: Trace, ctx: PassContext) -> Parts:
    """The forward and the backward of `trace`, each with its context; the split's facts kept in the compile."""
    c = ctx.compile
    # The VJP rules choose the backward's ops by the sizes (a slice's padding, a broadcast's sum),
    # as capture chose the forward's: their comparisons are guarded like the capture's.
    c.recompute = recompute_for(trace, trace.fn_name, c.no_grad, c.functionalized.mutated_inputs)
    with recording_constraints(c.constraints):
        fwd, bwd, c.split = split_forward_backward(trace, ctx.executors, c.no_grad, c.functionalized.inplace_originals,
                                                   c.functionalized.written_with_grad,
                                                   double_backward=c.recompute.refusal is None)
    positions = {p.name: i for i, p in enumerate(trace.args)}
    c.backward_writes = tuple(positions[p.name] for b in bwd.bound_symbols if b.sym.effects.copies
                              for p in b.written() if p.name in positions)
    return ((fwd, replace(ctx, part="forward", in_function=bool(c.split.differentiable_outputs or c.split.dirty_inputs))),
            (bwd, replace(ctx, part="backward", writes_inputs=bool(c.backward_writes))))


def _half(ctx: PassContext) -> bool:
    return ctx.part != "computation"


def _reuses_buffers(ctx: PassContext) -> bool:
    # Only where the trace runs with grad mode off (no grad, or inside autograd.Function): a forward
    # with nothing to differentiate runs as is, and `out=` refuses arguments requiring grad.
    return ctx.writes_inputs and (ctx.part != "forward" or ctx.in_function)


# The whole compile after capture, in order: each entry runs where its condition holds; after the split, the
# entries after it run on the forward, then on the backward. The names here are the module's (tests replace `dce`).
PASSES: tuple[Pass, ...] = (
    Pass("functionalize", _functionalize),
    Pass("dce", lambda t, ctx: dce(t, keep_sizes=True)),  # the grad pass may save them
    Pass("simplify", lambda t, ctx: simplify(t)),
    Pass("expand inline gradients", _expand_inline_grads, lambda ctx: ctx.inline_grads),
    Pass("split forward/backward", _split, lambda ctx: ctx.differentiates),
    Pass("simplify", lambda t, ctx: simplify(t), lambda ctx: ctx.part == "backward"),
    Pass("dce", lambda t, ctx: dce(t), _half),  # what the split left dead
    Pass("claim executors", lambda t, ctx: claim_executors(t, ctx.executors)),
    Pass("dce", lambda t, ctx: dce(t)),
    Pass("write copies in place", lambda t, ctx: write_copies_in_place(t, ctx.executors),
         lambda ctx: ctx.writes_inputs, writes=True),
    Pass("reuse buffers", lambda t, ctx: reuse_buffers(t, ctx.executors), _reuses_buffers, writes=True),
    # (not on a backward: an optimizer step is a forward where its parameters require grad, a backward gains little)
    Pass("group calls", lambda t, ctx: group_calls(t, ctx.executors), lambda ctx: ctx.part != "backward",
         writes=True),
    Pass("release dead values", lambda t, ctx: release_dead_values(t), lambda ctx: _half(ctx) or ctx.inline_grads),
)


def run_passes(trace: Trace, ctx: PassContext, passes: Sequence[Pass]) -> None:
    """Run on `trace` the entries of `passes` whose condition holds for `ctx`, in order, each trace kept and
    checked (`_keep`); where an entry splits the trace, the entries after it run on each part, in its context."""
    for i, p in enumerate(passes):
        if not p.when(ctx):
            continue
        later = passes[i + 1:]
        start = time.perf_counter()
        with running_pass(p.name):
            made = p.run(trace, ctx)
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if isinstance(made, Trace):
            settled = p.writes and not any(q.writes and q.when(ctx) for q in later)
            trace = _keep(made, elapsed_ms, replace(ctx, writes_settled=settled))
            continue
        assert made is not None, f"the pass {p.name} made no trace"
        for part, part_ctx in made:
            _keep(part, elapsed_ms, part_ctx)
        for part, part_ctx in made:
            run_passes(part, part_ctx, later)
        return


def compile_for(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                executors: Sequence[Any], symbolic: bool = False, cuda_graphs: bool = False,
                numbers: DynamicNumbers | None = None,
                constant_sizes: Sequence[tuple[int | None, ...]] | None = None,
                state_sizes: Mapping[str, StateSizes] | None = None) -> CompiledEntry:
    """Capture `fn` on proxies of `args`, run the passes, and compile the final trace.

    With `symbolic`, sizes and Python numbers are traced as symbolic values, and the
    entry's guard checks the constraints the trace relied on; `constant_sizes`, per tensor argument,
    gives the sizes kept constant as ints (`CallArguments.proxify`); `state_sizes`, per state tensor read from an
    object, those of the trace before (only those that differ become symbolic: `tensor_capturer`). With `cuda_graphs`, the
    compiled traces replay from CUDA graphs where they can (minijit.runtime.cuda_graphs).
    Numbers read from outside at the dynamic sources of `numbers` are symbolic inputs of the
    trace, read afresh on every call (minijit.runtime.dynamic).
    """
    arguments = read_arguments(fn, args, kwargs, symbolic)  # before the traced code runs: it might change one
    # The capture records the constraints; the passes after it may rely on them, recording none but
    # the layout checks a decision on an input's strides needs (functionalizing `reshape`).
    pinned: frozenset[int] = frozenset()
    while True:
        constraints: list[str] = []
        state_reads: dict[str, Callable[[], Any]] = {}
        with knowing_constraints(constraints), guarding_layouts(constraints), noting_state_reads(state_reads):
            entry = _compile(arguments, executors, constraints, pinned, cuda_graphs, numbers, constant_sizes,
                             state_sizes)
        if not isinstance(entry, NeedsPins):
            break
        # Written inputs that share memory are rebuilt from their storage by their concrete layouts:
        # traced again with those inputs' sizes constant, the rest symbolic (the set only grows).
        assert not entry.positions <= pinned, f"inputs at {sorted(entry.positions)} were pinned already"
        pinned |= entry.positions
    # Read now, back in the call's state (the traced code may have changed it inside `with` blocks).
    constraints += [f"{expr} == {query()!r}" for expr, query in state_reads.items()]
    entry.constraints = drop_implied(constraints)
    _dump_traces(entry)
    entry.arg_objects = object_arguments(arguments.params, arguments.checks, args, kwargs)
    entry.capture.forget_tensors()
    entry.prologue = compile_prologue(entry, (arguments.params, arguments.checks), tuple(kwargs), entry.constraints)
    entry.guard = entry.prologue.guard
    return entry


def _dump_traces(entry: CompiledEntry) -> None:
    """With MINIJIT_DUMP_TRACES=<dir>, append the final traces' source to a file per pytest test in <dir>.

    A debugging aid: two runs of the same tests give byte-identical dumps unless a change altered the traces.
    """
    folder = environment.dump_traces_folder()
    if not folder:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)[-200:] or "other"
    text = entry.traces[-1].python() + "\n"
    if entry.backward_traces:
        text += entry.backward_traces[-1].python() + "\n"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name + ".py.txt"), "a") as f:
            f.write(text)
    except OSError as e:
        raise EnvironmentVariableError(f"MINIJIT_DUMP_TRACES={folder!r}: cannot write traces there ({e})") from e


def _compile(arguments: CallArguments, executors: Sequence[Any], constraints: list[str],
             pinned: frozenset[int] = frozenset(), cuda_graphs: bool = False,
             numbers: DynamicNumbers | None = None,
             constant_sizes: Sequence[tuple[int | None, ...]] | None = None,
             state_sizes: Mapping[str, StateSizes] | None = None) -> CompiledEntry | NeedsPins:
    """Capture, then the passes, then the compiled entry; `NeedsPins` where the capture must be redone with more
    input sizes constant (decided from the call's inputs and the inputs the captured trace writes)."""
    fn, symbolic = arguments.fn, arguments.symbolic
    c = Compile(arguments, constraints, TraceChecker() if checking_traces() else None)
    ctx = PassContext("computation", executors, c)

    def capture() -> tuple[Trace, CaptureResult]:
        trace = Trace(getattr(fn, "__name__", "computation").replace("<lambda>", "lambda_fn"))
        if not trace.fn_name.isidentifier():
            trace.fn_name = "computation"
        found = CaptureResult()
        state = trace.capture = CaptureState(
            capture_tensor=tensor_capturer(trace, found.captured_inputs, found.constants, symbolic, pinned,
                                           found.symbolic_captured, state_sizes, found.state_sizes),
            captures_user_code=True, try_probe=user_try_location,
            numbers_stay_tensors=cuda_graphs or any(getattr(e, "numbers_stay_tensors", False) for e in executors),
            capture_number=number_capturer(trace, found.captured_inputs, numbers) if numbers and numbers.sources
            else None)

        def finish(result: Any, outside: Outside) -> Any:
            # A list or dict argument the code changed: its new contents go back into the caller's, every call.
            containers.replay_changes(outside.effects)
            found.iterators_consumed = containers.iterators_consumed()
            if found.iterators_consumed:
                refuse_escaping(result, "the result")
                for effect in outside.effects:
                    refuse_escaping(effect.value, f"a value stored outside the call ({effect.describe()})")
            result = fresh_folded(result)
            for effect in outside.effects:
                effect.value = fresh_folded(effect.value)
            output, found.call_plan = finish_capture(trace, _describe_function(fn), result, outside)
            return output

        reader = ValueReader(trace, lambda: arguments.flat + [t for _, _, t in found.captured_inputs], _evaluate_prefix)
        escaped: list[Escaped] = []
        containers = None
        grad_mode = torch.is_grad_enabled()
        try:
            with tracing(trace), recording_constraints(constraints), reading_values(reader):
                pargs, pkwargs = arguments.proxify(trace, pinned, constant_sizes)
                own = trace.args[: len(arguments.flat)]
                state.arguments = {p.name: t for p, t in zip(own, arguments.flat) if isinstance(t, torch.Tensor)}
                containers = arguments.snapshot_containers(pargs, pkwargs)
                if isinstance(fn, ModuleForward):
                    params, _flags, *user_args = pargs
                    trace.output = interpret(fn.module, tuple(user_args), pkwargs, guard_roots=fn.module.modules(),
                                             finish=finish, view=fn.tracing_view(params), guards=found.guards,
                                             escaped=escaped)
                else:
                    trace.output = interpret(fn, pargs, pkwargs, finish=finish, guards=found.guards, escaped=escaped)
                containers.check_unchanged()
        except BaseException as error:
            # The traced code switches grad mode for real; a raise between its switches (Dynamo's graphs call
            # `torch._C._set_grad_enabled(False)` and later `(True)`, with no `with` to undo it) must not leave it so.
            torch.set_grad_enabled(grad_mode)
            if escaped and escaped[0].error is error and _runs_eagerly(escaped[0], trace, containers):
                raise RaisedWhileTracing(error, escaped[0].where) from error
            raise
        trace.capture = None
        found.ops_in_try = list(state.ops_in_try)
        found.no_grad = frozenset(state.recorded_without_grad)
        found.no_grad_writes = frozenset(state.written_without_grad)
        found.declined = list(state.declined)
        found.call_plan.captured = [(source, t) for _, source, t in found.captured_inputs]
        found.call_plan.inputs = [p.name for p in trace.args[: len(arguments.flat)]]
        found.made_leaves = [leaf for leaf, _ in state.made_leaves.values()]
        found.value_checks = reader.checks
        found.identities = list(dict.fromkeys(state.identities))
        return trace, found

    start = time.perf_counter()
    trace, c.found = capture()
    _keep(trace, (time.perf_counter() - start) * 1e3, ctx)
    found = c.found
    inline_grads, grad_inputs = has_inline_grads(trace), bool(requires_grad_inputs(trace))
    refuse_made_leaves(trace, trace.output, found.made_leaves, inline_grads or not torch.is_grad_enabled() or grad_inputs,
                       found.no_grad | found.no_grad_writes)
    if inline_grads:
        split_output = found.call_plan.effects or found.call_plan.result is not None
        refuse_outputs_requiring_grad(trace, trace.output[0] if split_output else trace.output,
                                      found.no_grad | found.no_grad_writes)
    # Which inputs the trace writes, and how they share memory, decide how it is functionalized (once).
    c.plan = arguments.plan_aliasing(trace, [t for _, _, t in found.captured_inputs])
    if c.plan.pins:
        return NeedsPins(c.plan.pins)
    # The passes, in order: each a pure function of its input trace, some keeping what they found in `c`.
    # (Functionalizing adds no input requiring grad: a synthetic base is refused where one would be needed.)
    differentiates = torch.is_grad_enabled() and grad_inputs and not inline_grads
    run_passes(trace, replace(ctx, inline_grads=inline_grads, differentiates=differentiates), PASSES)
    records = dict(capture=found, functionalized=c.functionalized, aliasing=c.aliasing)
    family = GraphFamily() if cuda_graphs else None
    start = time.perf_counter()
    epilogue = _epilogue(c, family, inline_grads)
    c.traces[-1].elapsed_ms += (time.perf_counter() - start) * 1e3
    # The entry keeps the split's facts; the second backward's trace lives in the saved_backward alone.
    split = replace(c.split, second_backward=None) if c.split is not None else None
    return CompiledEntry(epilogue.function, c.traces, **records, split=split, backward_traces=c.backward_traces,
                         epilogue=epilogue, graphs=family)


def _bases(c: Compile) -> tuple[tuple[int, int], ...]:
    return c.aliasing.synthetic_bases if c.aliasing is not None else ()


def _guarding(c: Compile) -> dict[str, Any]:
    """What the epilogue guards the call with: the generators put back where a value check fails after the trace
    drew, and the eager fallback of ops in a user's `try`, which may raise at run time on other data."""
    found, fallback = c.found, None
    if found.ops_in_try:
        draws = [b for b in c.traces[0].bound_symbols if b.sym.effects.random]
        generators = list({id(g): g for b in draws if isinstance(g := b.kwargs.get("generator"), torch.Generator)
                           }.values())
        fallback = Fallback(found.ops_in_try, c.functionalized.mutated_inputs, bool(draws), generators)
    restore_rng = bool(found.value_checks) and any(b.sym.effects.random for t in c.traces for b in t.bound_symbols)
    return dict(restore_rng=restore_rng, fallback=fallback)


def _epilogue(c: Compile, family: GraphFamily | None, inline_grads: bool) -> Epilogue:
    """The call of a compile: its compiled trace with what runs around it; where it split its trace, the forward,
    joined to the compiled backward by an autograd.Function generated with the rest of the call."""
    trace, mutated, split = c.traces[-1], c.functionalized.mutated_inputs, c.split is not None
    computation = graphed(trace.python_callable(), trace, family, "forward" if split else "computation", mutated,
                          saved_from=split)
    # A trace that took its gradients itself needs no autograd: it runs with grad mode off.
    body = around([p.name for p in trace.args], mutated, c.functionalized.write_sites, no_grad=inline_grads)
    return Epilogue(trace.fn_name, computation, body, c.found.call_plan, _bases(c), any_autocast_enabled(),
                    _compiled_grad(c, family) if split else None, **_guarding(c))


def _runs_eagerly(escaped: Escaped, trace: Trace, containers: ArgumentContainers | None) -> bool:
    """Whether the call whose code raised `escaped` while traced runs eagerly (minijit.runtime.fallback).

    The code's own exception does: eager makes the writes and effects before it. A MinijitError standing for
    eager's error (an op refusing its shapes) may also be minijit's own limitation, which eager does not share:
    raised as it is where the capture so far made nothing eager would have shown (a write into a tensor, a draw,
    a write into an object from outside or a print, a change to a container or iterator argument), else run
    eagerly too. (A write made in a traced `autograd.Function` whose forward raised is not seen.)
    """
    if getattr(type(escaped.error), "eager_type", None) is None:
        return True
    return (escaped.wrote_outside or (containers is not None and containers.changed())
            or any(b.written() or b.sym.effects.random for b in trace.bound_symbols))


def _compiled_grad(c: Compile, family: GraphFamily | None) -> CompiledGrad:
    """The compiled backward of a compile that split its trace, and how it meets the forward (runtime/autograd.py)."""
    assert c.split is not None and c.recompute is not None
    split, bwd = c.split, c.backward_traces[-1]
    backward = graphed(bwd.python_callable(), bwd, family, "backward", (),
                       refusal="the backward writes into inputs of the forward" if c.backward_writes else None)
    # A double backward runs from the saved values (runtime/double_backward.py) where they carry their history, and
    # never where a recompute is refused: a traced custom Function's backward or writes into inputs, whose backward
    # run again as eager ops would not be eager's either.
    saved_backward = (None if c.recompute.refusal is not None or split.saved_inputs_with_history is None
                      else SavedBackward(c.backward_traces[0], split.saved_inputs_with_history, split.first_order_saved,
                                         split.hidden_saved, split.second_backward, split.second_saved))
    return CompiledGrad(backward, split.differentiable_outputs, c.recompute, split.dirty_inputs,
                        split.overwritten_saved, c.backward_writes, saved_backward, split.first_order_saved)


def _evaluate_prefix(prefix: Trace, flat: list[Any], no_grad: frozenset[str]) -> Any:
    """Run `prefix`, the part of a capture recorded so far with the proxy to read as its output, on the
    call's real inputs (`flat`): functionalized, without its writes into inputs, by the torch executor.
    `no_grad`: the names the capture recorded or wrote under torch.no_grad() so far.

    Where the prefix writes into inputs that share memory and have symbolic sizes, its functional form cannot be
    made (it rebuilds those inputs from their storage at concrete sizes, which cannot mix with the symbolic sizes
    the prefix holds); the capture goes on, and is redone with those sizes constant once it ends (`_compile`
    returns `NeedsPins`). The value is then eager's own: the prefix as recorded, on copies (`_run_on_copies`).
    """
    plan = plan_aliasing(prefix, flat)
    if plan.pins:
        return _run_on_copies(prefix, flat, plan.written)
    functional, _, aliasing = functionalize_for_call(prefix, flat, no_grad, plan)
    # Without functionalize's write-backs.
    functional = dce(rewrite(functional, lambda b, env: () if b.sym is prims.copy_to_out_ else None,
                             pass_name="value read"))
    took_grads = has_inline_grads(functional)
    if took_grads:  # gradients the code took so far (`scaler.step` reads them for infs)
        functional = expand_inline_grads(functional, (), no_grad)
    run = claim_executors(functional, resolve_executors(["torch"])).python_callable()
    bases = aliasing.synthetic_bases if aliasing is not None else ()
    inputs = [*flat, *(torch.as_strided(flat[lead], (length,), (1,), 0) for lead, length in bases)]
    with torch.no_grad() if took_grads else contextlib.nullcontext(), no_autocast():  # it holds its own casts
        return run(*inputs)


def _run_on_copies(prefix: Trace, flat: list[Any], written: Sequence[str]) -> Any:
    """Run `prefix` as recorded, its in-place ops included, by the torch executor, with the memory it writes
    copied: each storage holding an input in `written` is cloned once, and every input living in it is rebuilt
    on the clone with its own layout. Inputs that share memory share the copy as they share the original, so the
    writes see each other as in eager, and none lands on the call's tensors."""
    if has_inline_grads(prefix):
        raise UnsupportedSyntaxError(
            "the jitted function reads a value computed from gradients it took itself (backward() or "
            "torch.autograd.grad) while it writes into inputs that share memory and have symbolic sizes; "
            "minijit cannot evaluate that while tracing. Pass those inputs as separate tensors, or use "
            "cache='constant values'")
    names = [p.name for p in prefix.args]
    storages = {flat[names.index(n)].untyped_storage().data_ptr() for n in written}
    clones: dict[int, torch.UntypedStorage] = {}
    inputs = list(flat)
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor) and (key := x.untyped_storage().data_ptr()) in storages:
            if key not in clones:
                clones[key] = x.untyped_storage().clone()
            inputs[i] = x.new_empty(0).set_(clones[key], x.storage_offset(), x.size(), x.stride())
    runnable = claim_executors(prefix, resolve_executors(["torch"]))
    with warnings.catch_warnings(), no_autocast():  # torch's warnings belong to the call's own run, not to this scratch one
        warnings.simplefilter("ignore")
        return runnable.python_callable()(*inputs)


def _describe_function(fn: Any) -> str:
    """`name (file:line)` of the function being traced, for messages."""
    target = fn.module.forward if isinstance(fn, ModuleForward) else fn
    code = getattr(target, "__code__", None)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code is not None else name


def graphed(computation: Callable[..., Any], trace: Trace, family: GraphFamily | None, part: str,
            mutated_inputs: Sequence[str], saved_from: bool = False, refusal: str | None = None) -> Callable[..., Any]:
    """`computation` (the compiled `trace`) replayed from CUDA graphs where it can be, when `family` is given."""
    if family is None:
        return computation
    mutated = set(mutated_inputs)
    return GraphedCallable(computation, family, part, saved_from=saved_from, refusal=refusal or graph_refusal(trace),
                           mutated=[i for i, p in enumerate(trace.args) if p.name in mutated],
                           names=[p.name for p in trace.args])
