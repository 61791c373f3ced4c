"""Which inputs a trace writes, asked of the memory model before functionalizing (`inputs_written`), and
functionalize run once per compile.

The query must agree exactly with what functionalizing the same captured trace finds
(`FunctionalizeResult.mutated_inputs`): checked on every trace the runtime plans the aliasing
of, over the functionalize fuzzers' programs and the mutation programs below, each also
checked against eager PyTorch.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import minijit
import minijit.runtime.arguments as arguments
import minijit.runtime.pipeline as pipeline
from minijit.errors import MinijitError, TraceInvariantError
from minijit.transforms.memory import inputs_written
from minijit.transforms.view_updates import view_shares_memory
from tests.transforms import test_functionalize_fuzz as fuzz
from tests.transforms import test_symbolic_mutation_fuzz as symbolic_fuzz

functionalize_module = importlib.import_module("minijit.transforms.functionalize")


@pytest.fixture
def compared(monkeypatch):
    """Every trace whose aliasing the runtime plans: (the query's answer, functionalize's), appended to a list."""
    pairs: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    original = arguments.plan_aliasing

    def spy(trace, flat):
        plan = original(trace, flat)
        assert plan.written == inputs_written(trace, view_shares_memory)
        try:
            _, result = functionalize_module.functionalize(trace, grad_enabled=False)
        except MinijitError:
            return plan  # refused: the compile refuses it too
        pairs.append((plan.written, result.mutated_inputs))
        return plan

    monkeypatch.setattr(arguments, "plan_aliasing", spy)
    monkeypatch.setattr(pipeline, "plan_aliasing", spy)
    return pairs


def _assert_agree(pairs: list[tuple[tuple[str, ...], tuple[str, ...]]], where: str = "") -> None:
    for mine, theirs in pairs:
        assert mine == theirs, f"inputs_written says {mine}, functionalize found {theirs}{where}"


def test_written_inputs_agree_with_functionalize_over_the_fuzzer_programs(compared):
    outcomes = []
    for seed in range(150):
        outcomes.append(fuzz.run_one(seed))  # also checks the jitted result against eager
    for seed in range(2, 90, 3):  # inputs sharing memory, symbolic sizes
        outcomes.append(fuzz.run_one(seed, cache="symbolic values"))
    _assert_agree(compared)
    assert outcomes.count("ok") > 100
    assert sum(1 for mine, _ in compared if mine) > 50  # programs that do write into inputs


def test_written_inputs_agree_with_functionalize_over_the_symbolic_mutation_fuzzer(compared):
    checked = 0
    for seed in range(40):
        for kind in symbolic_fuzz.INPUTS:
            program = symbolic_fuzz.make_program(seed, kind, 5, grad=False)
            if program is None:
                continue
            jf = minijit.jit(program, cache="symbolic values")
            for n in (5, 6):
                outcome = symbolic_fuzz.check_call(program, jf, kind, n, seed, grad=False)
                checked += outcome == "ok"
    _assert_agree(compared)
    assert checked > 100


def _setitem(a: torch.Tensor, key: Any, value: Any) -> torch.Tensor:
    a[key] = value
    return a


# Writes into inputs by every route the query must follow, and writes that leave an input as it was.
MUTATIONS = {
    "in-place method": lambda a, b: a.add_(b),
    "view of a view": lambda a, b: a[1:].t()[0].mul_(2),
    "out=": lambda a, b: torch.add(b[0], 1, out=a[0]),
    "setitem": lambda a, b: _setitem(a, (slice(None), 0), b[0, 0]),
    "setitem of a view": lambda a, b: _setitem(a.t()[1], slice(0, 2), 3.0),
    "opaque in-place op": lambda a, b: a.index_copy_(0, torch.tensor([1, 0]), b[:2]),
    "copy into itself": lambda a, b: a.copy_(a) + b,
    "copy into itself, then a write": lambda a, b: a.copy_(a).sub_(b),
    "reshape that copies": lambda a, b: a.t().reshape(-1)[:3].add_(1.0) + b.sum(),
    "reshape that views": lambda a, b: a.reshape(-1)[:3].add_(1.0) + b.sum(),
    "contiguous of a transpose": lambda a, b: a.t().contiguous().add_(1.0) + b.sum(),
    "second input through the first": lambda a, b: b.unsqueeze(0).squeeze(0).zero_() + a,
    "no write": lambda a, b: a * b,
}


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_written_inputs_agree_with_functionalize_over_mutations(compared, name, cache):
    fn = MUTATIONS[name]
    inputs = [torch.randn(4, 4), torch.randn(4, 4)]
    ours, theirs = [x.clone() for x in inputs], [x.clone() for x in inputs]
    torch.testing.assert_close(minijit.jit(fn, cache=cache)(*ours), fn(*theirs))
    torch.testing.assert_close(ours, theirs)
    assert compared
    _assert_agree(compared, f" ({name})")


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
@pytest.mark.parametrize("aliasing", ["identical inputs", "synthetic base"])
def test_functionalize_runs_once_per_compile(monkeypatch, aliasing, cache):
    calls = []
    original = arguments.functionalize_trace

    def counting(trace, **kwargs):
        calls.append(kwargs)
        return original(trace, **kwargs)

    monkeypatch.setattr(arguments, "functionalize_trace", counting)

    def f(a, b):
        a.mul_(2)
        return a + b

    t = torch.randn(10)
    ours, theirs = t.clone(), t.clone()
    make = (lambda s: (s[0:4], s[0:4])) if aliasing == "identical inputs" else (lambda s: (s[0:4], s[2:6]))
    jf = minijit.jit(f, cache=cache)
    torch.testing.assert_close(jf(*make(ours)), f(*make(theirs)))
    torch.testing.assert_close(ours, theirs)
    assert len(calls) == 1, calls
    if aliasing == "identical inputs":
        assert calls[0]["input_aliases"] == [[0, 1]] and not calls[0]["synthetic_bases"]
    else:
        assert [b.members for b in calls[0]["synthetic_bases"]] == [(0, 1)]


def test_a_pin_decided_after_capture_recaptures_without_an_exception(monkeypatch):
    """Written overlapping inputs with symbolic sizes: `_compile` returns NeedsPins, and the compile loop captures
    again with their sizes constant."""
    results = []
    original = pipeline._compile

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(pipeline, "_compile", spy)

    def f(a, b):
        a.mul_(2)
        return a * 3 + b.sum()

    t = torch.randn(12)
    ours, theirs = t.clone(), t.clone()
    torch.testing.assert_close(minijit.jit(f, cache="symbolic values")(ours[0:6], ours[2:8]),
                               f(theirs[0:6], theirs[2:8]))
    torch.testing.assert_close(ours, theirs)
    assert isinstance(results[0], pipeline.NeedsPins) and results[0].positions == {0, 1}
    assert isinstance(results[1], pipeline.CompiledEntry)


@pytest.mark.parametrize("aliasing", ["overlapping inputs", "identical inputs"])
def test_a_value_read_inside_capture_before_a_pin_matches_eager_without_an_exception(monkeypatch, aliasing):
    """A value read whose trace prefix writes inputs that share memory and have symbolic sizes: the value is
    eager's (the read depends on the write through the other input), no write of that read lands on the call's
    tensors, and the capture ends before the pin is taken (`NeedsPins`), with no exception unwinding it."""
    results = []
    original = pipeline._compile

    def spy(*args, **kwargs):
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(pipeline, "_compile", spy)

    def f(a, b):
        a.mul_(2)
        if b.sum() > 0:
            return a * 3 + b.sum()
        return a * 4 - b.sum()

    jf = minijit.jit(f, cache="symbolic values")
    shift = 2 if aliasing == "overlapping inputs" else 0
    for n, seed in ((6, 0), (6, 1), (8, 2), (8, 3), (8, 4)):
        t = torch.randn(2 * n, generator=torch.Generator().manual_seed(seed))
        ours, theirs = t.clone(), t.clone()
        torch.testing.assert_close(jf(ours[0:n], ours[shift:n + shift]), f(theirs[0:n], theirs[shift:n + shift]))
        torch.testing.assert_close(ours, theirs)
    assert isinstance(results[0], pipeline.NeedsPins) and results[0].positions == {0, 1}
    assert isinstance(results[1], pipeline.CompiledEntry)


def test_a_plan_missing_a_written_input_is_refused_not_followed(monkeypatch):
    """Were the memory model ever to miss an input the trace writes, the entry would skip its aliasing guard:
    functionalize's own finding is checked against the plan, and the compile stops with the names."""
    monkeypatch.setattr(arguments, "inputs_written", lambda trace, views: ())

    def f(x):
        x.add_(1)
        return x * 2

    with pytest.raises(TraceInvariantError, match=r"writes the inputs \['x'\]"):
        minijit.jit(f)(torch.randn(3))
