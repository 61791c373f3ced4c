"""Pooling: F.max_pool*, F.avg_pool*, F.adaptive_avg_pool*, F.adaptive_max_pool* (1-d, 2-d, 3-d).

Each op normalises its arguments as torch does and makes one call of a pooling prim
(minijit/ops/aten_prims.py), which runs torch's kernel. 1-d pooling is 2-d pooling
over a dim of size 1 inserted before the last, as aten computes it (so the indices
of max pooling are the same flat positions). Adaptive average pooling to size 1 is
a mean, as in torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import Symbol, TensorProxy
from minijit.ir.proxies import rule_compare
from minijit.ops import aten_prims
from minijit.ops.ltorch.conv import per_dim
from minijit.ops.ltorch.reductions import mean
from minijit.ops.registry import declare_op, ltorch_op
from minijit.ops.utils import fail, numel_of, reshape_to, tensor_argument, unsqueeze_at

F = torch.nn.functional
_nn = torch._C._nn


def _input(op: str, input: Any, n: int) -> TensorProxy:  # noqa: A002
    tensor_argument(op, input)
    if input.ndim not in (n + 1, n + 2):
        raise fail(op, f"expected a {n + 1}-d (unbatched) or {n + 2}-d (batched) input, got shape {tuple(input.shape)}")
    return input


def _lift(x: TensorProxy) -> TensorProxy:
    """(..., L) -> (..., 1, L): 1-d pooling as 2-d pooling."""
    return unsqueeze_at(x, (x.ndim - 1,))


def _drop(x: TensorProxy) -> TensorProxy:
    """(..., 1, L) -> (..., L)."""
    return reshape_to(x, (*x.shape[:-2], x.shape[-1]))


def _window(op: str, n: int, kernel_size: Any, stride: Any, padding: Any,
            dilation: Any = 1) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """Per-dim kernel, stride (the kernel where None or []), padding and dilation, lifted to 2-d for n == 1."""
    kernel = per_dim(op, kernel_size, n, "kernel_size")
    strides = kernel if stride is None or (isinstance(stride, Sequence) and len(stride) == 0) else \
        per_dim(op, stride, n, "stride")
    pads, dils = per_dim(op, padding, n, "padding"), per_dim(op, dilation, n, "dilation")
    if n == 1:
        return [1, *kernel], [1, *strides], [0, *pads], [1, *dils]
    return kernel, strides, pads, dils


# -- max pooling ---------------------------------------------------------------------------------

def _max_pool(op: str, n: int, input: TensorProxy, kernel_size: Any, stride: Any, padding: Any,  # noqa: A002
              dilation: Any, ceil_mode: bool) -> tuple[TensorProxy, TensorProxy]:
    x = _input(op, input, n)
    kernel, strides, pads, dils = _window(op, n, kernel_size, stride, padding, dilation)
    out, indices = aten_prims.max_pool(_lift(x) if n == 1 else x, kernel, strides, pads, dils, bool(ceil_mode))
    return (_drop(out), _drop(indices)) if n == 1 else (out, indices)


def _max_pool_ops(n: int) -> tuple[Symbol, Symbol]:
    """Declares F.max_pool{n}d and F.max_pool{n}d_with_indices."""
    name = f"max_pool{n}d"

    def max_pool(input: TensorProxy, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
                 dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        out, indices = _max_pool(name, n, input, kernel_size, stride, padding, dilation, ceil_mode)
        if return_indices:
            return out, indices
        if n == 1 and input.device.type == "cpu" and not (input.requires_grad and torch.is_grad_enabled()):
            # Without grad, the CPU's 1-d max pool is a kernel of its own that writes a contiguous output; with
            # grad it is the 2-d one with indices, whose output follows the input's layout, as this one's does.
            # Reshaped flat and back: a copy, contiguous, where that output is not.
            return reshape_to(reshape_to(out, (numel_of(out.shape),)), out.shape)
        return out

    def max_pool_with_indices(input: TensorProxy, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
                              dilation: Any = 1, ceil_mode: bool = False,
                              return_indices: bool = False) -> tuple[TensorProxy, TensorProxy]:
        return _max_pool(name, n, input, kernel_size, stride, padding, dilation, ceil_mode)

    op = declare_op(name, max_pool, f"F.{name}: window maxima (and their flat indices if asked for).",
                    torch_fns=[getattr(F, name), getattr(torch, name)])
    with_indices = [getattr(F, f"{name}_with_indices")]
    with_indices += [fn for fn in (getattr(torch, f"{name}_with_indices", None), getattr(_nn, f"{name}_with_indices", None))
                     if fn is not None]
    return op, declare_op(f"{name}_with_indices", max_pool_with_indices,
                          f"F.{name}_with_indices: window maxima and their flat spatial indices.", torch_fns=with_indices)


# -- average pooling ---------------------------------------------------------------------------------

def _avg_pool(op: str, n: int, input: TensorProxy, kernel_size: Any, stride: Any, padding: Any,  # noqa: A002
              ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> TensorProxy:
    x = _input(op, input, n)
    kernel, strides, pads, _ = _window(op, n, kernel_size, stride, padding)
    if divisor_override is not None and rule_compare(divisor_override, "==", 0):
        raise fail(op, "divisor_override must be non-zero")
    out = aten_prims.avg_pool(_lift(x) if n == 1 else x, kernel, strides, pads, bool(ceil_mode),
                              bool(count_include_pad), divisor_override)
    return _drop(out) if n == 1 else out


@ltorch_op(torch_fns=[torch.avg_pool1d, F.avg_pool1d])
def avg_pool1d(input: TensorProxy, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True) -> TensorProxy:
    """F.avg_pool1d: window means over the last dim."""
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@ltorch_op(torch_fns=[F.avg_pool2d])
def avg_pool2d(input: TensorProxy, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> TensorProxy:
    """F.avg_pool2d: window means over the last two dims."""
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@ltorch_op(torch_fns=[F.avg_pool3d])
def avg_pool3d(input: TensorProxy, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> TensorProxy:
    """F.avg_pool3d: window means over the last three dims."""
    return _avg_pool("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


# -- adaptive pooling ------------------------------------------------------------------------------------

def _output_size(op: str, x: TensorProxy, output_size: Any, n: int) -> list[Any]:
    """Per-dim output sizes; None keeps the input's size (as torch's _list_with_default)."""
    sizes = per_dim(op, output_size, n, "output_size")
    spatial = x.shape[x.ndim - n:]
    return [s if o is None else o for o, s in zip(sizes, spatial)]


def _adaptive_avg_pool_op(n: int, torch_fns: list[Any]) -> Symbol:
    """Declares F.adaptive_avg_pool{n}d, the torch functions `torch_fns` run as it."""
    name = f"adaptive_avg_pool{n}d"

    def adaptive_avg_pool(input: TensorProxy, output_size: Any) -> TensorProxy:  # noqa: A002
        x = _input(name, input, n)
        sizes = _output_size(name, x, output_size, n)
        if all(rule_compare(s, "==", 1) for s in sizes):
            return mean(x, tuple(range(x.ndim - n, x.ndim)), keepdim=True)
        if n == 1:
            return _drop(aten_prims.adaptive_avg_pool(_lift(x), [1, *sizes]))
        return aten_prims.adaptive_avg_pool(x, sizes)

    return declare_op(name, adaptive_avg_pool, f"F.{name}: means over windows splitting each of the last {n} dims "
                      "into output_size parts.", torch_fns=torch_fns)


def _adaptive_max_pool(op: str, n: int, input: TensorProxy, output_size: Any) -> tuple[TensorProxy, TensorProxy]:  # noqa: A002
    x = _input(op, input, n)
    sizes = _output_size(op, x, output_size, n)
    if n == 1:
        out, indices = aten_prims.adaptive_max_pool(_lift(x), [1, *sizes])
        return _drop(out), _drop(indices)
    return aten_prims.adaptive_max_pool(x, sizes)


def _adaptive_max_pool_ops(n: int) -> tuple[Symbol, Symbol]:
    """Declares F.adaptive_max_pool{n}d and F.adaptive_max_pool{n}d_with_indices."""
    name = f"adaptive_max_pool{n}d"

    def adaptive_max_pool(input: TensorProxy, output_size: Any, return_indices: bool = False) -> Any:  # noqa: A002
        out, indices = _adaptive_max_pool(name, n, input, output_size)
        return (out, indices) if return_indices else out

    def adaptive_max_pool_with_indices(input: TensorProxy, output_size: Any,  # noqa: A002
                                       return_indices: bool = False) -> tuple[TensorProxy, TensorProxy]:
        return _adaptive_max_pool(name, n, input, output_size)

    op = declare_op(name, adaptive_max_pool, f"F.{name}: window maxima (and their flat indices if asked for).",
                    torch_fns=[getattr(F, name)])
    with_indices = [getattr(F, f"{name}_with_indices"), getattr(_nn, name, None), getattr(torch, name, None)]
    return op, declare_op(f"{name}_with_indices", adaptive_max_pool_with_indices,
                          f"F.{name}_with_indices: window maxima and their flat spatial indices.",
                          torch_fns=[fn for fn in with_indices if fn is not None])


max_pool1d, max_pool1d_with_indices = _max_pool_ops(1)
adaptive_max_pool1d, adaptive_max_pool1d_with_indices = _adaptive_max_pool_ops(1)
max_pool2d, max_pool2d_with_indices = _max_pool_ops(2)
adaptive_max_pool2d, adaptive_max_pool2d_with_indices = _adaptive_max_pool_ops(2)
max_pool3d, max_pool3d_with_indices = _max_pool_ops(3)
adaptive_max_pool3d, adaptive_max_pool3d_with_indices = _adaptive_max_pool_ops(3)
adaptive_avg_pool1d = _adaptive_avg_pool_op(1, [torch.adaptive_avg_pool1d, F.adaptive_avg_pool1d])
adaptive_avg_pool2d = _adaptive_avg_pool_op(2, [F.adaptive_avg_pool2d, _nn.adaptive_avg_pool2d])
adaptive_avg_pool3d = _adaptive_avg_pool_op(3, [F.adaptive_avg_pool3d, _nn.adaptive_avg_pool3d])
