"""Casts and creation ops against eager torch: OpInfo samples, call forms, random ops' statistics, errors."""

from __future__ import annotations

import math

import pytest
import torch

from minijit.errors import MetaError, UnsupportedOpError
from minijit.ops import ltorch
from tests.ops.opinfo_util import CREATION_CASES, FLOAT_DTYPES, OpCase, assert_matches, case_params, run_case
from tests.oputil import run_decomposed, run_trace_source, trace_call

PARAMS = case_params(CREATION_CASES)


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_creation_op_matches_eager(case: OpCase, dtype: torch.dtype) -> None:
    run_case(case, dtype)


def _check(fn, *args) -> None:
    expected = fn(*args)
    for runner in (run_decomposed, run_trace_source):
        assert_matches(runner(fn, *args), expected, lambda d: (0, 0), runner.__name__)


def _both(name):
    """torch.<name> on tensors (or with no tensor), ltorch.<name> while tracing."""
    from minijit.ir.context import current_trace

    return lambda *a, **k: (getattr(ltorch, name) if current_trace() else getattr(torch, name))(*a, **k)


@pytest.mark.parametrize("form", [
    lambda a: a.to(torch.float16), lambda a: a.to("cpu"), lambda a: a.to(torch.device("cpu"), torch.float64),
    lambda a: a.to(dtype=torch.int32), lambda a: a.to(device="cpu", dtype=torch.bfloat16, non_blocking=True),
    lambda a: a.to(a.long()), lambda a: a.to(torch.float32, memory_format=torch.contiguous_format),
    lambda a: a.float(), lambda a: a.double(), lambda a: a.half(), lambda a: a.bfloat16(), lambda a: a.long(),
    lambda a: a.int(), lambda a: a.short(), lambda a: a.char(), lambda a: a.byte(), lambda a: a.bool(),
    lambda a: a.type_as(a.int()), lambda a: a.type(torch.float64),
])
@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_cast_forms(form, shape) -> None:
    _check(form, torch.randn(shape) * 4)


def test_cast_to_the_same_dtype_records_nothing_unless_copy_is_asked() -> None:
    trace = trace_call(lambda a: a.to(torch.float32).float().to("cpu"), torch.randn(2))
    assert trace.output is trace.args[0] and not trace.bound_symbols
    x = torch.randn(2)
    copied = run_decomposed(lambda a: a.to(torch.float32, copy=True), x)
    assert torch.equal(copied, x) and copied.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("form", [
    lambda: _both("zeros")(2, 3), lambda: _both("zeros")((2, 3), dtype=torch.int32), lambda: _both("ones")([4]),
    lambda: _both("ones")(torch.Size([1, 2]), dtype=torch.bool), lambda: _both("zeros")(()),
    lambda: _both("full")((2, 2), 7), lambda: _both("full")((3,), True), lambda: _both("full")((1,), 2.5),
    lambda: _both("full")((2,), 3, dtype=torch.float64), lambda: _both("full")([], -1.5, device="cpu"),
    lambda: _both("arange")(5), lambda: _both("arange")(2, 9, 3), lambda: _both("arange")(0, 1, 0.1),
    lambda: _both("arange")(1.5, -2.5, -0.5), lambda: _both("arange")(10, dtype=torch.float32),
    lambda: _both("arange")(0.5, 4.7, 1.1, dtype=torch.float64), lambda: _both("arange")(3, 3),
    lambda: _both("arange")(0, 7.5, 2.5, dtype=torch.int64),
    lambda: _both("tensor")(3), lambda: _both("tensor")(2.5), lambda: _both("tensor")([True, False]),
    lambda: _both("tensor")([[1, 2], [3, 4]]), lambda: _both("tensor")([[1, 2.5]], dtype=torch.float64),
    lambda: _both("tensor")([]),
])
def test_creation_without_tensor_arguments(form) -> None:
    _check(form)


@pytest.mark.parametrize("form", [
    lambda a: _both("zeros_like")(a), lambda a: _both("ones_like")(a, dtype=torch.int64),
    lambda a: _both("full_like")(a, 3.5),
    lambda a: a.new_zeros(2, 3), lambda a: a.new_ones((1, 2)), lambda a: a.new_full((2,), 4, dtype=torch.int32),
])
@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.int64])
def test_like_and_new_forms(form, dtype) -> None:
    _check(form, torch.randn(2, 4).to(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_random_ops_have_the_right_distribution(dtype) -> None:
    x = torch.empty(40000, dtype=dtype)
    torch.manual_seed(0)
    u = run_decomposed(lambda a: ltorch.rand_like(a), x)
    n = run_decomposed(lambda a: ltorch.randn_like(a), x)
    r = run_decomposed(lambda: ltorch.randn(200, 200, dtype=dtype))
    assert u.dtype == n.dtype == r.dtype == dtype and u.shape == n.shape == (40000,) and r.shape == (200, 200)
    assert 0 <= u.min().item() and u.max().item() <= 1
    assert abs(u.double().mean().item() - 0.5) < 0.01 and abs(u.double().var().item() - 1 / 12) < 0.01
    for z in (n, r.flatten()):
        z = z.double()
        assert abs(z.mean().item()) < 0.03 and abs(z.std().item() - 1) < 0.03
        assert abs((z.abs() < 1).double().mean().item() - math.erf(1 / math.sqrt(2))) < 0.02


def test_random_ops_follow_the_torch_seed() -> None:
    x = torch.empty(100)
    results = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        results.append(run_decomposed(lambda a: ltorch.randn_like(a) + ltorch.rand_like(a), x))
    assert torch.equal(results[0], results[1]) and not torch.equal(results[0], results[2])


@pytest.mark.parametrize(("fn", "message"), [
    (lambda a: a.to("cpu", torch.float32, False, False, 5), "to: unexpected arguments"),
    (lambda a: ltorch.zeros(2, -1), "zeros: negative size"),
    (lambda a: ltorch.zeros(2, 3.0), "zeros: sizes must be ints"),
    (lambda a: ltorch.ones(2, requires_grad=True), "ones: requires_grad=True is not supported"),
    (lambda a: ltorch.arange(0, 5, 0), "arange: step must be nonzero"),
    (lambda a: ltorch.arange(5, 0, 1), "arange: upper bound and larger bound inconsistent"),
    (lambda a: ltorch.rand_like(a.long()), "rand_like: needs a floating point dtype"),
    (lambda a: ltorch.tensor([[1], [2, 3]]), "tensor: nested sequences have ragged shapes"),
    (lambda a: ltorch.tensor(a), "tensor: only \\(nested lists of\\) Python numbers"),
])
def test_bad_input_raises_meta_error_naming_the_op(fn, message) -> None:
    with pytest.raises(MetaError, match=message):
        trace_call(fn, torch.randn(2, 3))


def test_type_with_a_type_name_is_unsupported_naming_the_op() -> None:
    # Eager accepts it, but torch cannot run it on meta tensors either: no opaque fallback.
    with pytest.raises(UnsupportedOpError, match=r"type: only Tensor\.type"):
        trace_call(lambda a: a.type("torch.FloatTensor"), torch.randn(2, 3))


def test_to_another_device_records_a_device_put() -> None:
    trace = trace_call(lambda a: a.to("meta", torch.float16), torch.randn(2, 3))
    (bsym,) = trace.bound_symbols
    assert trace.output.device == torch.device("meta") and trace.output.dtype == torch.float16
    assert [sub.sym.name for sub in bsym.subsymbols] == ["convert_element_type", "device_put"]
