"""Slicing by a number read from a tensor (`x[:n.item()]`, narrow, split): one trace for every value, against eager.

The slice's bounds are clamped by arithmetic the trace computes (minijit/ops/runtime_bounds.py), so a new value
is a cache hit, negative values and values past the end included; where eager raises for a value, so does the
jitted function. Each case runs over several values, comparing results, written inputs and gradients with eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import MinijitError
from tests.semantics.util import assert_same


def _run_both(fn: Callable[..., Any], calls: list[tuple[Any, ...]], **options: Any) -> Any:
    """Call eager `fn` and `minijit.jit(fn)` on copies of each call's arguments; results and arguments must match."""
    jf = minijit.jit(fn, **options)
    for args in calls:
        eager_args, jit_args = [a.clone() for a in args], [a.clone() for a in args]
        assert_same(jf(*jit_args), fn(*eager_args))
        for got, want in zip(jit_args, eager_args, strict=True):
            assert_same(got, want, "argument after the call")
    return jf


def _traced_once(jf: Any) -> None:
    info = minijit.cache_info(jf)
    assert (info.misses, info.entries) == (1, 1), info


def head(x, n):
    k = n.item()
    return x[:k] * 2


def tail(x, n):
    k = n.item()
    return x[k:].sum()


def window(x, n):
    a = n.item()
    return x[a:a + 3] + 1


def last_dim(x, n):
    k = n.item()
    return x[..., :k].exp()


def of_a_view(x, n):
    k = n.item()
    return x.view(2, 6)[1][:k] - 1


def used_after(x, n):
    k = n.item()
    y = x[:k]
    return y.sum() + torch.zeros(12)[:k] + y * y, y.shape[0]


def matmul_of_slices(x, n):
    k = n.item()
    y = x.view(3, 4)
    return y[:, :k] @ y[:, :k].t()


VALUES = (3, 5, 0, -2, 12, 20, -13, 7)


@pytest.mark.parametrize("fn", [head, tail, window, last_dim, of_a_view, used_after, matmul_of_slices])
def test_slice_by_an_item_traces_once(fn) -> None:
    jf = _run_both(fn, [(torch.randn(12), torch.tensor(v)) for v in VALUES])
    _traced_once(jf)


def test_both_bounds_read_from_tensors() -> None:
    fn = lambda x, a, b: x[a.item():b.item()] * 3
    pairs = ((1, 5), (2, 9), (-3, 12), (5, 2), (-20, -4), (0, 0))
    jf = _run_both(fn, [(torch.randn(10), torch.tensor(a), torch.tensor(b)) for a, b in pairs])
    _traced_once(jf)


def test_narrow_and_split_trace_once() -> None:
    narrow = _run_both(lambda x, n: x.narrow(0, 0, n.item()) * 2, [(torch.randn(10), torch.tensor(v)) for v in (3, 0, 10, 6)])
    start = _run_both(lambda x, n: x.narrow(0, n.item(), 2), [(torch.randn(10), torch.tensor(v)) for v in (3, -2, 8, 0)])

    def split(x, n):
        k = n.item()
        a, b = torch.split(x, [k, x.shape[0] - k])
        return a * 2, b.sum()

    pieces = _run_both(split, [(torch.randn(10), torch.tensor(v)) for v in (3, 0, 10, 4)])
    for jf in (narrow, start, pieces):
        _traced_once(jf)


@pytest.mark.parametrize(("fn", "bad"), [
    pytest.param(lambda x, n: x.narrow(0, 0, n.item()), (-1, 11), id="narrow-length"),
    pytest.param(lambda x, n: x.narrow(0, n.item(), 2), (9, 10, -11), id="narrow-start"),
    pytest.param(lambda x, n: torch.split(x, [n.item(), 10 - n.item()]), (-1, 11), id="split"),
])
def test_values_eager_refuses_raise(fn, bad) -> None:
    jf = minijit.jit(fn)
    assert_same(jf(torch.arange(10.0), torch.tensor(4)), fn(torch.arange(10.0), torch.tensor(4)))
    for v in bad:
        with pytest.raises((RuntimeError, IndexError)):
            fn(torch.arange(10.0), torch.tensor(v))
        with pytest.raises(MinijitError, match=r"test_item_slices\.py"):
            jf(torch.arange(10.0), torch.tensor(v))
    assert_same(jf(torch.arange(10.0), torch.tensor(2)), fn(torch.arange(10.0), torch.tensor(2)))
    assert minijit.cache_info(jf).entries == 1


def sliced_twice(x, n):
    k = n.item()
    return (x[:k] * x[:k]).sum() + x[k:].exp().sum() + x[1::3][:k].sum()


def narrowed(x, n):
    return x.narrow(1, 0, n.item()).sin()


def split_in_two(x, n):
    k = n.item()
    a, b = torch.split(x, [k, x.shape[0] - k])
    return a * 2, b.cos()


def of_two_lengths(x, n):
    k = n.item()
    y = torch.cat([x, x])
    return x[:k] * y[:k]  # two sizes the trace computes, compared once by the capture, again by the grad pass


