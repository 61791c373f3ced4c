"""Gradients of every differentiable prim under minijit.jit, against eager torch autograd.

The eager reference runs the torch executor's implementation of the prim (a plain
torch call) under torch.autograd; the jitted side runs the VJP rule's backward trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.extend import get_executor
from minijit.ir import Symbol, TensorProxy
from minijit.ops import prims
from minijit.transforms.vjp import VJP_RULES
from tests.oputil import assert_same_grads
from tests.transforms import aten_prim_cases

F64 = torch.float64


def _t(*shape: int, low: float | None = None, high: float | None = None, dtype: torch.dtype = F64) -> torch.Tensor:
    if low is None:
        return torch.randn(shape, dtype=dtype)
    return torch.empty(shape, dtype=dtype).uniform_(low, high)


def _ties(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(*shape, dtype=F64)
    b = torch.randn(*shape, dtype=F64)
    b.view(-1)[::2] = a.view(-1)[::2]
    return a, b


def _with_zeros(*shape: int, at: tuple[tuple[int, ...], ...] = ((1, 2), (2, 0), (2, 3))) -> torch.Tensor:
    """Zeros at `at` (index tuples of the last dims): by default row 0 has none, row 1 one, row 2 two."""
    x = torch.randn(*shape, dtype=F64)
    for index in at:
        x[(..., *index)] = 0
    return x


def _with_ties(*shape: int) -> torch.Tensor:
    x = torch.randn(*shape, dtype=F64)
    x[..., 0] = x[..., 1] = x.max() + 1  # ties for the maximum
    return x


# (prim name, args builder, which args are differentiable tensors)
UNARY_DOMAINS: dict[str, tuple[float | None, float | None]] = {
    "log": (0.5, 2), "log1p": (0.5, 2), "log2": (0.5, 2), "log10": (0.5, 2), "sqrt": (0.5, 2),
    "rsqrt": (0.5, 2), "reciprocal": (0.5, 2), "lgamma": (0.5, 3), "digamma": (0.5, 3), "asin": (-0.9, 0.9),
    "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "erfinv": (-0.9, 0.9), "acosh": (1.2, 3),
}
UNARY = ["abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin",
         "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal",
         "erf", "erfc", "erfinv", "lgamma", "digamma", "floor", "ceil", "round", "trunc", "sign", "real"]

Case = tuple[str, Callable[[], tuple[Any, ...]]]
CASES: list[Case] = [(name, lambda name=name: (_t(3, 4, low=UNARY_DOMAINS.get(name, (None, None))[0],
                                                  high=UNARY_DOMAINS.get(name, (None, None))[1]),)) for name in UNARY]
CASES += [
    ("add", lambda: (_t(3, 4), _t(3, 4))),
    ("add", lambda: (_t(3, 4), 2.5)),
    ("sub", lambda: (_t(3, 4), _t(3, 4))),
    ("sub", lambda: (1.5, _t(3, 4))),
    ("mul", lambda: (_t(3, 4), _t(3, 4))),
    ("mul", lambda: (_t(3, 4), -3.0)),
    ("div", lambda: (_t(3, 4), _t(3, 4, low=0.5, high=2))),
    ("div", lambda: (2.0, _t(3, 4, low=0.5, high=2))),
    ("pow", lambda: (_t(3, 4, low=0.5, high=2), _t(3, 4))),
    ("pow", lambda: (_t(3, 4), 3)),
    ("pow", lambda: (2.0, _t(3, 4))),
    ("pow", lambda: (0.0, _t(3, 4))),  # eager's gradient: 0 for exponents >= 0, -inf below (inf * log(0))
    ("maximum", lambda: _ties(3, 4)),
    ("minimum", lambda: _ties(3, 4)),
    ("atan2", lambda: (_t(3, 4), _t(3, 4))),
    ("copysign", lambda: (_t(3, 4), _t(3, 4))),
    ("remainder", lambda: (_t(3, 4) * 3, _t(3, 4, low=0.5, high=2))),
    ("fmod", lambda: (_t(3, 4) * 3, _t(3, 4, low=0.5, high=2))),
    ("floor_divide", lambda: (_t(3, 4) * 3, _t(3, 4, low=0.5, high=2))),
    ("where", lambda: (torch.rand(3, 4) > 0.5, _t(3, 4), _t(3, 4))),
    ("where", lambda: (torch.rand(3, 4) > 0.5, _t(3, 4), 0.0)),
    ("native_dropout", lambda: (_t(3, 4), 0.3)),
    ("lerp", lambda: (_t(3, 4), _t(3, 4), _t(3, 4))),
    ("lerp", lambda: (_t(3, 4), _t(3, 4), 0.3)),
    ("convert_element_type", lambda: (_t(3, 4), torch.float32)),
    ("broadcast_in_dim", lambda: (_t(3, 1), (2, 3, 4), (1, 2))),
    ("broadcast_in_dim", lambda: (_t(4), (3, 4), (1,))),
    ("reshape", lambda: (_t(3, 4), (2, 6))),
    ("squeeze", lambda: (_t(3, 1, 4, 1), (1, 3))),
    ("transpose", lambda: (_t(2, 3, 4), (2, 0, 1))),
    ("slice", lambda: (_t(5, 7), (1, 0), (4, 7), (1, 1))),
    ("slice", lambda: (_t(5, 7), (0, 1), (5, 6), (2, 3))),
    ("slice", lambda: (_t(6, 8), (1, 2), (6, 8), (2, 2))),
    ("cat", lambda: ([_t(2, 3), _t(4, 3), _t(1, 3)], 0)),
    ("cat", lambda: ([_t(2, 3), _t(2, 1)], 1)),
    ("sum", lambda: (_t(3, 4, 5), (0, 2))),
    ("sum", lambda: (_t(3, 4), ())),
    ("prod", lambda: (_t(3, 4, low=0.5, high=2), (1,))),
    ("prod", lambda: (_with_zeros(3, 4), (1,))),
    ("prod", lambda: (_with_zeros(2, 5, 4), (0, 2))),
    ("prod", lambda: (_with_zeros(5, 4, at=((3, 1),)), (0, 1))),
    ("prod", lambda: (_with_zeros(3, 4), ())),
    ("prod", lambda: (torch.zeros(3, 4, dtype=F64), (1,))),
    ("amax", lambda: (_with_ties(3, 4), (1,))),
    ("amin", lambda: (-_with_ties(3, 4), (0, 1))),
    ("var_mean", lambda: (_t(3, 4, 5), (1, 2), 1)),
    ("var_mean", lambda: (_t(3, 4), (0,), 0)),
    ("matmul", lambda: (_t(4), _t(4))),
    ("matmul", lambda: (_t(3, 4), _t(4))),
    ("matmul", lambda: (_t(4), _t(4, 5))),
    ("matmul", lambda: (_t(3, 4), _t(4, 5))),
    ("matmul", lambda: (_t(2, 3, 4), _t(4, 5))),
    ("matmul", lambda: (_t(3, 4), _t(2, 4, 5))),
    ("matmul", lambda: (_t(2, 3, 4), _t(2, 4, 5))),
    ("matmul", lambda: (_t(2, 3, 4), _t(4))),
    ("cumsum", lambda: (_t(3, 4), 1)),
    ("cumsum", lambda: (_t(3, 4), 0)),
    ("device_put", lambda: (_t(3, 4), torch.device("cpu"))),
    ("clone", lambda: (_t(3, 4),)),
    ("copy_in_format", lambda: (_t(2, 3, 4, 5).transpose(1, 3), torch.channels_last)),
    ("take", lambda: (_t(5, 3), torch.tensor([0, 2, 2, 4]), 0)),
    ("take_along_axis", lambda: (_t(3, 4), torch.randint(0, 4, (3, 6)), 1)),
    ("index_add", lambda: (_t(5, 3), torch.tensor([0, 2, 2]), _t(3, 3), 0)),
    ("index_copy", lambda: (_t(5, 3), torch.tensor([4, 0, 2]), _t(3, 3), 0)),
    ("scatter_add", lambda: (_t(3, 4), torch.randint(0, 4, (3, 6)), _t(3, 6), 1)),
    ("slice_scatter", lambda: (_t(5, 4), _t(2, 4), (1, 0), (3, 4), (1, 1))),
    ("slice_scatter", lambda: (_t(6, 7), _t(3, 2), (0, 1), (6, 7), (2, 3))),
    ("slice_scatter", lambda: (_t(4, 3), _t(0, 3), (2, 0), (2, 3), (1, 1))),
    ("polygamma", lambda: (0, _t(3, 4, low=0.5, high=3))),
    ("polygamma", lambda: (1, _t(3, 4, low=0.5, high=3))),
    ("polygamma", lambda: (3, _t(3, 4, low=0.5, high=3))),
    # Distinct values, so the indices (and the gradients that follow them) do not depend on tie-breaking.
    ("topk", lambda: (_t(4, 6), 3, 1, True, True)),
    ("topk", lambda: (_t(4, 6), 2, 0, False, True)),
    ("topk", lambda: (_t(3, 5, 4), 5, 1, True, False)),
    ("topk", lambda: (_t(4, 6), 0, 1, True, True)),
    ("topk", lambda: (_t(), 1, 0, True, True)),
    ("sort", lambda: (_t(4, 6), 1, False, False)),
    ("sort", lambda: (_t(4, 6), 0, True, False)),
    ("sort", lambda: (_t(2, 3, 5), 2, True, True)),
    ("sort", lambda: (_t(), 0, False, False)),
    # Ties: both sides run torch.sort with stable=True on the same values, so the same index wins.
    ("sort", lambda: (_with_ties(3, 5), 1, True, True)),
]

CASES += aten_prim_cases.CASES

# aten::floor_divide has no derivative; torch.div(..., rounding_mode="floor") defines it as zero.
ZERO_GRAD = {"floor_divide"}
_PRIM_BY_NAME = {sym.name: sym for sym in prims.ALL_PRIMS.values()}


def _leaves(args: Any) -> list[torch.Tensor]:
    if isinstance(args, list | tuple):
        return [t for a in args for t in _leaves(a)]
    return [args] if isinstance(args, torch.Tensor) and args.dtype.is_floating_point else []


def _grads_match(name: str, args: tuple[Any, ...], dtype: torch.dtype, atol: float, rtol: float) -> None:
    prim = _PRIM_BY_NAME[name]
    eager = get_executor("torch").implementations[prim].fn

    def cast(x: Any) -> Any:
        if isinstance(x, list):
            return [cast(v) for v in x]
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            return x.to(dtype).requires_grad_()
        return x

    args = tuple(cast(a) for a in args)
    inputs = _leaves(args)
    torch.manual_seed(0)  # random prims (native_dropout) make the same draws in both runs
    expected = eager(*args)
    torch.manual_seed(0)
    got = minijit.jit(lambda *a: prim(*a))(*args)
    expected_t = expected if isinstance(expected, tuple) else (expected,)
    got_t = got if isinstance(got, tuple) else (got,)
    for e, g in zip(expected_t, got_t, strict=True):
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol)
    # Integer outputs (the indices of sort and topk) get no cotangent.
    expected_t = tuple(e for e in expected_t if e.dtype.is_floating_point)
    got_t = tuple(g for g in got_t if g.dtype.is_floating_point)
    cts = [torch.randn_like(e) for e in expected_t]
    if name in ZERO_GRAD:  # torch's own derivative of the op (div with a rounding mode) is zero
        want = tuple(torch.zeros_like(x) for x in inputs)
    else:
        want = torch.autograd.grad(expected_t, inputs, cts, allow_unused=True)
    have = torch.autograd.grad(got_t, inputs, cts, allow_unused=True)
    assert_same_grads(want, have, inputs, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("name", "make_args"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_prim_grad_float64(name: str, make_args: Callable[[], tuple[Any, ...]]) -> None:
    torch.manual_seed(0)
    _grads_match(name, make_args(), F64, atol=1e-10, rtol=1e-8)


FLOAT32_CASES = [c for c in CASES if c[0] in {"exp", "tanh", "mul", "div", "sum", "matmul", "var_mean", "slice",
                                               "broadcast_in_dim", "amax", "take", "prod", "topk", "sort",
                                               "slice_scatter", "digamma", "polygamma"}]


@pytest.mark.parametrize(("name", "make_args"), FLOAT32_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FLOAT32_CASES)])
def test_prim_grad_float32(name: str, make_args: Callable[[], tuple[Any, ...]]) -> None:
    torch.manual_seed(0)
    _grads_match(name, make_args(), torch.float32, atol=1e-4, rtol=1e-4)


# Prims that need no rule: their outputs are never differentiable, they take no tensor
# that could require grad, or they write in place (kept in the forward as side effects).
NOT_DIFFERENTIABLE = {
    "bitwise_not", "logical_not", "isfinite", "isnan", "isinf", "signbit", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_xor", "shape", "argmax", "argmin", "full", "iota", "copy_",
    "copy_to_out_", "detach",
    # Random numbers: fresh draws (a tensor argument only gives their size and layout) or the generator's
    # state, and the probabilities of bernoulli and multinomial, which must not require grad.
    "uniform", "normal", "random_integers", "exponential", "bernoulli", "randperm", "multinomial", "manual_seed",
    "seed", "initial_seed", "get_rng_state", "set_rng_state",
    # Recorded by backward rules only (eager has no derivative for the op): it has no output.
    "no_derivative",
    # Arithmetic on symbolic Python numbers: their outputs are numbers, not tensors.
    *(f"num_{op}" for op in prims.NUMBER_OPS),
    # A constant: it takes no tensor that could require grad.
    "tensor_constant",
    # Attention kernels that only the VJP rule of ltorch.scaled_dot_product_attention records,
    # in the forward and backward traces it builds; nothing differentiates those again.
    "sdpa_flash", "sdpa_flash_backward", "sdpa_cuda", "sdpa_cuda_backward", "native_dropout_backward",
    *aten_prim_cases.NOT_DIFFERENTIABLE,
}
# Prims whose rule refuses complex inputs (tested by the error test below) and has no real-input case torch runs.
REFUSES_COMPLEX = {"imag"}
# Prims whose gradient is tested against an eager program of their own below, not their torch impl.
TESTED_BELOW = {"no_grad_update"}


def test_every_differentiable_prim_has_a_rule() -> None:
    missing = [sym.id for name, sym in prims.ALL_PRIMS.items()
               if sym not in VJP_RULES and sym.name not in NOT_DIFFERENTIABLE]
    assert not missing, f"prims without a VJP rule: {missing}"
    tested = {name for name, _ in CASES} | REFUSES_COMPLEX | TESTED_BELOW | set(aten_prim_cases.TESTED_ELSEWHERE)
    untested = [sym.name for sym in prims.ALL_PRIMS.values() if sym in VJP_RULES and sym.name not in tested]
    assert not untested, f"prims with a rule but no gradient test: {untested}"


def test_prim_without_rule_is_an_error_naming_it() -> None:
    # A prim declared outside prims.ALL_PRIMS, so no rule can exist for it.
    no_rule = Symbol("twice_without_rule", lambda x: TensorProxy.like(x), namespace="prims", is_prim=True)
    x = torch.rand(3, dtype=F64, requires_grad=True)
    jf = minijit.jit(lambda x: no_rule(x))
    with pytest.raises(minijit.UnsupportedOpError, match=r"prims\.twice_without_rule"):
        jf(x)


@pytest.mark.parametrize("name", ["real", "imag"])
def test_complex_parts_refuse_complex_gradients(name: str) -> None:
    # The rules do not conjugate complex gradients, so a complex input that requires grad is refused.
    x = torch.randn(3, dtype=torch.complex128, requires_grad=True)
    jf = minijit.jit(lambda x: _PRIM_BY_NAME[name](x))
    with pytest.raises(minijit.UnsupportedOpError, match="complex"):
        jf(x)
    with torch.no_grad():
        torch.testing.assert_close(jf(x), getattr(torch, name)(x))


def test_polygamma_refuses_a_bad_order() -> None:
    x = torch.rand(3, dtype=F64) + 0.5
    with pytest.raises(minijit.MinijitError, match=r"prims\.polygamma: the order n must be a non-negative"):
        minijit.jit(lambda x: prims.polygamma(-1, x))(x)
    with pytest.raises(minijit.MinijitError, match=r"prims\.polygamma: needs a floating point tensor"):
        minijit.jit(lambda x: prims.polygamma(1, x))(torch.arange(3))


def test_no_grad_update_grads_match_an_in_place_write_under_no_grad() -> None:
    # Eager's meaning of the prim: `old`'s autograd identity, `new`'s values, no gradient to `new`.
    def eager(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        out = old * 1
        with torch.no_grad():
            out.copy_(new)
        return out

    old, new = _t(3, 4).requires_grad_(), _t(3, 4).requires_grad_()
    want = eager(old, new)
    have = minijit.jit(lambda a, b: prims.no_grad_update(a * 1, b))(old, new)
    torch.testing.assert_close(have, want)
    ct = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (old, new), ct, allow_unused=True)
    have_grads = torch.autograd.grad(have, (old, new), ct, allow_unused=True)
    assert_same_grads(want_grads, have_grads, [old, new])
