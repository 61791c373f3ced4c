"""The strides eager torch's C++ kernels give an elementwise op's output, for replays on meta tensors.

Layouts are worked out by running ops on meta tensors (`minijit.ops.strides`). For most ops the meta
kernel lays out its output as the CPU and CUDA kernels do, but the elementwise ops' meta kernels are
Python references with their own stride rule, and where an input has dims of size 1 they may pick
other strides than ATen's TensorIterator (`(x * 1).stride()` of a `(1, 1, 3)` tensor with strides
`(1, 1, 1)`: `(1, 1, 1)` on the CPU, `(3, 3, 1)` on meta). Broadcasting carries such a difference into
dims of other sizes, and a `contiguous()` or `view` decided on it would differ from eager's.

`iterator_layouts()` is a dispatch mode for those replays (on meta tensors, and on the fake tensors of
`minijit.ops.symbolic_strides`): each elementwise aten op (tagged `pointwise`) runs its meta kernel, and
its output is laid out again by TensorIterator's rule (`iterator_strides`), written here after ATen's
TensorIterator.cpp; ops whose C++ kernel allocates its output otherwise (`*_like` factories and `clone`
as `empty_like` does: `like_strides`, after TensorUtils.cpp) are listed in `_OWN_RULE`.
`tests/ops/test_iterator_layouts.py` compares them with real CPU tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from minijit.ir import BoundSymbol, Tag, TensorProxy
from minijit.ir.layouts import contiguous_strides

Strides = tuple[int, ...]

# Ops whose output the C++ kernel lays out by a rule of its own, not as a TensorIterator over its arguments:
# "contiguous" (it allocates a contiguous output), "like" (as `empty_like`: `clone`, the `*_like` factories, ops
# that write into a clone), "suggested" (channels-last where the 4-d input's strides suggest it, else contiguous),
# "convolution" (so, for the input or the weight, 5-d too; 3-d as 4-d), "batch_norm" (contiguous where the input
# is, else channels-last where it is, else "suggested"), "roll" (a `cat` of two slices per dim), "glu" (a
# TensorIterator over the input's halves), "fft" (the CPU's transforms: `_fft_strides`), "input" (a TensorIterator
# over the input alone, then written in place), "column_major" (`nonzero`'s (count, ndim) result); and "iterator":
# TensorIterator ops that are not tagged pointwise.
# Found by comparing meta with CPU tensors over OpInfo's samples in random layouts.
_OWN_RULE = {
    **dict.fromkeys(("aten::_softmax", "aten::_log_softmax", "aten::native_layer_norm", "aten::linalg_vector_norm",
                     "aten::log_sigmoid_forward", "aten::tril", "aten::triu", "aten::masked_fill.Scalar",
                     "aten::masked_fill.Tensor", "aten::rrelu_with_noise", "aten::mvlgamma", "aten::normal.Tensor_Tensor",
                     "aten::normal.Tensor_float", "aten::normal.float_Tensor", "aten::max_unpool3d"), "contiguous"),
    **dict.fromkeys(("aten::clone", "aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like",
                     "aten::rand_like", "aten::randn_like", "aten::randint_like", "aten::flip", "aten::sort",
                     "aten::sort.stable", "aten::index_put", "aten::_prelu_kernel", "aten::nan_to_num",
                     "aten::huber_loss", "aten::binary_cross_entropy"), "like"),
    **dict.fromkeys(("aten::native_group_norm", "aten::pixel_shuffle", "aten::pixel_unshuffle",
                     "aten::channel_shuffle", "aten::native_channel_shuffle", "aten::replication_pad2d",
                     "aten::replication_pad3d", "aten::reflection_pad2d", "aten::reflection_pad3d",
                     "aten::max_unpool2d"), "suggested"),
    "aten::convolution": "convolution",
    "aten::roll": "roll",
    "aten::glu": "glu",
    "aten::nonzero": "column_major",
    **dict.fromkeys(("aten::_fft_c2c", "aten::_fft_r2c", "aten::_fft_c2r"), "fft"),
    **dict.fromkeys(("aten::native_batch_norm", "aten::_native_batch_norm_legit",
                     "aten::_native_batch_norm_legit.no_stats", "aten::_native_batch_norm_legit_no_training",
                     "aten::_native_batch_norm_legit_functional", "aten::_batch_norm_with_update",
                     "aten::_batch_norm_with_update_functional", "aten::_batch_norm_no_update"), "batch_norm"),
    **dict.fromkeys(("aten::hardswish", "aten::floor_divide", "aten::floor_divide.Scalar", "aten::mse_loss",
                     "aten::smooth_l1_loss"), "iterator"),
    "aten::soft_margin_loss": "input",
}


def _channels_last(shape: Sequence[int]) -> Strides:
    _, c, h, w = shape
    return (max(h, 1) * max(w, 1) * max(c, 1), 1, max(w, 1) * max(c, 1), max(c, 1))


def _channels_last_3d(shape: Sequence[int]) -> Strides:
    _, c, d, h, w = (max(n, 1) for n in shape)
    return (d * h * w * c, 1, h * w * c, w * c, c)


def _channels_last_like(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """c10's `is_channels_last_strides_2d` (`_3d` for 5 dims): whether a 4-d (5-d) tensor's strides suggest
    channels-last."""
    if len(shape) not in (4, 5) or strides[1] == 0:
        return False
    least = 0
    for d in (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0):
        if shape[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return False
        least = strides[d] * (shape[d] if shape[d] > 1 else 1)
    return True


def _is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    if 0 in shape:
        return True
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def _is_channels_last(shape: Sequence[int], strides: Sequence[int]) -> bool:
    if len(shape) != 4:
        return False
    if 0 in shape:
        return True
    expected = 1
    for d in (1, 3, 2, 0):
        if shape[d] != 1:
            if strides[d] != expected:
                return False
            expected *= shape[d]
    return True


def _non_overlapping_and_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    if len(shape) == 1:
        return shape[0] < 2 or strides[0] == 1
    required = 1
    for d in sorted(range(len(shape)), key=lambda d: (bool(shape[d] < 2), strides[d])):
        if shape[d] < 2:
            return True
        if strides[d] != required:
            return False
        required *= shape[d]
    return True


def _insertion_perm(ndim: int, should_swap: Any) -> list[int]:
    """TensorIterator's order of dims, fastest first: an insertion sort that stops at the first strict
    comparison and moves past ambiguous ones (so it is no sort, and ties are resolved by position)."""
    perm = list(reversed(range(ndim)))
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm


def dense_strides(shape: Sequence[int], strides: Sequence[int]) -> Strides:
    """ATen's `infer_dense_strides`: a dense layout in the order of `strides` (what `empty_like` gives a
    tensor that is not dense)."""
    ndim = len(shape)
    if ndim <= 1:
        return (1,) * ndim

    def should_swap(d0: int, d1: int) -> int:
        s0, s1 = strides[d0], strides[d1]
        if s0 == 0 or s1 == 0:
            return 0
        if s0 != s1:
            return -1 if s0 < s1 else 1
        return 1 if shape[d0] > shape[d1] else 0

    out, step = [0] * ndim, 1
    for d in _insertion_perm(ndim, should_swap):
        out[d] = step
        if shape[d] > 1:
            step *= shape[d]
    return tuple(out)


def like_strides(shape: Sequence[int], strides: Sequence[int]) -> Strides:
    """`empty_like`'s strides (memory format preserved): the same where dense, else `dense_strides`."""
    return tuple(strides) if _non_overlapping_and_dense(shape, strides) else dense_strides(shape, strides)


