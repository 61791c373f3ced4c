"""0-dim integer tensors made of sizes and numbers only, then given as sizes (issue 28, Longformer's `_chunk`).

Eager makes `torch.div(x.size(1), n, rounding_mode="trunc")` a 0-dim int64 tensor and reads it through
`__index__` where a size is needed. Under `cache="symbolic values"` such a tensor keeps the number it holds
as an expression of the sizes (minijit/ops/number_args.py), so the trace stays symbolic: one trace for
every size. A tensor computed from data keeps the value-guard path. Every result is compared with eager's.
"""

from __future__ import annotations

import pytest
import torch

import minijit

MODES = ("symbolic values", "constant values")
SIZES = (8, 12, 16)


def _check(fn, calls, cache):
    """Each call's result equals eager's; returns the cache info."""
    jf = minijit.jit(fn, cache=cache)
    for args in calls:
        got, want = jf(*args), fn(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                        strict=True):
            assert type(g) is type(w) and g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)
    return minijit.cache_info(jf)


def _traces(cache, symbolic):
    return symbolic if cache == "symbolic values" else len(SIZES)


@pytest.mark.parametrize("cache", MODES)
def test_div_of_sizes_as_a_view_shape(cache) -> None:
    def f(x, n):
        k = torch.div(x.size(1), n, rounding_mode="trunc")
        return x.view(x.size(0), k, n), k

    info = _check(f, [(torch.randn(b, s), 4) for b, s in zip((2, 3, 2), SIZES, strict=True)], cache)
    assert info.misses == _traces(cache, 1), info.miss_reasons


@pytest.mark.parametrize("cache", MODES)
def test_longformer_chunks_count_in_reshape_and_new_zeros(cache) -> None:
    def f(x):
        chunks = torch.div(x.size(1), 4, rounding_mode="trunc") - 1
        y = torch.reshape(x, (x.size(0), chunks + 1, 4))
        return y + 1, y.new_zeros((x.size(0) * 2, chunks + 1, 3)), y.expand(2, x.size(0), chunks + 1, 4)

    info = _check(f, [(torch.randn(2, s),) for s in SIZES], cache)
    assert info.misses == _traces(cache, 1), info.miss_reasons


@pytest.mark.parametrize("cache", MODES)
def test_tensor_of_a_size_as_a_slice_bound(cache) -> None:
    def f(x):
        k = torch.floor_divide(torch.tensor(x.size(1)), 2)
        return x[:, :k] * 2, x[:, k - 1:]

    info = _check(f, [(torch.randn(2, s),) for s in SIZES], cache)
    assert info.misses == _traces(cache, 1), info.miss_reasons


@pytest.mark.parametrize("cache", MODES)
def test_trunc_division_of_a_negative_number_rounds_toward_zero(cache) -> None:
    def f(x):
        k = torch.div(1 - x.size(1), 2, rounding_mode="trunc")  # -3 for 8 where floor gives -4
        r = torch.remainder(torch.tensor(x.size(1)) * 3, 5) + torch.mul(k, -1)
        return x.new_zeros((-k, 2)), x.new_ones((r, 1)), k, r

    info = _check(f, [(torch.randn(2, s),) for s in SIZES], cache)
    assert info.misses == _traces(cache, 1), info.miss_reasons


@pytest.mark.parametrize("cache", MODES)
def test_range_and_int_of_a_tensor_of_sizes(cache) -> None:
    def f(x):
        k = torch.div(x.size(1), 4, rounding_mode="floor")
        total = sum(x[:, i] for i in range(k))
        return total, x[:, int(k)], x[:, k.__index__() + 1]

    info = _check(f, [(torch.randn(2, s),) for s in SIZES], cache)
    # range() and int() need a real int: the trace specialises on the number, as for range(x.size(1) // 4).
    assert info.misses == len(SIZES), info.miss_reasons


@pytest.mark.parametrize("cache", MODES)
def test_data_dependent_tensor_as_a_size_goes_through_the_value_guard(cache) -> None:
    def f(x):
        k = (x[0, 0] > 0).long() + 2
        return x.view(k, -1), k

    x = torch.ones(2, 12)
    info = _check(f, [(x,), (-x,), (x,), (-x,)], cache)
    assert info.misses == 2, info.miss_reasons
    assert any("value guard" in r for r in info.miss_reasons), info.miss_reasons


# Under "constant values" the tensor is folded (computed while tracing), and a write into it is refused (left
# alone: minijit/transforms/functionalize.py), so only the symbolic mode is checked here.
@pytest.mark.parametrize("cache", MODES[:1])
def test_tensor_of_sizes_written_in_place_is_read_again(cache) -> None:
    def f(x):
        k = torch.div(x.size(1), 4, rounding_mode="trunc")
        k.add_(1)  # its number is forgotten: the size read is of the written value
        return x.new_zeros((k, 2)), k

    info = _check(f, [(torch.randn(2, s),) for s in SIZES], cache)
    assert info.misses <= len(SIZES), info.miss_reasons
