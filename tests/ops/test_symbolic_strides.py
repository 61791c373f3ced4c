"""Strides that follow symbolic sizes (minijit/ops/symbolic_strides.py): layout queries and `as_strided` under
`cache="symbolic values"` reuse one trace across sizes where torch's stride rules give the same formulas, and
retrace (or raise as eager does) where the layout truly changes with the sizes. Every result is compared with
eager's."""

from __future__ import annotations

import torch
from torch.nn import functional as F

import minijit
from tests.oputil import assert_refused_as_eager


def _check(fn, calls, traces: int) -> None:
    jf = minijit.jit(fn, cache="symbolic values")
    for args in calls:
        torch.testing.assert_close(jf(*args), fn(*args))
    assert minijit.cache_info(jf).misses == traces, minijit.cache_info(jf).miss_reasons


def _chunk(x: torch.Tensor, w: int) -> torch.Tensor:
    """Overlapping chunks of a (B, T, H, D) tensor, heads folded into the batch, as Longformer reads them."""
    b, t, h, d = x.shape
    y = x.transpose(1, 2).reshape(b * h, t, d)
    y = y.view(b * h, t // (2 * w), 2 * w, d)
    size = list(y.shape)
    size[1] = size[1] * 2 - 1
    stride = list(y.stride())
    stride[1] = stride[1] // 2
    return y.as_strided(size, stride) * 2


def test_strides_of_a_reshaped_transpose_follow_the_sizes() -> None:
    calls = [(torch.randn(b, t, h, 3),) for b, t, h in ((2, 8, 2), (3, 8, 2), (2, 16, 3), (4, 12, 5))]
    _check(lambda x: _chunk(x, 2), calls, 1)


def test_a_stride_query_gives_numbers_that_follow_the_sizes() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.transpose(0, 1).reshape(x.shape[1], -1)
        s = y.stride()
        return y.sum(0) * s[0] + s[1] + x.transpose(0, 1).stride(0)
    _check(fn, [(torch.randn(n, m),) for n, m in ((2, 3), (5, 3), (4, 7))], 1)


def _padded_chunks(v: torch.Tensor, w: int) -> torch.Tensor:
    """Longformer's chunking of a padded value: `pad` then `as_strided` with strides read from the pad's output."""
    b, t, d = v.shape
    padded = F.pad(v, (0, 0, w, w), value=-1)
    s = padded.stride()
    chunks = t // w - 1
    return padded.as_strided((b, chunks + 1, 3 * w, d), (s[0], w * s[1], s[1], s[2])) + 1


def test_pad_then_as_strided_chunks_over_several_sizes() -> None:
    calls = [(torch.randn(b, t, d),) for b, t, d in ((2, 8, 3), (3, 12, 3), (2, 16, 5), (5, 4, 2))]
    _check(lambda v: _padded_chunks(v, 2), calls, 1)


def _diagonalize(x: torch.Tensor) -> torch.Tensor:
    """Pad, view, slice and view again (Longformer's `_pad_and_diagonalize`): viewable at every size."""
    b, c, w, d = x.shape
    y = F.pad(x, (0, w + 1)).view(b, c, -1)[:, :, :-w]
    return y.view(b, c, w, w + d)[:, :, :, :-1] * 3


def test_a_view_of_a_slice_that_is_viewable_at_every_size() -> None:
    calls = [(torch.randn(b, c, w, d),) for b, c, w, d in ((2, 3, 2, 5), (4, 3, 2, 5), (2, 5, 3, 7))]
    _check(_diagonalize, calls, 1)


def test_a_view_of_a_slice_viewable_at_some_sizes_only_raises_as_eager() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x[:, :4].view(-1) + 1
    jf = minijit.jit(fn, cache="symbolic values")
    for shape in ((3, 4), (5, 4)):
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), fn(x))
    x = torch.randn(3, 6)  # x[:, :4] has gaps between its rows: eager cannot view it
    assert_refused_as_eager(jf, fn, x)


def test_a_size_one_dimension_changes_the_layout_and_is_never_wrong() -> None:
    # y = x.transpose(1, 2) * 2 keeps x's permuted layout; where x's dim 1 is 1 the strides differ.
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.transpose(1, 2) * 2
        s = y.stride()
        return y.as_strided((y.shape[0], y.shape[1] * y.shape[2]), (s[0], 1)) + 0
    jf = minijit.jit(fn, cache="symbolic values")
    for shape in ((2, 1, 3), (2, 4, 3), (3, 1, 5), (3, 5, 2), (2, 3, 1)):
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), fn(x))
    assert minijit.cache_info(jf).misses <= 3


