"""A call's arguments take one road through a compile: minijit.runtime.arguments reads them once."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.extend import resolve_executors
from minijit.ir import containers
from minijit.runtime.pipeline import compile_for


def _flattenings(run: Callable[[], Any], arguments: tuple[Any, ...]) -> list[tuple[str, int]]:
    """(the module that asked, the argument's position) for each `flatten` or `leaves` of one of `arguments`,
    or of a tuple holding them all, while `run` runs."""
    watched = {containers.flatten.__code__, containers.leaves.__code__}
    seen: list[tuple[str, int]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code not in watched:
            return
        value = frame.f_locals["value"]
        for i, a in enumerate(arguments):
            if value is a:
                seen.append((frame.f_back.f_globals["__name__"], i))
        if isinstance(value, tuple) and value and (value[0] is arguments or value[0] == arguments):
            seen.append((frame.f_back.f_globals["__name__"], -1))  # all of them at once

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
def test_a_compile_flattens_each_argument_once_in_the_arguments_module(cache):
    def f(x, xs, n, table):
        return x * n + xs[0] - xs[1] * table["w"]

    args = (torch.randn(3), [torch.randn(3), torch.randn(3)], 2, {"w": torch.randn(3)})
    symbolic = cache == "symbolic values"
    entries = []
    seen = _flattenings(lambda: entries.append(compile_for(f, args, {}, resolve_executors(None), symbolic)), args)
    # Read once, by the module that owns the arguments: names, checks and leaves in one pass.
    assert sorted(seen) == [("minijit.runtime.arguments", i) for i in range(len(args))]
    flat = [args[0], *args[1], *([args[2]] if symbolic else []), args[3]["w"]]
    torch.testing.assert_close(entries[0].computation(*flat), f(*args))


def test_the_arguments_read_once_serve_proxies_checks_and_aliasing():
    # A container argument, a keyword, aliased inputs written in place: each step reads the one reading.
    def f(pair, y, *, scale):
        y.mul_(scale)
        return pair[0] + pair[1] + y

    for split in (lambda t: (t[:3], t[3:]), lambda t: (t[:3], t[:3]), lambda t: (t[:3], t[1:4])):
        base = torch.randn(6)
        eager_base = base.clone()
        jf = minijit.jit(f)
        pair, eager_pair = split(base), split(eager_base)
        torch.testing.assert_close(jf(pair, pair[1], scale=2.0), f(eager_pair, eager_pair[1], scale=2.0))
        torch.testing.assert_close(base, eager_base)
        assert "scale" in jf.last_prologue()


class _Key:
    """An object used as a dict key (its repr is no Python expression)."""


def test_a_dict_keyed_by_objects_or_nan_is_read_as_an_object() -> None:
    """A dict argument whose keys are objects, tensors or NaN (once a SyntaxError from the generated checks, which
    wrote the keys' reprs into their source) is specialised on by identity: its items are read, and guarded, as
    an outside object's, so a changed value or a new dict gives eager's result."""
    def total(d: dict[Any, Any], x: torch.Tensor) -> torch.Tensor:
        return x * sum(v for v in d.values() if not isinstance(v, torch.Tensor)) + sum(
            v.sum() for v in d.values() if isinstance(v, torch.Tensor))

    jitted, x, key, t = minijit.jit(total), torch.ones(2), _Key(), torch.zeros(1)
    d = {key: 1, "a": 2, float("nan"): 3, t: torch.ones(3)}
    for _ in range(2):
        torch.testing.assert_close(jitted(d, x), total(d, x))
        d[key] += 5
        d[t] = torch.full((3,), 2.0)
    other = {_Key(): 4, (1, "b"): torch.ones(2)}
    torch.testing.assert_close(jitted(other, x), total(other, x))
