"""Translating a fusion region's prims into calls on an nvFuser `FusionDefinition`.

Values of 16-bit float dtypes are cast to float32 right after they are defined and
computed in float32; each output is cast back to its own dtype before `add_output`
(nvFuser computes in float anyway; the explicit casts make the trace's dtypes hold).
A copy into a region input becomes `fd.add_output(value, alias_input=input)`, which
writes the value into the input's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.extend import BoundSymbol, Region, TensorProxy

NARROW = (torch.float16, torch.bfloat16)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = (*FLOATS, torch.int32, torch.int64, torch.bool)
_DATATYPE = {
    torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float64: "Double",
    torch.int32: "Int32", torch.int64: "Int", torch.bool: "Bool",
}

# prim name -> (fd.ops name, dtype kinds it accepts: f(loat), i(nt), b(ool))
ELEMENTWISE: dict[str, tuple[str, str]] = {
    **{n: (n, "f") for n in (
        "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
        "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal", "erf", "erfc", "erfinv",
        "lgamma", "floor", "ceil", "round", "trunc", "sign", "div", "pow", "atan2", "fmod", "remainder",
        "isnan", "isinf", "isfinite", "lerp")},
    **{n: (n, "fi") for n in ("add", "sub", "mul", "neg", "abs", "maximum", "minimum", "lt", "le", "gt", "ge")},
    **{n: (n, "fib") for n in ("eq", "ne", "where")},
    **{n: (n, "ib") for n in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not")},
    **{n: (n, "b") for n in ("logical_and", "logical_or", "logical_not")},
}
# Elementwise prims nvFuser is not given, and why (tests/executors/test_lowering_coverage.py: every elementwise
# prim is in ELEMENTWISE or here).
NOT_FUSED: dict[str, str] = {
    **{n: "no nvFuser op of the same definition mapped yet" for n in (
        "digamma", "signbit", "floor_divide", "copysign", "bitwise_left_shift", "bitwise_right_shift", "logical_xor")},
    **{n: "views of complex tensors: not a computation" for n in ("real", "imag")},
}
REDUCTIONS = {"sum": "sum", "amax": "max", "amin": "min", "prod": "prod"}
SHAPE_OPS = ("broadcast_in_dim", "reshape", "transpose", "squeeze")
OTHER = ("convert_element_type", "var_mean", "full")
SUPPORTED = (*ELEMENTWISE, *REDUCTIONS, *SHAPE_OPS, *OTHER)  # and every copy prim (`Effects.copies`)


def kind(dtype: torch.dtype) -> str:
    """'f', 'i' or 'b': the family of a dtype."""
    return "b" if dtype == torch.bool else "f" if dtype.is_floating_point else "i"


def datatype(nv: Any, dtype: torch.dtype) -> Any:
    """The nvFuser `DataType` for a torch dtype."""
    return getattr(nv.DataType, _DATATYPE[dtype])


@dataclass(frozen=True)
class InputMeta:
    """What a FusionDefinition is specialised on for one tensor input: its shape, strides and dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @staticmethod
    def of(t: torch.Tensor) -> InputMeta:
        """The metadata of a tensor."""
        return InputMeta(tuple(t.shape), tuple(t.stride()), t.dtype)


def contiguity_and_order(meta: InputMeta) -> tuple[list[bool | None], list[int]]:
    """nvFuser's `contiguity` (None for size-1 dims) and `stride_order` (rank of each dim's stride)."""
    ndim = len(meta.shape)
    # stride_order[d] = how many dims have a smaller stride (the innermost dim gets 0).
    by_stride = sorted(range(ndim), key=lambda d: (meta.stride[d], -d))
    order = [0] * ndim
    for rank, d in enumerate(by_stride):
        order[d] = rank
    contiguity: list[bool | None] = [None] * ndim
    expected = 1
    for d in by_stride:
        if meta.shape[d] == 1:
            continue
        contiguity[d] = meta.stride[d] == expected
        expected = meta.stride[d] * meta.shape[d]
    return contiguity, order


