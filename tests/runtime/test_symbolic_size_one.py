"""Sizes traced at 1 under `cache="symbolic values"` (issue 28): a batch of 1, a feature map of 1x1.

A size of 1 among the inputs is symbolic like any other: a trace made for it serves other sizes
unless the code decided something on the size being 1. Such decisions are guarded: broadcasting
a symbolic size against another size (not against a literal 1), `squeeze`, a view that merges dims
of a layout seen at size 1, a branch on the size. Every result is compared with eager, and a trace
made for size 1 must not be reused where size 1 changed the answer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minijit
from minijit.errors import MinijitError


def _serve(fn, calls):
    """Run the jitted `fn` (symbolic values) on each argument tuple of `calls`, compared with eager; the jitted fn."""
    jf = minijit.jit(fn, cache="symbolic values")
    for args in calls:
        torch.testing.assert_close(jf(*args), fn(*args))
    return jf


def _misses(jf) -> int:
    return minijit.cache_info(jf).misses


def test_a_batch_of_one_then_larger_batches_trace_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3), nn.Softmax(-1)).eval()
    with torch.no_grad():
        jm = _serve(model, [(torch.randn(b, 5, 6),) for b in (1, 2, 3, 1, 7)])
    assert _misses(jm) == 1


def test_a_spatial_size_of_one_then_larger_sizes_trace_once():
    torch.manual_seed(0)
    w, bias = torch.randn(4, 3, 3, 3), torch.randn(4)

    def f(x):
        y = F.conv2d(x, w, stride=2, padding=1) + bias[:, None, None]  # 1x1 for a 1x1 or 2x2 image
        y = F.relu(y) * y.mean((2, 3), keepdim=True)
        return F.adaptive_avg_pool2d(y, 1).flatten(1)

    jf = _serve(f, [(torch.randn(b, 3, s, s),) for b, s in [(1, 1), (1, 2), (2, 5), (3, 9), (1, 6)]])
    assert _misses(jf) == 1


class _Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 4))  # a parameter's sizes are constants: a literal 1

    def forward(self, x):
        centred = x - x.mean(0, keepdim=True)  # a literal 1 against the symbolic batch
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), centred], 1)  # expanded to the batch
        return tokens * x.sum(1)[:, None, :]


def test_keepdim_and_unsqueezed_sizes_broadcast_against_a_batch_of_one():
    model = _Tokens()
    with torch.no_grad():
        jm = _serve(model, [(torch.randn(b, 3, 4),) for b in (1, 4, 2, 1)])
    assert _misses(jm) == 1


def test_two_inputs_with_batches_of_one_stay_one_batch_size():
    """Two sizes of 1 broadcast together are guarded equal, not 1: the trace serves equal batches."""
    def f(x, mask):
        return (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)

    jf = _serve(f, [(torch.randn(b, 5, 3), torch.rand(b, 5) + 0.1) for b in (1, 3, 2)])
    assert _misses(jf) == 1
    x, mask = torch.randn(1, 5, 3), torch.rand(3, 5) + 0.1  # x's batch of 1 broadcasts: not that trace
    torch.testing.assert_close(jf(x, mask), f(x, mask))
    assert _misses(jf) == 2


def test_two_symbolic_sizes_broadcast_only_as_traced():
    def f(a, b):
        return a + b

    jf = minijit.jit(f, cache="symbolic values")
    shapes = [((1, 4), (3, 4)), ((1, 4), (6, 4)),  # a broadcasts: one trace, guarded a.shape[0] == 1
              ((3, 4), (3, 4)), ((5, 4), (5, 4)),  # equal sizes of 2 or more: a second trace
              ((2, 4), (1, 4)), ((7, 4), (1, 4)),  # b broadcasts: a third
              ((1, 4), (1, 4)), ((6, 4), (6, 4)),  # equal sizes of 1 (traced apart from those of 2 or more)
              ((1, 4), (2, 4))]                    # a broadcasts again: the first trace
    for sa, sb in shapes:
        a, b = torch.randn(sa), torch.randn(sb)
        out = jf(a, b)
        assert out.shape == f(a, b).shape
        torch.testing.assert_close(out, f(a, b))
    assert _misses(jf) == 4


def test_a_trace_made_for_equal_sizes_of_one_is_not_reused_to_broadcast():
    """Traced with two sizes of 1 (equal: no broadcast), a call where one is 1 and the other 5 broadcasts."""
    def f(a, b):
        return (a * b).sum(0)

    jf = minijit.jit(f, cache="symbolic values")
    a, b = torch.randn(1, 3), torch.randn(1, 3)
    torch.testing.assert_close(jf(a, b), f(a, b))
    a, b = torch.randn(1, 3), torch.randn(5, 3)
    out = jf(a, b)
    torch.testing.assert_close(out, f(a, b))
    assert out.shape == (3,) and _misses(jf) == 2
    a, b = torch.randn(4, 3), torch.randn(4, 3)  # equal again: the first trace serves it
    torch.testing.assert_close(jf(a, b), f(a, b))
    assert _misses(jf) == 2


def test_a_trace_where_a_size_of_one_broadcast_refuses_sizes_that_cannot():
    def f(a, b):
        return a + b

    jf = minijit.jit(f, cache="symbolic values")
    jf(torch.randn(1, 4), torch.randn(3, 4))
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    with pytest.raises(RuntimeError):
        f(a, b)
    with pytest.raises(MinijitError, match="broadcast"):
        jf(a, b)


def test_an_in_place_write_broadcasts_a_batch_of_one_only_as_traced():
    def f(x, y):
        x = x.clone()
        x.add_(y)
        return x

    jf = _serve(f, [(torch.randn(3, 4), torch.randn(1, 4)), (torch.randn(5, 4), torch.randn(1, 4)),
                    (torch.randn(3, 4), torch.randn(3, 4))])
    assert _misses(jf) == 2  # y broadcast (y.shape[0] == 1), then y of the written size


def test_squeeze_of_a_size_traced_at_one_is_guarded():
    def f(x):
        return x.squeeze(1) * 2

    jf = _serve(f, [(torch.randn(2, 1, 3),), (torch.randn(4, 1, 3),), (torch.randn(2, 5, 3),), (torch.randn(2, 1, 3),)])
    assert _misses(jf) == 2


def test_a_branch_on_a_size_traced_at_one_is_guarded():
    def f(x):
        if x.shape[0] <= 1:  # a comparison with 1 that a size traced at 1 does not imply
            return x * 2
        return x * 3

    jf = _serve(f, [(torch.randn(1, 3),), (torch.randn(5, 3),), (torch.randn(1, 3),), (torch.randn(2, 3),)])
    assert _misses(jf) == 2


def test_a_merging_view_of_a_layout_seen_at_size_one_is_not_reused_where_eager_cannot_view():
    """At size 1 the transposed, activated tensor is contiguous and `view` merges its dims; at 5 eager raises."""
    def f(x):
        y = F.gelu(x.transpose(1, 2))
        return y.view(x.shape[0], -1)

    jf = minijit.jit(f, cache="symbolic values")
    x = torch.randn(2, 1, 3)
    torch.testing.assert_close(jf(x), f(x))
    x = torch.randn(2, 5, 3)
    with pytest.raises(RuntimeError):
        f(x)
    with pytest.raises((MinijitError, RuntimeError), match="view"):
        jf(x)
    x = torch.randn(4, 1, 3)  # a size 1 again, another batch: the first trace serves it
    torch.testing.assert_close(jf(x), f(x))
    assert _misses(jf) == 2


def _reshape_viewed_at_size_one(x):
    """At size 1 the reshape of the transposed input views it, so its product is not contiguous, `contiguous()`
    copies and the write into the copy is lost; at 2 the reshape copies, `contiguous()` returns the product itself
    and the write lands in it. A trace made at size 1 is not reused at 2 (found by the layout fuzzer, seed 1112)."""
    y = x.transpose(0, 2)
    z = y.reshape(y.shape[0], -1).reshape(y.shape) * 1
    z.contiguous().add_(1)
    return z


def _computed_size_becomes_one(x):
    """`x[:, ::2]` has ceil(n / 2) rows: 2 at n = 3, 1 at n = 2, where the transposed product becomes contiguous,
    `contiguous()` returns it and the write lands in it; at 3 it copies. A trace made at 3 is not reused at 2,
    though x's sizes are all 2 or more (found by the layout fuzzer, seed 11144)."""
    y = x[:, ::2].transpose(0, 1) * 1
    y.contiguous().add_(1)
    return y


