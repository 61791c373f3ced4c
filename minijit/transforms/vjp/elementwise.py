"""VJP rules of the elementwise prims: unary math (and polygamma), real/imag, binary math, where, lerp, dropout.

Elementwise prims take operands of one shape and dtype (numbers allowed), so the
gradients need no broadcasting or casting. Bool-valued prims (comparisons,
isnan, ...) need no rule: their outputs are not differentiable, which makes
them constant for VJP. Gradients of complex tensors are not supported: the rules
do not conjugate, so `real` and `imag`, where a complex input meets the real
world, refuse complex inputs with a clear error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from minijit.errors import UnsupportedOpError
from minijit.ir import TensorProxy
from minijit.ir.context import where_now
from minijit.ops import aten_prims, prims
from minijit.ops.registry import ALL_LTORCH
from minijit.transforms.vjp.registry import VjpRule, is_tensor, vjp, zeros_like

P = prims
Derivative = Callable[[TensorProxy, TensorProxy], Any]


def _unary(prim: Any, derivative: Derivative | None) -> None:
    """Register `prim(x)` whose gradient is `g * derivative(x, out)` (None: zero gradient)."""

    @vjp(prim)
    def forward(x: TensorProxy) -> tuple[TensorProxy, tuple[Any, ...]]:
        out = prim(x)
        return out, (x, out)

    @forward.backward
    def backward(saved: tuple[Any, ...], g: TensorProxy) -> tuple[TensorProxy]:
        x, out = saved
        if derivative is None:  # piecewise constant: torch's gradient is zero everywhere
            return (zeros_like(x),)
        return (P.mul(g, derivative(x, out)),)


def _one_minus_square(x: TensorProxy) -> TensorProxy:
    return P.sub(1, P.mul(x, x))


_UNARY_DERIVATIVES: dict[str, Derivative | None] = {
    "abs": lambda x, out: P.sign(x),
    "exp": lambda x, out: out,
    "exp2": lambda x, out: P.mul(out, math.log(2.0)),
    "expm1": lambda x, out: P.add(out, 1),
    "log": lambda x, out: P.reciprocal(x),
    "log1p": lambda x, out: P.reciprocal(P.add(x, 1)),
    "log2": lambda x, out: P.reciprocal(P.mul(x, math.log(2.0))),
    "log10": lambda x, out: P.reciprocal(P.mul(x, math.log(10.0))),
    "sin": lambda x, out: P.cos(x),
    "cos": lambda x, out: P.neg(P.sin(x)),
    "tan": lambda x, out: P.add(P.mul(out, out), 1),
    "asin": lambda x, out: P.rsqrt(_one_minus_square(x)),
    "acos": lambda x, out: P.neg(P.rsqrt(_one_minus_square(x))),
    "atan": lambda x, out: P.reciprocal(P.add(P.mul(x, x), 1)),
    "sinh": lambda x, out: P.cosh(x),
    "cosh": lambda x, out: P.sinh(x),
    "tanh": lambda x, out: _one_minus_square(out),
    "asinh": lambda x, out: P.rsqrt(P.add(P.mul(x, x), 1)),
    "acosh": lambda x, out: P.rsqrt(P.sub(P.mul(x, x), 1)),
    "atanh": lambda x, out: P.reciprocal(_one_minus_square(x)),
    "sqrt": lambda x, out: P.div(0.5, out),
    "rsqrt": lambda x, out: P.mul(P.mul(P.mul(out, out), out), -0.5),
    "reciprocal": lambda x, out: P.neg(P.mul(out, out)),
    "erf": lambda x, out: P.mul(P.exp(P.neg(P.mul(x, x))), 2 / math.sqrt(math.pi)),
    "erfc": lambda x, out: P.mul(P.exp(P.neg(P.mul(x, x))), -2 / math.sqrt(math.pi)),
    "erfinv": lambda x, out: P.mul(P.exp(P.mul(out, out)), math.sqrt(math.pi) / 2),
    "lgamma": lambda x, out: P.digamma(x),
    "digamma": lambda x, out: P.polygamma(1, x),
    "floor": None, "ceil": None, "round": None, "trunc": None, "sign": None,
}

for _name, _derivative in _UNARY_DERIVATIVES.items():
    _unary(getattr(prims, _name), _derivative)


@vjp(prims.neg)
def neg_fwd(x: TensorProxy) -> tuple[TensorProxy, tuple[()]]:
    return prims.neg(x), ()


@neg_fwd.backward
def neg_bwd(saved: tuple[()], g: TensorProxy) -> tuple[TensorProxy]:
    return (prims.neg(g),)


@vjp(prims.polygamma)
def polygamma_fwd(n: int, x: TensorProxy) -> tuple[TensorProxy, tuple[Any, ...]]:
    return prims.polygamma(n, x), (n, x)


@polygamma_fwd.backward
def polygamma_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    n, x = saved
    return (None, P.mul(g, P.polygamma(n + 1, x)))


def _complex_part(prim: Any, is_real_part: bool) -> None:
    """real/imag: exact for real inputs; refused for complex ones, whose gradients the rules do not support."""

    @vjp(prim)
    def forward(x: TensorProxy) -> Any:
        if x.dtype.is_complex:
            # The other rules do not conjugate (mul's gradient is g * b, not g * conj(b)), so a
            # complex gradient would be wrong: refuse rather than answer silently wrong.
            raise UnsupportedOpError(
                f"cannot differentiate {prim.id}{where_now()}: gradients of complex tensors are not supported; "
                "compute it under torch.no_grad(), or work on the real and imaginary parts as real tensors"
            )
        return prim(x), ()

    @forward.backward
    def backward(saved: tuple[Any, ...], g: TensorProxy) -> tuple[TensorProxy]:
        return (g if is_real_part else zeros_like(g),)


_complex_part(prims.real, is_real_part=True)
_complex_part(prims.imag, is_real_part=False)


# -- binary ------------------------------------------------------------------------

def _tensor_grads(args: tuple[Any, ...], grads: tuple[Callable[[], Any], ...]) -> tuple[Any, ...]:
    """Evaluate the gradient of each tensor argument lazily; numbers get None."""
    return tuple(make() if is_tensor(a) else None for a, make in zip(args, grads, strict=True))


def _binary(prim: Any, keep_output: bool = False) -> VjpRule:
    """Register the forward of the binary `prim`, saving its operands (and output); set `.backward` on the result."""

    @vjp(prim)
    def forward(a: Any, b: Any) -> tuple[TensorProxy, tuple[Any, ...]]:
        out = prim(a, b)
        return out, ((a, b, out) if keep_output else (a, b))

    return forward


add_fwd = _binary(prims.add)


@add_fwd.backward
def add_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    return _tensor_grads(saved, (lambda: g, lambda: g))


sub_fwd = _binary(prims.sub)


@sub_fwd.backward
def sub_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    return _tensor_grads(saved, (lambda: g, lambda: P.neg(g)))


mul_fwd = _binary(prims.mul)


@mul_fwd.backward
def mul_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    a, b = saved
    if a is b and is_tensor(a):  # x * x (x ** 2 decomposed): one gradient, 2 * x * g, rather than two to add
        return P.mul(P.mul(g, a), 2), None
    return _tensor_grads(saved, (lambda: P.mul(g, b), lambda: P.mul(g, a)))


div_fwd = _binary(prims.div, keep_output=True)


@div_fwd.backward
def div_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    a, b, out = saved
    return _tensor_grads((a, b), (lambda: P.div(g, b), lambda: P.neg(P.div(P.mul(g, out), b))))


pow_fwd = _binary(prims.pow, keep_output=True)


@pow_fwd.backward
def pow_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    a, b, out = saved

    def grad_base() -> TensorProxy:
        # d/da a**b = b * a**(b-1); torch defines it as 0 where b == 0 (even at a == 0).
        d = P.mul(b, P.pow(a, P.sub(b, 1) if is_tensor(b) else b - 1))
        if is_tensor(b):
            d = P.where(P.eq(b, 0), zeros_like(d), d)
        elif b == 0:
            d = zeros_like(d)
        return P.mul(g, d)

    def grad_exponent() -> TensorProxy:
        # d/db a**b = a**b * log(a); 0 where a == 0 and b >= 0, as torch does.
        # a number base's log as eager's Scalar log: -inf at 0 (0 ** b for b < 0 is inf: the gradient -inf), nan below
        d = P.mul(out, P.log(a) if is_tensor(a) else math.log(a) if a > 0 else -math.inf if a == 0 else math.nan)
        if is_tensor(a):
            d = P.where(P.logical_and(P.eq(a, 0), P.ge(b, 0)), zeros_like(d), d)
        elif a == 0:
            d = P.where(P.ge(b, 0), zeros_like(d), d)
        return P.mul(g, d)

    return _tensor_grads((a, b), (grad_base, grad_exponent))


def _min_max(prim: Any, wins: Any) -> None:
    """maximum/minimum: the gradient goes to the winning operand, split evenly on ties."""

    @_binary(prim).backward
    def backward(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
        a, b = saved
        half = P.mul(g, 0.5)
        zero = zeros_like(g)

        def share(x: Any, y: Any) -> TensorProxy:
            return P.where(wins(x, y), g, P.where(P.eq(x, y), half, zero))

        return _tensor_grads(saved, (lambda: share(a, b), lambda: share(b, a)))


_min_max(prims.maximum, P.gt)
_min_max(prims.minimum, P.lt)


atan2_fwd = _binary(prims.atan2)


@atan2_fwd.backward
def atan2_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    a, b = saved
    scale = P.div(g, P.add(P.mul(a, a) if is_tensor(a) else a * a, P.mul(b, b) if is_tensor(b) else b * b))
    return _tensor_grads(saved, (lambda: P.mul(scale, b), lambda: P.neg(P.mul(scale, a))))


copysign_fwd = _binary(prims.copysign, keep_output=True)


@copysign_fwd.backward
def copysign_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    a, b, out = saved

    def grad_a() -> TensorProxy:
        ratio = P.div(out, a)  # +1 or -1; torch gives 0 where a == 0
        return P.where(P.eq(a, 0), zeros_like(g), P.mul(g, ratio))

    return _tensor_grads((a, b), (grad_a, lambda: zeros_like(b)))


def _rounded_quotient(prim: Any, rounding: Any) -> None:
    """remainder/fmod: a - rounding(a / b) * b, so d/da = 1 and d/db = -rounding(a / b)."""

    @_binary(prim).backward
    def backward(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
        a, b = saved
        return _tensor_grads(saved, (lambda: g, lambda: P.neg(P.mul(g, rounding(P.div(a, b))))))


_rounded_quotient(prims.remainder, P.floor)
_rounded_quotient(prims.fmod, P.trunc)


floor_divide_fwd = _binary(prims.floor_divide)


@floor_divide_fwd.backward
def floor_divide_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    return tuple(zeros_like(x) if is_tensor(x) else None for x in saved)


@vjp("ltorch.floor_divide")
def ltorch_floor_divide_fwd(a: Any, b: Any) -> tuple[TensorProxy, tuple[Any, ...]]:
    return ALL_LTORCH["floor_divide"](a, b), (a, b)


@ltorch_floor_divide_fwd.backward
def ltorch_floor_divide_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    # Eager has no derivative for torch.floor_divide (`//`): its backward raises where it reaches the op, while
    # div(rounding_mode='floor'), the same prim, has a zero gradient.
    aten_prims.no_derivative(g, "floor_divide")
    return tuple(zeros_like(x) if is_tensor(x) else None for x in saved)


# -- ternary -------------------------------------------------------------------------

@vjp(prims.where)
def where_fwd(pred: TensorProxy, a: Any, b: Any) -> tuple[TensorProxy, tuple[Any, ...]]:
    return prims.where(pred, a, b), (pred, a, b)


@where_fwd.backward
def where_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    pred, a, b = saved
    zero = zeros_like(g)
    grads = _tensor_grads((a, b), (lambda: P.where(pred, g, zero), lambda: P.where(pred, zero, g)))
    return (None, *grads)


@vjp(prims.lerp)
def lerp_fwd(start: Any, end: Any, weight: Any) -> tuple[TensorProxy, tuple[Any, ...]]:
    return prims.lerp(start, end, weight), (start, end, weight)


@lerp_fwd.backward
def lerp_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    start, end, weight = saved
    return _tensor_grads(saved, (
        lambda: P.mul(g, P.sub(1, weight) if is_tensor(weight) else 1 - weight),
        lambda: P.mul(g, weight),
        lambda: P.mul(g, P.sub(end, start)),
    ))


# -- dropout ---------------------------------------------------------------------------

@vjp(prims.native_dropout)
def native_dropout_fwd(x: TensorProxy, p: float) -> tuple[Any, tuple[Any, ...]]:
    out, mask = prims.native_dropout(x, p)
    return (out, mask), (mask, 1.0 / (1.0 - p))


@native_dropout_fwd.backward
def native_dropout_bwd(saved: tuple[Any, ...], g: TensorProxy | None, g_mask: Any = None) -> tuple[Any, ...]:
    # The forward's mask, saved: the backward never draws again.
    mask, scale = saved
    return P.native_dropout_backward(g, mask, scale), None


# -- norms of order 0 ----------------------------------------------------------------------------------------------
# The count of nonzero elements: eager's result requires grad, but its backward gives no gradient (`x.grad` stays
# None where nothing else reaches x); the decomposition's cast to bool would make the result constant.

def _order_zero(order: Any) -> bool:
    return isinstance(order, int | float) and not isinstance(order, bool) and order == 0


@vjp("ltorch.vector_norm")
def vector_norm_fwd(x: TensorProxy, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                    dtype: Any = None) -> Any:
    if not _order_zero(ord):
        return NotImplemented
    return ALL_LTORCH["vector_norm"](x, ord, dim, keepdim, dtype=dtype), ()


@vector_norm_fwd.backward
def vector_norm_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    return None, None, None, None


@vjp("ltorch.norm")
def norm_fwd(input: TensorProxy, p: Any = "fro", dim: Any = None, keepdim: bool = False,  # noqa: A002
             dtype: Any = None) -> Any:
    if not _order_zero(p):
        return NotImplemented
    return ALL_LTORCH["norm"](input, p, dim, keepdim, dtype), ()


@norm_fwd.backward
def norm_bwd(saved: tuple[Any, ...], g: TensorProxy) -> tuple[Any, ...]:
    return None, None, None, None, None
