"""A call whose code raises while it is traced behaves as eager: the writes and effects before the raise land.

Each pattern builds fresh state (inputs, outside objects) and returns `(step, observe)`; the same pattern
runs eagerly and jitted for several calls, each call on fresh copies of the same inputs, and after every
call the outcome (the result, or the exception's type and message), the observed state (inputs written,
outside objects, the random generator) and what was printed must match (minijit.runtime.fallback).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import MetaError, as_eager
from minijit.frontend.frame import current_frame
from tests.semantics.util import assert_same

Pattern = Callable[[], tuple[Callable[..., Any], Callable[[], Any]]]


def _outcome(step: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """("result", the result) or ("raised", the exception), with the random generator seeded the same."""
    torch.manual_seed(7)
    try:
        return "result", step(*args)
    except (Exception, KeyboardInterrupt) as e:
        return "raised", e


def _compare(pattern: Pattern, inputs: Callable[[int], tuple[Any, ...]], capsys: Any, calls: int = 3,
             **jit_options: Any) -> Callable[..., Any]:
    """Run `pattern` eagerly and jitted for `calls` calls, on fresh `inputs(i)` each; every call must end the same."""
    eager_step, eager_observe = pattern()
    jit_step, jit_observe = pattern()
    jitted = minijit.jit(jit_step, **jit_options)
    for i in range(calls):
        eager_args, jit_args = inputs(i), inputs(i)
        capsys.readouterr()
        want = _outcome(eager_step, eager_args)
        eager_rng, eager_printed = torch.get_rng_state(), capsys.readouterr().out
        got = _outcome(jitted, jit_args)
        jit_rng, jit_printed = torch.get_rng_state(), capsys.readouterr().out
        assert got[0] == want[0], f"call {i}: {got[0]} {got[1]!r}, eager: {want[0]} {want[1]!r}"
        if want[0] == "raised":
            assert isinstance(got[1], type(want[1])), f"call {i}: raised {got[1]!r}, eager raised {want[1]!r}"
            if not isinstance(got[1], MetaError):  # (a MetaError says the same in minijit's words, naming the op)
                assert str(got[1]) == str(want[1]), f"call {i}: message {got[1]}, eager: {want[1]}"
        else:
            assert_same(got[1], want[1], f"call {i}: result")
        assert_same(jit_args, eager_args, f"call {i}: inputs")
        assert_same(jit_observe(), eager_observe(), f"call {i}: state")
        assert torch.equal(jit_rng, eager_rng), f"call {i}: the random generator"
        assert jit_printed == eager_printed, f"call {i}: printed {jit_printed!r}, eager: {eager_printed!r}"
    return jitted


def _two(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)


def _nothing() -> list[Any]:
    return []


# -- writes into inputs, then a raise ---------------------------------------------------------------------

def _python_raise() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        a.add_(1)
        b.mul_(2)
        raise ValueError("after the writes")
    return f, _nothing


def _matmul_mismatch() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        a.add_(1)
        return a @ b  # (3, 4) @ (3, 4)
    return f, _nothing


def _cat_mismatch() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        b.sub_(a)
        return torch.cat([a, b.t()])
    return f, _nothing


def _index_out_of_range() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        a.mul_(3)
        return a[5]
    return f, _nothing


def _value_read_of_bad_data() -> tuple[Callable[..., Any], Callable[[], Any]]:
    # The branch reads a value: the trace so far runs on the real inputs, and its index_select raises on the data.
    def f(a, b):
        a.add_(1)
        if torch.index_select(a, 0, torch.tensor([7])).sum() > 0:
            return a * 2
        return b
    return f, _nothing


def _through_a_view() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        a[1:].add_(10)
        b.t()[0].zero_()
        raise RuntimeError("after writing through views")
    return f, _nothing


def _nested_call() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def inner(t, k):
        t.add_(k)
        if k > 1:
            raise KeyError(f"too deep: {k}")
        inner(t, k + 1)

    def f(a, b):
        b.mul_(2)
        inner(a, 0)
        return a
    return f, _nothing


@pytest.mark.parametrize("pattern", [_python_raise, _matmul_mismatch, _cat_mismatch, _index_out_of_range,
                                     _value_read_of_bad_data, _through_a_view, _nested_call])
def test_writes_into_inputs_before_the_raise_land(pattern: Pattern, capsys: Any) -> None:
    jitted = _compare(pattern, _two, capsys)
    info = minijit.cache_info(jitted)
    assert info.entries == 0 and info.eager_calls == 3  # nothing half-made is cached: each call traced again


def test_the_exception_of_an_op_is_eagers_type() -> None:
    a, b = _two(0)
    with pytest.raises(RuntimeError):
        _matmul_mismatch()[0](a.clone(), b)
    with pytest.raises(IndexError):
        minijit.jit(_index_out_of_range()[0])(a, b)
    with pytest.raises(ValueError, match="after the writes"):
        minijit.jit(_python_raise()[0])(a, b)


# -- effects on outside objects, then a raise --------------------------------------------------------------

GLOBAL_TENSOR = torch.zeros(4)


class _Holder:
    def __init__(self) -> None:
        self.count = 0
        self.items: list[Any] = []


def _outside_objects() -> tuple[Callable[..., Any], Callable[[], Any]]:
    log: list[Any] = []
    table: dict[str, Any] = {}
    holder = _Holder()
    global GLOBAL_TENSOR
    GLOBAL_TENSOR = torch.zeros(4)

    def f(a, b):
        log.append(a.sum())
        table["first"] = b[0] * 2
        holder.count += 1
        holder.items.append("seen")
        GLOBAL_TENSOR.add_(a[0])
        print("about to raise", holder.count)
        raise LookupError("after the effects")

    return f, lambda: [log, table, holder.count, holder.items, GLOBAL_TENSOR.clone()]


def _draws_then_raises() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        a.add_(torch.rand(4))
        raise ArithmeticError("after a draw")
    return f, _nothing


@pytest.mark.parametrize("pattern", [_outside_objects, _draws_then_raises])
def test_effects_before_the_raise_happen_once(pattern: Pattern, capsys: Any) -> None:
    _compare(pattern, _two, capsys)


def _effect_then_op_error(what: str) -> Pattern:
    """An op refusing its shapes after one thing eager shows that is no tensor write: `what` names it."""
    def pattern() -> tuple[Callable[..., Any], Callable[[], Any]]:
        log: list[Any] = []

        def f(a, b, xs):
            if what == "outside":
                log.append(1)
            elif what == "print":
                print("before the error")
            elif what == "draw":
                torch.rand(2)
            else:
                xs.append("argument")
            return torch.cat([a, b.t()])
        return f, lambda: list(log)
    return pattern


@pytest.mark.parametrize("what", ["outside", "print", "draw", "argument"])
def test_an_op_error_after_an_effect_keeps_the_effect(what: str, capsys: Any) -> None:
    jitted = _compare(_effect_then_op_error(what), lambda i: (*_two(i), []), capsys)
    assert minijit.cache_info(jitted).eager_calls == 3


# -- a user callback raising on its first call only ----------------------------------------------------------

class _Counter:
    """A callback counting its calls, which raises on the first one only."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("not ready yet")
        return t * self.calls


