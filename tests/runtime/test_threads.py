"""Threads sharing one jitted module or function, as a server's request threads do.

Every result is compared with eager's; the cache's counts with the number of distinct signatures (a
miss another thread is compiling waits for it, then hits); and a compile held open half-way shows what
other threads see meanwhile: the module's own tensors, and hits of entries compiled before.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import minijit
from minijit.frontend.frame import current_state
from minijit.ir import current_trace

THREADS = 8
CALLS = 50
BATCHES = (1, 3, 6)


@contextmanager
def _switching_often() -> Iterator[None]:
    """Threads switch every few microseconds (CPython's default is 5 ms), so that calls interleave finely."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _in_threads(work: Callable[[int], Any]) -> list[Any]:
    """`work(i)` for i in range(THREADS), on a pool of THREADS threads started together; their results."""
    start = threading.Barrier(THREADS)

    def run(i: int) -> Any:
        start.wait()
        return work(i)

    with _switching_often(), ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(run, range(THREADS)))


def _mixed_calls(seed: int, jitted: Callable[..., Any], eager: Callable[..., Any],
                 make_args: Callable[[int], tuple[torch.Tensor, ...]]) -> tuple[list[str], set[tuple[int, bool]]]:
    """CALLS calls of `jitted` with batch sizes from BATCHES, under no_grad or with a gradient taken with respect
    to the first argument, each compared with `eager`: the mismatches, in words, and the (batch, grad) pairs met."""
    rng = random.Random(seed)
    wrong = []
    met = set()
    for call in range(CALLS):
        args = make_args(rng.choice(BATCHES))
        grad = rng.random() >= 0.5
        met.add((args[0].shape[0], grad))
        if not grad:
            with torch.no_grad():
                got, expected = jitted(*args), eager(*args)
            grads = expected_grads = torch.zeros(())
        else:
            x = args[0].requires_grad_()
            got = jitted(x, *args[1:])
            (grads,) = torch.autograd.grad(got.sum(), x)  # with respect to the input: no .grad accumulates
            x_eager = x.detach().clone().requires_grad_()
            expected = eager(x_eager, *args[1:])
            (expected_grads,) = torch.autograd.grad(expected.sum(), x_eager)
        if not torch.allclose(got, expected, atol=1e-5) or not torch.allclose(grads, expected_grads, atol=1e-5):
            wrong.append(f"thread {seed}, call {call}: batch {args[0].shape[0]} differs from eager")
    return wrong, met


def _check_shared(results: list[tuple[list[str], set[tuple[int, bool]]]], jitted: Any, cache: str) -> None:
    """Every thread's results were eager's; with constant values, one trace per (batch, grad) pair met, whichever
    thread met it first; in the default mode (sizes going symbolic) no more traces than that."""
    assert [line for wrong, _ in results for line in wrong] == []
    info = minijit.cache_info(jitted)
    pairs = len(set().union(*(met for _, met in results)))
    if cache == "constant values":
        assert info.misses == info.entries == pairs
    else:
        assert info.entries <= info.misses <= pairs
    assert info.hits + info.misses == THREADS * CALLS


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


@pytest.mark.parametrize("cache", ["constant values", "automatic"])
def test_threads_share_a_jitted_module(cache):
    model = _model()
    jm = minijit.jit(model, cache=cache)
    _check_shared(_in_threads(lambda i: _mixed_calls(i, jm, model, lambda b: (torch.randn(b, 16),))), jm, cache)
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())


def _function(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ w)
    return h * h.sum(dim=1, keepdim=True) + x[:, :1]


@pytest.mark.parametrize("cache", ["constant values", "automatic"])
def test_threads_share_a_jitted_function(cache):
    jf = minijit.jit(_function, cache=cache)
    torch.manual_seed(0)
    w = torch.randn(16, 8)
    _check_shared(_in_threads(lambda i: _mixed_calls(i, jf, _function, lambda b: (torch.randn(b, 16), w))), jf,
                  cache)


class _Gate:
    """Called from a module's forward: once armed, holds the first call that meets it until released.

    Its state is in `threading.Event`s, whose methods run natively: traced code reads nothing of it
    that a guard would check, so a trace made while it was armed serves later calls, and the other way round.
    """

    def __init__(self):
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.release = threading.Event()
        self.timed_out = threading.Event()  # the timeout keeps a broken test from hanging

    def __call__(self) -> None:
        if self.armed.is_set():
            self.armed.clear()
            self.reached.set()
            if not self.release.wait(timeout=30):
                self.timed_out.set()


class _Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.norm = torch.nn.BatchNorm1d(8)  # with buffers
        self.fc2 = torch.nn.Linear(8, 2)
        self.gate = _Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc1(x))
        self.gate()
        return self.fc2(torch.relu(h))


