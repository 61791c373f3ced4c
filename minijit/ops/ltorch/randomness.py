"""Random ltorch ops: rand, randn, randint, randperm, bernoulli, normal, multinomial, the `*_like` ops,
the in-place fills (`uniform_`, `normal_`, `bernoulli_`, `exponential_`, `random_`) and dropout's mask.

Each decomposes into the random prims that make eager's draws (`torch.rand(size)` is
`torch.empty(size).uniform_(0, 1)`, `torch.rand_like(x)` is `torch.empty_like(x).uniform_(0, 1)`),
from torch's default generator, in the order the user's code calls them: a seeded run
matches eager bit for bit and leaves the generator where eager leaves it. All declare the
RANDOM effect (`Effects.random`): no pass merges, reorders or drops them. An explicit `generator=` is
passed on to the prims, which draw from it as eager does (the generator is a constant of the trace, so the
cache entry is for that generator object: another one is a new trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import Effects, TensorProxy
from minijit.ops import prims
from minijit.ops.ltorch.creation import _check_options, _device
from minijit.ops.ltorch.inplace import write_into
from minijit.ops.registry import ltorch_op
from minijit.ops.utils import broadcast_shapes, expand_to, fail, parse_shape, tensor_argument, unsupported

RANDOM = prims.RANDOM
INPLACE_RANDOM = Effects(writes=(0,), random=True)  # draws into its first argument


def _float_dtype(op: str, dtype: torch.dtype | None, default: torch.dtype) -> torch.dtype:
    dtype = dtype or default
    if not dtype.is_floating_point:
        error = fail(op, f"needs a floating point dtype, got {dtype}")
        # Eager's kernels have no such dtype: "normal_kernel_cpu" not implemented for 'Long'.
        error.eager_raised = NotImplementedError  # type: ignore[attr-defined]
        raise error
    return dtype


def _like(op: str, input: TensorProxy, memory_format: Any) -> Any:  # noqa: A002
    """What a `*_like` op's result takes its layout from: input itself (eager's preserve_format) or its size."""
    if memory_format is None or memory_format == torch.preserve_format:
        return tensor_argument(op, input)
    if memory_format == torch.contiguous_format:
        return tuple(tensor_argument(op, input).shape)
    raise fail(op, f"memory_format={memory_format} is not supported")


def _drawn_from(generator: Any) -> dict[str, Any]:
    """The `generator=` a random prim takes: none for torch's default generator (the trace prints no keyword)."""
    return {} if generator is None else {"generator": generator}


def _not_requiring_grad(op: str, *tensors: Any) -> None:
    for t in tensors:
        if isinstance(t, TensorProxy) and t.requires_grad:
            # Declined: the call runs as the opaque torch op, whose gradient is torch's own (zero).
            raise unsupported(op, f"an argument requires grad; eager gives it a zero gradient through {op}, which "
                                  "the decomposition does not reproduce: pass it detached (the gradient is zero anyway)")


# -- fresh tensors -------------------------------------------------------------------------------------

@ltorch_op(torch_fns=[torch.rand], effects=RANDOM)
def rand(*size: Any, generator: Any = None, out: Any = None, dtype: torch.dtype | None = None, layout: Any = None,
         device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> TensorProxy:
    """torch.rand(*size): uniform samples in [0, 1)."""
    _check_options("rand", requires_grad, out, layout)
    dtype = _float_dtype("rand", dtype, torch.get_default_dtype())
    return prims.uniform(parse_shape("rand", size), 0.0, 1.0, dtype=dtype, device=_device(device), **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.randn], effects=RANDOM)
def randn(*size: Any, generator: Any = None, out: Any = None, dtype: torch.dtype | None = None, layout: Any = None,
          device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> TensorProxy:
    """torch.randn(*size): standard normal samples."""
    _check_options("randn", requires_grad, out, layout)
    dtype = _float_dtype("randn", dtype, torch.get_default_dtype())
    return prims.normal(parse_shape("randn", size), 0.0, 1.0, dtype=dtype, device=_device(device), **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.rand_like], effects=RANDOM)
def rand_like(input: TensorProxy, *, dtype: torch.dtype | None = None, layout: Any = None,  # noqa: A002
              device: Any = None, pin_memory: bool = False, requires_grad: bool = False,
              memory_format: Any = None, generator: Any = None) -> TensorProxy:
    """torch.rand_like: uniform samples in [0, 1) shaped (and laid out) like input."""
    _check_options("rand_like", requires_grad, None, layout)
    dtype = _float_dtype("rand_like", dtype, tensor_argument("rand_like", input).dtype)
    return prims.uniform(_like("rand_like", input, memory_format), 0.0, 1.0, dtype=dtype,
                         device=_device(device, input.device), **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.randn_like], effects=RANDOM)