@pytest.mark.parametrize(("fn", "shape", "values"), [
    pytest.param(sliced_twice, (10,), (3, 5, -2, 12, 0, -13), id="getitem"),
    pytest.param(of_two_lengths, (10,), (3, 5, 0, 10, 7), id="two-lengths"),
    pytest.param(narrowed, (3, 6), (0, 2, 6, 4), id="narrow"),
    pytest.param(split_in_two, (10,), (0, 3, 10, 7), id="split"),
])
def test_gradient_through_the_slice(fn, shape, values) -> None:
    jf = minijit.jit(fn)
    for v in values:
        base = torch.randn(*shape)
        xe, xj = base.clone().requires_grad_(), base.clone().requires_grad_()
        want, got = fn(xe, torch.tensor(v)), jf(xj, torch.tensor(v))
        assert_same(got, want)
        want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
        sum(w.square().sum() for w in want).backward()
        sum(g.square().sum() for g in got).backward()
        torch.testing.assert_close(xj.grad, xe.grad)
    _traced_once(jf)


def write_head(x, n):
    x[:n.item()] = 0
    return x * 1


def add_to_tail(x, n):
    y = x[n.item():]
    y.add_(1)
    return x.sum()


def write_element(x, n):
    x[n.item()] = -1
    return x * 1


def write_every_nth(x, n):
    x[::n.item() + 2] = 5
    return x.sum()


def add_to_a_row(x, n):
    x.view(2, 5)[n.item() % 2].add_(1)
    return x.exp()


@pytest.mark.parametrize(("fn", "values"), [
    (write_head, (3, -2, 12, 0)), (add_to_tail, (3, -2, 12, 0)), (write_element, (3, -2, 9, 0, -10)),
    (write_every_nth, (3, -1, 12, 0)), (add_to_a_row, (3, -2, 12, 0)),
])
def test_writes_through_the_slice(fn, values) -> None:
    jf = _run_both(fn, [(torch.randn(10), torch.tensor(v)) for v in values])
    _traced_once(jf)


def test_symbolic_values_mode() -> None:
    fn = lambda x, n: x[:n.item()].sum(0) + x[-n.item():].mean()
    jf = _run_both(fn, [(torch.randn(size, 2), torch.tensor(v)) for size, v in ((10, 1), (11, 2), (12, 3))],
                   cache="symbolic values")
    _traced_once(jf)


def test_no_value_guard_is_reported() -> None:
    jf = _run_both(head, [(torch.randn(12), torch.tensor(v)) for v in (3, 4, 5, 6)])
    info = minijit.cache_info(jf)
    assert info.hits == 3
    assert "value guard" not in str(info)


def select_row(x, n):
    return x[n.item()] * 2


def select_column(x, n):
    k = n.item()
    return x[:, k].exp() + x[k - 1, k]


def every_nth(x, n):
    return x[::n.item()] + 1


def every_nth_of_a_window(x, a, s):
    return x[a.item():-1:s.item()].sum(0)


def test_index_by_an_item_traces_once_for_every_index_in_bounds() -> None:
    rows = _run_both(select_row, [(torch.randn(6, 3), torch.tensor(v)) for v in (2, 0, 5, -1, -6, 3)])
    columns = _run_both(select_column, [(torch.randn(4, 5), torch.tensor(v)) for v in (2, 1, 3, -2, 4)])
    for jf in (rows, columns):
        _traced_once(jf)


def test_step_read_from_a_tensor_traces_once() -> None:
    steps = _run_both(every_nth, [(torch.randn(10, 2), torch.tensor(v)) for v in (1, 3, 2, 10, 12, 4)])
    windows = _run_both(every_nth_of_a_window, [(torch.randn(10, 2), torch.tensor(a), torch.tensor(s))
                                                for a, s in ((0, 2), (3, 1), (-4, 3), (8, 5), (12, 2))])
    for jf in (steps, windows):
        _traced_once(jf)


@pytest.mark.parametrize(("fn", "bad"), [
    pytest.param(select_row, (6, -7, 40), id="index"),
    pytest.param(every_nth, (0, -2), id="step"),
    pytest.param(lambda x, n: write_element(x, n), (6, -7), id="setitem"),
])
def test_indices_and_steps_eager_refuses_raise(fn, bad) -> None:
    x = torch.randn(6, 3)
    jf = minijit.jit(fn)
    assert_same(jf(x, torch.tensor(2)), fn(x, torch.tensor(2)))
    for v in bad:
        with pytest.raises((IndexError, ValueError, RuntimeError)):
            fn(x, torch.tensor(v))
        with pytest.raises(MinijitError, match=r"test_item_slices\.py"):
            jf(x, torch.tensor(v))
    assert_same(jf(x, torch.tensor(1)), fn(x, torch.tensor(1)))


def test_gradient_through_an_index_read_from_a_tensor() -> None:
    fn = lambda x, n: (x[-n.item()] * x[::n.item() + 1].sum(0)).sum()
    jf = minijit.jit(fn)
    for v in (1, 3, 0, 5, 2):
        base = torch.randn(6, 3)
        xe, xj = base.clone().requires_grad_(), base.clone().requires_grad_()
        want, got = fn(xe, torch.tensor(v)), jf(xj, torch.tensor(v))
        assert_same(got, want)
        want.backward()
        got.backward()
        torch.testing.assert_close(xj.grad, xe.grad)
    _traced_once(jf)