def test_an_input_contiguous_at_one_call_and_not_at_another_retraces() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        s = x.stride()
        return x.as_strided((x.shape[0] * x.shape[1],), (min(s),)) * 2
    jf = minijit.jit(fn, cache="symbolic values")
    calls = [torch.randn(3, 4), torch.randn(5, 2), torch.randn(4, 3).t(), torch.randn(6, 2).t(), torch.randn(2, 7)]
    for x in calls:
        torch.testing.assert_close(jf(x), fn(x))
    assert minijit.cache_info(jf).misses <= 3
    assert minijit.cache_info(jf).misses >= 2  # the transposed inputs cannot reuse the contiguous trace


# -- a batch of 1 ----------------------------------------------------------------------------------
# Torch's stride rules decide some questions on whether a size is 1 (contiguity ignores a size-1 dim's
# stride). Where the answer for a size traced at 1 is the answer for any size of 2 or more with that size
# set to 1, a batch of 1 shares the trace; where it is not, it traces apart and matches eager.


def test_a_batch_of_one_shares_the_trace_of_larger_batches() -> None:
    # Longformer's layout: the sequence first, so folding the heads into the batch views at every batch.
    calls = [(torch.randn(t, b, 2, 3),) for b, t in ((1, 8), (2, 8), (3, 12), (1, 16))]
    _check(lambda x: _chunk(x.transpose(0, 1), 2), calls, 1)
    calls = [(torch.randn(b, c, 2, 5),) for b, c in ((1, 3), (4, 3), (2, 5), (1, 2))]
    _check(_diagonalize, calls, 1)


def test_a_batch_of_one_whose_layout_differs_traces_apart() -> None:
    # With the batch first, folding the heads into it views at a batch of 1 only (a copy otherwise):
    # the strides `_chunk` reads differ, so the batch of 1 has its own trace.
    calls = [(torch.randn(b, t, 2, 3),) for b, t in ((1, 8), (2, 8), (3, 12), (1, 16))]
    _check(lambda x: _chunk(x, 2), calls, 2)


def test_an_opaque_op_on_a_batch_of_one_shares_the_trace() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bcxd,bcyd->bcxy", a, b) + 1
    calls = [(torch.randn(n, 3, 4, 2), torch.randn(n, 3, 5, 2)) for n in (1, 2, 3, 1)]
    _check(fn, calls, 1)


def test_a_value_written_through_a_key_on_a_batch_of_one_shares_the_trace() -> None:
    def fn(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[:, :2] = v
        return y
    _check(fn, [(torch.randn(n, 5), torch.randn(n, 2)) for n in (1, 2, 4, 1)], 1)


def test_strides_of_a_layout_a_size_of_one_changes_match_eager_at_every_call() -> None:
    # A stride read from a layout that a size of 1 changes is a Python number the code goes on with: each
    # call's numbers must be eager's. (Only the strides of dims of other sizes: the stride of a size-1 dim
    # after an elementwise kernel depends on the kernel's path in eager itself.)
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.transpose(1, 2) * 2
        s = y.stride()
        return y.sum() * 0 + sum(st * 10 ** k for k, (st, n) in enumerate(zip(s, y.shape, strict=True)) if n != 1)
    jf = minijit.jit(fn, cache="symbolic values")
    for shape in ((2, 1, 3), (2, 4, 3), (1, 1, 5), (3, 5, 2), (2, 3, 1), (1, 4, 4), (3, 1, 1)):
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), fn(x))


def test_a_broadcast_only_a_size_of_one_allows_is_not_reused_for_larger_sizes() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bi,bi->bi", a, b) * 2
    jf = minijit.jit(fn, cache="symbolic values")
    for n in (1, 4):  # a's batch of 1 broadcasts against b's 4
        a, b = torch.randn(n, 3), torch.randn(4, 3)
        torch.testing.assert_close(jf(a, b), fn(a, b))
    assert_refused_as_eager(jf, fn, torch.randn(2, 3), torch.randn(4, 3))