def randn_like(input: TensorProxy, *, dtype: torch.dtype | None = None, layout: Any = None,  # noqa: A002
               device: Any = None, pin_memory: bool = False, requires_grad: bool = False,
               memory_format: Any = None, generator: Any = None) -> TensorProxy:
    """torch.randn_like: standard normal samples shaped (and laid out) like input."""
    _check_options("randn_like", requires_grad, None, layout)
    dtype = _float_dtype("randn_like", dtype, tensor_argument("randn_like", input).dtype)
    return prims.normal(_like("randn_like", input, memory_format), 0.0, 1.0, dtype=dtype,
                        device=_device(device, input.device), **_drawn_from(generator))


def _bounds(op: str, args: Sequence[Any], low: Any, high: Any) -> tuple[Any, Any, list[Any]]:
    """(low, high, rest) from randint's call forms `(high, ...)` and `(low, high, ...)`."""
    rest = list(args)
    if high is None:
        if not rest:
            raise fail(op, "missing the upper bound `high`")
        if len(rest) >= 2 and not isinstance(rest[1], tuple | list | torch.Size):
            low, high, rest = rest[0], rest[1], rest[2:]
        else:
            high, rest = rest[0], rest[1:]
    for bound in (low, high):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise fail(op, f"the bounds must be Python ints, got {bound!r}")
    return (0 if low is None else low), high, rest


@ltorch_op(torch_fns=[torch.randint], effects=RANDOM)
def randint(*args: Any, low: Any = None, high: Any = None, size: Any = None, generator: Any = None, out: Any = None,
            dtype: torch.dtype | None = None, layout: Any = None, device: Any = None, pin_memory: bool = False,
            requires_grad: bool = False) -> TensorProxy:
    """torch.randint(high, size) or (low, high, size): integers drawn uniformly from [low, high)."""
    _check_options("randint", requires_grad, out, layout)
    low, high, rest = _bounds("randint", args, low, high)
    if size is None:
        if len(rest) != 1:
            raise fail("randint", "expects (high, size) or (low, high, size)")
        size = rest[0]
    return prims.random_integers(parse_shape("randint", (size,)), low, high, dtype=dtype or torch.int64,
                                  device=_device(device), **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.randint_like], effects=RANDOM)
def randint_like(input: TensorProxy, *args: Any, low: Any = None, high: Any = None,  # noqa: A002
                 dtype: torch.dtype | None = None, layout: Any = None, device: Any = None, pin_memory: bool = False,
                 requires_grad: bool = False, memory_format: Any = None, generator: Any = None) -> TensorProxy:
    """torch.randint_like(input, high) or (input, low, high): integers in [low, high) shaped like input."""
    _check_options("randint_like", requires_grad, None, layout)
    low, high, rest = _bounds("randint_like", args, low, high)
    if rest:
        raise fail("randint_like", f"unexpected arguments {tuple(rest)!r}")
    return prims.random_integers(_like("randint_like", input, memory_format), low, high,
                                  dtype=dtype or input.dtype, device=_device(device, input.device), **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.randperm], effects=RANDOM)
def randperm(n: int, *, generator: Any = None, out: Any = None, dtype: torch.dtype = torch.int64, layout: Any = None,
             device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> TensorProxy:
    """torch.randperm(n): a random permutation of 0 .. n-1."""
    _check_options("randperm", requires_grad, out, layout)
    return prims.randperm(n, dtype=dtype, device=_device(device), **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.bernoulli, torch.Tensor.bernoulli], methods=["bernoulli"], effects=RANDOM)
def bernoulli(input: TensorProxy, p: Any = None, *, generator: Any = None, out: Any = None) -> TensorProxy:  # noqa: A002
    """torch.bernoulli(probs): 1 with each element's probability; with a number p, 1 with probability p."""
    _check_options("bernoulli", False, out, None)
    tensor_argument("bernoulli", input)
    _not_requiring_grad("bernoulli", input, p)
    # Eager draws into a contiguous tensor here (not one laid out like input).
    return prims.bernoulli(tuple(input.shape), input if p is None else p, dtype=input.dtype, device=input.device,
                           **_drawn_from(generator))


@ltorch_op(torch_fns=[torch.normal], effects=RANDOM)
def normal(mean: Any = 0.0, std: Any = 1.0, size: Any = None, *, generator: Any = None, out: Any = None,
           dtype: torch.dtype | None = None, layout: Any = None, device: Any = None, pin_memory: bool = False,
           requires_grad: bool = False) -> TensorProxy:
    """torch.normal: samples of N(mean, std), with mean and std numbers (and a size) or tensors.

    With tensors eager draws N(0, 1) (N(0, std) for a number std), then scales and shifts.
    """
    _check_options("normal", requires_grad, out, layout)
    tensors = [t for t in (mean, std) if isinstance(t, TensorProxy)]
    if not tensors:
        if size is None:
            raise fail("normal", "with a number mean and std, give a size")
        return prims.normal(parse_shape("normal", (size,)), mean, std,
                            dtype=_float_dtype("normal", dtype, torch.get_default_dtype()), device=_device(device),
                            **_drawn_from(generator))
    _not_requiring_grad("normal", mean, std)
    if size is not None or len({t.dtype for t in tensors}) > 1:
        raise fail("normal", "with tensor arguments, give no size, and a mean and std of one dtype")
    like = tensors[0]
    shape = broadcast_shapes(*(t.shape for t in tensors))
    if not isinstance(std, TensorProxy):
        noise = prims.normal(shape, 0.0, std, dtype=like.dtype, device=like.device, **_drawn_from(generator))
        return prims.add(noise, expand_to(mean, shape))
    noise = prims.normal(shape, 0.0, 1.0, dtype=like.dtype, device=like.device, **_drawn_from(generator))
    scaled = prims.mul(noise, expand_to(std, shape))
    return prims.add(scaled, expand_to(mean, shape) if isinstance(mean, TensorProxy) else mean)