def iterator_strides(shape: Sequence[int], operands: Sequence[tuple[Sequence[int], Sequence[int]]],
                     same_shape: bool) -> Strides:
    """The strides TensorIterator gives a fresh output of broadcast `shape` from its inputs' (sizes, strides),
    in argument order; `same_shape`: every operand (a number taken as a 0-d tensor included) has `shape`."""
    ndim = len(shape)
    if same_shape and operands:
        if all(_is_contiguous(*op) for op in operands):
            return contiguous_strides(tuple(shape))
        if all(_is_channels_last(*op) for op in operands):
            return _channels_last(shape)
        if all(_non_overlapping_and_dense(*op) for op in operands) \
                and all(tuple(op[1]) == tuple(operands[0][1]) for op in operands):
            return tuple(operands[-1][1])
    # Each operand's strides over the broadcast dims, 0 where it is broadcast.
    aligned = []
    for sizes, strides in operands:
        lead = ndim - len(sizes)
        aligned.append([0] * lead + [0 if n == 1 and shape[lead + i] != 1 else s
                                     for i, (n, s) in enumerate(zip(sizes, strides, strict=True))])

    def should_swap(d0: int, d1: int) -> int:
        for strides in aligned:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = _insertion_perm(ndim, should_swap) if ndim > 1 else list(range(ndim))
    if perm == list(reversed(range(ndim))):
        return contiguous_strides(tuple(shape))
    out, step = [0] * ndim, 1
    for d in perm:
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _rolled(t: torch.Tensor, shifts: Sequence[int], dims: Sequence[int]) -> torch.Tensor:
    """`t.roll(shifts, dims)` as ATen's CPU kernel makes it, each dim's the `cat` of two slices (whose layouts
    the meta kernels give as the CPU's)."""
    if not dims:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)  # a view of a rolled flat copy
    if len(dims) > 1:
        return _rolled(_rolled(t, shifts[:1], dims[:1]), shifts[1:], dims[1:])
    size = t.shape[dims[0]]
    if t.numel() == 0:
        return torch.empty_strided(t.shape, like_strides(*_sizes_strides(t)), dtype=t.dtype, device=t.device)
    start = (size - shifts[0]) % size
    return torch.cat([t.narrow(dims[0], start, size - start), t.narrow(dims[0], 0, start)], dims[0])


