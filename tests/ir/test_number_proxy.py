"""A number proxy's conversions mean one thing wherever they run; a pass asks `same_value`, which records nothing."""

from __future__ import annotations

import operator

import pytest

from minijit.errors import UnguardedValueError, UnsupportedSyntaxError
from minijit.ir import IntegerProxy
from minijit.ir.context import knowing_constraints, recording_constraints, replaying_captured, running_pass
from minijit.ir.proxies import same_shape, same_value


def test_a_number_proxy_converts_to_its_value_in_a_capture_and_outside_one():
    def conversions(n):
        return bool(n), int(n), float(n), str(n), f"{n:>3}", operator.index(n)

    n = IntegerProxy(4, expr="x.shape[0]")
    want = conversions(4)  # what Python gives for the value
    with recording_constraints() as recorded:
        assert conversions(n) == want
    assert recorded == ["x.shape[0] == 4"]  # a capture relies on the value: the guard checks it
    with knowing_constraints(recorded):
        assert conversions(n) == want  # a pass, where the guard fixes the value
    with knowing_constraints(["x.shape[0] == y.shape[0]", "y.shape[0] == 4"]):
        assert conversions(n) == want  # fixed through a chain of equalities
    with replaying_captured():
        assert conversions(n) == want  # a pass re-recording what the capture decided, as it decided


@pytest.mark.parametrize("convert", [bool, int, float, str, operator.index, lambda n: f"{n:>3}"])
def test_a_pass_converting_a_symbolic_number_the_guard_does_not_fix_raises_naming_it(convert):
    n = IntegerProxy(4, expr="x.shape[0]")
    with knowing_constraints(["x.shape[0] == y.shape[0]"]), running_pass("simplify"):
        with pytest.raises(UnguardedValueError, match=rf"the pass 'simplify' .* {n.name} \(x.shape\[0\], 4"):
            convert(n)
    with pytest.raises(UnguardedValueError, match=n.name):
        convert(n)  # outside any compile: nothing guards it either
    read = IntegerProxy(4, expr="x.shape[0]")
    read.read = True  # a value the trace checks where the capture read it: a constant from there on
    assert convert(read) == convert(4)


@pytest.mark.parametrize("convert", [bool, int, float, str, operator.index])
def test_a_value_the_trace_computes_is_never_converted_to_the_value_seen(convert):
    computed = IntegerProxy(3)  # no expression: Tensor.item()'s result, known only when the trace runs
    with pytest.raises(UnsupportedSyntaxError, match="only known when the trace runs"):
        convert(computed)  # in a pass (no value reader)
    with recording_constraints(), pytest.raises(UnsupportedSyntaxError, match="only known when the trace runs"):
        convert(computed)  # in a capture without a value reader (a grad rule)


def test_same_value_is_a_pass_s_question_in_a_capture_too():
    n, m = IntegerProxy(4, expr="x.shape[0]"), IntegerProxy(4, expr="y.shape[0]")
    with recording_constraints() as recorded:
        answers = (same_value(n, m), same_value(n, n), same_value(4, n), same_value(n, 4), same_value(4, 4))
    assert answers == (False, True, False, False, True) and recorded == []
    with knowing_constraints(["x.shape[0] == y.shape[0]", "x.shape[0] == 4"]):
        assert same_value(n, m) and same_value(4, n) and same_value(n, 4)


def test_same_shape_asks_same_value_of_each_size():
    n, m = IntegerProxy(4, expr="x.shape[0]"), IntegerProxy(4, expr="y.shape[0]")
    assert same_shape((n, 3), (n, 3)) and not same_shape((n, 3), (m, 3)) and not same_shape((n,), (n, 3))
    with knowing_constraints(["x.shape[0] == y.shape[0]"]):
        assert same_shape((n, 3), (m, 3))