@ltorch_op(torch_fns=[torch.multinomial, torch.Tensor.multinomial], methods=["multinomial"], effects=RANDOM)
def multinomial(input: TensorProxy, num_samples: int, replacement: bool = False, *,  # noqa: A002
                generator: Any = None, out: Any = None) -> TensorProxy:
    """torch.multinomial: indices drawn from the categories of each row of input, by weight."""
    _check_options("multinomial", False, out, None)
    _not_requiring_grad("multinomial", input)
    return prims.multinomial(tensor_argument("multinomial", input), num_samples, replacement, **_drawn_from(generator))


# -- in-place fills ----------------------------------------------------------------------------------------

def _fill(op: str, a: TensorProxy, value: TensorProxy) -> TensorProxy:
    return write_into(a, value, op)


@ltorch_op("uniform_", torch_fns=[torch.Tensor.uniform_], methods=["uniform_"], effects=INPLACE_RANDOM)
def uniform_(a: TensorProxy, from_: float = 0.0, to: float = 1.0, *, generator: Any = None) -> TensorProxy:
    """Tensor.uniform_: fills a with uniform samples in [from, to)."""
    return _fill("uniform_", a, prims.uniform(tensor_argument("uniform_", a), from_, to, dtype=a.dtype, **_drawn_from(generator)))


@ltorch_op("normal_", torch_fns=[torch.Tensor.normal_], methods=["normal_"], effects=INPLACE_RANDOM)
def normal_(a: TensorProxy, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> TensorProxy:
    """Tensor.normal_: fills a with samples of N(mean, std)."""
    return _fill("normal_", a, prims.normal(tensor_argument("normal_", a), mean, std, dtype=a.dtype, **_drawn_from(generator)))


@ltorch_op("bernoulli_", torch_fns=[torch.Tensor.bernoulli_], methods=["bernoulli_"], effects=INPLACE_RANDOM)
def bernoulli_(a: TensorProxy, p: Any = 0.5, *, generator: Any = None) -> TensorProxy:
    """Tensor.bernoulli_: fills a with 1 with probability p (a number or a tensor of probabilities), else 0."""
    _not_requiring_grad("bernoulli_", p)
    if isinstance(p, TensorProxy):
        p = expand_to(p, a.shape)
    return _fill("bernoulli_", a, prims.bernoulli(tensor_argument("bernoulli_", a), p, dtype=a.dtype, **_drawn_from(generator)))


@ltorch_op("exponential_", torch_fns=[torch.Tensor.exponential_], methods=["exponential_"], effects=INPLACE_RANDOM)
def exponential_(a: TensorProxy, lambd: float = 1.0, *, generator: Any = None) -> TensorProxy:
    """Tensor.exponential_: fills a with samples of the exponential distribution of rate lambd."""
    return _fill("exponential_", a, prims.exponential(tensor_argument("exponential_", a), lambd, dtype=a.dtype,
                                                      **_drawn_from(generator)))


@ltorch_op("random_", torch_fns=[torch.Tensor.random_], methods=["random_"], effects=INPLACE_RANDOM)
def random_(a: TensorProxy, *args: Any, generator: Any = None, **bounds: Any) -> TensorProxy:
    """Tensor.random_(), random_(to), random_(from, to): fills a with integers drawn uniformly."""
    values = list(args) + [bounds.pop(k) for k in ("from", "to") if k in bounds]
    if bounds or len(values) > 2:
        raise fail("random_", f"expects random_(), random_(to) or random_(from, to), got {args!r} {bounds!r}")
    # random_() and random_(0, None) draw differently for some dtypes: keep the call's form.
    low, high = (None, None) if not values else (0, values[0]) if len(values) == 1 else values
    return _fill("random_", a, prims.random_integers(tensor_argument("random_", a), low, high, dtype=a.dtype,
                                                     **_drawn_from(generator)))


# -- dropout -------------------------------------------------------------------------------------------

def dropout_mask_scale(x: TensorProxy, p: float) -> TensorProxy:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p), drawn as eager does.

    On CUDA eager runs the fused `native_dropout`; elsewhere it scales a Bernoulli mask made like x:
    `noise = empty_like(x).bernoulli_(1 - p); noise.div_(1 - p); x * noise`, whose backward multiplies
    by the same noise (saved, never drawn again).
    """
    if x.device.type == "cuda":
        return prims.native_dropout(x, p)[0]
    noise = prims.div(prims.bernoulli(x, 1 - p, dtype=x.dtype), 1 - p)
    return prims.mul(x, noise)
