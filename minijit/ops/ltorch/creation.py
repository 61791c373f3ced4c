"""Casts and tensor creation: Tensor.to and .float()/.long()/..., zeros/ones/full/arange, *_like, torch.tensor.

Creation ops take no tensor argument but are traced like any other op; `empty`
is `zeros` (a trace has no uninitialized memory). Random ones are in `randomness`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from minijit.ir import NumberProxy, Symbol, TensorProxy
from minijit.ops import prims
from minijit.ops.registry import declare_op, ltorch_op
from minijit.ops.utils import fail, numel_of, parse_shape, reshape_to, result_dtype, tensor_argument, to_dtype, unsupported


def _device(device: Any, default: torch.device | None = None) -> torch.device:
    if device is None:
        return default if default is not None else torch.get_default_device()
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        # Eager's tensors made on "cuda" are on the current device, "cuda:0" by default.
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _check_options(op: str, requires_grad: bool = False, out: Any = None, layout: Any = None,
                   generator: Any = None) -> None:
    if requires_grad:
        raise fail(op, "requires_grad=True is not supported inside a traced function; create the tensor outside")
    if out is not None:
        raise unsupported(op, "out= is not supported")
    if layout is not None and layout != torch.strided:
        raise fail(op, f"only the strided layout is supported, got {layout}")
    if generator is not None:
        raise fail(op, "an explicit generator is not supported; seed with torch.manual_seed instead")


# -- casts ---------------------------------------------------------------------------

def convert(op: str, x: TensorProxy, dtype: torch.dtype | None, device: torch.device | None) -> TensorProxy:
    """x in `dtype` on `device` (either may be None: unchanged); x itself when nothing changes."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise fail(op, f"expected a torch.dtype, got {dtype!r}")
        x = to_dtype(x, dtype)
    if device is not None and not _same_device(device, x.device):
        x = prims.device_put(x, device)
    return x


def _is_device(x: Any) -> bool:
    return isinstance(x, str | torch.device) or (type(x) is int)


def _decline_memory_format(op: str, memory_format: Any) -> None:
    """Decline a conversion with a memory format of its own (to the opaque torch op, whose run on the input's
    layout decides): eager returns the input itself where it is laid out as that format suggests, and a copy in
    that format otherwise (`x.to(memory_format=torch.channels_last)` of a contiguous `x` is a new tensor, a
    write into which does not reach `x`), which the decomposition does not reproduce."""
    if memory_format is not None and memory_format != torch.preserve_format:
        raise unsupported(op, f"memory_format={memory_format}: whether eager copies depends on the input's layout")


@ltorch_op(torch_fns=[torch.Tensor.to], methods=["to"])
def to(input: TensorProxy, *args: Any, **kwargs: Any) -> TensorProxy:  # noqa: A002
    """Tensor.to(dtype), .to(device, dtype), .to(other), with non_blocking/copy keywords (with a memory format:
    the opaque torch op)."""
    tensor_argument("to", input)
    rest = list(args)
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    if rest and isinstance(rest[0], TensorProxy):
        other = rest.pop(0)
        dtype, device = other.dtype, other.device
    elif rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    elif rest and _is_device(rest[0]):
        device = rest.pop(0)
        if rest and isinstance(rest[0], torch.dtype):
            dtype = rest.pop(0)
    flags = dict(zip(("non_blocking", "copy"), rest))
    if len(rest) > 2:
        raise fail("to", f"unexpected arguments {tuple(args)!r}")
    flags.update({k: kwargs.pop(k) for k in ("non_blocking", "copy") if k in kwargs})
    _decline_memory_format("to", kwargs.pop("memory_format", None))
    if kwargs:
        raise fail("to", f"unexpected keyword arguments {sorted(kwargs)}")
    out = convert("to", input, dtype, None if device is None else _device(device))
    if flags.get("copy") and out is input:
        # A same-dtype conversion is a new tensor (the executors copy), as copy=True asks.
        out = prims.convert_element_type(input, input.dtype)
    return out


@ltorch_op(torch_fns=[torch.Tensor.cpu], methods=["cpu"])
def cpu(input: TensorProxy, memory_format: Any = None) -> TensorProxy:  # noqa: A002
    """Tensor.cpu(): the tensor on the CPU (itself if it is there)."""
    _decline_memory_format("cpu", memory_format)
    return convert("cpu", tensor_argument("cpu", input), None, torch.device("cpu"))


@ltorch_op(torch_fns=[torch.Tensor.cuda], methods=["cuda"])
def cuda(input: TensorProxy, device: Any = None, non_blocking: bool = False,  # noqa: A002
         memory_format: Any = None) -> TensorProxy:
    """Tensor.cuda(device=None, non_blocking=False): the tensor on that CUDA device (the current one by default)."""
    _decline_memory_format("cuda", memory_format)
    target = _device(torch.device("cuda", device) if type(device) is int else device or "cuda")
    return convert("cuda", tensor_argument("cuda", input), None, target)