def _callback_object() -> tuple[Callable[..., Any], Callable[[], Any]]:
    counter = _Counter()

    def f(a, b):
        a.add_(1)
        return counter(a) + b
    return f, lambda: counter.calls


def _callback_closure() -> tuple[Callable[..., Any], Callable[[], Any]]:
    calls = 0

    def callback(t):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("not ready yet")
        return t + calls

    def f(a, b):
        b.mul_(2)
        return callback(a)
    return f, lambda: calls


@pytest.mark.parametrize("pattern", [_callback_object, _callback_closure])
def test_a_callback_that_raises_once_counts_that_call(pattern: Pattern, capsys: Any) -> None:
    # After the first call the counter is eager's (1), so the later calls return as eager's do.
    jitted = _compare(pattern, _two, capsys, calls=4)
    assert minijit.cache_info(jitted).eager_calls == 1


def _raises_on_positive_sum() -> tuple[Callable[..., Any], Callable[[], Any]]:
    def f(a, b):
        a.add_(1)
        if b.sum() > 0:
            raise ValueError("positive")
        return a * b
    return f, _nothing


def test_a_path_that_raises_after_a_value_read_on_later_calls(capsys: Any) -> None:
    # The first call caches the path that returns; later calls whose value leads to the raise trace again.
    def inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = _two(i)
        return a, b.abs() * (1 if i % 2 else -1)
    jitted = _compare(_raises_on_positive_sum, inputs, capsys, calls=4)
    assert minijit.cache_info(jitted).eager_calls == 2


# -- KeyboardInterrupt ----------------------------------------------------------------------------------------

