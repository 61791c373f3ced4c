"""A compile's dynamic state is its own: passes record no constraint, threads and nested jit calls do not mix."""

from __future__ import annotations

import threading

import torch

import minijit
from minijit.ir.context import knowing_constraints, recording_constraints
from minijit.ir.proxies import IntegerProxy, known_compare, same_value


def test_a_pass_comparing_symbolic_sizes_records_no_constraint():
    n, m = IntegerProxy(4, expr="x.shape[0]"), IntegerProxy(4, expr="y.shape[0]")
    with recording_constraints() as recorded:  # a capture: the comparison is guarded
        assert (n == m) == (4 == 4)
    assert recorded == ["x.shape[0] == y.shape[0]"]
    known: list[str] = []
    with knowing_constraints(known):  # a pass of a compile whose capture compared nothing
        same, differ, same_itself = same_value(n, m), known_compare(n, "!=", m), same_value(n, IntegerProxy(4, expr="x.shape[0]"))
    assert known == []
    # Equal on the traced call, but not on every call: a pass must not treat them as one size.
    assert (same, differ, same_itself) == (False, True, True)
    with knowing_constraints(["x.shape[0] == y.shape[0]"]):  # the capture's guard keeps them equal
        assert same_value(n, m)


def test_a_pass_comparing_symbolic_sizes_adds_nothing_to_the_guard():
    def f(x, y):
        a = (x.sqrt() / 2).add_(1)  # buffer reuse compares a's sizes with exp's
        return a.sum(), y.exp().sum()

    jf = minijit.jit(f, cache="symbolic values")
    for shapes in (((4, 5), (4, 5)), ((4, 5), (3, 5)), ((4, 5), (6, 2))):
        x, y = torch.rand(shapes[0]), torch.randn(shapes[1])
        got, want = jf(x, y), f(x, y)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert minijit.cache_info(jf).misses == 1, minijit.cache_info(jf)


_EVENTS: dict[str, threading.Event] = {}


def _pause(name):
    """Called by traced code: say this capture is paused, and wait until told to go on."""
    _EVENTS[name + " paused"].set()
    _EVENTS[name + " go"].wait(60)


def test_two_threads_compiling_at_once_each_get_eager_results():
    # The captures interleave: f pauses mid-capture, g starts and pauses mid-capture, f goes
    # on and finishes while g's trace is still being recorded, then g finishes.
    def f(x):
        y = x.sin()
        _pause("f")
        return y * 2 + x.cos()

    def g(a, b):
        y = a @ b
        _pause("g")
        return torch.nn.functional.gelu(y).softmax(dim=-1)

    _EVENTS.update({k: threading.Event() for k in ("f paused", "f go", "g paused", "g go")})
    results = {}

    def run(name, fn, args):
        try:
            results[name] = (minijit.jit(fn)(*args), fn(*args))
        except BaseException as e:  # reported by the main thread
            results[name] = e

    x, a, b = torch.randn(3, 5), torch.randn(2, 4), torch.randn(4, 3)
    tf = threading.Thread(target=run, args=("f", f, (x,)))
    tg = threading.Thread(target=run, args=("g", g, (a, b)))
    tf.start()
    assert _EVENTS["f paused"].wait(60)
    tg.start()
    assert _EVENTS["g paused"].wait(60)
    _EVENTS["f go"].set()
    tf.join(60)
    _EVENTS["g go"].set()
    tg.join(60)
    for name in ("f", "g"):
        assert not isinstance(results[name], BaseException), repr(results[name])
        torch.testing.assert_close(*results[name])


def test_a_jitted_function_called_inside_a_jitted_function():
    inner = minijit.jit(lambda a: a.sin() * 2)

    def outer(x):
        return inner(x + 1).sum() * x

    x = torch.randn(3, requires_grad=True)
    got = minijit.jit(outer)(x)
    want = outer(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


def _grad_off_then_refused(x: torch.Tensor) -> torch.Tensor:
    # As Dynamo's graphs switch grad mode: plain calls, no `with` to undo them if something raises in between.
    torch._C._set_grad_enabled(False)
    y = (x * 2).numpy()  # refused: native code on a traced tensor
    torch._C._set_grad_enabled(True)
    return torch.from_numpy(y)


def test_a_refused_capture_leaves_the_callers_grad_mode_as_it_was():
    """The traced code switches grad mode for real while it is captured; a refusal between two switches left grad
    off for everything the caller ran next (a torch.compile graph with `torch.no_grad()` inside, refused by minijit)."""
    for _ in range(2):
        try:
            minijit.jit(_grad_off_then_refused)(torch.randn(3, requires_grad=True))
        except minijit.MinijitError:
            pass
        grad_on = torch.is_grad_enabled()
        torch.set_grad_enabled(True)  # for the tests after this one, whatever happened
        assert grad_on
