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

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from minijit.ir import BoundSymbol, TensorProxy
from minijit.ir.layouts import contiguous_strides

Strides = tuple[int, ...]

# Ops whose output the C++ kernel lays out by a rule of its own, not as a TensorIterator over its arguments:
# "contiguous" (it allocates a contiguous output), "like" (as `empty_like`: `clone`, the `*_like` factories, ops
# that write into a clone), "suggested" (channels-last where the 4-d input's strides suggest it, else contiguous),
# "convolution" (so, for the input or the weight, 5-d too), "batch_norm" (contiguous where the input is, else
# "suggested"), "roll" (a `cat` of two slices per dim); and
# "iterator": TensorIterator ops that are not tagged pointwise.
_OWN_RULE = {
    **dict.fromkeys(("aten::_softmax", "aten::_log_softmax", "aten::native_layer_norm", "aten::linalg_vector_norm",
                     "aten::log_sigmoid_forward", "aten::tril", "aten::triu", "aten::masked_fill.Scalar",
                     "aten::masked_fill.Tensor"), "contiguous"),
    **dict.fromkeys(("aten::clone", "aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like",
                     "aten::rand_like", "aten::randn_like", "aten::randint_like", "aten::flip", "aten::sort",
                     "aten::sort.stable", "aten::index_put", "aten::_prelu_kernel"), "like"),
    **dict.fromkeys(("aten::native_group_norm", "aten::pixel_shuffle", "aten::pixel_unshuffle"), "suggested"),
    "aten::convolution": "convolution",
    "aten::roll": "roll",
    **dict.fromkeys(("aten::native_batch_norm", "aten::_native_batch_norm_legit",
                     "aten::_native_batch_norm_legit.no_stats", "aten::_native_batch_norm_legit_no_training",
                     "aten::_native_batch_norm_legit_functional"), "batch_norm"),
    **dict.fromkeys(("aten::hardswish", "aten::floor_divide", "aten::floor_divide.Scalar"), "iterator"),
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
    if rule is None:
        return None
    if rule == "contiguous":
        return contiguous_strides(tuple(out.shape))
    if rule == "roll":
        return tuple(_rolled(args[0], args[1], args[2] if len(args) > 2 else kwargs.get("dims", ())).stride())
    if rule in ("suggested", "convolution", "batch_norm"):
        suggesting = args[:2] if rule == "convolution" else args[:1]
        if rule == "batch_norm" and _is_contiguous(*_sizes_strides(args[0])):
            return contiguous_strides(tuple(out.shape))
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


_RULES: dict[Any, str | None] = {}


def _rule_of(func: Any) -> str | None:
    """`func`'s rule in `_OWN_RULE`, "iterator" for another elementwise op, None for the rest (views, writes);
    kept per op, as the mode asks it of every op a replay runs."""
    if func not in _RULES:
        rule = _OWN_RULE.get(func.name(), "iterator" if torch.Tag.pointwise in func.tags else None)
        _RULES[func] = None if func._schema.is_mutable or func.is_view else rule
    return _RULES[func]


class _IteratorLayouts(TorchDispatchMode):
    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
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


@contextmanager
def iterator_layouts(device_type: str) -> Iterator[None]:
    """Within: elementwise ops and `*_like` factories on meta tensors lay out their outputs as eager's
    kernels on `device_type` ("cpu", "cuda") do."""
    with _IteratorLayouts(device_type):
        yield


def replay_layouts(bsym: BoundSymbol) -> AbstractContextManager[None]:
    """`iterator_layouts` for a replay of `bsym`, on the device of its first tensor argument; nothing for tensors
    on meta themselves, whose eager kernels are the meta ones."""
    devices = [x.device.type for x in bsym.proxy_args() if isinstance(x, TensorProxy)]
    device_type = devices[0] if devices else "cpu"
    return iterator_layouts(device_type) if device_type != "meta" else nullcontext()
