"""A call is dispatched once: `JitFunction._dispatch` decides hit, rebind, value switch, miss or eager run, and
`_serve` runs it, deciding again only after a run that failed a value check or raised in a user's `try`.

Each call's result and its writes are compared with eager's, and the decisions it took are read from
`cache_info().decisions`, before and after the call."""

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.runtime.jit import JitFunction


class State:
    """An object the traced code writes into: a new one of the same kind is a rebind, not a trace."""

    def __init__(self) -> None:
        self.total = torch.zeros(2)


def step(x: torch.Tensor, state: State) -> torch.Tensor:
    state.total = state.total + x
    if x.sum() > 0:  # a value read from a tensor: one entry per side
        return state.total * 2
    return state.total - 1


def factor(a: torch.Tensor) -> torch.Tensor:
    try:
        return torch.linalg.cholesky(a)
    except torch.linalg.LinAlgError:  # never traced: the call runs eagerly
        return torch.zeros_like(a)


def checked(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 5:
        raise ValueError("too large")
    return x + 1


def _decided(jf: JitFunction, call: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """(what `call()` returned, the decisions it took that were not 0), with `_serve` entered at most once."""
    before = Counter(minijit.cache_info(jf).decisions)
    served = []
    serve = jf._serve
    jf._serve = lambda *a: served.append(1) or serve(*a)  # type: ignore[method-assign]
    try:
        result = call()
    finally:
        del jf._serve
    assert len(served) <= 1, "a path came back up to the dispatcher"
    return result, dict(Counter(minijit.cache_info(jf).decisions) - before)


def test_each_call_takes_the_paths_eager_requires() -> None:
    jf = minijit.jit(step)
    positive, negative = torch.ones(2), -torch.ones(2)
    mine, theirs = State(), State()
    calls = [
        (positive, False, {"miss": 1}),
        (positive, False, {"hit": 1}),
        (positive, True, {"rebind": 1}),  # a new State: the entry moves to it
        (negative, False, {"hit": 1, "miss": 1}),  # the value check fails; no entry for False yet
        (positive, False, {"hit": 1, "value switch": 1}),  # the entry used last first, then the one for True
        (negative, False, {"hit": 1, "value switch": 1}),
    ]
    for i, (x, new_state, expected) in enumerate(calls, start=1):
        if new_state:
            mine, theirs = State(), State()
        result, decided = _decided(jf, lambda x=x, mine=mine: jf(x, mine))
        assert torch.equal(result, step(x, theirs)), f"call {i}"
        assert torch.equal(mine.total, theirs.total), f"call {i}"
        assert decided == expected, f"call {i}: {decided}"
        info = minijit.cache_info(jf)
        assert info.hits + info.misses + info.rebound == i, str(info)  # each call counted once
    info = minijit.cache_info(jf)
    assert (info.value_switches, info.entries) == (3, 2), str(info)


def test_a_raise_in_a_users_try_runs_eagerly() -> None:
    jf = minijit.jit(factor)
    definite, singular = torch.eye(2) * 4, -torch.eye(2)
    for a, expected in [(definite, {"miss": 1}), (singular, {"hit": 1, "eager": 1}), (definite, {"hit": 1})]:
        result, decided = _decided(jf, lambda a=a: jf(a))
        assert torch.equal(result, factor(a))
        assert decided == expected, decided
    assert minijit.cache_info(jf).eager_calls == 1


def test_a_raise_while_tracing_runs_eagerly_and_caches_nothing() -> None:
    jf = minijit.jit(checked)
    large = torch.full((2,), 4.0)
    with pytest.raises(ValueError, match="too large") as eager:
        checked(large)
    with pytest.raises(ValueError, match="too large") as jitted:
        _decided(jf, lambda: jf(large))
    assert type(jitted.value) is type(eager.value)
    # Traced (a miss), then decided an eager run: the trace raised.
    info = minijit.cache_info(jf)
    assert info.decisions == {"hit": 0, "rebind": 0, "value switch": 0, "miss": 0, "eager": 1}, info.decisions
    assert (info.misses, info.eager_calls, info.entries) == (1, 1, 0), str(info)
    small = torch.ones(2)
    result, decided = _decided(jf, lambda: jf(small))
    assert torch.equal(result, checked(small)) and decided == {"miss": 1}


def test_entries_kept_from_constant_values_still_hit() -> None:
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    jf = minijit.jit(scale)  # cache="automatic": the second size makes sizes symbolic
    for n, expected in [(2, {"miss": 1}), (3, {"miss": 1}), (2, {"hit": 1}), (5, {"hit": 1})]:
        x = torch.arange(float(n))
        result, decided = _decided(jf, lambda x=x: jf(x))
        assert torch.equal(result, scale(x))
        assert decided == expected, f"size {n}: {decided}"
    assert minijit.cache_info(jf).dynamic


@pytest.mark.parametrize("symbolic", [False, True])
def test_rebind_tries_only_entries_whose_key_differs_in_objects_alone(symbolic: bool) -> None:
    # The quick filter before `rebind`: a new object of the same type may differ; anything else in the key
    # (a shape, a number, a list's length, a string, another type) rules the entry out without trying it.
    from minijit.runtime.cache_key import cache_key
    from minijit.runtime.rebind import differs_in_objects_only

    def key(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return cache_key(args, kwargs, symbolic=symbolic)

    x, old = torch.ones(2, 3), State()
    before = key(x, old, [1, 2], mode="a")
    assert differs_in_objects_only(before, key(x, State(), [1, 2], mode="a"))
    assert differs_in_objects_only(before, key(torch.zeros(2, 3), old, [1, 2], mode="a"))
    assert not differs_in_objects_only(before, key(x, object(), [1, 2], mode="a"))
    assert not differs_in_objects_only(before, key(x, State(), [1, 2, 3], mode="a"))
    assert not differs_in_objects_only(before, key(x, State(), [1, 2], mode="b"))
    assert not differs_in_objects_only(before, key(x.double(), State(), [1, 2], mode="a"))
    assert differs_in_objects_only(before, key(torch.ones(4, 3), State(), [1, 2], mode="a")) is symbolic
    assert differs_in_objects_only(before, key(x, State(), [1, 7], mode="a")) is symbolic


@pytest.mark.parametrize("symbolic", [False, True])
def test_a_long_tuple_of_tensors_keeps_its_key_part_only_while_its_metadata_holds(symbolic: bool) -> None:
    # A jitted module's parameters, fetched anew on each call, are a long tuple of tensors: the jitted function keeps
    # their part of the key from call to call. Each change of what the key reads must show in the key.
    from minijit.runtime.cache_key import KeyMemo, cache_key

    memo = KeyMemo()
    params = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(10)]
    changes: list[Callable[[list[Any]], None]] = [
        lambda p: None,
        lambda p: p[3].requires_grad_(False),
        lambda p: p.__setitem__(4, torch.nn.Parameter(torch.randn(3, 4).double())),
        lambda p: p.__setitem__(5, torch.nn.Parameter(torch.randn(5, 4))),
        lambda p: p.__setitem__(6, torch.nn.Parameter(torch.randn(3))),
        lambda p: p.__setitem__(7, torch.randn(3, 4)),  # a plain tensor, not a Parameter: same key
        lambda p: p.__setitem__(8, torch.randn(4, 3).t()),  # other strides: same key
    ]
    for change in changes:
        change(params)
        for _ in range(2):  # walked, then kept
            args = (tuple(params), torch.ones(2))
            assert cache_key(args, {}, symbolic, memo) == cache_key(args, {}, symbolic)
    with torch.no_grad():
        args = (tuple(params), torch.ones(2))
        assert cache_key(args, {}, symbolic, memo) == cache_key(args, {}, symbolic)


class Holder:
    """An object passed alone (no tensor argument): its tensors are read from it, the object checked by identity."""

    def __init__(self, scale: float) -> None:
        self.x = torch.arange(3.0)
        self.scale = scale


def scaled_step(h: Holder) -> torch.Tensor:
    h.x.mul_(h.scale)
    if h.x.sum() > 40:  # a value read from a tensor: one entry per side
        return h.x - 1
    return h.x + 1


def test_calls_passing_only_objects_hit_without_the_dispatcher_and_fail_over_as_it_would() -> None:
    # A call passing no tensor is served from the last such call's entry (its key's checks and its guard) without
    # reaching `_dispatch`; every other outcome goes through `_serve`, deciding what the dispatcher decides.
    jf = minijit.jit(scaled_step)
    mine, theirs = [Holder(2.0), Holder(2.0)], [Holder(2.0), Holder(2.0)]
    calls = [
        (0, {"miss": 1}),
        (0, {"hit": 1}),
        (1, {"rebind": 1}),  # another object of the same kind: the entry moves to it
        (1, {"hit": 1}),
        (1, {"hit": 1}),
        (1, {"hit": 1, "miss": 1}),  # the sum passes 40: the value check fails, no entry for that side yet
        (1, {"hit": 1}),
        (0, None),  # back to the first object (moved again: which entry first is the dispatcher's business)
    ]
    for i, (which, expected) in enumerate(calls, start=1):
        result, decided = _decided(jf, lambda which=which: jf(mine[which]))
        assert torch.equal(result, scaled_step(theirs[which])), f"call {i}"
        assert torch.equal(mine[which].x, theirs[which].x), f"call {i}"
        assert expected is None or decided == expected, f"call {i}: {decided}"
    mine[0].scale = theirs[0].scale = 0.5  # a number read from the object changed: the guard fails
    result = jf(mine[0])
    assert torch.equal(result, scaled_step(theirs[0])) and torch.equal(mine[0].x, theirs[0].x)
    with torch.no_grad():  # grad mode is part of the key: checked on the object path too
        before = minijit.cache_info(jf).misses
        assert torch.equal(jf(mine[0]), scaled_step(theirs[0]))
        assert minijit.cache_info(jf).misses == before + 1
