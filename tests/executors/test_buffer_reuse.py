"""Buffer reuse in final traces: ops compute into intermediates nothing reads any more, never anywhere else.

Each test runs a function eagerly and under jit (the torch executor) on clones of the
same inputs, requires the results and the final inputs to be equal to eager's, and
reads the final trace to see where each op writes.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

import minijit
from minijit.errors import CopyToOutError
from minijit.ir import BoundSymbol, TensorProxy, Trace, tree_iter
from minijit.ops import prims
from minijit.transforms import check_copies

ROOT = Path(__file__).resolve().parents[2]


def run_both(fn, *args) -> Trace:
    """fn eagerly and jitted on clones of args: outputs and final inputs must be equal; returns the final trace."""
    eager_args = [a.clone() for a in args]
    jit_args = [a.clone() for a in args]
    want = fn(*eager_args)
    jf = minijit.jit(fn)
    got = jf(*jit_args)
    for g, w in zip(_tensors(got), _tensors(want), strict=True):
        assert torch.equal(g, w)
        assert g.stride() == w.stride()
    for g, w in zip(jit_args, eager_args, strict=True):
        assert torch.equal(g, w)
    return minijit.last_traces(jf)[-1]


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in tree_iter(x) if isinstance(t, torch.Tensor)]


def producer(trace: Trace, name: str) -> BoundSymbol:
    """The bound symbol of the final trace whose output is the proxy printed as `name`."""
    found = [b for b in trace.bound_symbols if any(p.name == name for p in b.proxy_outputs())]
    assert found, f"no {name} in\n{trace}"
    return found[0]


def writes(trace: Trace) -> dict[str, str]:
    """Output name -> the name of the tensor it was written into (`out=`), for every op but copy_to_out_."""
    return {b.output.name: b.kwargs["out"].name for b in trace.bound_symbols
            if "out" in b.kwargs and b.sym.name != "copy_to_out_"}


def op_outputs(trace: Trace, op: str) -> list[str]:
    return [b.output.name for b in trace.bound_symbols if b.sym.name == op]


# -- where reuse happens -------------------------------------------------------------------

def test_in_place_chain_on_an_intermediate_reuses_its_buffer():
    def f(x, y):
        d = (x.sqrt() / 2).add_(1e-3)
        return (y / d).sum()
    trace = run_both(f, torch.rand(8, 8), torch.randn(8, 8))
    (s,) = op_outputs(trace, "sqrt")
    (q1, q2) = op_outputs(trace, "div")
    (a,) = op_outputs(trace, "add")
    w = writes(trace)
    assert w[q1] == s and w[a] == q1, trace  # / 2 into sqrt's result, + 1e-3 into that
    assert w[q2] == a, trace  # y / d into d: nothing reads d after it


def test_check_reports_a_read_of_an_overwritten_intermediate():
    def f(x):
        return ((x.sqrt() / 2) * 3).sum()
    trace = run_both(f, torch.rand(4, 4))
    check_copies(trace)
    (s,) = op_outputs(trace, "sqrt")
    late_reader = prims.neg.bind(producer(trace, s).output, output=TensorProxy.like(producer(trace, s).output))
    broken = trace.derive([*trace.bound_symbols[:-1], late_reader, trace.bound_symbols[-1]], pass_name="broken")
    with pytest.raises(CopyToOutError, match=rf"reads {s} after `t\d+ = torchex.div\({s}, 2, out={s}\)`"):
        check_copies(broken)


def test_dead_buffer_of_the_same_kind_is_taken():
    def f(x, y):
        a = x.sqrt().sum()
        return a, y.exp().sum()
    trace = run_both(f, torch.rand(4, 5), torch.randn(4, 5))
    (s,) = op_outputs(trace, "sqrt")
    (e,) = op_outputs(trace, "exp")
    assert writes(trace).get(e) == s, trace
    assert "nothing reads any more" in producer(trace, e).note


def test_adam_trace_writes_straight_into_its_inputs():
    spec = importlib.util.spec_from_file_location("minijit_bench", ROOT / "scripts" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    n = 4
    args = [[torch.randn(16, 8) for _ in range(n)], [torch.randn(16, 8) * 0.01 for _ in range(n)],
            [torch.randn(16, 8) * 0.01 for _ in range(n)], [torch.rand(16, 8) * 1e-4 for _ in range(n)]]
    want = [[t.clone() for t in group] for group in args]
    ptrs = [t.data_ptr() for group in args for t in group]
    jf = minijit.jit(bench.adam_step)
    with torch.no_grad():
        bench.adam_step(*want)
        jf(*args)
    for got_group, want_group in zip(args, want, strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got_group, want_group, strict=True))
    assert [t.data_ptr() for group in args for t in group] == ptrs
    trace = next(t for t in minijit.last_traces(jf) if t.pass_name == "reuse buffers")  # (before calls are grouped)
    copies = [b for b in trace.bound_symbols if b.sym.name == "copy_to_out_"]
    assert len(copies) == 3 * n and all(b.note.startswith("in place") for b in copies), trace
    assert not [b for b in trace.bound_symbols if b.sym.name == "copy_"], trace
    # One tensor allocated in all (the first sqrt); every other op writes into an input or a free buffer.
    allocating = [b for b in trace.bound_symbols if b.sym.name != "copy_to_out_" and "out" not in b.kwargs]
    assert [b.sym.name for b in allocating] == ["sqrt"], trace
    inputs = {p.name for p in trace.args}
    muls = [b for b in trace.bound_symbols if b.sym.name == "mul"]
    assert len(muls) == n and all(b.kwargs["out"].name in inputs for b in muls), trace  # v.mul_ into v


# -- where it must not happen --------------------------------------------------------------

def test_not_into_an_intermediate_read_later():
    def f(x):
        t = x.sqrt()
        u = t * 2
        return (u + t).sum()
    trace = run_both(f, torch.rand(6, 6))
    (s,) = op_outputs(trace, "sqrt")
    (m,) = op_outputs(trace, "mul")
    assert m not in writes(trace), trace
    (a,) = op_outputs(trace, "add")
    assert writes(trace).get(a) in (s, m), trace  # both are free once the add has read them


def test_not_into_a_returned_intermediate_nor_a_returned_result():
    def f(x):
        t = x.sqrt()
        u = t * 2
        return t, u.sum(), (u + 1)
    trace = run_both(f, torch.rand(6, 6))
    (m,) = op_outputs(trace, "mul")
    (a,) = op_outputs(trace, "add")
    w = writes(trace)
    assert m not in w and a not in w, trace


def test_not_into_a_view_of_an_input():
    def f(x):
        t = x.view(-1)
        return (t * 2).sum() + x.t().contiguous().exp().sum()
    trace = run_both(f, torch.rand(4, 4))
    inputs = {p.name for p in trace.args}
    assert not set(writes(trace).values()) & inputs, trace
    assert all(not producer(trace, n).sym.name.startswith("reshape") for n in writes(trace).values()), trace


def test_not_into_an_expanded_view_of_a_smaller_buffer():
    def f(x):
        e = x.sum(-1).expand(2, 2)  # shows each element of the (2,) sum twice
        return e.sin().sum(-1)
    trace = run_both(f, torch.rand(2, 4))
    assert op_outputs(trace, "expand") and not set(writes(trace).values()) & set(op_outputs(trace, "expand")), trace


def test_not_into_an_expanded_view_of_a_buffer_of_its_own_shape():
    def f(x):
        y = x[:, :1].expand(3, 3, 3) * 1
        # This view has y's shape, and shows the first row of each of y's planes 3 times.
        return (y[:, :1].expand(3, 3, 3) * 2).exp()
    trace = run_both(f, torch.rand(3, 2, 3))
    assert op_outputs(trace, "expand") and not set(writes(trace).values()) & set(op_outputs(trace, "expand")), trace


def test_not_into_a_buffer_of_another_layout_that_as_strided_reads():
    def f(x):
        y = (x.transpose(0, 1) * 0.1).exp()  # laid out as x.transpose(0, 1)
        z = (y.sum(-1, keepdim=True) + y) * 2  # eager lays the sum out after its first operand: row by row
        return z.as_strided((z.numel(),), (1,)) + 0
    run_both(f, torch.rand(2, 4, 3))


def test_not_into_a_constant():
    c = torch.rand(5)

    def f(x):
        return (c + x).sum()
    x = torch.rand(5)
    before = c.clone()
    run_both(f, x)
    assert torch.equal(c, before)


@pytest.mark.parametrize("case", ["dtype", "broadcast", "other_view"])
def test_not_into_a_buffer_of_another_kind_or_read_through_a_view(case):
    def f(x, y):
        t = x.sqrt()
        if case == "dtype":
            u = t + y  # float32 + float64: a float64 result
        elif case == "broadcast":
            u = t + y  # (1, 4) + (3, 4): a (3, 4) result
        else:
            u = t + t.t()  # reads t through another view
        return u.sum()
    x = torch.rand(1, 4) if case == "broadcast" else torch.rand(4, 4)
    y = {"dtype": torch.rand(4, 4, dtype=torch.float64), "broadcast": torch.rand(3, 4),
         "other_view": torch.rand(4, 4)}[case]
    trace = run_both(f, x, y)
    (s,) = op_outputs(trace, "sqrt")
    assert s not in writes(trace).values(), trace


def test_not_into_a_buffer_still_read_later():
    def f(x, y):
        a = x.sqrt()
        c = y.exp()
        return (a + c).sum()
    trace = run_both(f, torch.rand(4, 4), torch.randn(4, 4))
    (e,) = op_outputs(trace, "exp")
    assert e not in writes(trace), trace  # a is still to be read by the add


def _old_value_read_later(v, g):
    u = v * 0.5
    s = v.sum()  # reads v's old value after the mul
    v.copy_(u.addcmul(g, g))
    return s


def _intermediate_read_later(v, g):
    u = v * 0.5
    v.copy_(u.addcmul(g, g))
    return u.sum()  # reads u after the addcmul wrote v


def _both_fine(v, g):
    u = v * 0.5
    v.copy_(u.addcmul(g, g))


@pytest.mark.parametrize("fn", [_old_value_read_later, _intermediate_read_later, _both_fine],
                         ids=lambda f: f.__name__.strip("_"))
def test_steps_before_a_copy_compute_into_the_input_only_when_safe(fn):
    trace = run_both(fn, torch.rand(4, 4), torch.rand(4, 4))
    (copy,) = [b for b in trace.bound_symbols if b.sym.name == "copy_to_out_"]
    assert copy.note.startswith("in place"), trace  # the addcmul writes v
    (m,) = op_outputs(trace, "mul")
    assert (writes(trace).get(m) == "v") == (fn is _both_fine), trace


def test_under_grad_results_and_gradients_match_eager():
    # The forward runs inside autograd.Function.forward (grad mode off): reuse there is safe.
    def f(w, x):
        y = (w.sqrt() / 2).add_(1)
        return (y * x).sum(), y > x
    w, x = torch.rand(6, requires_grad=True), torch.rand(6)
    want = f(w, x)
    (gw_want,) = torch.autograd.grad(want[0], w)
    jf = minijit.jit(f)
    got = jf(w, x)
    (gw,) = torch.autograd.grad(got[0], w)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(gw, gw_want)  # the backward is minijit's own VJP: equal up to rounding
    assert writes(minijit.last_traces(jf)[-1]), minijit.last_traces(jf)[-1]


def test_under_grad_with_nothing_differentiable():
    # The forward then runs with grad mode on, where `out=` refuses tensors that require grad.
    def f(w, x):
        return (w.sqrt() / 2).add_(1) > x
    w, x = torch.rand(6, requires_grad=True), torch.rand(6)
    assert torch.equal(minijit.jit(f)(w, x), f(w, x))


def test_symbolic_sizes_match_only_when_they_are_the_same_size():
    def f(x, y):
        a = (x.sqrt() / 2).add_(1)  # into sqrt's buffer: the same sizes, by construction
        return a.sum(), y.exp().sum()  # exp's sizes are other symbols: not into a's buffer
    jf = minijit.jit(f, cache="symbolic values")
    for shapes in (((4, 5), (4, 5)), ((4, 5), (3, 5)), ((2, 2), (6, 1))):
        x, y = torch.rand(shapes[0]), torch.randn(shapes[1])
        got, want = jf(x, y), f(x, y)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    trace = minijit.last_traces(jf)[-1]
    (s,) = op_outputs(trace, "sqrt")
    (e,) = op_outputs(trace, "exp")
    assert writes(trace)[op_outputs(trace, "div")[0]] == s and e not in writes(trace), trace


def test_a_vector_times_matrix_is_not_written_into_a_buffer_torch_would_resize_with_a_warning():
    # torch.matmul(v, m, out=buf) computes into a [1, n] result and warns that it resizes buf: no out= there.
    def f(x, w):
        a = (x[0] @ w).relu() * 2
        b = (x[1] @ w).relu() * 3
        return torch.stack([a, b], 1)

    x, w = torch.randn(4, 3), torch.randn(3, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(minijit.jit(f)(x, w), f(x, w))
