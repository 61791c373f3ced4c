"""VJP rules of the prims that run one aten kernel (minijit/ops/aten_prims.py), and of eval-mode batch norm.

The backward of each is torch's own backward kernel where torch has one
(`convolution_backward`, `avg_pool_backward`, `upsample_backward`,
`batch_norm_backward`); max pooling scatters the gradient to the positions of the
maxima with one `scatter_add`. Backward kernels are asked only for the gradients
whose inputs require grad (their `output_mask`), as eager autograd does.
"""

from __future__ import annotations

import math
from typing import Any

from minijit.errors import UnsupportedOpError
from minijit.ir import TensorProxy
from minijit.ir.context import where_now
from minijit.ir.proxies import rule_compare
from minijit.ops import aten_prims as A
from minijit.ops import prims as P
from minijit.ops.registry import ALL_LTORCH
from minijit.ops.utils import numel_of
from minijit.transforms.vjp.registry import cast_like, compute_dtype, matrix_transpose, vjp

Saved = tuple[Any, ...]


def _needs(x: Any) -> bool:
    """Whether x is a tensor that may receive a gradient."""
    return isinstance(x, TensorProxy) and x.requires_grad


# -- convolution ------------------------------------------------------------------------------------

@vjp(A.convolution)
def convolution_fwd(input: TensorProxy, weight: TensorProxy, bias: Any, stride: Any, padding: Any,  # noqa: A002
                    dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
    out = A.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    bias_sizes = list(bias.shape) if isinstance(bias, TensorProxy) else None
    mask = [_needs(input), _needs(weight), _needs(bias)]
    return out, (input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask)


@convolution_fwd.backward
def convolution_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask = saved  # noqa: A001
    gi, gw, gb = A.convolution_backward(g, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                        output_padding, groups, mask)
    return gi, gw, gb


# -- pooling ------------------------------------------------------------------------------------------

def scatter_to_maxima(g: TensorProxy, x: TensorProxy, indices: TensorProxy, spatial: int) -> TensorProxy:
    """The gradient of x for a max pool whose maxima sit at `indices` (flat over x's last `spatial` dims)."""
    lead = tuple(x.shape[: x.ndim - spatial])
    plane = math.prod(x.shape[x.ndim - spatial:])
    windows = math.prod(g.shape[g.ndim - spatial:])
    dtype = compute_dtype(g.dtype)
    flat_g = P.reshape(g if g.dtype == dtype else P.convert_element_type(g, dtype), (*lead, windows))
    flat_i = P.reshape(indices, (*lead, windows))
    zeros = P.full((*lead, plane), 0, dtype=dtype, device=g.device)
    return cast_like(P.reshape(P.scatter_add(zeros, flat_i, flat_g, len(lead)), tuple(x.shape)), x)


@vjp(A.max_pool)
def max_pool_fwd(input: TensorProxy, kernel_size: Any, stride: Any, padding: Any, dilation: Any,  # noqa: A002
                 ceil_mode: bool) -> Any:
    out, indices = A.max_pool(input, kernel_size, stride, padding, dilation, ceil_mode)
    return (out, indices), (input, indices, len(kernel_size))


@max_pool_fwd.backward
def max_pool_bwd(saved: Saved, g: Any, _g_indices: Any = None) -> tuple[Any, ...]:
    x, indices, spatial = saved
    return (scatter_to_maxima(g, x, indices, spatial),)


@vjp(A.adaptive_max_pool)
def adaptive_max_pool_fwd(input: TensorProxy, output_size: Any) -> Any:  # noqa: A002
    out, indices = A.adaptive_max_pool(input, output_size)
    return (out, indices), (input, indices, len(output_size))


adaptive_max_pool_fwd.backward(max_pool_bwd)  # saves what max_pool saves


@vjp(A.avg_pool)
def avg_pool_fwd(input: TensorProxy, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,  # noqa: A002
                 count_include_pad: bool, divisor_override: Any) -> Any:
    out = A.avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return out, (input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@avg_pool_fwd.backward
def avg_pool_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, *params = saved
    return (A.avg_pool_backward(g, x, *params),)


@vjp(A.adaptive_avg_pool)
def adaptive_avg_pool_fwd(input: TensorProxy, output_size: Any) -> Any:  # noqa: A002
    return A.adaptive_avg_pool(input, output_size), (input, len(output_size))


@adaptive_avg_pool_fwd.backward
def adaptive_avg_pool_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, dims = saved
    return (A.adaptive_avg_pool_backward(g, x, dims),)


# -- upsampling -----------------------------------------------------------------------------------------

@vjp(A.upsample)
def upsample_fwd(input: TensorProxy, mode: str, output_size: Any, align_corners: Any, scales: Any) -> Any:  # noqa: A002
    out = A.upsample(input, mode, output_size, align_corners, scales)
    return out, (input, mode, output_size, list(input.shape), align_corners, scales)


@upsample_fwd.backward
def upsample_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, mode, output_size, input_size, align_corners, scales = saved
    return (cast_like(A.upsample_backward(g, mode, output_size, input_size, align_corners, scales), x),)


# -- batch normalization ---------------------------------------------------------------------------------

def _batch_norm_grads(g: Any, x: TensorProxy, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                      save_mean: Any, save_invstd: Any, train: bool, eps: Any) -> tuple[Any, Any, Any]:
    if g is None:
        return None, None, None
    mask = [_needs(x), _needs(weight), _needs(bias)]
    return A.batch_norm_backward(g, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask)


@vjp(A.batch_norm_training)
def batch_norm_training_fwd(input: TensorProxy, weight: Any, bias: Any, running_mean: TensorProxy,  # noqa: A002
                            running_var: TensorProxy, training: bool, momentum: Any, eps: Any) -> Any:
    outs = A.batch_norm_training(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return outs, (input, weight, bias, outs[1], outs[2], eps)


@batch_norm_training_fwd.backward
def batch_norm_training_bwd(saved: Saved, g: Any, *_running: Any) -> tuple[Any, ...]:
    # The new running statistics get no gradient: eager updates them outside autograd.
    x, weight, bias, save_mean, save_invstd, eps = saved
    return _batch_norm_grads(g, x, weight, bias, None, None, save_mean, save_invstd, True, eps)


@vjp(A.batch_norm_no_stats)
def batch_norm_no_stats_fwd(input: TensorProxy, weight: Any, bias: Any, training: bool, momentum: Any,  # noqa: A002
                            eps: Any) -> Any:
    outs = A.batch_norm_no_stats(input, weight, bias, training, momentum, eps)
    return outs, (input, weight, bias, outs[1], outs[2], eps)


batch_norm_no_stats_fwd.backward(batch_norm_training_bwd)  # saves what batch_norm_training saves


@vjp("ltorch.batch_norm")
def batch_norm_fwd(input: TensorProxy, running_mean: Any, running_var: Any, weight: Any = None,  # noqa: A002
                   bias: Any = None, training: bool = False, momentum: Any = 0.1, eps: Any = 1e-5) -> Any:
    # In eval mode the op stays one F.batch_norm call; in training its decomposition's prims have rules, and so
    # they do for an empty input (eager's kernel then runs no batch norm; its backward kernel crashes on one)
    if training or running_mean is None or running_var is None or (
            isinstance(input, TensorProxy) and rule_compare(numel_of(input.shape), "==", 0)):
        return NotImplemented
    out = ALL_LTORCH["batch_norm"](input, running_mean, running_var, weight, bias, training, momentum, eps)
    return out, (input, weight, bias, running_mean, running_var, eps)


@batch_norm_fwd.backward
def batch_norm_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    x, weight, bias, running_mean, running_var, eps = saved
    gi, gw, gb = _batch_norm_grads(g, x, weight, bias, running_mean, running_var, None, None, False, eps)
    return gi, None, None, gw, gb, None, None, None


# -- grouped matrix products --------------------------------------------------------------------------------

@vjp(A.grouped_mm)
def grouped_mm_fwd(mat_a: TensorProxy, mat_b: TensorProxy, offs: Any, bias: Any, out_dtype: Any) -> Any:
    if mat_b.ndim != 3 or bias is not None or out_dtype not in (None, mat_a.dtype):
        raise UnsupportedOpError(
            f"differentiating torch._grouped_mm{where_now()} is supported for a 3-d mat_b (the experts' weights) "
            "without bias or out_dtype; compute it under torch.no_grad() otherwise")
    return A.grouped_mm(mat_a, mat_b, offs, bias, out_dtype), (mat_a, mat_b, offs)


@grouped_mm_fwd.backward
def grouped_mm_bwd(saved: Saved, g: TensorProxy) -> tuple[Any, ...]:
    # out_g = a_g @ b_g, so grad a_g = g_g @ b_g^T and grad b_g = a_g^T @ g_g, per group; a 2-d mat_a
    # has its groups along dim 0, which `offs` splits the same way in both products.
    a, b, offs = saved
    ga = A.grouped_mm(g, matrix_transpose(b), offs, None, None) if _needs(a) else None
    gb = A.grouped_mm(matrix_transpose(a), g, offs, None, None) if _needs(b) else None
    return ga, gb, None, None, None
