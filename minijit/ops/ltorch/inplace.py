"""In-place ltorch ops (`add_`, `mul_`, `copy_`, `zero_`, ...), recorded as in-place symbols.

Each decomposes into its functional op and a `prims.copy_` of the result into the
mutated tensor. The `functionalize` pass later removes the copies (docs/design.md,
invariant 1). Like eager torch, a result that cannot be cast to the tensor's
dtype, or that would change its shape, is an error.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from minijit.errors import DeviceError, MetaError, UnsupportedOpError
from minijit.ir import TENSOR_METHODS, Effects, Tag, TensorProxy
from minijit.ir.context import current_trace, where_now
from minijit.ir.proxies import broadcasts_to
from minijit.ops import prims
from minijit.ops.eager_facts import write_facts
from minijit.ops.ltorch.indexing import indexed_update
from minijit.ops.registry import ALL_LTORCH, declare_op, ltorch_op
from minijit.ops.utils import expand_to, to_device, to_dtype

INPLACE = Effects(writes=(0,))  # writes into its first argument
# The tags of in-place ops declared from their functional op (minijit.ir.Tag).
_INPLACE_TAGS = {"masked_fill": frozenset({Tag.MASKED_FILL})}


def _category(dtype: torch.dtype) -> int:
    return 0 if dtype == torch.bool else 3 if dtype.is_complex else 2 if dtype.is_floating_point else 1


def write_into(target: TensorProxy, value: Any, op: str) -> TensorProxy:
    """Record `target <- value` (cast and broadcast like torch's in-place ops); returns target."""
    if isinstance(value, TensorProxy):
        if _category(value.dtype) > _category(target.dtype):
            raise MetaError(f"ltorch.{op}: result type {value.dtype} can't be cast to the desired output type "
                            f"{target.dtype} of the tensor written in place{where_now()}")
        _check_broadcasts(op, value, target)
        if value.device != target.device:
            raise DeviceError(f"ltorch.{op}: the result is on {value.device} but the tensor written in place is on "
                              f"{target.device}{where_now()}")
        value = expand_to(to_dtype(value, target.dtype), target.shape)
    else:
        value = prims.full(target.shape, value, dtype=target.dtype, device=target.device)
    return prims.copy_(value, target)


def _declare_inplace(name: str, functional_name: str) -> None:
    functional = ALL_LTORCH[functional_name]

    def decomposition(a: TensorProxy, *args: Any, **kwargs: Any) -> TensorProxy:
        return write_into(a, functional(a, *args, **kwargs), f"{name}_")

    fns = [getattr(torch.Tensor, f"{name}_")]
    if hasattr(torch, f"{name}_"):
        fns.append(getattr(torch, f"{name}_"))
    declare_op(f"{name}_", decomposition, f"Tensor.{name}_: {functional_name} written into the first argument.",
               torch_fns=fns, methods=[f"{name}_"], effects=replace(INPLACE, **write_facts(f"{name}_")),
               tags=_INPLACE_TAGS.get(name, ()))


_INPLACE_OF = (
    "add", "sub", "mul", "div", "pow", "remainder", "fmod", "floor_divide", "clamp", "clip", "lerp",
    "addcmul", "addcdiv", "abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh",
    "reciprocal", "floor", "ceil", "round", "trunc", "sign", "square", "bitwise_and", "bitwise_or",
    "bitwise_xor", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_not",
    "sigmoid", "relu", "exp2", "expm1", "log1p", "erf", "atan2",
    "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10", "erfc",
    "erfinv", "lgamma", "digamma", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "copysign",
    "logical_and", "logical_or", "logical_xor", "clamp_min", "clamp_max", "hardtanh", "silu", "gelu",
    "leaky_relu", "elu", "mish", "hardsigmoid", "hardswish", "celu", "selu", "nan_to_num", "xlogy",
    "hypot", "frac", "sinc", "logit", "heaviside", "sgn", "fix", "deg2rad", "rad2deg",
    "tril", "triu", "index_copy", "index_add", "index_fill", "masked_fill", "scatter_add", "scatter", "index_put",
)
def declare_inplace_variants() -> None:
    """Declare `<op>_` for every op in _INPLACE_OF that exists (called once all ops are declared).

    The in-place forms of aliases (`clip_`, `arccos_`) are those of their ops (minijit/ops/aliases.py).
    """
    for name in _INPLACE_OF:
        if name in ALL_LTORCH and f"{name}_" not in ALL_LTORCH and hasattr(torch.Tensor, f"{name}_"):
            _declare_inplace(name, name)


def _metadata_inplace(name: str) -> None:
    def decomposition(a: TensorProxy, *args: Any, **kwargs: Any) -> TensorProxy:
        raise UnsupportedOpError(f"ltorch.{name}_: changing a tensor's shape or autograd metadata in place"
                                 f"{where_now()} is not supported; write x = x.{name}(...) instead")

    declare_op(f"{name}_", decomposition, f"Tensor.{name}_: unsupported (it changes the tensor's metadata in place).",
               torch_fns=[getattr(torch.Tensor, f"{name}_")], methods=[f"{name}_"], effects=INPLACE)


# In-place ops that change a tensor's shape or autograd metadata rather than its values.
METADATA_INPLACE = ("squeeze", "unsqueeze", "t", "transpose", "swapdims", "swapaxes", "resize", "resize_as",
                    "as_strided", "detach")
for _name in METADATA_INPLACE:
    _metadata_inplace(_name)


@ltorch_op("requires_grad_", torch_fns=[torch.Tensor.requires_grad_], effects=INPLACE)
def _requires_grad_changed(a: TensorProxy, requires_grad: bool = True) -> TensorProxy:
    """Tensor.requires_grad_ that changes the flag: unsupported (it changes autograd's graph)."""
    raise UnsupportedOpError(
        f"ltorch.requires_grad_: turning requires_grad {'on' if requires_grad else 'off'} for a traced tensor"
        f"{where_now()} changes autograd's graph, which minijit does not trace; set requires_grad on the "
        "function's inputs before the call, or use x.detach()")


def requires_grad_(a: TensorProxy, requires_grad: bool = True) -> TensorProxy:
    """Tensor.requires_grad_ on a traced tensor: the tensor itself where the flag has that value already
    (a hook marking an embedding's output, as transformers' enable_input_require_grads does); turned on for a
    tensor the trace made that does not require grad, a leaf as in eager (`make_leaf`); else refused."""
    if isinstance(a, TensorProxy) and a.requires_grad == bool(requires_grad):
        return a
    if isinstance(a, TensorProxy) and requires_grad and make_leaf(a):
        return a
    return _requires_grad_changed(a, requires_grad)


def make_leaf(a: TensorProxy) -> bool:
    """Make `a`, a tensor the trace computed that does not require grad, a leaf requiring grad, as eager's
    `requires_grad_()` does (`x.detach().requires_grad_()`, a factory's `requires_grad=True`): later ops see the
    flag, and a `backward()` in the traced code reaches it and sets its `.grad` (minijit/frontend/backward.py).
    False where the trace cannot: `a` is an input (its flag is the caller's) or no capture records it."""
    trace = current_trace()
    if trace is None or trace.capture is None or any(p is a for p in trace.args):
        return False
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        raise RuntimeError("only Tensors of floating point and complex dtype can require gradients")
    a.requires_grad = True
    trace.capture.made_leaves.setdefault(id(a), [a, None])
    return True


TENSOR_METHODS["requires_grad_"] = requires_grad_


def _check_broadcasts(op: str, value: TensorProxy, target: TensorProxy) -> None:
    if value.ndim > target.ndim or not all(map(broadcasts_to, reversed(value.shape), reversed(target.shape))):
        raise MetaError(f"ltorch.{op}: a value of shape {tuple(value.shape)} cannot be broadcast to the "
                        f"tensor of shape {tuple(target.shape)} written in place{where_now()}")


@ltorch_op(torch_fns=[torch.Tensor.copy_], methods=["copy_"], effects=replace(INPLACE, moves_values=True))
def copy_(a: TensorProxy, src: Any, non_blocking: bool = False) -> TensorProxy:
    """Tensor.copy_: writes src (cast to a's dtype whatever it is, and broadcast) into a."""
    if not isinstance(src, TensorProxy):
        raise MetaError(f"ltorch.copy_: expects a tensor source, got {type(src).__name__}{where_now()}")
    _check_broadcasts("copy_", src, a)
    return prims.copy_(expand_to(to_dtype(to_device(src, a.device), a.dtype), a.shape), a)


@ltorch_op(torch_fns=[torch.Tensor.zero_, torch.zero_], methods=["zero_"], effects=INPLACE)
def zero_(a: TensorProxy) -> TensorProxy:
    """Tensor.zero_."""
    return prims.copy_(prims.full(a.shape, 0, dtype=a.dtype, device=a.device), a)


@ltorch_op(torch_fns=[torch.Tensor.fill_, torch.fill_], methods=["fill_"],
           effects=replace(INPLACE, reads_scalar_first=True))
def fill_(a: TensorProxy, value: Any) -> TensorProxy:
    """Tensor.fill_ with a number or a 0-d tensor (cast to a's dtype)."""
    if isinstance(value, TensorProxy):
        if value.ndim != 0:
            raise MetaError(f"ltorch.fill_: only supports a 0-dimensional value tensor, got shape "
                            f"{list(value.shape)}{where_now()}")
        return prims.copy_(expand_to(to_dtype(to_device(value, a.device), a.dtype), a.shape), a)
    return prims.copy_(prims.full(a.shape, value, dtype=a.dtype, device=a.device), a)


def _setitem_eager(a: torch.Tensor, key: Any, value: Any) -> torch.Tensor:
    a[key] = value
    return a


@ltorch_op("setitem", torch_fns=[torch.Tensor.__setitem__], methods=["setitem"], impl=_setitem_eager, effects=INPLACE,
           tags={Tag.INDEXED_WRITE})
def setitem(a: TensorProxy, key: Any, value: Any) -> TensorProxy:
    """`a[key] = value`: the updated tensor computed functionally, then one copy into `a`.

    Like eager torch, the value is cast to a's dtype (as copy_ does) and broadcast to
    the shape of `a[key]`; a boolean mask key works with a value that needs no
    knowledge of how many entries are True.
    """
    return prims.copy_(indexed_update("setitem", a, key, value), a)
