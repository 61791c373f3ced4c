"""One memory model per trace: every pass and check of a compile asks the same model of a trace, cached on
it until it is edited, and a pass that makes a new trace gets a new one (minijit/transforms/memory.py,
`memory_model`; minijit/ir/trace.py, `Trace.analysis`)."""

from __future__ import annotations

import sys

import torch

import minijit
from minijit.ir import Proxy, TensorProxy, Trace, tracing
from minijit.ops import prims
from minijit.transforms import memory
from minijit.transforms.memory import memory_model


def _record_walks(monkeypatch) -> list[tuple[int, ...]]:
    """The bound symbols (by id) of every walk a memory model makes from now on."""
    walks: list[tuple[int, ...]] = []
    init = memory.MemoryModel.__init__

    def recording(self, trace, bound_symbols=None, **kwargs):
        walks.append(tuple(map(id, trace.bound_symbols if bound_symbols is None else bound_symbols)))
        init(self, trace, bound_symbols, **kwargs)

    monkeypatch.setattr(memory.MemoryModel, "__init__", recording)
    return walks


def _adam_like(p, g, m, v):
    m.mul_(0.9).add_(g, alpha=0.1)
    v.mul_(0.99).addcmul_(g, g, value=0.01)
    p.sub_(m / (v.sqrt() + 1e-8))
    return p


def test_a_compile_walks_each_trace_once(monkeypatch):
    walks = _record_walks(monkeypatch)
    asks: list[int] = []
    ask = memory.memory_model

    def counting(trace, views=None, order=None):
        asks.append(1)
        return ask(trace, views, order)

    for module in ("copy_analysis", "verify", "buffer_reuse", "functionalize", "grad", "simplify"):
        monkeypatch.setattr(sys.modules[f"minijit.transforms.{module}"], "memory_model", counting)
    args = [torch.randn(4, 5) for _ in range(3)] + [torch.rand(4, 5)]
    expected = _adam_like(*[a.clone() for a in args])
    jf = minijit.jit(_adam_like)
    torch.testing.assert_close(jf(*args), expected)
    # The trace verifier (on in the tests), check_copies and the passes ask about the same traces...
    assert len(asks) > len(set(walks)) > 0
    # ... and no trace is walked twice.
    assert len(walks) == len(set(walks)), walks


def _copy_into_x() -> tuple[Trace, TensorProxy]:
    trace = Trace("f")
    x = trace.add_input(TensorProxy((2, 3), torch.float32, torch.device("cpu")), "x")
    with tracing(trace):
        t = prims.neg(x)
        trace.output = t
    return trace, t


def test_a_compile_builds_one_view_graph_per_trace(monkeypatch):
    """A call passing inputs that share memory: which inputs the trace writes is asked of the memory model
    before functionalization, which then runs once; no trace's view graph is built twice."""
    walks: list[tuple[int, ...]] = []
    init = memory.ViewGraph.__init__

    def recording(self, trace):
        walks.append(tuple(map(id, trace.bound_symbols)))
        init(self, trace)

    monkeypatch.setattr(memory.ViewGraph, "__init__", recording)
    arguments = sys.modules["minijit.runtime.arguments"]
    runs: list[int] = []
    run = arguments.functionalize_trace

    def counting(trace, **kwargs):
        runs.append(id(trace))
        return run(trace, **kwargs)

    monkeypatch.setattr(arguments, "functionalize_trace", counting)

    def f(a, b):
        a[1:].add_(1)
        return b * 2

    x = torch.randn(4, 5)
    eager = x.clone()
    expected = f(eager, eager)
    got_in = x.clone()
    torch.testing.assert_close(minijit.jit(f)(got_in, got_in), expected)
    torch.testing.assert_close(got_in, eager)
    assert len(runs) == 1
    assert len(walks) == len(set(walks)) > 0, walks


def _counting_walks(monkeypatch) -> list[int]:
    """One entry per memory model walked from now on."""
    walks: list[int] = []
    init = memory.MemoryModel.__init__

    def counting(self, *args, **kwargs):
        walks.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(memory.MemoryModel, "__init__", counting)
    return walks


def test_a_changed_trace_gets_a_new_model(monkeypatch):
    walks = _counting_walks(monkeypatch)
    trace, t = _copy_into_x()
    before = memory_model(trace)
    assert memory_model(trace) is before and len(walks) == 1
    assert before.written_inputs() == []
    with tracing(trace):
        prims.copy_to_out_(t, out=trace.args[0])
    after = memory_model(trace)
    assert after is not before and len(walks) == 2
    assert after.written_inputs() == ["x"]
    # A trace derived with the same content (a pass that changed nothing) takes the analyses along...
    assert memory_model(trace.derive(trace.bound_symbols, pass_name="dce")) is after and len(walks) == 2
    # ... and one with other bound symbols does not.
    shorter = trace.derive(trace.bound_symbols[:1], pass_name="dce")
    assert memory_model(shorter).written_inputs() == [] and len(walks) == 3


def test_an_edited_trace_gets_a_new_model(monkeypatch):
    """Setting the output (grad.py's forward does, after asking its model), replacing the bound symbols, or renaming
    an input: the next question walks the trace afresh, and answers as a model built afresh does."""
    trace, t = _copy_into_x()
    x = trace.args[0]
    answers = [memory_model(trace)]
    walks = _counting_walks(monkeypatch)

    def changed(p: Proxy) -> bool:
        """Whether the cached model's answer about `p` changed since the last question; checked against a model
        built afresh."""
        model, before = memory_model(trace), answers[-1]
        fresh = memory.MemoryModel(trace)
        assert (model.readers_of(p), model.leaders) == (fresh.readers_of(p), fresh.leaders)
        answers.append(model)
        return (model.readers_of(p), model.leaders) != (before.readers_of(p), before.leaders)

    trace.output = x  # the output, set again
    assert changed(t)
    assert len(walks) == 2  # the cached one, and the fresh one to compare with
    with tracing(trace):  # a bound symbol appended
        prims.neg(x)
    assert changed(x)
    trace.bound_symbols = trace.bound_symbols[:1]  # the bound symbols replaced
    assert changed(x)
    trace.names.used.discard(x.name)
    x.name = trace.names.claim("y")  # an input renamed
    assert changed(x)
    assert len(walks) == 8
    assert memory_model(trace) is answers[-1] and len(walks) == 8  # nothing changed since