def _compiling_in_another_thread(jm: Any, x: torch.Tensor) -> tuple[threading.Thread, list[Any]]:
    """A thread calling `jm(x)`, started and held half-way through its compile; its result lands in the list."""
    gate = jm.gate
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(jm(x)))
    gate.armed.set()
    thread.start()
    assert gate.reached.wait(timeout=30)
    return thread, out


def test_an_eager_call_during_a_compile_sees_the_module_as_it_is():
    torch.manual_seed(0)
    model = _Gated().eval()
    jm = minijit.jit(model, cache="constant values")  # a trace per batch size: the gate meets each
    x = torch.randn(5, 4)
    tensors = [*model.parameters(), *model.buffers()]
    with torch.no_grad():
        expected = model(x)
    thread, out = _compiling_in_another_thread(jm, x)
    try:
        # The compile is half-way: the module still holds its own tensors, and runs eagerly as before.
        now = [*model.parameters(), *model.buffers()]
        assert len(now) == len(tensors) and all(t is before for t, before in zip(now, tensors))
        with torch.no_grad():
            torch.testing.assert_close(model(x), expected)
    finally:
        model.gate.release.set()
        thread.join()
    assert not model.gate.timed_out.is_set()
    torch.testing.assert_close(out[0], expected)


def test_hits_run_while_another_thread_compiles():
    torch.manual_seed(0)
    model = _Gated().eval()
    jm = minijit.jit(model, cache="constant values")  # a trace per batch size: the gate meets each
    small, large = torch.randn(2, 4), torch.randn(7, 4)
    torch.testing.assert_close(jm(small), model(small))  # the entry the hit below finds
    thread, out = _compiling_in_another_thread(jm, large)
    try:
        # A hit takes no lock: it runs while the compile is held (else it would wait for the timeout).
        torch.testing.assert_close(jm(small), model(small))
    finally:
        model.gate.release.set()
        thread.join()
    assert not model.gate.timed_out.is_set()
    torch.testing.assert_close(out[0], model(large))
    assert (minijit.cache_info(jm).misses, minijit.cache_info(jm).hits) == (2, 1)


def test_concurrent_first_calls_with_one_signature_trace_once():
    torch.manual_seed(0)
    model = _Gated().eval()
    jm = minijit.jit(model, cache="constant values")  # a trace per batch size: the gate meets each
    x = torch.randn(3, 4)
    thread, out = _compiling_in_another_thread(jm, x)
    waiting = [threading.Thread(target=lambda: out.append(jm(x))) for _ in range(THREADS - 1)]
    try:
        for t in waiting:
            t.start()  # each misses, then waits for the compile held open
    finally:
        model.gate.release.set()
        for t in [thread, *waiting]:
            t.join()
    assert not model.gate.timed_out.is_set()
    for result in out:
        torch.testing.assert_close(result, model(x))
    info = minijit.cache_info(jm)
    assert (info.misses, info.entries, info.hits) == (1, 1, THREADS - 1)


class _CallsItselfJitted(torch.nn.Module):
    """A lazy layer, then the jitted module itself again, `depth` times."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.LazyLinear(4)
        self.jitted: list[Any] = []  # in a list: not a submodule

    def forward(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        y = torch.tanh(self.fc(x))
        return y if depth == 0 else self.jitted[0](y, depth - 1)


def test_a_call_made_while_holding_the_compile_lock_may_call_the_same_jitted_module():
    # The lazy module's first call runs eagerly holding the lock (one thread makes the parameters); its forward
    # calls the jitted module again, on the same thread.
    torch.manual_seed(0)
    model = _CallsItselfJitted()
    jm = minijit.jit(model, cache="constant values")  # a trace per batch size: the gate meets each
    model.jitted.append(jm)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = jm(x, 2)  # eager: the parameters are made
        torch.testing.assert_close(jm(x, 2), first)  # traced through its three levels
        expected = torch.tanh(model.fc(torch.tanh(model.fc(torch.tanh(model.fc(x))))))
    torch.testing.assert_close(first, expected)
    assert minijit.cache_info(jm).misses == 1


def _compile_state_left() -> list[str]:
    """What a finished compile left in this thread's context, by name."""
    state = current_state()  # outside an interpretation: the thread's idle one
    left = {"trace": current_trace() is not None, "frames": bool(state.frames), "guards": bool(state.guards),
            "roots": bool(state.outside.roots), "stand-ins": bool(state.outside.stand_ins),
            "effects": bool(state.outside.effects)}
    return [name for name, found in left.items() if found]


