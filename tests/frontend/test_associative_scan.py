"""`associative_scan` (torch._higher_order_ops) under minijit: values and grads equal eager's generic scan."""

from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan

import minijit
from minijit.errors import UnsupportedOpError

F64 = torch.float64


def linear_recurrence(left, right):
    """Mamba's combine: (a, b) pairs of h -> a * h + b, composed."""
    (a_left, b_left), (a_right, b_right) = left, right
    return a_left * a_right, a_right * b_left + b_right


def matrix_product(left, right):
    """Not pointwise: a product of 2x2 matrices (associative, not commutative)."""
    return left @ right


def _recurrence(reverse: bool):
    """A Mamba-like selective state: the linear recurrence scanned over dim 1 of (batch, length, channels)."""
    def f(a, b):
        _, states = associative_scan(linear_recurrence, (a.sigmoid(), b), dim=1, reverse=reverse,
                                     combine_mode="generic")
        return states * 2

    return f


def _assert_values_and_grads_match(f, jitted, length: int) -> None:
    """`jitted` gives eager `f`'s values and gradients on random inputs of shape (2, length, 3)."""
    a, b = torch.randn(2, length, 3, dtype=F64), torch.randn(2, length, 3, dtype=F64)
    ae, be = a.clone().requires_grad_(), b.clone().requires_grad_()
    aj, bj = a.clone().requires_grad_(), b.clone().requires_grad_()
    want, have = f(ae, be), jitted(aj, bj)
    torch.testing.assert_close(have, want)
    want.pow(2).sum().backward()
    have.pow(2).sum().backward()
    torch.testing.assert_close(aj.grad, ae.grad)
    torch.testing.assert_close(bj.grad, be.grad)


@pytest.mark.parametrize("reverse", [False, True])
def test_pytree_scan_matches_eager_values_and_grads(reverse: bool) -> None:
    f = _recurrence(reverse)
    _assert_values_and_grads_match(f, minijit.jit(f), 5)


def test_non_pointwise_combine_matches_eager() -> None:
    def f(m):
        return associative_scan(matrix_product, m, dim=0, combine_mode="generic")

    m = torch.randn(6, 2, 2, dtype=F64) / 2
    torch.testing.assert_close(minijit.jit(f)(m), f(m))


def test_bad_arguments_raise_eagers_errors() -> None:
    x = torch.randn(3, 4)
    for kwargs in ({"dim": 2}, {"dim": 0, "combine_mode": "fast"}):
        def f(x, kwargs=kwargs):
            return associative_scan(torch.add, x, **kwargs)

        with pytest.raises((ValueError, IndexError)) as eager:
            f(x)
        with pytest.raises(type(eager.value)) as jitted:
            minijit.jit(f)(x)
        assert str(eager.value) in str(jitted.value)


# -- symbolic lengths: one opaque scan instead of one trace per length ----------------------------------

@pytest.mark.parametrize("reverse", [False, True])
def test_symbolic_length_scan_traces_twice_and_matches_eager(reverse: bool) -> None:
    f = _recurrence(reverse)
    jf = minijit.jit(f, cache="symbolic values")
    for length in (5, 3, 1, 9, 17, 6):
        _assert_values_and_grads_match(f, jf, length)
    # One trace serves every length of 2 or more (symbolic); length 1 is traced apart (eager combines nothing).
    assert minijit.cache_info(jf).misses == 2, minijit.cache_info(jf)
    assert "opaque.associative_scan(" in str(minijit.last_traces(jf)[-1])


def test_symbolic_length_scan_of_a_non_pointwise_combine() -> None:
    def f(m):
        return associative_scan(matrix_product, m, dim=0, combine_mode="generic")

    jf = minijit.jit(f, cache="symbolic values")
    for length in (4, 6, 11):
        m = torch.randn(length, 2, 2, dtype=F64) / 2
        torch.testing.assert_close(jf(m), f(m))
    assert minijit.cache_info(jf).misses == 1


def test_combine_holding_a_traced_tensor_is_unrolled_not_kept() -> None:
    """A combine function closing over a tensor of the call cannot be a constant of the trace (it would keep
    the first call's tensor): the scan is unrolled, one trace per length, and right for each call."""
    def f(x, scale):
        def combine(left, right):
            return left * right * scale

        return associative_scan(combine, x, dim=0, combine_mode="generic")

    jf = minijit.jit(f, cache="symbolic values")
    for length, s in ((3, 0.5), (5, 2.0), (7, -1.0)):
        x, scale = torch.randn(length, 4, dtype=F64), torch.full((4,), s, dtype=F64)
        torch.testing.assert_close(jf(x, scale), f(x, scale))
    assert minijit.cache_info(jf).misses == 3


CALLS: list[int] = []


def _writes_its_argument(left, right):
    right.mul_(2)
    return left * right


def _appends_outside(left, right):
    CALLS.append(1)
    return left * right


def _draws(left, right):
    return left * right + torch.rand_like(right)


@pytest.mark.parametrize("combine", [_writes_its_argument, _appends_outside, _draws])
def test_symbolic_length_scan_of_an_impure_combine_is_refused(combine) -> None:
    """Kept as a constant, an impure combine would run at torch's scan's own times, and its trial run is part of
    the capture: refused by name, leaving the inputs and the outside state as they were."""
    def f(x):
        return associative_scan(combine, x, dim=0, combine_mode="generic")

    x = torch.randn(5, 3, dtype=F64)
    before, calls = x.clone(), len(CALLS)
    with pytest.raises(UnsupportedOpError, match=f"combine_fn {combine.__name__} .*effect beyond its result"):
        minijit.jit(f, cache="symbolic values")(x)
    assert torch.equal(x, before) and len(CALLS) == calls


def test_a_combine_writing_its_argument_is_traced_step_by_step_with_constant_sizes() -> None:
    def f(x):
        return associative_scan(_writes_its_argument, x, dim=0, combine_mode="generic")

    x = torch.randn(5, 3, dtype=F64)
    xe, xj = x.clone(), x.clone()
    torch.testing.assert_close(minijit.jit(f)(xj), f(xe))
    torch.testing.assert_close(xj, xe)
