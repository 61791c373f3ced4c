"""The printed trace is valid Python that runs, with safe constants and readable names."""

import math

import pytest
import torch

import minijit
from minijit.ir import TensorProxy, Trace, tracing
from minijit.ir.printing import Constants, to_source
from minijit.ops import ltorch
from minijit.runtime import trace_callable


def _affine(x, w, b):
    return (x @ w.t() + b).exp().sum(dim=-1) * 2


@pytest.fixture
def xwb():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)


def test_every_pass_trace_reruns_from_its_own_source(xwb):
    jf = minijit.jit(_affine)
    expected = _affine(*xwb)
    torch.testing.assert_close(jf(*xwb), expected)
    traces = minijit.last_traces(jf)
    assert traces[0].pass_name == "capture"
    for trace in traces:
        compile(trace.python(), "<test>", "exec")
        torch.testing.assert_close(trace_callable(trace)(*xwb), expected)


def test_inputs_keep_parameter_names_and_others_are_short(xwb):
    jf = minijit.jit(_affine)
    jf(*xwb)
    source = minijit.last_traces(jf)[-1].python()
    assert source.startswith("def _affine(x, w, b):")
    names = {line.split(" = ")[0].strip() for line in source.splitlines() if " = " in line and not line.strip().startswith("#")}
    assert names and all(n[0] == "t" and n[1:].isdigit() for n in names)


def test_trace_header_names_pass_and_time(xwb):
    jf = minijit.jit(_affine)
    jf(*xwb)
    for trace in minijit.last_traces(jf):
        first = str(trace).splitlines()[0]
        assert first.startswith(f"# {trace.pass_name} (") and first.endswith(" ms)")


def test_subsymbols_print_as_indented_comments(xwb):
    jf = minijit.jit(_affine)
    jf(*xwb)
    lines = str(minijit.last_traces(jf)[0]).splitlines()
    add_line = next(i for i, line in enumerate(lines) if "ltorch.add(" in line)
    assert lines[add_line + 1].lstrip().startswith("# ")
    assert "prims.broadcast_in_dim" in lines[add_line + 1]


@pytest.mark.parametrize("value", [
    "'); import os; os.system('echo pwned'); ('", 'a"b\\n', "\n#", 1.5, float("inf"), -float("inf"),
    float("nan"), None, True, 3, (1, "x"), [2, None], {"k": "v'"}, slice(1, None, 2), Ellipsis, 2 + 3j,
    torch.float16, torch.device("cpu"),
])
def test_constants_print_so_they_evaluate_to_themselves(value):
    constants = Constants()
    source = to_source(value, constants)
    result = eval(source, {"torch": torch, **constants.values})
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(result)
    else:
        assert result == value and type(result) is type(value)


def test_string_outputs_cannot_inject_code():
    evil = "'); raise SystemExit('injected'); ('"

    def f(x):
        return x + 1, evil

    jf = minijit.jit(f)
    out, s = jf(torch.ones(2))
    assert s == evil
    torch.testing.assert_close(out, torch.ones(2) + 1)


def test_unprintable_constants_are_bound_by_name():
    marker = object()
    trace = Trace("f")
    with tracing(trace):
        x = trace.add_input(TensorProxy((2,), torch.float32, torch.device("cpu")), "x")
        trace.output = (ltorch.neg(x), marker)
    fn = trace_callable(trace)
    out, m = fn(torch.ones(2))
    assert m is marker
    torch.testing.assert_close(out, -torch.ones(2))


def test_parameter_names_that_clash_with_reserved_names_are_renamed():
    def f(torch_, ltorch):  # 'ltorch' is a namespace in printed traces
        return torch_ * ltorch

    jf = minijit.jit(f)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(jf(a, b), a * b)
    header = minijit.last_traces(jf)[-1].python().splitlines()[0]
    params = header.split("(")[1].rstrip("):").split(", ")
    assert "ltorch" not in params and params[0] == "torch_"