def test_pool_threads_keep_no_compile_state_between_calls():
    model = _model()
    jm, jf = minijit.jit(model, cache="constant values"), minijit.jit(_function, cache="constant values")
    w = torch.randn(16, 8)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda b: (jm(torch.randn(b, 16)), jf(torch.randn(b, 16), w)), [1, 2, 3, 4]))
        left = list(pool.map(lambda _: _compile_state_left(), range(4)))
    assert left == [[]] * 4


@pytest.mark.parametrize("grad", [False, True])
def test_a_parameter_replaced_between_calls_is_seen_by_every_thread(grad):
    model = _model()
    jm = minijit.jit(model, cache="constant values")  # a trace per batch size: the gate meets each
    x = torch.randn(3, 16, requires_grad=grad)
    _in_threads(lambda i: jm(x))
    with torch.no_grad():
        model[0].weight = torch.nn.Parameter(model[0].weight * 2)
    results = _in_threads(lambda i: jm(x))
    for result in results:
        torch.testing.assert_close(result, model(x))
    assert minijit.cache_info(jm).misses == 1  # a new parameter of the same kind: the same trace


def test_the_entry_order_is_read_while_other_threads_mark_entries_used():
    """Hits mark their entry used outside the compile lock while a miss reads the most recent entries;
    the read must never see the order changing under it (it raised "OrderedDict mutated during
    iteration" in CI)."""
    from minijit.runtime.entry_limit import EntryLimit

    limit = EntryLimit(None)
    entries = [object() for _ in range(64)]
    for i, entry in enumerate(entries):
        limit.add(i, entry)
    stop = threading.Event()

    def mark_used(i: int) -> None:
        rng = random.Random(i)
        while not stop.is_set():
            limit.used(entries[rng.randrange(len(entries))])

    def read_recent() -> int:
        try:
            return sum(len(limit.recent(8)) for _ in range(3000))
        finally:
            stop.set()

    with _switching_often(), ThreadPoolExecutor(4) as pool:
        markers = [pool.submit(mark_used, i) for i in range(3)]
        assert pool.submit(read_recent).result() == 3000 * 8
        for marker in markers:
            marker.result()



def _writes_while_held(fn: Callable[[torch.Tensor], torch.Tensor], gate: _Gate, other: Callable[[], Any]) -> Any:
    """`fn(x)` in this thread, held at `gate` half-way while another thread runs `other`."""
    gate.armed.set()
    thread = threading.Thread(target=lambda: (gate.reached.wait(timeout=30), other(), gate.release.set()))
    thread.start()
    try:
        return fn(torch.zeros(2))
    finally:
        gate.release.set()
        thread.join()


@pytest.mark.parametrize("writer", ["eager", "jitted"])
def test_writes_another_thread_makes_while_a_capture_writes_the_same_containers_are_kept(writer):
    # A capture writes into outside containers for real and puts them back when it ends; what another thread wrote
    # into them meanwhile (eager code, or a jitted function) stays. The capture's own writes are made by the first
    # call after it, so the list's elements may come in another order than eager's: an order threads could give.
    def scenario(jit: Callable[[Any], Any]) -> tuple[Any, list[str], dict[str, int]]:
        log, table, gate = ["old"], {"a": 1, "c": 3}, _Gate()

        def other_writes(t: torch.Tensor) -> torch.Tensor:
            log.append("other")
            log.remove("old")
            table["b"] = 2
            del table["c"]
            return t + 1

        def f(x: torch.Tensor) -> torch.Tensor:
            log.append("f")
            table["a"] = 10
            gate()
            log.append("g")
            return x + len(log) + sum(table.values())

        writes = jit(other_writes) if writer == "jitted" else other_writes
        result = _writes_while_held(jit(f), gate, lambda: writes(torch.ones(1)))
        assert not gate.timed_out.is_set()
        return result, log, table

    expected, eager_log, eager_table = scenario(lambda fn: fn)
    result, log, table = scenario(minijit.jit)
    torch.testing.assert_close(result, expected)
    assert table == eager_table
    assert sorted(log) == sorted(eager_log)


def test_a_value_another_thread_finds_while_a_capture_writes_it_out_is_refused_by_name():
    # A capture writes for real, so another thread reading the list meanwhile finds a value of the trace: computing
    # with it fails, naming the op and what happened, rather than giving anything.
    values, gate, found = [], _Gate(), []

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 3
        values.append(y)
        gate()
        return y

    def other() -> None:
        try:
            found.append(values[-1] * 2)
        except minijit.MinijitError as e:
            found.append(e)

    result = _writes_while_held(minijit.jit(f), gate, other)
    torch.testing.assert_close(result, torch.zeros(2) * 3)
    assert len(values) == 1 and values[0] is result  # as in eager: the stored tensor is the one returned
    assert isinstance(found[0], minijit.MinijitError) and "not being made in this thread" in str(found[0])
    assert "mul" in str(found[0])
