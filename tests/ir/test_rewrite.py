"""The one way to rewrite a trace (minijit/ir/rewrite.py): substitution by proxy identity, rules, replay.

Each rewritten trace is run from its printed source and compared with eager torch
computing what the rewrite means, and checked by the trace verifier.
"""

from __future__ import annotations

import pytest
import torch

from minijit.errors import MinijitError
from minijit.ir import BoundSymbol, TensorProxy, Trace, tracing
from minijit.ir.rewrite import ProxyMap, expand, replay, rewrite
from minijit.ops import ltorch
from minijit.runtime import trace_callable
from minijit.transforms.verify import check_trace


def _inputs(trace: Trace, *names: str, shape: tuple[int, ...] = (2, 3)) -> list[TensorProxy]:
    return [trace.add_input(TensorProxy(shape, torch.float32, torch.device("cpu")), n) for n in names]


@pytest.fixture
def ab() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(2, 3), torch.randn(2, 3)


def _nested_trace() -> Trace:
    """sin(a) read through a list, a tuple, a keyword and a dict in the output."""
    t = Trace("nested")
    with tracing(t):
        a, b = _inputs(t, "a", "b")
        c = ltorch.sin(a)
        d = ltorch.cat([c, b], dim=0)
        e = ltorch.stack((d, ltorch.add(d, c.repeat(2, 1), alpha=2)))
        t.output = {"s": e, "l": [c, (d, 3)]}
    return t


def _sin_to_cos(within: Trace):
    """A rule replacing each sin by a cos: a new bound symbol with a fresh output that later ones must read."""
    def rule(bsym: BoundSymbol, env: ProxyMap) -> list[BoundSymbol] | None:
        if bsym.sym is not ltorch.sin:
            return None
        scratch = within.derive([], pass_name="scratch")
        with tracing(scratch):
            env[bsym.output] = ltorch.cos(*bsym.args)
        return scratch.bound_symbols
    return rule


def test_substitution_through_nested_containers_and_outputs(ab):
    before = _nested_trace()
    printed = before.python()
    after = rewrite(before, _sin_to_cos(before), pass_name="sin to cos")
    check_trace(after)
    a, b = ab
    c = torch.cos(a)
    d = torch.cat([c, b], dim=0)
    expected = {"s": torch.stack((d, torch.add(d, c.repeat(2, 1), alpha=2))), "l": [c, (d, 3)]}
    torch.testing.assert_close(trace_callable(after)(a, b), expected)
    assert "sin" not in after.python()
    # A rewrite builds a new trace: the input trace still computes sin.
    assert before.python() == printed
    torch.testing.assert_close(trace_callable(before)(a, b)["l"][0], torch.sin(a))


def test_proxy_map_substitutes_by_identity_in_any_container():
    t = Trace()
    with tracing(t):
        x, y, z = _inputs(t, "x", "y", "z")
    env = ProxyMap()
    env[x] = y
    tree = (x, [z, {"k": x}], slice(x, None, 2), 5)
    assert env(tree) == (y, [z, {"k": y}], slice(y, None, 2), 5)
    # A proxy spelled like x but another object is another value: not substituted.
    other = TensorProxy((2, 3), torch.float32, torch.device("cpu"), name=x.name)
    assert env(other) is other and x in env and other not in env


def _sub_as_add_neg(bsym: BoundSymbol, env: ProxyMap, within: Trace) -> list[BoundSymbol] | None:
    if bsym.sym is not ltorch.sub:
        return None
    return expand(bsym, lambda a, b, alpha=None: ltorch.add(a, ltorch.neg(b)), within, what="the test's expansion")


def test_a_rule_that_expands_one_symbol_into_several(ab):
    t = Trace("expand")
    with tracing(t):
        a, b = _inputs(t, "a", "b")
        d = ltorch.sub(a, b)
        t.output = (ltorch.mul(d, d), d)
    after = rewrite(t, lambda bsym, env: _sub_as_add_neg(bsym, env, t), pass_name="sub as add and neg")
    check_trace(after)
    assert [b.sym for b in after.bound_symbols] == [ltorch.neg, ltorch.add, ltorch.mul]
    # The expansion computes the original output itself: later readers and the output are unchanged.
    assert after.bound_symbols[1].output is d and after.output[1] is d
    x, y = ab
    torch.testing.assert_close(trace_callable(after)(x, y), ((x - y) * (x - y), x - y))


def test_a_rule_that_drops_a_symbol_maps_its_output(ab):
    t = Trace("double_negation")
    with tracing(t):
        (a,) = _inputs(t, "a")
        n = ltorch.neg(ltorch.neg(ltorch.exp(a)))
        t.output = [ltorch.add(n, 1), n]

    producer = {id(b.output): b for b in t.bound_symbols}

    def drop_double_negation(bsym: BoundSymbol, env: ProxyMap) -> list[BoundSymbol] | None:
        inner = producer.get(id(bsym.args[0])) if bsym.sym is ltorch.neg else None
        if inner is None or inner.sym is not ltorch.neg:
            return None
        env[bsym.output] = env.value(inner.args[0])
        return []

    after = rewrite(t, drop_double_negation, pass_name="no double negation")
    check_trace(after)
    x = ab[0]
    torch.testing.assert_close(trace_callable(after)(x), [torch.exp(x) + 1, torch.exp(x)])
    assert after.output[1] is after.bound_symbols[0].output  # exp's output, returned in place of n


def test_expand_refuses_a_transform_that_returns_an_input():
    t = Trace()
    with tracing(t):
        (a,) = _inputs(t, "a")
        ltorch.exp(a)
    with pytest.raises(MinijitError, match=r"the test's expansion of ltorch\.exp returns its input a"):
        expand(t.bound_symbols[0], lambda x: x, t, what="the test's expansion")


def test_replay_records_a_trace_again_on_new_inputs(ab):
    inner = _nested_trace()
    outer = Trace("outer")
    with tracing(outer):
        x, y = _inputs(outer, "x", "y")
        outer.output = replay(inner, [ltorch.mul(x, 2), y])
    check_trace(outer)
    a, b = ab
    c = torch.sin(a * 2)
    d = torch.cat([c, b], dim=0)
    expected = {"s": torch.stack((d, torch.add(d, c.repeat(2, 1), alpha=2))), "l": [c, (d, 3)]}
    torch.testing.assert_close(trace_callable(outer)(a, b), expected)
