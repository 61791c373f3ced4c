"""Methods changing a container from outside the call are replayed as eager calls them: with their keywords
(`od.popitem(last=False)`), and where the method is written in Python and runs natively (Counter.update,
Counter.subtract). Each case runs eagerly and jitted over several calls, on its own state (each call runs its
entry's replay, a trace's own native writes undone), and after every call the results and containers must be equal.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from tests.semantics.util import assert_same

Make = Callable[[], tuple[Any, Callable[..., Any]]]


def _popitem_with_keyword() -> tuple[Any, Callable[..., Any]]:
    od = collections.OrderedDict((c, i) for i, c in enumerate("abcdefgh"))

    def f(x: torch.Tensor, k: int) -> Any:
        key, value = od.popitem(last=k % 2 == 1)
        od.move_to_end(next(iter(od)), last=False)
        return x * value, key
    return od, f


def _counter_methods() -> tuple[Any, Callable[..., Any]]:
    counts = collections.Counter(a=5)

    def f(x: torch.Tensor, k: int) -> Any:
        counts.update(["b", "b"], c=x.shape[0])
        counts.subtract(["a"])
        return x * counts["a"]
    return counts, f


def _dict_update_with_keywords() -> tuple[Any, Callable[..., Any]]:
    d = {"a": 1}

    def f(x: torch.Tensor, k: int) -> Any:
        d.update(b=x.shape[0], a=d["a"] + 1)
        return x + d["a"]
    return d, f


@pytest.mark.parametrize("make", [_popitem_with_keyword, _counter_methods, _dict_update_with_keywords])
def test_a_method_changing_an_outside_container_is_replayed_as_called(make: Make) -> None:
    eager_state, eager = make()
    jit_state, fn = make()
    jitted = minijit.jit(fn)
    for i in range(5):
        x = torch.ones(2 + i % 2)
        assert_same(jitted(x, i % 2), eager(x, i % 2), f"call {i}: result")
        assert_same(dict(jit_state), dict(eager_state), f"call {i}: state")
        assert list(jit_state) == list(eager_state), f"call {i}: order"
