"""`associative_scan` (torch._higher_order_ops) under minijit: values and grads equal eager's generic scan."""

from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan

import minijit

F64 = torch.float64


def linear_recurrence(left, right):
    """Mamba's combine: (a, b) pairs of h -> a * h + b, composed."""
    (a_left, b_left), (a_right, b_right) = left, right
    return a_left * a_right, a_right * b_left + b_right


def matrix_product(left, right):
    """Not pointwise: a product of 2x2 matrices (associative, not commutative)."""
    return left @ right


@pytest.mark.parametrize("reverse", [False, True])
def test_pytree_scan_matches_eager_values_and_grads(reverse: bool) -> None:
    def f(a, b):
        _, states = associative_scan(linear_recurrence, (a.sigmoid(), b), dim=1, reverse=reverse,
                                     combine_mode="generic")
        return states * 2

    a, b = torch.randn(2, 5, 3, dtype=F64), torch.randn(2, 5, 3, dtype=F64)
    ae, be = a.clone().requires_grad_(), b.clone().requires_grad_()
    aj, bj = a.clone().requires_grad_(), b.clone().requires_grad_()
    want, have = f(ae, be), minijit.jit(f)(aj, bj)
    torch.testing.assert_close(have, want)
    want.pow(2).sum().backward()
    have.pow(2).sum().backward()
    torch.testing.assert_close(aj.grad, ae.grad)
    torch.testing.assert_close(bj.grad, be.grad)


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
    def f(a, b):
        _, states = associative_scan(linear_recurrence, (a.sigmoid(), b), dim=1, reverse=reverse,
                                     combine_mode="generic")
        return states * 2

    jf = minijit.jit(f, cache="symbolic values")
    for length in (5, 3, 1, 9, 17, 6):
        a, b = torch.randn(2, length, 3, dtype=F64), torch.randn(2, length, 3, dtype=F64)
        ae, be = a.clone().requires_grad_(), b.clone().requires_grad_()
        aj, bj = a.clone().requires_grad_(), b.clone().requires_grad_()
        want, have = f(ae, be), jf(aj, bj)
        torch.testing.assert_close(have, want)
        want.pow(2).sum().backward()
        have.pow(2).sum().backward()
        torch.testing.assert_close(aj.grad, ae.grad)
        torch.testing.assert_close(bj.grad, be.grad)
    # The first call's length (5) and the symbolic one; length 1 may be specialised once more.
    assert minijit.cache_info(jf).misses <= 3, minijit.cache_info(jf)
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
