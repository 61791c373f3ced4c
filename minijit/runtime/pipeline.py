"""From a function and example arguments to a compiled trace: capture, then the passes in order."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.frontend import interpret
from minijit.ir import TensorProxy, Trace, tracing, tree_map
from minijit.runtime.autograd import CompiledGrad, autograd_callable
from minijit.transforms import claim_executors, dce
from minijit.transforms.grad import release_dead_values, requires_grad_inputs, split_forward_backward
from minijit.transforms.simplify import remove_cast_round_trips


@dataclass
class CompiledEntry:
    """One cache entry: the compiled computation and the traces that led to it."""

    computation: Callable[..., Any]
    traces: list[Trace] = field(default_factory=list)
    # True when every argument is a tensor passed positionally: the call can skip flattening.
    direct_call: bool = False
    # The backward traces, one per pass, when the entry differentiates (else empty).
    backward_traces: list[Trace] = field(default_factory=list)


def _timed(trace_fn: Callable[[], Trace], traces: list[Trace]) -> Trace:
    start = time.perf_counter()
    trace = trace_fn()
    trace.elapsed_ms = (time.perf_counter() - start) * 1e3
    traces.append(trace)
    return trace


def _parameter_names(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """A name per positional argument and keyword, from fn's signature where it has one."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(len(args))] + list(kwargs)
    names: list[str] = []
    for name, value in bound.arguments.items():
        param = bound.signature.parameters[name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}{i}" for i in range(len(value))]
        elif param.kind is not inspect.Parameter.VAR_KEYWORD:
            names.append(name)
    return names[: len(args)] + list(kwargs)


def _proxify(trace: Trace, args: tuple[Any, ...], kwargs: dict[str, Any],
             names: Sequence[str]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace every tensor among the arguments by a trace input named after its parameter."""
    values = list(args) + list(kwargs.values())
    proxied = []
    for name, value in zip(names, values, strict=True):
        count = [0]

        def to_proxy(x: Any, name: str = name, count: list[int] = count) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            p = TensorProxy(tuple(x.shape), x.dtype, x.device, x.requires_grad)
            wanted = name if count[0] == 0 else f"{name}_{count[0]}"
            count[0] += 1
            return trace.add_input(p, wanted)

        proxied.append(tree_map(to_proxy, value))
    return tuple(proxied[: len(args)]), dict(zip(kwargs, proxied[len(args):], strict=True))


def compile_for(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                executors: Sequence[Any]) -> CompiledEntry:
    """Capture `fn` on proxies of `args`, run the passes, and compile the final trace."""
    traces: list[Trace] = []

    def capture() -> Trace:
        trace = Trace(getattr(fn, "__name__", "computation").replace("<lambda>", "lambda_fn"))
        if not trace.fn_name.isidentifier():
            trace.fn_name = "computation"
        with tracing(trace):
            pargs, pkwargs = _proxify(trace, args, kwargs, _parameter_names(fn, args, kwargs))
            trace.output = interpret(fn, pargs, pkwargs)
        return trace

    # The passes, in order. Each is a pure Trace -> Trace function.
    trace = _timed(capture, traces)
    trace = _timed(lambda: dce(trace), traces)
    trace = _timed(lambda: remove_cast_round_trips(trace), traces)
    direct = not kwargs and all(isinstance(a, torch.Tensor) for a in args)

    if torch.is_grad_enabled() and requires_grad_inputs(trace):
        return _compile_with_grad(trace, traces, executors, direct)

    trace = _timed(lambda: claim_executors(trace, executors), traces)
    trace = _timed(lambda: dce(trace), traces)

    start = time.perf_counter()
    computation = trace.python_callable()
    traces[-1].elapsed_ms += (time.perf_counter() - start) * 1e3
    return CompiledEntry(computation, traces, direct)


def _compile_with_grad(trace: Trace, traces: list[Trace], executors: Sequence[Any], direct: bool) -> CompiledEntry:
    """Grad is needed: split into forward and backward, run the passes on both, compile both."""
    start = time.perf_counter()
    fwd, bwd = split_forward_backward(trace)
    fwd.elapsed_ms = bwd.elapsed_ms = (time.perf_counter() - start) * 1e3
    traces.append(fwd)
    bwd_traces = [bwd]
    bwd = _timed(lambda: remove_cast_round_trips(bwd), bwd_traces)
    for passes, t in ((traces, fwd), (bwd_traces, bwd)):
        t = _timed(lambda t=t: dce(t), passes)
        t = _timed(lambda t=t: claim_executors(t, executors), passes)
        t = _timed(lambda t=t: dce(t), passes)
        _timed(lambda t=t: release_dead_values(t), passes)
    compiled = CompiledGrad(
        forward=traces[-1].python_callable(),
        backward=bwd_traces[-1].python_callable(),
        differentiable_outputs=fwd.info["differentiable_outputs"],
        name=trace.fn_name,
    )
    return CompiledEntry(autograd_callable(compiled), traces, direct, bwd_traces)