def _declare_cast(name: str, dtype: torch.dtype) -> Any:
    def decomposition(input: TensorProxy, memory_format: Any = None) -> TensorProxy:  # noqa: A002
        _decline_memory_format(name, memory_format)
        return convert(name, tensor_argument(name, input), dtype, None)

    return declare_op(name, decomposition, f"Tensor.{name}(): the tensor as {dtype}.",
                      torch_fns=[getattr(torch.Tensor, name)], methods=[name])


_CASTS = {
    "float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
    "long": torch.int64, "int": torch.int32, "short": torch.int16, "char": torch.int8, "byte": torch.uint8,
    "bool": torch.bool,
}
for _name, _dtype in _CASTS.items():
    _declare_cast(_name, _dtype)


@ltorch_op(torch_fns=[torch.Tensor.type_as], methods=["type_as"])
def type_as(input: TensorProxy, other: TensorProxy) -> TensorProxy:  # noqa: A002
    """Tensor.type_as: the tensor in other's dtype."""
    return convert("type_as", tensor_argument("type_as", input), tensor_argument("type_as", other).dtype, None)


@ltorch_op("type", torch_fns=[torch.Tensor.type], methods=["type"])
def type_(input: TensorProxy, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> TensorProxy:  # noqa: A002
    """Tensor.type(dtype): the tensor as dtype (the string forms and the no-argument query are not supported)."""
    if not isinstance(dtype, torch.dtype):
        raise unsupported("type", f"only Tensor.type(<torch.dtype>) is supported, got {dtype!r}")
    return convert("type", tensor_argument("type", input), dtype, None)


# -- filled tensors -----------------------------------------------------------------------------

def _filled(op: str, shape: Sequence[Any], value: Any, dtype: torch.dtype | None, device: Any) -> TensorProxy:
    if dtype is None:
        dtype = result_dtype(value)
    return prims.full(tuple(shape), value, dtype=dtype, device=_device(device))


def _declare_filled(name: str, value: Any) -> Symbol:
    """Declares torch.{name}, a tensor filled with `value`: of the sizes given (`zeros(*size)`), or like a
    tensor for a name ending in `_like` (`zeros_like(input)`)."""
    def of_size(*size: Any, out: Any = None, dtype: torch.dtype | None = None, layout: Any = None,
                device: Any = None, pin_memory: bool = False, requires_grad: bool = False,
                memory_format: Any = None) -> TensorProxy:
        _check_options(name, requires_grad, out, layout)
        return _filled(name, parse_shape(name, size), value, dtype or torch.get_default_dtype(), device)

    def like(input: TensorProxy, *, dtype: torch.dtype | None = None, layout: Any = None,  # noqa: A002
             device: Any = None, pin_memory: bool = False, requires_grad: bool = False,
             memory_format: Any = None) -> TensorProxy:
        tensor_argument(name, input)
        _check_options(name, requires_grad, None, layout)
        return _filled(name, input.shape, value, dtype or input.dtype, _device(device, input.device))

    if name.endswith("_like"):
        decomposition, doc = like, f"torch.{name}: a tensor like input filled with {value}."
    else:
        decomposition, doc = of_size, f"torch.{name}(*size): a tensor filled with {value} (default dtype unless given)."
    return declare_op(name, decomposition, doc, torch_fns=[getattr(torch, name)])


zeros = _declare_filled("zeros", 0)
ones = _declare_filled("ones", 1)
empty = _declare_filled("empty", 0)


@ltorch_op(torch_fns=[torch.full])
def full(size: Sequence[Any], fill_value: Any, *, out: Any = None, dtype: torch.dtype | None = None,
         layout: Any = None, device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> TensorProxy:
    """torch.full: a tensor of `size` filled with fill_value (dtype inferred from it as torch does)."""
    _check_options("full", requires_grad, out, layout)
    return _filled("full", parse_shape("full", (size,)), fill_value, dtype, device)


zeros_like = _declare_filled("zeros_like", 0)
ones_like = _declare_filled("ones_like", 1)
empty_like = _declare_filled("empty_like", 0)


@ltorch_op(torch_fns=[torch.full_like])
def full_like(input: TensorProxy, fill_value: Any, *, dtype: torch.dtype | None = None, layout: Any = None,  # noqa: A002
              device: Any = None, pin_memory: bool = False, requires_grad: bool = False,
              memory_format: Any = None) -> TensorProxy:
    """torch.full_like: a tensor like input filled with fill_value."""
    tensor_argument("full_like", input)
    _check_options("full_like", requires_grad, None, layout)
    return _filled("full_like", input.shape, fill_value, dtype or input.dtype, _device(device, input.device))


def _declare_new(name: str, value: Any) -> Any:
    def decomposition(input: TensorProxy, *sizes: Any, size: Any = None, dtype: torch.dtype | None = None,  # noqa: A002
                      layout: Any = None, device: Any = None, pin_memory: bool = False,
                      requires_grad: bool = False) -> TensorProxy:
        tensor_argument(name, input)
        _check_options(name, requires_grad, None, layout)
        if size is not None:  # x.new_ones(size=(2, 3)), as transformers' Longformer calls it
            if sizes:
                raise TypeError(f"{name}() got multiple values for argument 'size'")
            sizes = (size,)
        return _filled(name, parse_shape(name, sizes), value, dtype or input.dtype, _device(device, input.device))

    return declare_op(name, decomposition, f"Tensor.{name}(size): a tensor of input's dtype and device filled with "
                      f"{value}.", torch_fns=[getattr(torch.Tensor, name)], methods=[name])


new_zeros = _declare_new("new_zeros", 0)
new_ones = _declare_new("new_ones", 1)
new_empty = _declare_new("new_empty", 0)


@ltorch_op(torch_fns=[torch.Tensor.new_full], methods=["new_full"])
def new_full(input: TensorProxy, size: Sequence[Any], fill_value: Any, *, dtype: torch.dtype | None = None,  # noqa: A002
             layout: Any = None, device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> TensorProxy:
    """Tensor.new_full: a tensor of input's dtype and device filled with fill_value."""
    tensor_argument("new_full", input)
    _check_options("new_full", requires_grad, None, layout)
    return _filled("new_full", parse_shape("new_full", (size,)), fill_value, dtype or input.dtype,
                   _device(device, input.device))


@ltorch_op(torch_fns=[torch.arange])
def arange(start: Any, end: Any = None, step: Any = 1, *, out: Any = None, dtype: torch.dtype | None = None,
           layout: Any = None, device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> TensorProxy:
    """torch.arange(end), (start, end) or (start, end, step), float steps included."""
    _check_options("arange", requires_grad, out, layout)
    if end is None:
        start, end = 0, start
    for v in (start, end, step):
        if isinstance(v, TensorProxy) or not isinstance(v, int | float | NumberProxy):
            raise fail("arange", f"start, end and step must be Python numbers, got {(start, end, step)!r}")
    if any(isinstance(v, NumberProxy) for v in (start, end, step)):
        integral = all(isinstance(v, int) or getattr(v, "python_type", None) is int for v in (start, end, step))
        if integral and type(step) is int and step != 0 and (dtype is None or not dtype.is_floating_point):
            # A symbolic integer range: its length is symbolic too ("symbolic values" mode).
            length = (end - start + step - 1) // step if step > 0 else (start - end - step - 1) // (-step)
            return prims.iota(length, start=start, step=step, dtype=dtype or torch.int64, device=_device(device))
        start, end, step = (float(v) if isinstance(v, NumberProxy) else v for v in (start, end, step))
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        start, end, step = int(start), int(end), int(step)  # torch truncates the bounds for integer results
    if step == 0:
        raise fail("arange", "step must be nonzero")
    if (end - start) * step < 0:
        raise fail("arange", f"upper bound and larger bound inconsistent with step sign: {(start, end, step)}")
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype()
    length = math.ceil((float(end) - float(start)) / float(step))
    return prims.iota(length, start=start, step=step, dtype=dtype, device=_device(device))


# -- torch.tensor of Python numbers ----------------------------------------------------------------

def _nested_shape(op: str, data: Any) -> tuple[int, ...]:
    if isinstance(data, list | tuple):
        shapes = {_nested_shape(op, d) for d in data}
        if len(shapes) > 1:
            raise fail(op, f"nested sequences have ragged shapes {sorted(shapes)}")
        return (len(data), *(shapes.pop() if shapes else ()))
    if isinstance(data, bool | int | float | complex | NumberProxy):  # a symbolic number too: torch.tensor(x.size(1))
        return ()
    raise fail(op, f"only (nested lists of) Python numbers are supported, got {type(data).__name__}")


def _leaves(data: Any) -> list[Any]:
    return [x for d in data for x in _leaves(d)] if isinstance(data, list | tuple) else [data]


@ltorch_op(torch_fns=[torch.tensor])
def tensor(data: Any, *, dtype: torch.dtype | None = None, device: Any = None, requires_grad: bool = False,
           pin_memory: bool = False) -> TensorProxy:
    """torch.tensor of a Python number or nested lists of numbers (dtype inferred as torch does)."""
    _check_options("tensor", requires_grad)
    shape = _nested_shape("tensor", data)
    values = _leaves(data)
    if dtype is None:
        dtype = result_dtype(*values) if values else torch.get_default_dtype()
    dev = _device(device)
    if not shape:
        return prims.full((), data, dtype=dtype, device=dev)
    if not values:
        return prims.full(shape, 0, dtype=dtype, device=dev)
    flat = prims.cat([prims.full((1,), v, dtype=dtype, device=dev) for v in values], 0)
    return reshape_to(flat, shape) if numel_of(shape) == len(values) else flat