def _interrupting_callback() -> tuple[Callable[..., Any], Callable[[], Any]]:
    seen: list[int] = []

    def stop(n):
        seen.append(n)
        raise KeyboardInterrupt

    def f(a, b):
        a.add_(1)
        stop(len(seen))
        return a
    return f, lambda: list(seen)


def test_a_keyboard_interrupt_the_code_raises_keeps_the_writes_before_it(capsys: Any) -> None:
    _compare(_interrupting_callback, _two, capsys)


def _sigint(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    signal.raise_signal(signal.SIGINT)  # Ctrl-C, delivered while minijit traces
    return x * 2


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_ctrl_c_while_tracing_abandons_the_compile() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        jitted = minijit.jit(_sigint)
        x = torch.zeros(3)
        with pytest.raises(KeyboardInterrupt):
            jitted(x)
    finally:
        signal.signal(signal.SIGINT, previous)
    # Not run eagerly in its place: nothing written, nothing cached.
    assert torch.equal(x, torch.zeros(3))
    info = minijit.cache_info(jitted)
    assert info.entries == 0 and info.eager_calls == 0


# -- grad -----------------------------------------------------------------------------------------------------

def _leaf_written_under_no_grad() -> tuple[Callable[..., Any], Callable[[], Any]]:
    weight = torch.nn.Parameter(torch.ones(4))

    def f(a, b):
        loss = (a * weight).sum()
        with torch.no_grad():
            weight.sub_(0.5)
        if loss.requires_grad:
            raise RuntimeError("stop after the update")
        return loss
    return f, lambda: [weight.detach().clone(), weight.requires_grad, weight.grad]


def test_a_leaf_written_under_no_grad_before_the_raise(capsys: Any) -> None:
    _compare(_leaf_written_under_no_grad, _two, capsys)


# -- a module ---------------------------------------------------------------------------------------------------

class _CountingModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        if x.shape[0] > 2:
            raise ValueError("too many rows")
        return self.linear(x)


def test_a_jitted_module_whose_forward_raises(capsys: Any) -> None:
    def pattern() -> tuple[Callable[..., Any], Callable[[], Any]]:
        torch.manual_seed(0)
        module = _CountingModule()
        return module, lambda: [module.steps.clone()]
    eager_module, eager_state = pattern()
    jit_module, jit_state = pattern()
    jitted = minijit.jit(jit_module)
    for rows in (3, 2, 3):
        x = torch.randn(rows, 4)
        want, got = _outcome(eager_module, (x,)), _outcome(jitted, (x,))
        assert got[0] == want[0] and type(got[1]) is type(want[1])
        assert_same(jit_state(), eager_state())


# -- an op's error before anything happened; a capture that raises where eager does not ------------------

def _mismatch_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = a * 2
    return c @ b


def test_an_op_error_before_any_write_is_minijits_own_error_naming_the_op() -> None:
    # Nothing eager would show happened before it: the call is not run eagerly, the error names the op.
    a, b = _two(0)
    with pytest.raises(RuntimeError) as eager:
        _mismatch_first(a, b)
    jitted = minijit.jit(_mismatch_first)
    with pytest.raises(MetaError, match="matmul") as info:
        jitted(a, b)
    assert isinstance(info.value, type(eager.value))
    assert minijit.cache_info(jitted).eager_calls == 0


def _differs_when_traced(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    if current_frame() is not None:  # only inside minijit's interpreter: a stand-in for a limitation of minijit
        raise TypeError("only while traced")
    return x * 2


def _limitation_when_traced(x: torch.Tensor, write: bool) -> torch.Tensor:
    if write:
        x.add_(1)
    if current_frame() is not None:  # a stand-in for a limitation minijit reports as the error eager would raise
        raise as_eager(MetaError("a limitation of minijit"), RuntimeError)
    return x * 2


def test_a_capture_that_raises_where_eager_returns_gives_eagers_result_and_warns() -> None:
    for fn, args in ((_differs_when_traced, ()), (_limitation_when_traced, (True,))):
        x, y = torch.zeros(3), torch.zeros(3)
        want = fn(x, *args)
        with pytest.warns(minijit.TracingRaisedWarning, match="only while traced|a limitation"):
            got = minijit.jit(fn)(y, *args)
        assert torch.equal(got, want) and torch.equal(y, x)


def test_a_limitation_before_anything_happened_stays_a_refusal() -> None:
    x = torch.zeros(3)
    with pytest.raises(MetaError, match="a limitation"):
        minijit.jit(_limitation_when_traced)(x, False)
    assert torch.equal(x, torch.zeros(3))
