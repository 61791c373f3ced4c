"""A symbolic number used as a key: looked up in, written into and deleted from a dict, set or list from outside,
counted (Counter, defaultdict), given to a functools.lru_cache function (whose cache must not keep proxies), or
a key of a dict the function returns.

A lookup that finds no equal key compares nothing (the hash alone decides it), so the trace relies on the
number's value all the same; a write replays each call's value of the key, never the proxy. Each case runs
eagerly and jitted (cache="automatic", which goes symbolic once the number changes, and "symbolic values")
over numbers that miss and hit, each call on fresh copies of the same state, and compares results and state.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from tests.semantics.util import assert_same

KS = [0, 2, 3, 5, 1, 4]


def _lookups(state: dict[str, Any]) -> Callable[..., Any]:
    def f(x: torch.Tensor, k: int) -> Any:
        d, s = state["d"], state["s"]
        return x + 1, k in d, d.get(k, -1), k in s, k not in d
    return f


def _dict_writes(state: dict[str, Any]) -> Callable[..., Any]:
    def f(x: torch.Tensor, k: int) -> Any:
        d = state["d"]
        d[k] = x.shape[0]
        d[(k, "pair")] = k
        if k - 1 in d:
            del d[k - 1]
        return x * 2
    return f


def _list_writes(state: dict[str, Any]) -> Callable[..., Any]:
    def f(x: torch.Tensor, k: int) -> Any:
        lst = state["l"]
        lst[k] = 7
        del lst[k - 1]
        return x - 1
    return f


def _counted(state: dict[str, Any]) -> Callable[..., Any]:
    def f(x: torch.Tensor, k: int) -> Any:
        state["c"].update([k % 2, k])
        state["c"][k % 3] += 1
        state["dd"][k % 3] += x.shape[0]
        return x + state["dd"][0]
    return f


@functools.cache
def _cached(n: int) -> int:
    return n * 2 + 1


def _cached_helper(state: dict[str, Any]) -> Callable[..., Any]:
    def f(x: torch.Tensor, k: int) -> Any:
        return x * _cached(x.shape[0]) + _cached(k)
    return f


def _result_keys(state: dict[str, Any]) -> Callable[..., Any]:
    def f(x: torch.Tensor, k: int) -> Any:
        rows, cols = divmod(x.shape[0] * 10 + k, 10)
        return {x.shape[0]: x * 2, (k, "k"): rows, cols: "cols"}
    return f


def _fresh_state() -> dict[str, Any]:
    return {"d": {1: 10, 3: 30}, "s": {1, 3}, "l": [0] * 8, "c": collections.Counter(),
            "dd": collections.defaultdict(int)}


@pytest.mark.parametrize("cache", ["automatic", "symbolic values"])
@pytest.mark.parametrize("body", [_lookups, _dict_writes, _list_writes, _counted, _cached_helper, _result_keys])
def test_a_symbolic_key_behaves_as_its_value(body: Callable[[dict[str, Any]], Callable[..., Any]], cache: str) -> None:
    _cached.cache_clear()
    eager_state, jit_state = _fresh_state(), _fresh_state()
    eager, jitted = body(eager_state), minijit.jit(body(jit_state), cache=cache)
    for i, k in enumerate(KS):
        x = torch.arange(3.0 + i % 3)
        want = eager(x, k)
        got = jitted(x, k)
        assert_same(got, want, f"k={k}: result")
        assert_same(jit_state, eager_state, f"k={k}: state")
        for state in (eager_state, jit_state):
            _reset(state)
    assert [_cached(n) for n in range(8)] == [n * 2 + 1 for n in range(8)]  # no proxy kept in the cache


def _reset(state: dict[str, Any]) -> None:
    """Put the containers back as `_fresh_state` makes them, in place (the same objects on every call)."""
    for name, fresh in _fresh_state().items():
        state[name].clear()
        if isinstance(fresh, list):
            state[name].extend(fresh)
        else:
            state[name].update(fresh)


@pytest.mark.parametrize("cache", ["automatic", "symbolic values"])
def test_counts_kept_under_a_symbolic_key(cache: str) -> None:
    # The count read (a number the call takes from outside) is read again by each call under the key's value.
    eager_counts, jit_counts = collections.Counter(), collections.Counter()

    def step(counts: collections.Counter) -> Callable[..., Any]:
        def f(x: torch.Tensor, k: int) -> Any:
            counts[k % 3] += 1
            return x * counts[k % 3]
        return f

    eager, jitted = step(eager_counts), minijit.jit(step(jit_counts), cache=cache)
    for k in range(7):
        assert_same(jitted(torch.ones(2), k), eager(torch.ones(2), k), f"k={k}: result")
        assert jit_counts == eager_counts, f"k={k}: counts"
