"""Elementwise ops against eager torch: OpInfo samples (broadcasting, promotion, 0-d), operators on proxies, errors."""

from __future__ import annotations

import operator

import pytest
import torch

from minijit.errors import MetaError
from minijit.ops import ltorch
from tests.ops.opinfo_util import ELEMENTWISE_CASES, OpCase, assert_matches, case_params, run_case
from tests.oputil import run_decomposed, run_trace_source, trace_call

PARAMS = case_params(ELEMENTWISE_CASES)


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_elementwise_op_matches_eager(case: OpCase, dtype: torch.dtype) -> None:
    run_case(case, dtype)


OPERATORS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.lt, operator.ge,
             operator.neg, operator.abs]


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.__name__)
@pytest.mark.parametrize(("a", "b"), [
    ((2, 3), (3,)), ((), (2, 1)), ((4, 1), 2), (3.5, (2,)), ((1,), ()),
], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_python_operators_on_proxies_broadcast_and_promote(op, a, b, dtype) -> None:
    def make(x):
        return torch.randint(1, 5, x).to(dtype) if isinstance(x, tuple) else x

    x, y = make(a), make(b)
    if op in (operator.neg, operator.abs) and not isinstance(x, torch.Tensor):
        return
    args = [v for v in (x, y) if isinstance(v, torch.Tensor)]

    def fn(*tensors):
        given = iter(tensors)
        p, q = (next(given) if isinstance(v, torch.Tensor) else v for v in (x, y))
        return op(p) if op in (operator.neg, operator.abs) else op(p, q)

    expected = fn(*args)
    for runner in (run_decomposed, run_trace_source):
        assert_matches(runner(fn, *args), expected, lambda d: (2e-2, 2e-2) if d == torch.bfloat16 else (1e-6, 1e-6),
                       f"{op.__name__} {runner.__name__}")


def test_mixed_dtype_promotion_follows_torch() -> None:
    x32, x64, i, b = torch.randn(3), torch.randn(3, dtype=torch.float64), torch.arange(3), torch.tensor(True)
    for fn, args in [
        (lambda p, q: p + q, (x32, x64)), (lambda p, q: p * q, (i, x32)), (lambda p, q: p * q, (x32, b)),
        (lambda p, q: p / q, (i, i + 1)), (lambda p, q: ltorch.where(q, p, 2) if not isinstance(p, torch.Tensor)
                                           else torch.where(q, p, 2), (i, b)),
    ]:
        expected = fn(*args)
        actual = run_decomposed(fn, *args)
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize(("fn", "message"), [
    (lambda a, b: a + b, "cannot be broadcast together"),
    (lambda a, b: (a > 0) - (b > 0), "sub: subtraction with a bool tensor"),
    (lambda a, b: ltorch.where(a, a, b), "where: expected a bool condition tensor, got torch.float32"),
])
def test_bad_input_raises_meta_error(fn, message) -> None:
    with pytest.raises(MetaError, match=message):
        trace_call(fn, torch.randn(2, 3), torch.randn(4, 3))


ALIASES = ["not_equal", "less", "less_equal", "greater", "greater_equal", "absolute", "negative", "fix", "arcsin",
           "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "arctan2"]


@pytest.mark.parametrize("name", ALIASES)
def test_torch_aliases_of_ops_are_the_ops(name: str) -> None:
    import minijit

    x, y = torch.rand(3, 4) * 0.8 + 0.1, torch.rand(3, 4) + 1.1  # in every op's domain (arccosh: y)
    binary = name in ("not_equal", "less", "less_equal", "greater", "greater_equal", "arctan2")
    if binary:
        y[0, 0] = x[0, 0]  # a tie for the comparisons
    args = (x, y) if binary else (y,) if name == "arccosh" else (x,)
    for form in (lambda *a: getattr(torch, name)(*a), lambda a, *rest: getattr(a, name)(*rest)):
        jitted = minijit.jit(form)
        torch.testing.assert_close(jitted(*args), form(*args))
        assert "ltorch" in str(minijit.last_traces(jitted)[0])


@pytest.mark.parametrize("form", ["method", "unbound method", "function"])
def test_where_as_a_tensor_method_takes_the_tensor_as_input(form: str) -> None:
    # x.where(condition, y) is torch.where(condition, x, y); with bool x the two readings differ silently.
    import minijit

    calls = {"method": lambda a, m, b: a.where(m, b), "unbound method": lambda a, m, b: torch.Tensor.where(a, m, b),
             "function": lambda a, m, b: torch.where(m, a, b)}
    gen = torch.Generator().manual_seed(0)
    a, m, b = (torch.rand(16, generator=gen) > 0.5 for _ in range(3))
    f = calls[form]
    assert torch.equal(minijit.jit(f)(a, m, b), f(a, m, b))
    x = torch.randn(16, generator=gen)
    assert torch.equal(minijit.jit(lambda x, m: x.where(m, 0.5))(x, m), x.where(m, 0.5))


REFLECTED = {"radd": lambda x: 0.044715 + x, "rmul": lambda x: 0.044715 * x, "rsub": lambda x: 1.7 - x,
             "rtruediv": lambda x: 3.3 / x, "rtruediv_int": lambda x: 3 / x, "rpow": lambda x: 1.3 ** x,
             "rfloordiv": lambda x: 3.3 // x, "rmod": lambda x: 3.3 % x, "rand": lambda x: 6 & x.int()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(REFLECTED))
def test_reflected_operator_with_a_number_computes_as_eager_s(name: str, dtype: torch.dtype) -> None:
    """`0.044715 * x` is eager's `x.mul(0.044715)` (the number stays a wrapped number, computed with in float32),
    `3.3 / x` its `x.reciprocal() * 3.3`: recorded as `mul(0.044715, x)` and `div(3.3, x)` they rounded otherwise,
    bit for bit (GPT-2's GELU in bfloat16)."""
    import minijit

    fn = REFLECTED[name]
    x = (torch.rand(256, generator=torch.Generator().manual_seed(0)) + 0.5).to(dtype)
    want, got = fn(x), minijit.jit(fn)(x)
    assert got.dtype == want.dtype
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()
    if dtype.is_floating_point and name not in ("rfloordiv", "rmod", "rand"):
        x.requires_grad_(True)
        want_grad = torch.autograd.grad(fn(x).sum(), x)
        got_grad = torch.autograd.grad(minijit.jit(fn)(x).sum(), x)
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
