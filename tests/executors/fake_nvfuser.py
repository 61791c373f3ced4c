"""A reference model of nvFuser's Python API that runs each `fd.ops.*` call with eager torch.

Only what the nvFuser executor uses: `DataType`, `FusionDefinition` (a context
manager with `define_tensor`, `define_scalar`, `ops`, `add_output`, `execute`).
It is strict where nvFuser is: inputs must match what `define_tensor` declared
(rank, broadcast dims, dtype, contiguity), binary ops need tensors of one dtype
(the translation casts explicitly), and outputs with `alias_input` are written into
that input and not returned. A wrong translation therefore gives wrong numbers or
an error, not a pass.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import torch


class DataType(enum.Enum):
    """nvFuser's dtypes."""

    Half = torch.float16
    BFloat16 = torch.bfloat16
    Float = torch.float32
    Double = torch.float64
    Int32 = torch.int32
    Int = torch.int64
    Bool = torch.bool
    Null = None


class Value:
    """A tensor or scalar in a fusion definition (a node of the recorded program)."""

    def __init__(self, fd: FusionDefinition, index: int):
        self.fd = fd
        self.index = index


def _bcast(x: torch.Tensor, shape: list[int], broadcast_dims: list[int]) -> torch.Tensor:
    view = [1] * len(shape)
    for s, d in zip(x.shape, broadcast_dims, strict=True):
        view[d] = s
    return x.reshape(view).expand(shape)


def _binary(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def op(*args: Any) -> torch.Tensor:
        tensor_dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor) and not getattr(a, "_scalar", False)}
        if len(tensor_dtypes) > 1:
            raise TypeError(f"fake nvFuser: operands of different dtypes {tensor_dtypes}")
        return fn(*args)
    return op


def _scalar(value: Any, dtype: DataType) -> torch.Tensor:
    t = torch.tensor(value, dtype=dtype.value)
    t._scalar = True  # type: ignore[attr-defined]
    return t


def _where(c: torch.Tensor, a: Any, b: Any) -> torch.Tensor:
    if c.dtype != torch.bool:
        raise TypeError("fake nvFuser: where needs a bool condition")
    return torch.where(c, a, b)


