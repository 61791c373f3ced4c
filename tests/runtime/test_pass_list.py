"""The pipeline's pass list is data: one list of (pass, condition), from functionalize through the split to the
last pass of each half, and one list of checks after each pass."""

import pytest
import torch

import minijit
from minijit.ir import Trace
from minijit.runtime import pipeline


def _f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu().sum()


def _names(traces: list) -> list[str]:
    return [t.pass_name for t in traces]


def test_the_no_grad_trace_runs_the_passes_whose_condition_holds():
    jf = minijit.jit(_f)
    jf(torch.randn(3, 4), torch.randn(4, 5))
    assert _names(minijit.last_traces(jf)) == [
        "capture", "functionalize", "dce", "simplify",
        "claim executors", "dce", "write copies in place", "reuse buffers", "group calls"]


def test_forward_and_backward_run_the_same_list_under_their_conditions():
    jf = minijit.jit(_f)
    jf(torch.randn(3, 4), torch.randn(4, 5, requires_grad=True))
    assert _names(minijit.last_traces(jf))[4:] == [
        "split forward/backward", "dce", "claim executors", "dce", "write copies in place", "reuse buffers",
        "group calls", "release dead values"]
    # A backward that writes no input of the forward neither writes copies in place nor reuses buffers.
    assert _names(minijit.last_backward_traces(jf)) == [
        "split forward/backward", "simplify", "dce", "claim executors", "dce", "release dead values"]


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("level", ["0", "", "1"])
def test_check_copies_runs_as_a_hook_once_the_writes_are_settled(monkeypatch, grad, level):
    seen: list[str] = []
    monkeypatch.setattr(pipeline, "check_copies", lambda trace: seen.append(trace.pass_name))
    monkeypatch.setenv("MINIJIT_CHECK_TRACES", level)
    jf = minijit.jit(_f)
    jf(torch.randn(3, 4), torch.randn(4, 5, requires_grad=grad))
    # Once per trace whose writes the passes decide: the no-grad trace, or the forward (not this backward).
    # One switch: off at 0, on by default and with every pass checked.
    assert seen == ([] if level == "0" else ["group calls"])


def test_the_pass_list_and_the_checks_in_order():
    assert [p.name for p in pipeline.PASSES] == [
        "functionalize", "dce", "simplify", "expand inline gradients", "split forward/backward",
        "simplify", "dce", "claim executors", "dce", "write copies in place", "reuse buffers", "group calls",
        "release dead values"]
    assert [c.name for c in pipeline.AFTER_PASS] == ["verify", "check copies", "check writes after checks"]
    assert {type(p) for p in (*pipeline.PASSES, *pipeline.AFTER_PASS)} == {pipeline.Pass}


def _insert_look(monkeypatch, before: int) -> list[tuple[str, Trace]]:
    """Put into the pass list, before its entry at `before`, a pass that records the part and the trace it is
    given and hands on an equal trace named "look"; returns what it records."""
    seen: list[tuple[str, Trace]] = []

    def look(trace: Trace, ctx: pipeline.PassContext) -> Trace:
        seen.append((ctx.part, trace))
        return trace.derive(trace.bound_symbols, pass_name="look")

    passes = pipeline.PASSES
    monkeypatch.setattr(pipeline, "PASSES", (*passes[:before], pipeline.Pass("look", look), *passes[before:]))
    return seen


def _position(name: str) -> int:
    return [p.name for p in pipeline.PASSES].index(name)


def _texts(traces: list[Trace]) -> list[str]:
    return [t.python() for t in traces]


@pytest.mark.parametrize("before", ["functionalize", "claim executors"])
def test_a_pass_inserted_into_the_list_runs_there_without_grad(monkeypatch, before):
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    plain = minijit.jit(_f)
    plain(x, w)
    seen = _insert_look(monkeypatch, _position(before))
    jf = minijit.jit(_f)
    torch.testing.assert_close(jf(x, w), _f(x, w))
    traces, expected = minijit.last_traces(jf), minijit.last_traces(plain)
    at = _names(traces).index("look")
    assert _names(traces)[:at] + _names(traces)[at + 1:] == _names(expected)
    # It sees the trace its neighbour before it made, and the passes after it go on from an equal trace.
    assert seen == [("computation", traces[at - 1])]
    assert traces[at + 1].pass_name == before
    assert _texts(traces[:at] + traces[at + 1:]) == _texts(expected)


def test_a_pass_inserted_after_the_split_runs_on_each_half(monkeypatch):
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    w_plain, w_jit, w_eager = (w.clone().requires_grad_() for _ in range(3))
    plain = minijit.jit(_f)
    plain(x, w_plain).backward()
    seen = _insert_look(monkeypatch, _position("split forward/backward") + 1)
    jf = minijit.jit(_f)
    got, expected = jf(x, w_jit), _f(x, w_eager)
    got.backward()
    expected.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(w_jit.grad, w_eager.grad)
    forward, backward = minijit.last_traces(jf), minijit.last_backward_traces(jf)
    at, back_at = _names(forward).index("look"), _names(backward).index("look")
    # Each half is given the trace the split made, and the passes after it go on from an equal one.
    assert seen == [("forward", forward[at - 1]), ("backward", backward[back_at - 1])]
    assert forward[at - 1].pass_name == backward[back_at - 1].pass_name == "split forward/backward"
    assert _texts(forward[:at] + forward[at + 1:]) == _texts(minijit.last_traces(plain))
    assert _texts(backward[:back_at] + backward[back_at + 1:]) == _texts(minijit.last_backward_traces(plain))
