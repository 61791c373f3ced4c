"""The cache's bounds: at most `max_entries` entries (the least recently used go first), misses explained
against a fixed number of entries, and a bounded list of miss reasons."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch

import minijit
from minijit.runtime import checks, dynamic
from minijit.runtime.entry_limit import MAX_ENTRIES
from minijit.runtime.explain import EXPLAINED_AGAINST
from minijit.runtime.jit import KEPT_REASONS


def add_one(x):
    return x + 1


def test_hundreds_of_shapes_keep_the_entries_and_the_cost_of_a_miss_bounded(monkeypatch) -> None:
    shapes = 600  # past MAX_ENTRIES (256) and 2 * KEPT_REASONS (100) several times over
    explained: list[int] = []  # per miss, how many entries' checks it ran
    failures = checks.Prologue.failures

    def counting(self, *args, **kwargs):
        explained[-1] += 1
        return failures(self, *args, **kwargs)

    monkeypatch.setattr(checks.Prologue, "failures", counting)
    jf = minijit.jit(add_one, cache="constant values")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, shapes + 1):
            x = torch.randn(n)
            explained.append(0)
            assert torch.equal(jf(x), add_one(x))
    info = jf.cache_info()
    assert info.misses == shapes and info.entries == MAX_ENTRIES == info.max_entries
    assert info.evictions == shapes - MAX_ENTRIES
    assert max(explained) <= EXPLAINED_AGAINST  # not one more for all the entries before
    limits = [w for w in caught if issubclass(w.category, minijit.CacheLimitWarning)]
    assert len(limits) == 1 and "max_entries" in str(limits[0].message) and limits[0].filename == __file__
    assert len(info.miss_reasons) == 2 * KEPT_REASONS and info.dropped_reasons == shapes - 2 * KEPT_REASONS
    assert info.miss_reasons[-1] == f"arg 'x': shape ({shapes},) != ({shapes - 1},)"


def test_the_least_recently_used_entry_goes_first() -> None:
    jf = minijit.jit(add_one, cache="constant values", max_entries=3)
    with pytest.warns(minijit.CacheLimitWarning, match=r"add_one has 3 cache entries"):
        for n in (1, 2, 3, 1, 4):  # 1 is used again after 2 and 3: 2 goes for 4
            jf(torch.randn(n))
    assert jf.cache_info().misses == 4 and jf.cache_info().evictions == 1
    for n in (1, 3, 4):
        x = torch.randn(n)
        assert torch.equal(jf(x), add_one(x))
    assert jf.cache_info().misses == 4
    jf(torch.randn(2))
    info = jf.cache_info()
    assert (info.misses, info.entries, info.evictions) == (5, 3, 2)
    assert "2 evicted (max_entries=3)" in str(info)


def test_max_entries_none_keeps_every_entry_and_options_carry_the_bound() -> None:
    jf = minijit.jit(add_one, cache="constant values", max_entries=None)
    for n in range(1, 301):
        jf(torch.randn(n))
    assert jf.cache_info().entries == 300 and jf.cache_info().evictions == 0
    bounded = minijit.jit(add_one, max_entries=5)
    assert bounded.options()["max_entries"] == 5
    assert pickle.loads(pickle.dumps(bounded)).options()["max_entries"] == 5
    module = minijit.jit(torch.nn.Linear(2, 2), cache="constant values", max_entries=2)
    with pytest.warns(minijit.CacheLimitWarning, match="Linear.forward has 2 cache entries"):
        for n in (1, 2, 3):
            module(torch.randn(n, 2))
    assert minijit.cache_info(module).entries == 2
    with pytest.raises(ValueError, match="max_entries"):
        minijit.jit(add_one, max_entries=0)


def test_the_reasons_of_misses_that_raise_stay_bounded() -> None:
    def f(x):
        if x.shape[0] > 2:
            raise ValueError("too long")
        return x * 2

    jf = minijit.jit(f)
    for _ in range(3 * KEPT_REASONS):
        with pytest.raises(ValueError, match="too long"):
            jf(torch.randn(3))
    info = jf.cache_info()
    assert info.misses == 3 * KEPT_REASONS and info.entries == 0
    assert len(info.miss_reasons) == 2 * KEPT_REASONS and info.dropped_reasons == KEPT_REASONS
    assert info.miss_reasons[0] == "first call"
    text = str(info)
    assert f"{KEPT_REASONS} miss reason(s) not kept" in text and f"miss {3 * KEPT_REASONS}: " in text


def test_value_guards_list_only_the_entries_held() -> None:
    def f(x, n):
        return x * 2 if x.sum() > n else x

    jf = minijit.jit(f, cache="constant values", max_entries=2)
    with pytest.warns(minijit.CacheLimitWarning):
        for n in range(6):  # a new number each call: a new entry, reading the sum's value
            x = torch.full((2,), 1.0)
            assert torch.equal(jf(x, n), f(x, n))
    info = jf.cache_info()
    assert info.entries == 2 and len(info.value_guards) == 2


def test_automatic_mode_remembers_a_bounded_number_of_constant_traces() -> None:
    def f(x, tag):
        return x + len(tag)

    jf = minijit.jit(f, max_entries=8)  # cache="automatic": a new string is a new key, never a size
    with pytest.warns(minijit.CacheLimitWarning):
        for i in range(dynamic.MAX_KEYS + 50):
            x = torch.randn(2)
            assert torch.equal(jf(x, f"tag {i}"), f(x, f"tag {i}"))
    assert len(jf._automatic.keys) == dynamic.MAX_KEYS and minijit.cache_info(jf).entries == 8
