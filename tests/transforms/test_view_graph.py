"""What views what: the memory model's view graph (minijit/transforms/memory.py, `view_graph`), and
functionalization asking it instead of tracking views itself (minijit/transforms/functionalize.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

import minijit
from minijit.ir import TensorProxy
from minijit.transforms.functionalize import _Functionalizer
from minijit.transforms.memory import MustShare, memory_model, view_graph
from minijit.transforms.view_updates import is_view_step, view_shares_memory
from tests.transforms.test_functionalize_fuzz import run_one


def _captured(fn, *args):
    jf = minijit.jit(fn)
    jf(*args)
    return minijit.last_traces(jf)[0]


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


CASES = {
    "transpose then index": lambda x: x.t()[0],
    "view then unsqueeze": lambda x: x.view(2, 6).unsqueeze(0),
    "reshape eager views": lambda x: x.reshape(12)[2:5],
    "reshape eager copies": lambda x: x.t().reshape(12),
    "computed": lambda x: (x * 2)[1],
    "expand of a slice": lambda x: x[:, :1].expand(3, 5),
    "view of a written view": lambda x: x.clone()[1].add_(1).unsqueeze(0),
}


@pytest.mark.parametrize("name", CASES)
def test_the_graph_roots_every_view_that_eager_makes_at_the_tensor_it_views(name):
    fn = CASES[name]
    x = torch.randn(3, 4)
    trace = _captured(fn, x)
    graph = view_graph(trace)
    (out,) = [p for p in [trace.output] if isinstance(p, TensorProxy)]
    chain = graph.chain(out)
    may_copy = any(step.bsym.sym.effects.may_copy for step in chain)
    eager_shares = _shares(fn(x), x)
    rooted_at_x = graph.root(out) is trace.args[0]
    # "May share": every view eager makes is in the graph; a chain without a reshape is one eager makes.
    assert rooted_at_x if eager_shares else (not rooted_at_x or may_copy)
    # The chain is made of steps, each viewing the previous one's output.
    for before, step in itertools.pairwise(chain):
        assert step.parent is before.out
    # The memory model agrees: a tensor the graph roots at x may share x's storage.
    assert memory_model(trace).aliases(out, trace.args[0]) == rooted_at_x


def _proxies_made(trace) -> set[int]:
    made: set[int] = set()
    stack = list(trace.bound_symbols)
    while stack:
        bsym = stack.pop()
        stack.extend(bsym.subsymbols)
        made.update(id(p) for p in bsym.proxy_outputs())
    return made


MUST_SHARE_CASES = {
    **{name: fn for name, fn in CASES.items() if name != "view of a written view"},
    "flatten of a slice eager copies": lambda x: x[:, :2].flatten(),
    "reshape of rows eager views": lambda x: x[1:].reshape(-1),
    "reshape of a transposed view eager copies, then a view of it": lambda x: x.t().reshape(2, 6)[0],
}


@pytest.mark.parametrize("name", MUST_SHARE_CASES)
def test_must_share_is_eager_s_aliasing(name):
    """MustShare, deciding each view op in trace order as functionalization's walk does, roots the output at the
    input exactly where eager's output shares the input's memory."""
    fn = MUST_SHARE_CASES[name]
    x = torch.randn(3, 4)
    trace = _captured(fn, x)
    shares = MustShare(trace, view_shares_memory)
    for position, bsym in enumerate(trace.bound_symbols):
        if bsym.is_view():
            for out in bsym.proxy_outputs():
                if is_view_step(bsym, out):
                    shares.decide(bsym.viewed_tensor(), bsym, out, position)
    assert (shares.base_of(trace.output) is trace.args[0]) == _shares(fn(x), x)


def test_functionalize_follows_the_graph_over_the_fuzzers_programs(monkeypatch):
    """Over random programs of views and writes (inputs sharing memory included): every view functionalization
    follows in the captured trace is the graph's, its chain is the graph's chain cut where it decided eager
    copies, and the only views it keeps itself are those it makes in the new trace."""
    checked = {"views": 0, "cut": 0}
    run = _Functionalizer.run

    def checking(self):
        result = run(self)
        made = _proxies_made(self.trace)
        own_views = self.shares.added()
        for step in own_views:
            assert id(step.out) not in made, f"functionalize tracks a view of the captured trace itself: {step}"
        graph = view_graph(self.trace)
        stack = list(self.trace.bound_symbols)
        while stack:
            bsym = stack.pop()
            stack.extend(bsym.subsymbols)
            for p in bsym.proxy_outputs():
                if self.shares.step(p) is None:
                    continue
                checked["views"] += 1
                steps = [(s.bsym, s.out) for s in graph.chain(p)]
                own = self.shares.chain(p)
                ours = [s for s in own if not any(s[1] is v.out for v in own_views)]
                assert ours == steps[len(steps) - len(ours):]
                cut = steps[:len(steps) - len(ours)]
                if cut:
                    checked["cut"] += 1
                    # Cut where a step is not followed: eager copies (or the step's parent is a base here).
                    assert self.shares.step(cut[-1][1]) is None
        return result

    monkeypatch.setattr(_Functionalizer, "run", checking)
    outcomes = [run_one(seed) for seed in range(120)]
    assert outcomes.count("ok") > 60, outcomes
    assert checked["views"] > 100 and checked["cut"] > 0, checked


def test_last_write_sharing_sees_writes_through_views_and_shared_inputs():
    def f(a, b):
        v = a.view(12)
        w = v[2:4]
        w.mul_(2)
        return a.sum() + b.sum()

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    trace = _captured(f, x, y)
    graph = view_graph(trace)
    a, b = trace.args
    write = next(i for i, bsym in enumerate(trace.bound_symbols) if bsym.written())
    assert graph.last_write_sharing(a) == write
    assert graph.last_write_sharing(b) == -1
    # b passed sharing a's memory: now it is written too.
    assert graph.last_write_sharing(b, [[a, b]]) == write
    # As eager: the write through the views changed a, not b.
    eager_a = x.clone()
    f(eager_a, y)
    assert not torch.equal(eager_a, x)


def _after_write(a, b):
    _, y = torch.meshgrid(a, b, indexing="ij")
    b.add_(1)
    return y * 1  # eager: y views b, so it sees the write


def _before_write(a, b):
    x, y = torch.meshgrid(a, b, indexing="ij")
    s = x + y
    b.add_(1)
    return s


def _no_write(a, b):
    x, y = torch.meshgrid(a, b, indexing="ij")
    return x * y


@pytest.mark.parametrize("fn", [_after_write, _before_write, _no_write])
def test_a_view_of_one_of_several_tensors_is_never_read_stale(fn):
    """`torch.meshgrid((a, b))` returns views of a and of b, its symbol not saying which is whose (the graph's
    `views_one_of`): read after a write into a or b, minijit refuses (it returned the value from before the
    write); read before, or without a write, it matches eager."""
    a, b = torch.randn(3), torch.randn(4)
    eager_in, jit_in = (a.clone(), b.clone()), (a.clone(), b.clone())
    expected = fn(*eager_in)
    jf = minijit.jit(fn)
    if fn is _after_write:
        with pytest.raises(minijit.MinijitError, match="cannot tell which"):
            jf(*jit_in)
        return
    torch.testing.assert_close(jf(*jit_in), expected)
    torch.testing.assert_close(jit_in, eager_in)
    trace = minijit.last_traces(jf)[0]
    meshgrid = next(bsym for bsym in trace.bound_symbols if "meshgrid" in bsym.sym.id)
    assert {t.name for t in view_graph(trace).views_one_of(meshgrid.output[1])} == {"a", "b"}
