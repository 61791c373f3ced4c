"""Reductions against eager torch: OpInfo samples, call forms of overloaded ops, and errors naming the op."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import MetaError, UnsupportedOpError
from minijit.ops import ltorch
from tests.ops.opinfo_util import REDUCTION_CASES, OpCase, assert_matches, case_params, run_case
from tests.oputil import run_decomposed, run_trace_source, trace_call

# eager torch warns about var/std with too few elements; the comparison covers those cases
pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom:UserWarning")

PARAMS = case_params(REDUCTION_CASES)


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_reduction_matches_eager(case: OpCase, dtype: torch.dtype) -> None:
    run_case(case, dtype)


def _check_forms(forms, x):
    for form in forms:
        expected = form(x)
        for runner in (run_decomposed, run_trace_source):
            actual = runner(form, x)
            assert_matches(actual, tuple(expected) if isinstance(expected, tuple) else expected,
                           lambda d: (1e-5, 1e-5), f"{runner.__name__}")


@pytest.mark.parametrize("shape", [(), (1,), (3, 1, 4), (2, 3, 4)])
def test_call_forms_of_overloaded_reductions(shape) -> None:
    # The same lambdas run on tensors (eager) and on proxies (methods dispatch to ltorch).
    x = torch.randn(shape)
    last = -1
    forms = [
        lambda a: a.sum(), lambda a: a.sum(last), lambda a: a.sum(dim=last, keepdim=True),
        lambda a: a.mean(), lambda a: a.mean(last, True), lambda a: a.var(), lambda a: a.var(last, False),
        lambda a: a.std(unbiased=False), lambda a: a.var(dim=last, correction=0, keepdim=True),
        lambda a: a.amax(), lambda a: a.max(), lambda a: a.max(last), lambda a: a.min(dim=last, keepdim=True),
        lambda a: a.max(a * 2), lambda a: a.argmax(), lambda a: a.argmin(last, keepdim=True),
        lambda a: a.norm(), lambda a: a.logsumexp(last), lambda a: a.cumsum(last), lambda a: a.all(),
    ]
    if len(shape) >= 2:
        forms += [lambda a: a.sum(dim=(0, 1), keepdim=True), lambda a: a.norm(p="fro", dim=(0, 1)),
                  lambda a: a.var(dim=(0, 1), unbiased=True)]
    _check_forms(forms, x)


def test_max_and_min_with_dim_give_values_and_indices_fields() -> None:
    x = torch.randn(3, 5)
    for runner in (run_decomposed, run_trace_source):
        values, indices = runner(lambda a: (a.max(1).values, a.min(dim=0, keepdim=True).indices), x)
        torch.testing.assert_close(values, x.max(1).values)
        torch.testing.assert_close(indices, x.min(dim=0, keepdim=True).indices)
    result = run_trace_source(lambda a: ltorch.max(a, -1), x)
    assert result.values.shape == (3,) and result.indices.dtype == torch.int64


def test_torch_function_forms() -> None:
    x = torch.randn(3, 4)
    forms = [
        (ltorch.max, torch.max, (1,)), (ltorch.var_mean, torch.var_mean, (1, True)),
        (ltorch.std_mean, torch.std_mean, ()), (ltorch.var, torch.var, (True,)),
        (ltorch.vector_norm, torch.linalg.vector_norm, (3.5,)), (ltorch.norm, torch.norm, (float("inf"),)),
        (ltorch.sum, torch.sum, (0,)),
    ]
    for sym, fn, args in forms:
        expected = fn(x, *args)
        actual = run_decomposed(lambda a, sym=sym, args=args: sym(a, *args), x)
        assert_matches(actual, tuple(expected) if isinstance(expected, tuple) else expected,
                       lambda d: (1e-5, 1e-5), sym.name)


def test_low_precision_mean_accumulates_in_float32() -> None:
    # 4096 copies of 1.01 summed in bfloat16 would stall far below 4096 * 1.01.
    x = torch.full((4096,), 1.01, dtype=torch.bfloat16)
    actual = run_decomposed(lambda a: ltorch.mean(a), x)
    torch.testing.assert_close(actual, torch.mean(x), atol=0, rtol=0)


@pytest.mark.parametrize(("fn", "message"), [
    (lambda a: ltorch.sum(a, 3), "sum: dimension 3 is out of range"),
    (lambda a: ltorch.mean(a.long()), "mean: needs a floating point"),
    (lambda a: ltorch.var(a.long()), "var: only supports floating point"),
    (lambda a: ltorch.argmax(a > 0), "argmax: does not support bool"),
    (lambda a: ltorch.max(a, (0, 1)), "max: dim must be an int"),
    (lambda a: ltorch.var(a, 0, True, correction=1), "var: give either unbiased or correction"),
    (lambda a: ltorch.cumsum(a, -3), "cumsum: dimension -3 is out of range"),
])
def test_bad_input_raises_meta_error_naming_the_op(fn, message) -> None:
    with pytest.raises(MetaError, match=message):
        trace_call(fn, torch.randn(2, 3))


def test_nuclear_norm_is_unsupported_by_the_decomposition() -> None:
    # Eager accepts it: the interpreter records it as an opaque torch op (tests/ops/test_opaque.py).
    with pytest.raises(UnsupportedOpError, match="norm: p='nuc' is not supported"):
        trace_call(lambda a: ltorch.norm(a, "nuc"), torch.randn(2, 3))


def test_logsumexp_over_an_empty_dim_under_grad_matches_eager() -> None:
    """logsumexp decomposed (under grad) over a dim of size 0, constant or symbolic: -inf and a zero-size gradient
    as eager's, not the maximum's 'Expected reduction dim to have non-zero size'."""
    def f(x):
        return x.logsumexp(0), x.logsumexp(1)

    jitted = minijit.jit(f)
    for n in (2, 0, 3, 0):
        x = torch.randn(n, 3, requires_grad=True)
        xj = x.detach().clone().requires_grad_()
        expected, actual = f(x), jitted(xj)
        torch.testing.assert_close(actual, expected)
        sum(e.sum() for e in expected).backward()
        sum(a.sum() for a in actual).backward()
        torch.testing.assert_close(xj.grad, x.grad)


@pytest.mark.parametrize("op", ["cumsum", "max", "diff", "norm", "repeat_interleave"])
def test_a_symbolic_number_as_a_dim_order_or_count_matches_eager(op) -> None:
    """A number argument made symbolic (it changed between calls) given as a dim, a difference's order, a norm's
    ord or a repeat count: its value is relied on (the guard checks it), as for a plain int, where the proxy was
    refused as no int ('dim must be an int, got <IntegerProxy d: int 0>')."""
    fns = {"cumsum": lambda x, d: x.cumsum(d), "max": lambda x, d: x.max(d).values,
           "diff": lambda x, d: torch.diff(x, n=d % 3, dim=d), "norm": lambda x, d: x.norm(d + 2),
           "repeat_interleave": lambda x, d: x.repeat_interleave(d + 1, 0)}
    fn = fns[op]
    jitted = minijit.jit(fn, cache="symbolic values")
    for d in (0, 1, -1):
        x = torch.randn(3, 4)
        torch.testing.assert_close(jitted(x, d), fn(x, d))


def test_max_of_an_empty_tensor_raises_eagers_runtime_error() -> None:
    """x.max() / x.min() of no element, under grad too (where the maximum's kernel raised IndexError): eager's
    RuntimeError, which the caller's `except RuntimeError` catches."""
    def f(x):
        return x.max() + x.min()

    jitted = minijit.jit(f)
    for n in (3, 0, 2, 0):
        x = torch.randn(n, 2, requires_grad=True)
        if n:
            torch.testing.assert_close(jitted(x), f(x))
            continue
        with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
            f(x)
        with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
            jitted(x)


@pytest.mark.parametrize("shape, dim, correction", [
    ((2, 2), None, 4), ((3,), None, 3), ((1, 1, 1), None, 1), ((2, 3), 1, 3), ((2, 3), 1, 4), ((2, 3), 0, 2.5),
    ((5, 1, 5), (1,), 1.3),
])
def test_var_gradient_with_no_degree_of_freedom_left_matches_eager(shape: Any, dim: Any, correction: Any) -> None:
    # correction >= the reduced count: eager's gradient is 2 / (n - correction) as it is over some dims (negative,
    # or infinite), NaN or infinite over all (`x.var()`); minijit clamped n - correction at 0 (OpInfo's var_mean
    # with dim=(1,), correction=1.3 on a size-1 dim gave NaN).
    for fn in (lambda x: torch.var_mean(x, dim=dim, correction=correction),
               lambda x: torch.std(x, dim=dim, correction=correction)):
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        mine = x.detach().clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager's "degrees of freedom is <= 0"
            want = fn(x)
            have = minijit.jit(fn)(mine)
        want, have = (want, have) if isinstance(want, tuple) else ((want,), (have,))
        cotangents = [torch.randn_like(w) for w in want]
        torch.testing.assert_close(torch.autograd.grad(have, mine, cotangents)[0],
                                   torch.autograd.grad(want, x, cotangents)[0], equal_nan=True)