def _reduction(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def op(x: torch.Tensor, dims: list[int], keepdim: bool = False, dtype: DataType = DataType.Null) -> torch.Tensor:
        if dtype is not DataType.Null and dtype.value != x.dtype:
            x = x.to(dtype.value)
        return fn(x, dims, keepdim)
    return op


def _prod(x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


_OPS: dict[str, Callable[..., Any]] = {
    **{n: getattr(torch, n) for n in (
        "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
        "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal", "erf", "erfc", "erfinv",
        "lgamma", "floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "isfinite", "neg", "abs",
        "bitwise_not", "logical_not")},
    **{n: _binary(getattr(torch, n)) for n in (
        "add", "sub", "mul", "div", "pow", "atan2", "fmod", "remainder", "maximum", "minimum", "eq", "ne", "lt",
        "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "lerp")},
    "where": _where,
    "cast": lambda x, dtype: x.to(dtype.value),
    "broadcast_in_dim": lambda x, shape, broadcast_dims: _bcast(x, shape, broadcast_dims),
    "reshape": lambda x, new_shape: x.reshape(new_shape),
    "permute": lambda x, dims: x.permute(dims),
    "squeeze": lambda x, dims: x.squeeze(tuple(dims)),
    "sum": _reduction(lambda x, dims, keepdim: torch.sum(x, dims, keepdim=keepdim)),
    "prod": _reduction(_prod),
    "max": _reduction(lambda x, dims, keepdim: torch.amax(x, dims, keepdim=keepdim)),
    "min": _reduction(lambda x, dims, keepdim: torch.amin(x, dims, keepdim=keepdim)),
    "var_mean": lambda x, dims, correction, keepdim=False: torch.var_mean(x, dims, correction=correction, keepdim=keepdim),
    "full": lambda shape, fill_value, dtype: torch.full(shape, fill_value.item(), dtype=dtype.value),
}


class _Ops:
    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in _OPS:
            raise AttributeError(f"fake nvFuser has no fd.ops.{name}")
        return lambda *args, **kwargs: self._fd._record(name, args, kwargs)


class FusionDefinition:
    """Records a fusion; `execute(inputs)` runs it with torch and returns the non-aliased outputs."""

    def __init__(self) -> None:
        self.program: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.inputs: list[tuple[int, dict[str, Any]]] = []
        self.outputs: list[tuple[Value, Value | None]] = []
        self.ops = _Ops(self)
        self.calls: list[str] = []
        self._open = False

    def __enter__(self) -> FusionDefinition:
        self._open = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open = False

    def _new(self, entry: tuple[str, tuple[Any, ...], dict[str, Any]]) -> Value:
        if not self._open:
            raise RuntimeError("fake nvFuser: define ops inside `with FusionDefinition() as fd`")
        self.program.append(entry)
        return Value(self, len(self.program) - 1)

    def _record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append(name)
        v = self._new((name, args, kwargs))
        if name == "var_mean":
            return self._new(("_item", (v, 0), {})), self._new(("_item", (v, 1), {}))
        return v

    def define_tensor(self, shape: list[int], contiguity: list[bool | None], dtype: DataType,
                      stride_order: list[int] | None = None) -> Value:
        """A tensor input, checked against the actual input at execute time."""
        v = self._new(("_input", (len(self.inputs),), {}))
        self.inputs.append((v.index, dict(shape=shape, contiguity=contiguity, dtype=dtype, stride_order=stride_order)))
        return v

    def define_scalar(self, value: Any, dtype: DataType) -> Value:
        """A constant scalar."""
        return self._new(("_scalar", (value, dtype), {}))

    def add_output(self, value: Value, alias_input: Value | None = None) -> None:
        """An output; with alias_input, written into that input instead of returned."""
        self.outputs.append((value, alias_input))

    def _check_input(self, t: torch.Tensor, spec: dict[str, Any]) -> None:
        if t.dtype != spec["dtype"].value or t.ndim != len(spec["shape"]):
            raise ValueError(f"fake nvFuser: input {t.dtype}{list(t.shape)} does not match {spec}")
        for size, declared in zip(t.shape, spec["shape"]):
            if (declared == 1) != (size == 1):
                raise ValueError(f"fake nvFuser: input shape {list(t.shape)} does not match {spec['shape']}")
        order = sorted(range(t.ndim), key=lambda d: spec["stride_order"][d])
        expected = 1
        for d in order:
            if t.shape[d] == 1:
                continue
            if spec["contiguity"][d] and t.stride(d) != expected:
                raise ValueError(f"fake nvFuser: input strides {t.stride()} are not contiguous as declared in {spec}")
            expected = t.stride(d) * t.shape[d]

    def execute(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the recorded ops with torch on `inputs`; return the non-aliased outputs."""
        values: list[Any] = []

        def get(x: Any) -> Any:
            if isinstance(x, Value):
                return values[x.index]
            if isinstance(x, list | tuple):
                return type(x)(get(v) for v in x)
            return x

        for name, args, kwargs in self.program:
            if name == "_input":
                (i,) = args
                self._check_input(inputs[i], self.inputs[i][1])
                values.append(inputs[i])
            elif name == "_scalar":
                values.append(_scalar(*args))
            elif name == "_item":
                values.append(get(args[0])[args[1]])
            else:
                values.append(_OPS[name](*get(args), **{k: get(v) for k, v in kwargs.items()}))
        # Every output is computed before any aliased input is written, as in one kernel.
        computed = [get(value).clone() for value, _ in self.outputs]
        results = []
        for (_, alias), value in zip(self.outputs, computed):
            if alias is None:
                results.append(value)
            else:
                get(alias).copy_(value)
        return results