def _sizes_strides(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(t.shape), tuple(t.stride())


def _common_dtype(tensors: list[torch.Tensor], out: torch.Tensor) -> torch.dtype:
    if out.dtype != torch.bool:
        return out.dtype
    dims = [t for t in tensors if t.dim() > 0] or tensors
    dtype = dims[0].dtype
    for t in dims[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _probe_numbers_count(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether `func`'s C++ kernel takes its number arguments as operands (0-d tensors) of its iterator,
    which keeps it off the same-shape fast path: asked of the CPU once per op, with a `(1, 1, 3)` tensor
    strided `(1, 1, 1)`, which the fast path lays out `(3, 3, 1)` and the general path `(1, 1, 1)`."""
    def probe(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            shape = (1, 1, 3) if x.dim() > 0 else ()
            return torch.zeros(shape, dtype=x.dtype).as_strided(shape, (1,) * len(shape))
        return x
    with _disable_current_modes():  # real CPU tensors, under a fake tensor mode too
        pargs = [probe(a) for a in args]
        pkwargs = {k: probe(v) for k, v in kwargs.items()}
        out = func(*pargs, **pkwargs)
    out = out[0] if isinstance(out, tuple | list) else out
    return tuple(out.stride()) == (1, 1, 1)


_NUMBERS_COUNT: dict[Any, bool] = {}


def _pointwise_strides(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
                       device_type: str) -> Strides | None:
    flat = tree_flatten((args, kwargs))[0]
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    numbers = [x for x in flat
               if isinstance(x, int | float | complex | bool | torch.SymInt | torch.SymFloat | torch.SymBool)]
    shape = tuple(out.shape)
    if not tensors:
        return None
    operands = [_sizes_strides(t) for t in tensors]
    # On the CPU, and in `where` everywhere, an input of another dtype than the common one is converted
    # first, and a conversion lays out a tensor that is not dense densely.
    if device_type == "cpu" or func._schema.name == "aten::where":
        common = _common_dtype(tensors, out)
        operands = [(sizes, like_strides(sizes, strides)) if t.dim() > 0 and t.dtype != common else (sizes, strides)
                    for t, (sizes, strides) in zip(tensors, operands, strict=True)]
    same_shape = all(sizes == shape for sizes, _ in operands)
    if same_shape and numbers:
        key = (func, tuple(type(x) for x in flat))
        if key not in _NUMBERS_COUNT:
            if torch.Tag.nondeterministic_seeded in func.tags:
                return None  # (a probe would draw from the caller's generator)
            try:
                _NUMBERS_COUNT[key] = _probe_numbers_count(func, args, kwargs)
            except Exception:
                return None
        same_shape = not _NUMBERS_COUNT[key]
    return iterator_strides(shape, operands, same_shape)


def eager_strides(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
                  device_type: str) -> Strides | None:
    """The strides eager's C++ kernel gives `func`'s fresh output `out` (None where the meta kernel's are
    taken as they are): TensorIterator's for an elementwise op, `empty_like`'s for a `*_like` factory."""
    rule = _rule_of(func)
    if rule is None or out.dim() == 0:  # (a loss's reduction is 0-d)
        return None
    if rule == "contiguous":
        return contiguous_strides(tuple(out.shape))
    if rule == "roll":
        return tuple(_rolled(args[0], args[1], args[2] if len(args) > 2 else kwargs.get("dims", ())).stride())
    if rule == "fft":
        return None  # (on the CPU with MKL, made by `_fft_output` instead of the meta kernel; else meta's)
    if rule == "column_major":
        return column_major(tuple(out.shape)) if out.dim() == 2 else None
    if rule == "input":
        return iterator_strides(tuple(out.shape), [_sizes_strides(args[0])], tuple(args[0].shape) == tuple(out.shape))
    if rule == "glu":  # a TensorIterator over the input's two halves
        x, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", -1)
        half = x.shape[dim] // 2
        return iterator_strides(tuple(out.shape), [_sizes_strides(x.narrow(dim, start, half)) for start in (0, half)],
                                same_shape=True)
    if rule == "convolution" and len(out.shape) == 3:
        # A 1-d convolution runs as a 2-d one with a size-1 dim inserted at 2, its input made contiguous first.
        x = args[0] if _is_contiguous(*_sizes_strides(args[0])) else args[0].contiguous()
        if not any(_channels_last_like(*_sizes_strides(t.unsqueeze(2))) for t in (x, args[1])):
            return contiguous_strides(tuple(out.shape))
        return tuple(s for d, s in enumerate(_channels_last((out.shape[0], out.shape[1], 1, out.shape[2]))) if d != 2)
    if rule in ("suggested", "convolution", "batch_norm"):
        suggesting = args[:2] if rule == "convolution" else args[:1]
        if rule == "batch_norm" and _is_contiguous(*_sizes_strides(args[0])):
            return contiguous_strides(tuple(out.shape))
        if rule == "batch_norm" and _is_channels_last(*_sizes_strides(args[0])):
            return _channels_last(out.shape)
        if len(out.shape) not in (4, 5) or not any(_channels_last_like(*_sizes_strides(t)) for t in suggesting):
            return contiguous_strides(tuple(out.shape))
        return _channels_last(out.shape) if len(out.shape) == 4 else _channels_last_3d(out.shape)
    if rule == "like":
        memory_format = kwargs.get("memory_format")
        if memory_format not in (None, torch.preserve_format) or not isinstance(args[0], torch.Tensor) \
                or tuple(args[0].shape) != tuple(out.shape):
            return None
        return like_strides(*_sizes_strides(args[0]))
    return _pointwise_strides(func, args, kwargs, out, device_type)


def _fft_strides(name: str, x: torch.Tensor, dims: Sequence[int], out_shape: tuple[int, ...]) -> Strides:
    """The strides of a CPU transform's output where ATen runs it with MKL (`_exec_fft`): the dims not transformed
    outermost, in the order of the input's strides, then the transformed ones in the order the op picks (by the
    input's strides, but a one-sided transform's last dim stays last), laid out contiguously in that order."""
    dims = [d % x.dim() for d in dims]
    strides = tuple(x.stride())

    def by_stride(ds: Sequence[int]) -> list[int]:
        return sorted(ds, key=lambda d: -strides[d])  # (std::sort on few items: an insertion sort, stable)

    if name == "aten::_fft_c2r" and len(dims) > 1:  # a complex transform over all but the last dim first
        strides = _exec_fft_strides(tuple(x.shape), strides, by_stride(dims[:-1]))
        dims = dims[-1:]
    elif name == "aten::_fft_c2c":
        dims = by_stride(dims)
    elif name == "aten::_fft_r2c":
        dims = by_stride(dims[:-1]) + dims[-1:]
    return _exec_fft_strides(out_shape, strides, dims)


def _fft_output(name: str, x: torch.Tensor, dim: Sequence[int], normalization: int, last: Any) -> torch.Tensor:
    """A CPU transform's output (`_fft_c2c`, `_fft_r2c` with `last` its `onesided`, `_fft_c2r` with `last` its
    `last_dim_size`), made on `x`'s device with the strides MKL gives it."""
    shape = list(x.shape)
    dtype = x.dtype
    if name == "aten::_fft_r2c":
        dtype = dtype.to_complex()
        if last:
            shape[dim[-1]] = shape[dim[-1]] // 2 + 1
    elif name == "aten::_fft_c2r":
        dtype = dtype.to_real()
        shape[dim[-1]] = last
    strides = _fft_strides(name, x, dim, tuple(shape))
    return torch.empty_strided(shape, strides, dtype=dtype, device=x.device)


def _exec_fft_strides(shape: tuple[int, ...], strides: Strides, signal_dims: list[int]) -> Strides:
    # The dims not transformed are split off with std::partition, which swaps (and so reorders ties in the sort).
    order, first, last = list(range(len(shape))), 0, len(shape)
    while True:
        while first != last and order[first] not in signal_dims:
            first += 1
        if first == last:
            break
        last -= 1
        while first != last and order[last] in signal_dims:
            last -= 1
        if first == last:
            break
        order[first], order[last] = order[last], order[first]
        first += 1
    batch = sorted(order[:first], key=lambda d: -strides[d])
    out, step = [0] * len(shape), 1
    for d in reversed(batch + signal_dims):
        out[d] = step
        step *= shape[d]
    return tuple(out)


@functools.cache
def _transforms_use_mkl() -> bool:
    # MKL lays a transform's dim innermost; pocketfft (where this build has it) allocates contiguously.
    with _disable_current_modes():
        return tuple(torch.fft.fft(torch.zeros(2, 3), dim=0).stride()) == (1, 2)


_RULES: dict[Any, str | None] = {}


def _rule_of(func: Any) -> str | None:
    """`func`'s rule in `_OWN_RULE`, "iterator" for another elementwise op, None for the rest (views, writes);
    kept per op, as the mode asks it of every op a replay runs."""
    if func not in _RULES:
        rule = _OWN_RULE.get(func.name(), "iterator" if torch.Tag.pointwise in func.tags else None)
        # (An op that writes into an argument but returns fresh tensors, as `rrelu_with_noise` does, keeps its rule.)
        returns_an_argument = any(r.alias_info is not None for r in func._schema.returns)
        _RULES[func] = None if returns_an_argument or func.is_view else rule
    return _RULES[func]


class _IteratorLayouts(TorchDispatchMode):
    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if _rule_of(func) == "fft" and self.device_type == "cpu" and _transforms_use_mkl():
            return _fft_output(func.name(), *args, **kwargs)  # (not the meta kernel: torch 2.11's raises at some layouts)
        out = func(*args, **kwargs)
        if func in _LAPACK_COLUMN_MAJOR and self.device_type == "cpu":
            k = _LAPACK_COLUMN_MAJOR[func]
            r = out[k]
            return (*out[:k], torch.empty_strided(r.shape, column_major(tuple(r.shape)), dtype=r.dtype,
                                                  device=r.device), *out[k + 1:])
        if _rule_of(func) is None:
            return out
        results = out if isinstance(out, tuple) else (out,)
        if not all(isinstance(r, torch.Tensor) for r in results):
            return out
        strides = eager_strides(func, args, kwargs, results[0], self.device_type)
        if strides is None:
            return out
        # The rule lays out the outputs of the first's shape (`sort`'s indices too, not `native_layer_norm`'s mean).
        # Made under the modes below this one: a meta tensor, or a fake one in a fake tensor mode.
        fixed = tuple(torch.empty_strided(r.shape, strides, dtype=r.dtype, device=r.device)
                      if r.shape == results[0].shape and tuple(r.stride()) != strides else r for r in results)
        return fixed if isinstance(out, tuple) else fixed[0]


def _group_norm_as_on_the_cpu(grad: bool, input: torch.Tensor, num_groups: int,  # noqa: A002
                              weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                              eps: float = 1e-5, cudnn_enabled: bool = True) -> torch.Tensor:
    """`group_norm` as ATen runs it on the CPU: its input copied into the memory format its strides suggest (a
    channels-last image stays so), where other devices, meta among them, copy it contiguously."""
    suggested = _channels_last_like(*_sizes_strides(input))
    x = input.contiguous(memory_format=torch.channels_last if suggested and input.dim() == 4
                         else torch.channels_last_3d if suggested else torch.contiguous_format)
    hxw = 1
    for n in x.shape[2:]:
        hxw = hxw * n
    return torch.ops.aten.native_group_norm(x, weight, bias, x.shape[0], x.shape[1], hxw, num_groups, eps)[0]


def _max_pool1d_as_on_the_cpu(grad: bool, input: torch.Tensor, *args: Any,  # noqa: A002
                              **kwargs: Any) -> Any:
    """`max_pool1d` as ATen runs it on the CPU: where no grad is asked for, a kernel of its own that writes a
    contiguous output; else (and on other devices, meta among them) the 2-d kernel with indices, whose output
    follows the input's layout."""
    out = torch.nn.functional.max_pool1d(input, *args, **kwargs)
    if grad or isinstance(out, tuple):
        return out
    return torch.empty_strided(out.shape, contiguous_strides(tuple(out.shape)), dtype=out.dtype, device=out.device)


# LAPACK's results that the CPU returns column-major (each matrix transposed) and the meta kernels row-major, by
# position: `linalg.eig`'s eigenvectors, `_linalg_svd`'s `Vh` (so `torch.svd`'s `V`, its adjoint, is row-major).
_LAPACK_COLUMN_MAJOR = {torch.ops.aten.linalg_eig.default: 1, torch.ops.aten._linalg_svd.default: 2}


def column_major(shape: tuple[int, ...]) -> Strides:
    """The strides of a batch of matrices each laid out column-major, the batch dims outermost."""
    *batch, rows, columns = shape
    return (*contiguous_strides((*batch, rows * columns))[:-1], 1, rows) if batch else (1, rows)


# Composite functions whose CPU path lays out its input or output otherwise than their meta path does; a dispatch
# mode sees only the kernels, so these are replaced where they are called. Each takes whether the traced call
# asked for grad (its result requires grad), then the function's arguments.
_CPU_COMPOSITES: dict[Any, Any] = {
    torch.nn.functional.group_norm: _group_norm_as_on_the_cpu,
    torch.group_norm: _group_norm_as_on_the_cpu,
    torch.nn.functional.max_pool1d: _max_pool1d_as_on_the_cpu,
    torch.max_pool1d: _max_pool1d_as_on_the_cpu,
}


class _CpuComposites(TorchFunctionMode):
    def __init__(self, grad: bool) -> None:
        super().__init__()
        self.grad = grad

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        own = _CPU_COMPOSITES.get(func)
        return func(*args, **(kwargs or {})) if own is None else own(self.grad, *args, **(kwargs or {}))


@contextmanager
def iterator_layouts(device_type: str, grad: bool = False, composites: bool = True) -> Iterator[None]:
    """Within: elementwise ops and `*_like` factories on meta tensors lay out their outputs as eager's
    kernels on `device_type` ("cpu", "cuda") do; `grad`: whether the call replayed asked for grad;
    `composites`: whether it may call a function of `_CPU_COMPOSITES` (which then runs as on the CPU)."""
    with _CpuComposites(grad) if device_type == "cpu" and composites else nullcontext(), _IteratorLayouts(device_type):
        yield


def results_as_tuple(result: Any) -> Any:
    """A replay's results with torch's named result tuples (`torch.sort`'s values and indices, a structseq that
    the IR's flattening takes for one value) made plain tuples."""
    named = isinstance(result, tuple) and type(result) is not tuple and not hasattr(result, "_fields")
    return tuple(result) if named else result


def replay_layouts(bsym: BoundSymbol, impl: Any = None) -> AbstractContextManager[None]:
    """`iterator_layouts` for a replay of `bsym`, on the device of its first tensor argument; nothing for tensors
    on meta themselves, whose eager kernels are the meta ones."""
    devices = [x.device.type for x in bsym.proxy_args() if isinstance(x, TensorProxy)]
    device_type = devices[0] if devices else "cpu"
    if device_type == "meta":
        return nullcontext()
    # (The function mode costs each torch call a Python call: pushed where the replay may reach such a function,
    # its eager callable one of them or an opaque op.)
    composites = impl in _CPU_COMPOSITES or Tag.OPAQUE in bsym.sym.tags
    return iterator_layouts(device_type, any(isinstance(o, TensorProxy) and o.requires_grad
                                             for o in bsym.proxy_outputs()), composites)