def define_region(nv: Any, fd: Any, region: Region, metas: Sequence[InputMeta | None]) -> list[int]:
    """Add `region`'s inputs, computation and outputs to the open FusionDefinition `fd`.

    `nv` is the nvfuser module (or a stand-in with the same API); `metas` describe the
    region's tensor inputs (None for a non-tensor input). Returns, per region output,
    the index of the input it aliases, or -1 for an output `fd.execute` returns.
    """
    env: dict[str, tuple[Any, torch.dtype]] = {}
    defined: dict[int, Any] = {}
    for i, (p, meta) in enumerate(zip(region.inputs, metas)):
        if not isinstance(p, TensorProxy):
            raise NotImplementedError(f"non-tensor region input {p!r}")
        contiguity, order = contiguity_and_order(meta)
        t = fd.define_tensor(shape=[1 if s == 1 else -1 for s in meta.shape], contiguity=contiguity,
                             dtype=datatype(nv, meta.dtype), stride_order=order)
        defined[i] = t
        env[p.name] = (fd.ops.cast(t, dtype=nv.DataType.Float) if meta.dtype in NARROW else t, p.dtype)

    def value(x: Any, like: torch.dtype | None = None) -> Any:
        if isinstance(x, TensorProxy):
            return env[x.name][0]
        if isinstance(x, bool):
            return fd.define_scalar(x, dtype=nv.DataType.Bool)
        if isinstance(x, int):
            return fd.define_scalar(x, dtype=nv.DataType.Int)
        if isinstance(x, float):
            return fd.define_scalar(x, dtype=nv.DataType.Double)
        raise NotImplementedError(f"argument {x!r}")

    def compute(dtype: torch.dtype) -> Any:
        return nv.DataType.Float if dtype in NARROW else datatype(nv, dtype)

    copies: dict[int, Any] = {}
    index = {p.name: i for i, p in enumerate(region.inputs)}
    for bsym in region.members:
        name = bsym.sym.name
        args = bsym.args
        out = bsym.output
        if bsym.sym.effects.copies:
            src, (dst,) = bsym.copied_value(), bsym.written()
            v = env[src.name][0]
            if dst.name in index:
                if src.dtype != dst.dtype or dst.dtype in NARROW:
                    v = fd.ops.cast(v, dtype=datatype(nv, dst.dtype))
                copies[index[dst.name]] = v
            env[dst.name] = (env[src.name][0], dst.dtype)
            continue
        if name in ELEMENTWISE:
            result = getattr(fd.ops, ELEMENTWISE[name][0])(*[value(a) for a in args])
        elif name == "convert_element_type":
            x = value(args[0])
            if out.dtype in NARROW:
                # Round to the narrow dtype, as the cast does, and keep computing in float.
                result = fd.ops.cast(fd.ops.cast(x, dtype=datatype(nv, out.dtype)), dtype=nv.DataType.Float)
            else:
                result = fd.ops.cast(x, dtype=datatype(nv, out.dtype))
        elif name == "broadcast_in_dim":
            result = fd.ops.broadcast_in_dim(value(args[0]), shape=list(args[1]), broadcast_dims=list(args[2]))
        elif name == "reshape":
            result = fd.ops.reshape(value(args[0]), new_shape=list(args[1]))
        elif name == "transpose":
            result = fd.ops.permute(value(args[0]), dims=list(args[1]))
        elif name == "squeeze":
            result = fd.ops.squeeze(value(args[0]), dims=[d % args[0].ndim for d in args[1]])
        elif name in REDUCTIONS:
            dims = [d % max(args[0].ndim, 1) for d in args[1]]
            op = getattr(fd.ops, REDUCTIONS[name])
            result = op(value(args[0]), dims=dims, keepdim=False, dtype=compute(out.dtype)) if name in ("sum", "prod") \
                else op(value(args[0]), dims=dims, keepdim=False)
        elif name == "var_mean":
            x, dims, correction = args
            var, mean = fd.ops.var_mean(value(x), dims=[d % x.ndim for d in dims], correction=correction, keepdim=False)
            env[out[0].name] = (var, out[0].dtype)
            env[out[1].name] = (mean, out[1].dtype)
            continue
        elif name == "full":
            shape, fill = args
            dtype = bsym.kwargs["dtype"]
            result = fd.ops.full(shape=list(shape), fill_value=value(fill), dtype=compute(dtype))
        else:
            raise NotImplementedError(f"prims.{name}")
        env[out.name] = (result, out.dtype)

    aliases: list[int] = []
    for p in region.outputs:
        if p.name in index:
            aliases.append(index[p.name])  # written in place (a copy), or passed through
            continue
        v, dtype = env[p.name]
        if dtype in NARROW:
            v = fd.ops.cast(v, dtype=datatype(nv, dtype))
        fd.add_output(v)
        aliases.append(-1)
    for i, v in copies.items():
        fd.add_output(v, alias_input=defined[i])
    return aliases


def fusible(bsym: BoundSymbol, device_type: str) -> bool:
    """Whether the nvFuser translation handles this prim call on tensors of `device_type`."""
    if bsym.sym.namespace != "prims" or (bsym.sym.name not in SUPPORTED and not bsym.sym.effects.copies):
        return False
    name = bsym.sym.name
    values = [*bsym.args, *bsym.kwargs.values()]
    tensors = [x for x in values if isinstance(x, TensorProxy)]
    outs = list(bsym.proxy_outputs())
    if any(not isinstance(p, TensorProxy) for p in outs):
        return False
    for t in tensors + outs:
        if t.dtype not in DTYPES or t.device.type != device_type or any(type(d) is not int for d in t.shape):
            return False
    if name == "full":
        return isinstance(bsym.args[1], int | float | bool)
    if not tensors:
        return False
    if any(not isinstance(x, TensorProxy | int | float | bool | torch.dtype | tuple | list) for x in values):
        return False
    if name in ELEMENTWISE:
        data = tensors[1:] if name == "where" else tensors
        return all(kind(t.dtype) in ELEMENTWISE[name][1] for t in data)
    if name in REDUCTIONS or name == "var_mean":
        return tensors[0].dtype in FLOATS and tensors[0].ndim > 0 and len(bsym.args[1]) > 0
    return True
