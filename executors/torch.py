"""The torch executor: runs every prim and every ltorch op as eager torch. Always the fallback.

ltorch ops run as the torch callable they stand for (one `scaled_dot_product_attention`,
one `layer_norm`), so a trace that no fusion executor touches costs what eager costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.extend import OperatorExecutor, ltorch_eager_implementations, prims, register_executor

ex = OperatorExecutor("torch", version=torch.__version__)


def _broadcast_in_dim(x: torch.Tensor, shape: Sequence[int], broadcast_dims: Sequence[int]) -> torch.Tensor:
    view_shape = [1] * len(shape)
    for size, d in zip(x.shape, broadcast_dims, strict=True):
        view_shape[d] = size
    return x.reshape(view_shape).expand(shape)


def _slice(x: torch.Tensor, start_indices: Sequence[int], end_indices: Sequence[int],
           strides: Sequence[int] | None = None) -> torch.Tensor:
    strides = strides if strides is not None else [1] * x.ndim
    return x[tuple(slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides, strict=True))]


# The reduction prims keep their input's dtype (the meta says so); torch.sum and torch.prod
# would otherwise give int64 for bool and small integer inputs.
def _sum(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return torch.sum(x, tuple(dims), dtype=x.dtype) if dims else x.clone()


def _prod(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, dtype=x.dtype)
    return x if dims else x.clone()


def _amax(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return torch.amax(x, tuple(dims)) if dims else x.clone()


def _amin(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return torch.amin(x, tuple(dims)) if dims else x.clone()


def _var_mean(x: torch.Tensor, dims: Sequence[int], correction: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, tuple(dims), correction=correction)


def _full(shape: Sequence[int], fill_value: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full(tuple(shape), fill_value, dtype=dtype, device=device)


def _iota(length: int, *, start: Any, step: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + length * step, step, dtype=dtype, device=device)[:length]


def _random_seed() -> int:
    # Drawn from torch's default generator, so torch.manual_seed makes runs repeatable.
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())


def _uniform(shape: Sequence[int], low: float, high: float, *, dtype: torch.dtype, device: torch.device,
             seed: int, offset: int) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed((seed + offset) % (2**63))
    return torch.rand(tuple(shape), generator=gen, dtype=dtype, device=device) * (high - low) + low


def _take(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.index_select(x, dim, index)


def _scalars_as_tensors(fn: Any) -> Any:
    """`fn(a, b)` for torch functions that refuse Python numbers, which prims allow as scalars."""
    def impl(a: Any, b: Any) -> torch.Tensor:
        if not isinstance(a, torch.Tensor):
            a = torch.tensor(a, dtype=b.dtype, device=b.device)
        elif not isinstance(b, torch.Tensor):
            b = torch.tensor(b, dtype=a.dtype, device=a.device)
        return fn(a, b)
    return impl


def _maximum(a: Any, b: Any) -> torch.Tensor:
    # clamp_min propagates NaN like maximum and takes a Python number without a tensor allocation.
    if not isinstance(b, torch.Tensor):
        return torch.clamp_min(a, b)
    return torch.clamp_min(b, a) if not isinstance(a, torch.Tensor) else torch.maximum(a, b)


def _minimum(a: Any, b: Any) -> torch.Tensor:
    if not isinstance(b, torch.Tensor):
        return torch.clamp_max(a, b)
    return torch.clamp_max(b, a) if not isinstance(a, torch.Tensor) else torch.minimum(a, b)


def _copy_(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return dst.copy_(src)


def _copy_to_out_(computed: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    if computed is not out:
        out.copy_(computed)
    return out


_PRIM_IMPLS: dict[str, Any] = {
    # copy=True: a same-dtype conversion is how ltorch.clone makes a new tensor.
    "convert_element_type": lambda x, dtype: x.to(dtype, copy=True),
    "device_put": lambda x, device: x.to(device),
    "cumsum": torch.cumsum,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": torch.reshape,
    "transpose": torch.permute,
    "slice": _slice,
    "squeeze": torch.squeeze,
    "cat": torch.cat,
    "shape": lambda x: tuple(x.shape),
    "sum": _sum,
    "prod": _prod,
    "amax": _amax,
    "amin": _amin,
    "argmax": torch.argmax,
    "argmin": torch.argmin,
    "var_mean": _var_mean,
    "matmul": torch.matmul,
    "full": _full,
    "iota": _iota,
    "random_seed": _random_seed,
    "uniform": _uniform,
    "take": _take,
    "take_along_axis": lambda x, index, dim: torch.gather(x, dim, index),
    "index_add": lambda x, index, value, dim: torch.index_add(x, dim, index, value),
    "index_copy": lambda x, index, value, dim: torch.index_copy(x, dim, index, value),
    "scatter_add": lambda x, index, value, dim: torch.scatter_add(x, dim, index, value),
    "tensor_constant": lambda value: value,
    "copy_": _copy_,
    "copy_to_out_": _copy_to_out_,
    "where": torch.where,
    "maximum": _maximum,
    "minimum": _minimum,
    **{name: _scalars_as_tensors(getattr(torch, name))
       for name in ("fmod", "atan2", "copysign", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                    "logical_xor")},
    "lerp": torch.lerp,
}

for _op, (_, _fn) in prims.NUMBER_OPS.items():
    _PRIM_IMPLS[f"num_{_op}"] = _fn

for _name, _sym in prims.ALL_PRIMS.items():
    _impl = _PRIM_IMPLS.get(_name) or getattr(torch, _name, None)
    if _impl is None:
        raise RuntimeError(f"the torch executor has no implementation of prims.{_name}")
    ex.register_implementation(_sym, _impl)

for _name, _impl in ltorch_eager_implementations().items():
    ex.register_implementation(_name, _impl)

register_executor(ex, default=True)
torch_executor = ex
