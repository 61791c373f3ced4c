"""The memory model (minijit/transforms/memory.py) against what eager torch says about storage sharing.

Random programs of views, in-place ops and new tensors run eagerly and are traced on
proxies; each program returns every tensor it made, so each eager tensor has its proxy.
The model's storages must agree with eager's `untyped_storage().data_ptr()`: exactly for
ops that always view or always allocate, and soundly (eager shares => the model says
"may alias") where the op may do either (`reshape`, `contiguous`, `flatten`). The
writes it sees must be eager's: the storages whose version counter each step bumps.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from minijit.ir import Proxy
from minijit.transforms import functionalize
from minijit.transforms.memory import MemoryModel
from tests.oputil import trace_call

# (text, arity, may either view or copy, fn)
_OPS: list[tuple[str, int, bool, Callable[..., Any]]] = [
    ("a.t()", 1, False, lambda a: a.t()),
    ("a[0]", 1, False, lambda a: a[0]),
    ("a[1:]", 1, False, lambda a: a[1:]),
    ("a[..., ::2]", 1, False, lambda a: a[..., ::2]),
    ("a.unsqueeze(0)", 1, False, lambda a: a.unsqueeze(0)),
    ("a.transpose(0, -1)", 1, False, lambda a: a.transpose(0, -1)),
    ("a.view(-1)", 1, False, lambda a: a.view(-1)),
    ("a.expand(2, *a.shape)", 1, False, lambda a: a.expand(2, *a.shape)),
    ("a.squeeze(0)", 1, False, lambda a: a.squeeze(0)),
    ("a.reshape(-1)", 1, True, lambda a: a.reshape(-1)),
    ("a.contiguous()", 1, True, lambda a: a.contiguous()),
    ("a.flatten()", 1, True, lambda a: a.flatten()),
    ("a.add_(1)", 1, False, lambda a: a.add_(1)),
    ("a.mul_(b)", 2, False, lambda a, b: a.mul_(b)),
    ("a.zero_()", 1, False, lambda a: a.zero_()),
    ("a.copy_(b)", 2, False, lambda a, b: a.copy_(b)),
    ("a + b", 2, False, lambda a, b: a + b),
    ("a * 2", 1, False, lambda a: a * 2),
    ("a.clone()", 1, False, lambda a: a.clone()),
    ("a.exp()", 1, False, lambda a: a.exp()),
    ("a.sum(0)", 1, False, lambda a: a.sum(0)),
]
_MAY_COPY = {text for text, _, may_copy, _ in _OPS if may_copy}


Step = tuple[str, Callable[..., Any], tuple[int, ...]]  # text, fn, the indices of its arguments among the values


def _make_program(seed: int) -> tuple[Callable[..., Any], list[torch.Tensor], list[Step]]:
    """A program of random steps that eager accepts (built while running it), returning every tensor it made."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    inputs = [torch.randn(4, 4), torch.randn(4, 4), torch.randn(4)]
    env = [x.clone() for x in inputs]
    steps: list[Step] = []
    while len(steps) < 8:
        text, arity, _, fn = rng.choice(_OPS)
        args = tuple(rng.randrange(len(env)) for _ in range(arity))
        try:
            out = fn(*(env[i] for i in args))
        except (RuntimeError, IndexError):
            continue  # shapes that do not fit, a write into an expanded view: not a memory question
        steps.append((text, fn, args))
        env.append(out)

    def program(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(xs)
        for _, fn, args in steps:
            values.append(fn(*(values[i] for i in args)))
        return tuple(values)

    return program, inputs, steps


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


SEEDS = range(60)


@pytest.mark.parametrize("seed", SEEDS)
def test_storages_match_eager(seed):
    program, inputs, steps = _make_program(seed)
    texts = [text for text, _, _ in steps]
    eager = program(*[x.clone() for x in inputs])
    trace = trace_call(program, *[x.clone() for x in inputs])
    proxies = list(trace.output)
    memory = MemoryModel(trace)
    # Where a value was made by an op that may view or copy, the model may only over-approximate.
    n_in = len(inputs)
    exact = [i < n_in or texts[i - n_in] not in _MAY_COPY for i in range(len(eager))]
    listing = "\n".join(f"  v{n_in + k} = {t}" for k, t in enumerate(texts))
    for i in range(len(eager)):
        for j in range(i):
            shared, said = _shares(eager[i], eager[j]), memory.aliases(proxies[i], proxies[j])
            why = f"v{i} and v{j}: eager shares storage: {shared}, the model says {said}\n{listing}"
            assert said or not shared, why
            if exact[i] and exact[j] and not _derived_from_may_copy(memory, proxies[i], proxies[j], proxies, exact):
                assert said == shared, why


def _derived_from_may_copy(memory: MemoryModel, a: Proxy, b: Proxy, proxies: list[Proxy], exact: list[bool]) -> bool:
    """Whether a storage a or b may live in is one that only a may-copy op put them in (view of a reshape...)."""
    inexact = {s for p, ok in zip(proxies, exact) if not ok for s in memory.storages(p)}
    return bool((memory.storages(a) | memory.storages(b)) & inexact)


@pytest.mark.parametrize("seed", SEEDS[:30])
def test_writes_match_eager_version_counters(seed):
    """The storages each write goes into, in order, are those whose version counter eager bumps."""
    program, inputs, steps = _make_program(seed)
    texts = [text for text, _, _ in steps]
    values = [x.clone() for x in inputs]
    bumped: list[set[int]] = []  # per writing step: the values whose version counter it bumped
    for _, fn, args in steps:
        before = [v._version for v in values]
        values.append(fn(*(values[i] for i in args)))
        changed = {k for k, v in enumerate(values[:-1]) if v._version != before[k]}
        if changed:
            bumped.append(changed)
    # Each writing step as the set of all values that share storage with what it wrote.
    eager = [{k for k, v in enumerate(values) if any(_shares(v, values[b]) for b in ks)} for ks in bumped]

    trace = trace_call(program, *[x.clone() for x in inputs])
    proxies = list(trace.output)
    memory = MemoryModel(trace)
    written: dict[int, set[str]] = {}  # bound symbol index -> the storages it writes
    for s in {s for p in proxies for s in memory.storages(p)}:
        for i in memory.writers(s):
            written.setdefault(i, set()).add(s)
    said = [{k for k, p in enumerate(proxies) if memory.storages(p) & written[i]} for i in sorted(written)]
    assert len(said) == len(eager), (said, eager, texts)
    for m, e in zip(said, eager):
        assert e <= m, (said, eager, texts)  # never fewer than eager's
        if not _MAY_COPY & set(texts):
            assert m == e, (said, eager, texts)


def test_inputs_passed_twice_share_one_storage():
    """Inputs the call found to be one tensor are one storage; readers and writers of one are the other's."""

    def f(a, b, c):
        a.add_(1)
        return b * c

    x, y = torch.randn(3), torch.randn(3)
    eager = [x, x, y]
    trace, _ = functionalize(trace_call(f, x, x, y), input_aliases=[(0, 1)])
    memory = MemoryModel(trace)
    a, b, c = trace.args
    assert memory.aliases(a, b) == _shares(eager[0], eager[1])
    assert memory.aliases(a, c) == _shares(eager[0], eager[2])
    assert memory.storages(a) == memory.storages(b)
    (s,) = memory.storages(a)
    assert memory.written_inputs() == [s]
    # The read of b (the old value of a's storage) comes before the one copy into it.
    assert memory.old_value_readers(s) and max(r for r in memory.old_value_readers(s)
                                               if r < len(trace.bound_symbols)) < memory.copies_onto(s)[0]
    assert len(memory.copies_onto(s)) == 1
