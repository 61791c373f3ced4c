"""The pipeline's pass list is data: one list of (pass, condition) for every trace, and one list of hooks after each pass."""

import pytest
import torch

import minijit
from minijit.runtime import pipeline


def _f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu().sum()


def _names(traces: list) -> list[str]:
    return [t.pass_name for t in traces]


def test_the_no_grad_trace_runs_the_passes_whose_condition_holds():
    jf = minijit.jit(_f)
    jf(torch.randn(3, 4), torch.randn(4, 5))
    assert _names(minijit.last_traces(jf)) == [
        "capture", "functionalize", "dce", "remove cast round trips",
        "claim executors", "dce", "write copies in place", "reuse buffers"]


def test_forward_and_backward_run_the_same_list_under_their_conditions():
    jf = minijit.jit(_f)
    jf(torch.randn(3, 4), torch.randn(4, 5, requires_grad=True))
    assert _names(minijit.last_traces(jf))[4:] == [
        "split forward/backward", "dce", "claim executors", "dce", "write copies in place", "reuse buffers",
        "release dead values"]
    # A backward that writes no input of the forward neither writes copies in place nor reuses buffers.
    assert _names(minijit.last_backward_traces(jf)) == [
        "split forward/backward", "remove cast round trips", "dce", "claim executors", "dce", "release dead values"]


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
    assert seen == ([] if level == "0" else ["reuse buffers"])


def test_the_pass_list_and_the_hooks_in_order():
    assert [p.name for p in pipeline.PASSES] == [
        "dce", "claim executors", "dce", "write copies in place", "reuse buffers", "release dead values"]
    assert [h.name for h in pipeline.AFTER_PASS] == ["verify", "check copies", "check writes after checks"]
