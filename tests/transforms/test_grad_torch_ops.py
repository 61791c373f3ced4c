"""Gradients of user functions built on prod, topk, sort, slice assignment and digamma, against torch.autograd.

The functions run through `minijit.jit` (the interpreter, functionalization and the
grad split), with the inputs requiring grad; outputs and the gradients for a random
cotangent must match eager PyTorch, in float64 and in float32 with tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.ops import prims
from tests.oputil import assert_same_grads

F64, F32 = torch.float64, torch.float32
TOLERANCES = {F64: {"atol": 1e-10, "rtol": 1e-8}, F32: {"atol": 1e-5, "rtol": 1e-4}}


def _float_outputs(out: Any) -> list[torch.Tensor]:
    outs = list(out) if isinstance(out, tuple | list) else [out]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]


def _check(fn: Callable[..., Any], *args: Any, dtype: torch.dtype = F64) -> None:
    """`fn(*args)` under jit and eagerly: same outputs, same gradients of the float tensor arguments."""
    args = tuple(a.to(dtype).requires_grad_() if isinstance(a, torch.Tensor) and a.dtype.is_floating_point else a
                 for a in args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    want, got = fn(*args), minijit.jit(fn)(*args)
    want_t = list(want) if isinstance(want, tuple | list) else [want]
    got_t = list(got) if isinstance(got, tuple | list) else [got]
    for w, g in zip(want_t, got_t, strict=True):
        torch.testing.assert_close(g, w, **TOLERANCES[dtype])
    want_f, got_f = _float_outputs(want), _float_outputs(got)
    cts = [torch.randn_like(w) for w in want_f]
    want_g = torch.autograd.grad(want_f, leaves, cts, allow_unused=True)
    got_g = torch.autograd.grad(got_f, leaves, cts, allow_unused=True)
    assert_same_grads(want_g, got_g, leaves, **TOLERANCES[dtype])


def _zeros_in_rows() -> torch.Tensor:
    """Rows with no zero, one zero, two zeros, and all zeros."""
    x = torch.randn(4, 5, dtype=F64)
    x[1, 3] = 0
    x[2, 0] = x[2, 4] = 0
    x[3] = 0
    return x


# -- prod ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(("name", "fn"), [
    ("dim1", lambda x: torch.prod(x, 1)),
    ("dim0_keepdim", lambda x: x.prod(0, keepdim=True)),
    ("all", lambda x: x[:2].prod()),  # one zero in all the elements
    ("all_two_zeros", lambda x: x[1:3].prod()),
    ("after_mul", lambda x: (x * 2).prod(-1) * 3),
])
def test_prod_with_zeros(name: str, fn: Callable[..., Any], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _check(fn, _zeros_in_rows(), dtype=dtype)


def test_prod_gradient_has_no_nan_at_a_zero() -> None:
    x = torch.tensor([2.0, 0.0, 3.0], dtype=F64, requires_grad=True)
    minijit.jit(lambda x: x.prod())(x).backward()
    assert x.grad.tolist() == [0.0, 6.0, 0.0]


# -- topk and sort (values differentiable, indices not) -----------------------------------------------

def _distinct(*shape: int) -> torch.Tensor:
    """Distinct values in random order, so no result depends on how ties are broken."""
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n).to(F64) / n + torch.randn(()).item()).reshape(shape)


SELECTIONS = [
    ("topk_values", lambda x: torch.topk(x, 3).values),
    ("topk_pair", lambda x: torch.topk(x, 2, dim=0, largest=False)),
    ("topk_unsorted", lambda x: x.topk(4, 1, True, False).values.sum(1)),
    ("topk_indices_reused", lambda x: torch.gather(x * x, 1, torch.topk(x, 2).indices)),
    ("topk_named_unpack", lambda x: (lambda v, i: v * i)(*torch.topk(x, 3, dim=-1))),
    ("sort_values", lambda x: torch.sort(x).values * 2),
    ("sort_descending_dim0", lambda x: torch.sort(x, dim=0, descending=True)),
    ("sort_method_stable", lambda x: x.sort(stable=True)[0].cumsum(1)),
    ("argsort_is_constant", lambda x: torch.gather(x, 1, torch.argsort(x, dim=1, descending=True)) ** 2),
    ("sort_then_topk", lambda x: torch.topk(torch.sort(x, 1)[0][:, 1:], 2).values),
]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(("name", "fn"), SELECTIONS, ids=[n for n, _ in SELECTIONS])
def test_topk_and_sort(name: str, fn: Callable[..., Any], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _check(fn, _distinct(4, 6), dtype=dtype)


def test_sort_with_ties_follows_eager_tie_breaking() -> None:
    # The gradient follows the indices torch.sort chose; both sides run the same stable sort.
    torch.manual_seed(0)
    x = torch.tensor([[1.0, 3.0, 1.0, 2.0, 3.0], [0.5, 0.5, 0.5, -1.0, 2.0]], dtype=F64)
    _check(lambda x: torch.sort(x, dim=1, descending=True, stable=True).values * torch.arange(5.0, dtype=F64), x)


# -- slice assignment (functionalized to slice_scatter) -------------------------------------------------

def _assign_rows(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = a * 2
    x[1:3] = y
    return x


def _assign_strided(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = a.sin()
    x[:, ::2] = y * 3
    return x.sum(0)


def _add_into_slice(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = a.clone()
    x[1:3, 1:] += y[:, :2].sin()
    return x * x


def _assign_into_zeros(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = torch.zeros(5, 3, dtype=y.dtype)
    x[2:4] = y
    return x + a


def _assign_row(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = a + 1
    x[4] = y[0]
    return x


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("fn", [_assign_rows, _assign_strided, _add_into_slice, _assign_into_zeros, _assign_row],
                         ids=lambda f: f.__name__)
def test_slice_assignment(fn: Callable[..., Any], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a = torch.randn(5, 3, dtype=F64)
    y = torch.randn(2, 3 if fn is not _assign_strided else 2, dtype=F64)
    if fn is _assign_strided:
        y = torch.randn(5, 2, dtype=F64)
    _check(fn, a, y, dtype=dtype)


# -- digamma and lgamma ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(("name", "fn"), [
    ("digamma", lambda x: torch.digamma(x)),
    ("digamma_method", lambda x: (x * 2).digamma().sum()),
    ("lgamma", lambda x: torch.lgamma(x) * x),
])
def test_gamma_functions(name: str, fn: Callable[..., Any], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _check(fn, torch.rand(3, 4, dtype=F64) * 4 + 0.25, dtype=dtype)


def test_digamma_derivative_chain_matches_eager() -> None:
    # digamma's gradient is polygamma(1, x), whose own gradient (polygamma(2, x)) must be
    # eager's second derivative of digamma.
    x = torch.rand(5, dtype=F64) + 0.5
    xe = x.clone().requires_grad_()
    (first,) = torch.autograd.grad(torch.digamma(xe).sum(), xe, create_graph=True)
    (want,) = torch.autograd.grad(first.sum(), xe)
    xj = x.clone().requires_grad_()
    (got,) = torch.autograd.grad(minijit.jit(lambda x: prims.polygamma(1, x))(xj).sum(), xj)
    torch.testing.assert_close(got, want)


# -- std and the norms where the result is 0 ------------------------------------------------------

def _rows_with_a_constant_and_a_zero_row() -> torch.Tensor:
    x = torch.randn(4, 5, dtype=F64)
    x[1] = 0.5  # no spread: std 0
    x[3] = 0    # a zero vector: norm 0
    return x


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(("name", "fn"), [
    ("std_rows", lambda x: x.std(1)),
    ("std_biased_one_row", lambda x: x[1:2].std(0, unbiased=False)),
    ("std_all_constant", lambda x: x[1].std()),
    ("std_mean", lambda x: torch.std_mean(x, 1, keepdim=True)),
    ("norm", lambda x: x[3].norm()),
    ("norm_rows", lambda x: x.norm(dim=1)),
    ("vector_norm_p3", lambda x: torch.linalg.vector_norm(x, 3, dim=1)),
    ("vector_norm_p1", lambda x: torch.linalg.vector_norm(x, 1, dim=1)),
    ("normalize", lambda x: torch.nn.functional.normalize(x, dim=1)),
    ("cosine_similarity", lambda x: torch.nn.functional.cosine_similarity(x, x.flip(0), dim=1)),
])
def test_std_and_norms_where_the_result_is_zero(name: str, fn: Callable[..., Any], dtype: torch.dtype) -> None:
    # Eager's std and norm backward give 0 where the result is 0; differentiating sqrt there gives nan.
    torch.manual_seed(0)
    _check(fn, _rows_with_a_constant_and_a_zero_row(), dtype=dtype)


def _forward_then_backward(fn: Callable[..., Any], backward: Callable[[Any], None]) -> tuple[str, Any]:
    """Where `fn(x)` then `backward(out)` stops: ("forward", error), ("backward", error) or ("done", x.grad)."""
    x = torch.tensor([1.5, -2.5, 3.0, 7.0], requires_grad=True)
    try:
        out = fn(x)
    except Exception as error:
        return "forward", error
    try:
        backward(out)
    except Exception as error:
        return "backward", error
    return "done", x.grad


FLOOR_DIVIDES = {
    "floordiv_operator": (lambda x: x // 2, lambda out: out.sum().backward()),
    "floor_divide_tensors": (lambda x: torch.floor_divide(x, x.detach() + 10), lambda out: out.sum().backward()),
    "rfloordiv": (lambda x: 7 // x, lambda out: out.sum().backward()),
    "div_floor_mode": (lambda x: torch.div(x, 2, rounding_mode="floor"), lambda out: out.sum().backward()),
    "not_reached": (lambda x: (x * 2, x // 2), lambda out: out[0].sum().backward()),
    "reached_of_two": (lambda x: (x * 2, x // 2), lambda out: out[1].sum().backward()),
}


@pytest.mark.parametrize("name", list(FLOOR_DIVIDES))
def test_floor_divide_backward_raises_where_eager_does(name: str) -> None:
    # Eager has no derivative for floor_divide: `.backward()` raises when it reaches the op (div with
    # rounding_mode="floor" has a zero gradient); the forward works.
    fn, backward = FLOOR_DIVIDES[name]
    want_stage, want = _forward_then_backward(fn, backward)
    got_stage, got = _forward_then_backward(minijit.jit(fn), backward)
    assert got_stage == want_stage
    if want_stage == "done":
        torch.testing.assert_close(got, want)
    else:
        assert isinstance(got, type(want))


ORDER_ZERO_NORMS = {
    "vector_norm": lambda x: torch.linalg.vector_norm(x, 0),
    "vector_norm_dim_float": lambda x: torch.linalg.vector_norm(x, 0.0, dim=1, keepdim=True),
    "tensor_norm": lambda x: x.norm(0),
    "torch_norm_dim": lambda x: torch.norm(x, p=0, dim=0),
    "with_another_use": lambda x: torch.linalg.vector_norm(x, 0) + x.sum(),
    "order_two": lambda x: torch.linalg.vector_norm(x, 2),
}


@pytest.mark.parametrize("name", list(ORDER_ZERO_NORMS))
def test_norm_of_order_zero_requires_grad_like_eager(name: str) -> None:
    # The count of nonzeros: eager's result requires grad, and its backward gives x no gradient.
    fn = ORDER_ZERO_NORMS[name]
    results = []
    for f in (fn, minijit.jit(fn)):
        x = torch.tensor([[1.5, 0.0, -2.0], [0.0, 3.0, 0.5]], requires_grad=True)
        out = f(x)
        if out.requires_grad:
            out.sum().backward()
        results.append((out, out.requires_grad, x.grad))
    (want, want_rg, want_grad), (got, got_rg, got_grad) = results
    torch.testing.assert_close(got, want)
    assert got_rg == want_rg and (got_grad is None) == (want_grad is None)
    if want_grad is not None:
        torch.testing.assert_close(got_grad, want_grad)
