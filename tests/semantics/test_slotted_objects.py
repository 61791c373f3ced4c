"""Objects from outside the call whose attributes live in `__slots__` (`dataclass(slots=True)`), read and written by
the traced code as eager reads and writes them: a setting changed between calls is read again, a count kept in a
slot goes up on every call, a tensor stored in a slot is replaced, an unset slot is seen unset. Each case runs
eagerly and jitted on its own object, which the caller changes between calls, and must agree after every call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import minijit
from tests.semantics.util import assert_same


@dataclasses.dataclass(slots=True)
class _Settings:
    scale: float = 2.0
    calls: int = 0
    total: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(3))


class _Bare:
    __slots__ = ("last", "offset")


def _make() -> tuple[_Settings, _Bare]:
    bare = _Bare()
    bare.offset = 1
    return _Settings(), bare


def _step(settings: _Settings, bare: _Bare) -> Any:
    def f(x: torch.Tensor) -> Any:
        settings.calls += 1
        settings.total = settings.total + x
        seen_last = hasattr(bare, "last")
        bare.last = x.sum() * settings.scale
        if settings.calls % 3 == 0:
            del bare.last
        return x * settings.scale + bare.offset + settings.calls, seen_last
    return f


def _observe(settings: _Settings, bare: _Bare) -> Any:
    return (dataclasses.astuple(settings), bare.offset, getattr(bare, "last", None))


@pytest.mark.parametrize("cache", ["automatic", "symbolic values"])
def test_slotted_objects_read_and_written_as_in_eager(cache: str) -> None:
    eager_state, jit_state = _make(), _make()
    eager, jitted = _step(*eager_state), minijit.jit(_step(*jit_state), cache=cache)
    for i in range(7):
        for settings, bare in (eager_state, jit_state):  # the caller changes the objects between calls
            if i == 2:
                settings.scale = 5.0
            if i == 4:
                bare.offset = -3
                settings.total = torch.ones(3)
        x = torch.arange(3.0) + i
        assert_same(jitted(x), eager(x), f"call {i}: result")
        assert_same(_observe(*jit_state), _observe(*eager_state), f"call {i}: objects")