def _sum_broadcast_back_over_views(x):
    """At x's dim 0 of 1 the product is not contiguous (its strides follow the transposed views'), at 3 it is:
    `contiguous()` copies at 1 and returns the product at 3, where the write lands in it. Torch's views lay out
    the size-1 dim with symbolic sizes otherwise than with the traced ones, which contiguity does not read; a
    trace made at 1 is not reused at 3 (found by the layout fuzzer, seed 8233)."""
    y = x.view(x.shape[0] * x.shape[1], x.shape[2]).view(x.shape).transpose(1, 2)
    y = y.view(y.shape[0], 1, *y.shape[1:]).squeeze(1).transpose(0, 1)
    y = (y.sum(-1, keepdim=True) + y) * 1
    y.contiguous().add_(1)
    return y


@pytest.mark.parametrize("cache", ["symbolic values", "automatic"])
@pytest.mark.parametrize("program, shapes", [
    (_reshape_viewed_at_size_one, [(2, 1, 3), (4, 1, 5), (3, 2, 3), (2, 1, 3), (5, 3, 2)]),
    (_computed_size_becomes_one, [(2, 3, 2), (3, 3, 2), (2, 2, 2), (2, 5, 3), (3, 2, 2)]),
    (_sum_broadcast_back_over_views, [(1, 3, 3), (3, 3, 3), (4, 3, 3), (3, 2, 3), (1, 3, 3)]),
])
def test_a_write_through_contiguous_lands_as_eager_where_a_size_of_one_changes_contiguity(program, shapes, cache):
    jf = minijit.jit(program, cache=cache)
    for shape in shapes:
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), program(x))


def test_attention_with_a_mask_broadcast_over_a_batch_of_one():
    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])

    def args(b, t):
        mask = torch.zeros(b, t)
        mask[-1, :1] = float("-inf")
        return torch.randn(b, 2, t, 4), torch.randn(b, 2, t, 4), torch.randn(b, 2, t, 4), mask

    jf = _serve(f, [args(1, 3), args(2, 3), args(1, 5), args(3, 6)])
    assert _misses(jf) == 1
