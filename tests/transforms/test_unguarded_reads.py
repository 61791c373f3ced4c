"""A pass may not convert a symbolic number to the value seen while capturing: nothing guards that value, so a later
call of other sizes, served by the same entry, would run a trace decided on it. It raises, naming the proxy and the
pass; a value the compile's guard fixes may be converted."""

from __future__ import annotations

import operator

import pytest
import torch

import minijit
from minijit.errors import UnguardedValueError
from minijit.ir import Trace
from minijit.runtime import pipeline


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _insert_peek(monkeypatch, convert, seen: list[str]) -> None:
    """Put before the pass list's first dce a pass that converts the first input's first size with `convert`."""
    def peek(trace: Trace, ctx: pipeline.PassContext) -> Trace:
        size = trace.args[0].shape[0]
        seen.append(size.name)
        convert(size)
        return trace

    passes = pipeline.PASSES
    at = [p.name for p in passes].index("dce")
    monkeypatch.setattr(pipeline, "PASSES", (*passes[:at], pipeline.Pass("peek", peek), *passes[at:]))


@pytest.mark.parametrize("convert", [int, bool, float, str, operator.index, lambda n: f"{n}"])
def test_a_pass_converting_a_symbolic_size_raises_naming_the_proxy_and_the_pass(monkeypatch, convert):
    seen: list[str] = []
    _insert_peek(monkeypatch, convert, seen)
    jf = minijit.jit(_double, cache="symbolic values")
    with pytest.raises(UnguardedValueError) as raised:
        jf(torch.randn(3, 2))
    assert seen and seen[0] in str(raised.value) and "'peek'" in str(raised.value)


def test_a_pass_may_convert_a_size_the_guard_fixes(monkeypatch):
    def fixed(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] == 3 else x  # the capture relies on the size: the guard checks it

    seen: list[str] = []
    _insert_peek(monkeypatch, int, seen)
    jf = minijit.jit(fixed, cache="symbolic values")
    x = torch.randn(3, 2)
    torch.testing.assert_close(jf(x), fixed(x))
    assert seen
