"""Translating a fusion region's prims into calls on an nvFuser `FusionDefinition`.

Values of 16-bit float dtypes are cast to float32 right after they are defined and
computed in float32; each output is cast back to its own dtype before `add_output`
(nvFuser computes in float anyway; the explicit casts make the trace's dtypes hold).
A copy into a region input becomes `fd.add_output(value, alias_input=input)`, which
writes the value into the input's memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.extend import BoundSymbol, Region, Symbol, Tag, TensorProxy, check_table, prims

NARROW = (torch.float16, torch.bfloat16)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = (*FLOATS, torch.int32, torch.int64, torch.bool)
_DATATYPE = {
    torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float64: "Double",
    torch.int32: "Int32", torch.int64: "Int", torch.bool: "Bool",
}

# prim -> (fd.ops name, dtype kinds it accepts: f(loat), i(nt), b(ool)); nvFuser names its ops as the prims are named.
ELEMENTWISE: dict[Symbol, tuple[str, str]] = {
    **{sym: (sym.name, "f") for sym in (
        prims.exp, prims.exp2, prims.expm1, prims.log, prims.log1p, prims.log2, prims.log10, prims.sin, prims.cos,
        prims.tan, prims.asin, prims.acos, prims.atan, prims.sinh, prims.cosh, prims.tanh, prims.asinh, prims.acosh,
        prims.atanh, prims.sqrt, prims.rsqrt, prims.reciprocal, prims.erf, prims.erfc, prims.erfinv, prims.lgamma,
        prims.floor, prims.ceil, prims.round, prims.trunc, prims.sign, prims.div, prims.pow, prims.atan2, prims.fmod,
        prims.remainder, prims.isnan, prims.isinf, prims.isfinite, prims.lerp)},
    **{sym: (sym.name, "fi") for sym in (prims.add, prims.sub, prims.mul, prims.neg, prims.abs, prims.maximum,
                                         prims.minimum, prims.lt, prims.le, prims.gt, prims.ge)},
    **{sym: (sym.name, "fib") for sym in (prims.eq, prims.ne, prims.where)},
    **{sym: (sym.name, "ib") for sym in (prims.bitwise_and, prims.bitwise_or, prims.bitwise_xor, prims.bitwise_not)},
    **{sym: (sym.name, "b") for sym in (prims.logical_and, prims.logical_or, prims.logical_not)},
}
# Elementwise prims nvFuser is not given, and why: every elementwise prim is in ELEMENTWISE or here (checked below).
NOT_FUSED: dict[Symbol, str] = {
    **{sym: "no nvFuser op of the same definition mapped yet" for sym in (
        prims.digamma, prims.signbit, prims.floor_divide, prims.copysign, prims.bitwise_left_shift,
        prims.bitwise_right_shift, prims.logical_xor)},
    **{sym: "views of complex tensors: not a computation" for sym in (prims.real, prims.imag)},
}
# prim -> the fd.ops reduction
REDUCTIONS: dict[Symbol, str] = {prims.sum: "sum", prims.amax: "max", prims.amin: "min", prims.prod: "prod"}
SHAPE_OPS = (prims.broadcast_in_dim, prims.reshape, prims.transpose, prims.squeeze)
OTHER = (prims.convert_element_type, prims.var_mean, prims.full)
SUPPORTED = frozenset({*ELEMENTWISE, *REDUCTIONS, *SHAPE_OPS, *OTHER})  # and every copy prim (`Effects.copies`)
_PRIMS = frozenset(prims.ALL_PRIMS.values())


def check_lowerings(prim_symbols: Iterable[Symbol] | None = None) -> None:
    """Raise a MinijitError naming each elementwise prim (of `prim_symbols`, by default every one) without an
    nvFuser op in ELEMENTWISE or a reason in NOT_FUSED."""
    check_table({**ELEMENTWISE, **NOT_FUSED}, prims.ALL_PRIMS.values() if prim_symbols is None else prim_symbols,
                lambda s: Tag.ELEMENTWISE in s.tags, "nvFuser op or reason (nvfuser/translate.py ELEMENTWISE, NOT_FUSED)")


check_lowerings()


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
        sym = bsym.sym
        args = bsym.args
        out = bsym.output
        if sym.effects.copies:
            src, (dst,) = bsym.copied_value(), bsym.written()
            v = env[src.name][0]
            if dst.name in index:
                if src.dtype != dst.dtype or dst.dtype in NARROW:
                    v = fd.ops.cast(v, dtype=datatype(nv, dst.dtype))
                copies[index[dst.name]] = v
            env[dst.name] = (env[src.name][0], dst.dtype)
            continue
        if sym in ELEMENTWISE:
            result = getattr(fd.ops, ELEMENTWISE[sym][0])(*[value(a) for a in args])
        elif sym is prims.convert_element_type:
            x = value(args[0])
            if out.dtype in NARROW:
                # Round to the narrow dtype, as the cast does, and keep computing in float.
                result = fd.ops.cast(fd.ops.cast(x, dtype=datatype(nv, out.dtype)), dtype=nv.DataType.Float)
            else:
                result = fd.ops.cast(x, dtype=datatype(nv, out.dtype))
        elif sym is prims.broadcast_in_dim:
            result = fd.ops.broadcast_in_dim(value(args[0]), shape=list(args[1]), broadcast_dims=list(args[2]))
        elif sym is prims.reshape:
            result = fd.ops.reshape(value(args[0]), new_shape=list(args[1]))
        elif sym is prims.transpose:
            result = fd.ops.permute(value(args[0]), dims=list(args[1]))
        elif sym is prims.squeeze:
            result = fd.ops.squeeze(value(args[0]), dims=[d % args[0].ndim for d in args[1]])
        elif sym in REDUCTIONS:
            dims = [d % max(args[0].ndim, 1) for d in args[1]]
            op = getattr(fd.ops, REDUCTIONS[sym])
            result = op(value(args[0]), dims=dims, keepdim=False, dtype=compute(out.dtype)) \
                if sym in (prims.sum, prims.prod) \
                else op(value(args[0]), dims=dims, keepdim=False)
        elif sym is prims.var_mean:
            x, dims, correction = args
            var, mean = fd.ops.var_mean(value(x), dims=[d % x.ndim for d in dims], correction=correction, keepdim=False)
            env[out[0].name] = (var, out[0].dtype)
            env[out[1].name] = (mean, out[1].dtype)
            continue
        elif sym is prims.full:
            shape, fill = args
            dtype = bsym.kwargs["dtype"]
            result = fd.ops.full(shape=list(shape), fill_value=value(fill), dtype=compute(dtype))
        else:
            raise NotImplementedError(sym.id)
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
    sym = bsym.sym
    if sym not in SUPPORTED and not (sym.effects.copies and sym in _PRIMS):
        return False
    values = [*bsym.args, *bsym.kwargs.values()]
    tensors = [x for x in values if isinstance(x, TensorProxy)]
    outs = list(bsym.proxy_outputs())
    if any(not isinstance(p, TensorProxy) for p in outs):
        return False
    for t in tensors + outs:
        if t.dtype not in DTYPES or t.device.type != device_type or any(type(d) is not int for d in t.shape):
            return False
    if sym is prims.full:
        return isinstance(bsym.args[1], int | float | bool)
    if not tensors:
        return False
    if any(not isinstance(x, TensorProxy | int | float | bool | torch.dtype | tuple | list) for x in values):
        return False
    if sym in ELEMENTWISE:
        data = tensors[1:] if sym is prims.where else tensors
        return all(kind(t.dtype) in ELEMENTWISE[sym][1] for t in data)
    if sym in REDUCTIONS or sym is prims.var_mean:
        return tensors[0].dtype in FLOATS and tensors[0].ndim > 0 and len(bsym.args[1]) > 0
    return True
