"""Gradients of OpInfo entries through one jitted function per entry, in the default cache mode, against eager.

tests/ops/test_opinfo_reuse.py checks the forward of an entry's samples through one `jit`; this checks their
gradients. OpInfo's samples mostly differ in rank, which a symbolic entry never serves: so the samples alike but
for their sizes run next to each other, and each runs as it is, then grown, then shrunk (`resized`: every size of
2 or more one longer, then one shorter). The first call is traced with constant sizes; one of other sizes makes
the changed sizes symbolic (the "automatic" mode) and the calls after it hit that entry, or widen it. The backward of such an
entry reads its sizes symbolically: a reduction's gradient broadcast back to the input's shape, `sum_to_size`
of a broadcast input, an index's scatter, a view's inverse. For each sample, the outputs and the gradients of
`sum(out * w)` (a fixed random `w` per output, so that every element matters) with respect to the inputs that
require grad must equal eager's. Inputs are laid out at random (permuted, or strided views into larger
buffers, the leaves too) from a seed per entry, so that a hit also sees other strides. Each CI lane runs its
own slice of the entries (tests.lanes); `MINIJIT_GRAD_REUSE_STRIDE=1` runs every one (and the slow ones on as many
samples as the others), `MINIJIT_GRAD_REUSE_SAMPLES=N` N samples of each (three calls each).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import MinijitError, TraceInvariantError
from tests.lanes import LANE, LANES
from tests.ops.opinfo_sweep import (
    GRAD_DTYPE,
    UNSPECIFIED_VALUES,
    as_arguments,
    as_user_code,
    clone_arguments,
    compare,
    entry_name,
    entry_samples,
    is_random,
    op_db,
    reseed,
    supports_grad,
)

STRIDE = int(os.environ.get("MINIJIT_GRAD_REUSE_STRIDE", "28"))
SAMPLES = int(os.environ.get("MINIJIT_GRAD_REUSE_SAMPLES", "4"))
# Entries whose samples take seconds each (3-d convolutions, grid sampling): two samples in a lane's slice.
SLOW = {"nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
        "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d", "grid_sampler_2d", "grid_sampler_3d",
        "nn.functional.grid_sample", "nn.functional.avg_pool3d", "nn.functional.max_unpool3d.grad", "einsum",
        "nn.functional.cosine_similarity", "_unsafe_masked_index_put_accumulate", "pca_lowrank", "svd_lowrank"}
CHANGES = (0, 1, -1)  # each sample as it is, then grown, then shrunk (`resized`)
POOL = 40  # the samples drawn per entry, to find those alike but for sizes
# Entries whose samples hold indices or offsets that eager does not check: a shrunk sample's, past the end, read
# memory out of bounds (`_segment_reduce`'s offsets) or wrap (`take_along_dim`): they run as they are only.
AS_THEY_ARE = {"take_along_dim", "_segment_reduce.offsets", "_segment_reduce.lengths"}


def entries(stride: int = STRIDE, lane: int = LANE) -> list[Any]:
    """Lane `lane`'s slice of the entries whose gradients are compared: every `stride`-th, from an offset per lane."""
    chosen = op_db()[(lane * max(stride // LANES, 1)) % stride::stride]
    return [info for info in chosen if entry_name(info) not in UNSPECIFIED_VALUES and supports_grad(info)]


@dataclass
class SampleResult:
    """One sample's comparison: `status` is equal, refused, wrong, error or skipped (eager refuses, or nothing
    to differentiate); `hit` whether the call reused an entry, `symbolic` whether the function had switched to
    symbolic sizes by then."""

    index: int
    change: int
    call: int
    sizes: list[tuple[int, ...]]
    status: str
    detail: str = ""
    hit: bool = False
    symbolic: bool = False


def _tensors(x: Any) -> list[Any]:
    if type(x).__module__ == "torch.return_types" or isinstance(x, list | tuple):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def _relayout(t: torch.Tensor, how: float) -> torch.Tensor:
    """`t`'s values in another layout: permuted in memory (how < 0.5) or a strided view into a larger buffer."""
    if t.ndim >= 2 and how < 0.5:
        order = list(range(t.ndim))[::-1]
        return t.permute(order).contiguous().permute(order)
    big = torch.zeros([2 * s for s in t.shape], dtype=t.dtype)
    return big[tuple(slice(None, None, 2) for _ in t.shape)].copy_(t)


def _laid_out(args: Any, rng: random.Random) -> Any:
    """`args` with each tensor (of 1 or more dims) relaid out at random; a leaf that requires grad stays a leaf."""
    def visit(x: Any) -> Any:
        if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
            return type(x)(visit(v) for v in x)
        if isinstance(x, dict):
            return {k: visit(v) for k, v in x.items()}
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.ndim == 0 or x.numel() == 0 \
                or rng.random() < 0.4:
            return x
        return _relayout(x.detach(), rng.random()).requires_grad_(x.requires_grad)

    return visit(args)


def _resize_tensor(t: torch.Tensor, change: int) -> torch.Tensor:
    """`t` with each dim of 2 or more (3 or more when shrinking) one longer or shorter (`change`): grown by a copy
    of its first slice, nudged where floating (values in an op's domain stay near it; no new ties), shrunk by
    dropping its last slice."""
    for dim, size in enumerate(t.shape):
        if size < (2 if change > 0 else 3):
            continue
        if change < 0:
            t = t.narrow(dim, 0, size - 1)
            continue
        extra = t.narrow(dim, 0, 1)
        if t.dtype.is_floating_point:
            extra = extra * 1.01 + 0.001
        t = torch.cat([t, extra], dim)
    return t


def resized(args: Any, change: int) -> Any:
    """`args` with each tensor's sizes of 2 or more changed by `change` (1 or -1), alike in every tensor (sizes
    that broadcast against each other still do; sizes 0 and 1 stay): the same call at other sizes."""
    def visit(x: Any) -> Any:
        if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
            return type(x)(visit(v) for v in x)
        if isinstance(x, dict):
            return {k: visit(v) for k, v in x.items()}
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
            return x
        return _resize_tensor(x.detach(), change).clone().requires_grad_(x.requires_grad)

    return visit(args)


def _copy(args: Any) -> Any:
    """A copy of `args` with each tensor in the same memory layout, leaves that require grad fresh leaves."""
    def visit(x: Any) -> Any:
        if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
            return type(x)(visit(v) for v in x)
        if isinstance(x, dict):
            return {k: visit(v) for k, v in x.items()}
        if not isinstance(x, torch.Tensor):
            return x
        if x.layout != torch.strided:
            return x.detach().clone().requires_grad_(x.requires_grad)
        # The whole storage: the elements between a strided view's own hold the same values too (`as_strided`
        # reads them).
        y = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage().clone(), x.storage_offset(), x.shape, x.stride())
        return y.requires_grad_(x.requires_grad)

    return visit(args)


def _grads(outputs: list[Any], weights: list[Any], leaves: list[Any]) -> list[Any]:
    """The gradients of `sum(o * w)` over the outputs that require grad, zeros where none flows."""
    terms = [(o * w).sum() for o, w in zip(outputs, weights) if o.requires_grad]
    got = torch.autograd.grad(sum(terms), leaves, allow_unused=True) if terms else [None] * len(leaves)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(got, leaves)]


def _weights(outputs: list[Any], index: int) -> list[Any]:
    generator = torch.Generator().manual_seed(1000 + index)
    return [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in outputs]


def _differentiable(outputs: list[Any]) -> list[int]:
    return [i for i, t in enumerate(outputs) if t.requires_grad and t.dtype.is_floating_point]


def run_sample(info: Any, jf: Any, call: Any, sample: Any, index: int, change: int, call_index: int,
               rng: random.Random) -> SampleResult:
    """Sample `index`, resized by `change` (0: as it is), the `call_index`-th call of `jf`, through `jf` and eagerly:
    outputs and weighted-sum gradients compared."""
    args = _laid_out(resized(as_arguments(sample), change) if change else clone_arguments(as_arguments(sample)), rng)
    sizes = [tuple(t.shape) for t in _tensors(args)]
    result = SampleResult(index, change, call_index, sizes, "skipped")
    theirs, ours = _copy(args), _copy(args)
    try:
        if is_random(info, sample):
            return result
        reseed(0)
        want = _tensors(call(*theirs))
        picked = _differentiable(want)
        leaves = [t for t in _tensors(theirs) if t.requires_grad]
        if not picked or not leaves:
            return result
        weights = _weights([want[i] for i in picked], index)
        want_grads = _grads([want[i] for i in picked], weights, leaves)
    except Exception:  # eager refuses the sample: nothing to compare
        return result
    before = minijit.cache_info(jf).hits if call_index else 0
    try:
        reseed(0)
        try:
            have = _tensors(jf(*ours))
        finally:
            info_now = minijit.cache_info(jf)
            result.hit, result.symbolic = info_now.hits > before, bool(info_now.dynamic)
        diff = compare(have, want, GRAD_DTYPE, True, "output")
        if diff is None:
            mine = [t for t in _tensors(ours) if t.requires_grad]
            diff = compare(_grads([have[i] for i in picked], weights, mine), want_grads, GRAD_DTYPE, True, "grad")
    except MinijitError as e:
        # A trace the verifier rejects is a bug in a pass, never a refusal.
        result.status = "error" if isinstance(e, TraceInvariantError) else "refused"
        result.detail = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return result
    except Exception as e:
        result.status, result.detail = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return result
    result.status, result.detail = ("wrong", diff) if diff else ("equal", "")
    return result


def _signature(x: Any) -> Any:
    """What the automatic mode's sizes-free key sees of the arguments: tensors by rank and dtype, numbers by type."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.ndim, x.dtype, x.requires_grad)
    if isinstance(x, list | tuple):
        return (type(x).__name__, *(_signature(v) for v in x))
    if isinstance(x, dict):
        return tuple((k, _signature(v)) for k, v in x.items())
    return type(x).__name__ if isinstance(x, int | float) and not isinstance(x, bool) else repr(x)


def reuse_order(info: Any, limit: int) -> list[tuple[int, Any]]:
    """Up to `limit` of the entry's first POOL float64 samples (with their index), those alike but for their sizes
    and numbers next to each other, groups of two or more first: the second of a group switches the function to
    symbolic sizes, the next ones hit or widen that entry."""
    groups: dict[Any, list[tuple[int, Any]]] = {}
    try:
        for index, sample in enumerate(entry_samples(info, GRAD_DTYPE, requires_grad=True)):
            if index >= POOL:
                break
            groups.setdefault(_signature(as_arguments(sample)), []).append((index, sample))
    except Exception:  # OpInfo's sample generator itself failed: the samples made so far
        pass
    ordered = sorted(groups.values(), key=lambda group: len(group) < 2)
    return [pair for group in ordered for pair in group][:limit]


def run_entry(info: Any, samples: int = SAMPLES) -> list[SampleResult]:
    """`samples` of the entry's float64 samples through one jitted function (default cache mode), in reuse order,
    each as it is, grown and shrunk (the second call of a sample switches to symbolic sizes or hits such an entry,
    the third hits it or widens it)."""
    op = as_user_code(info.op)

    def call(a: Any, b: Any, k: Any) -> Any:
        return op(a, *b, **k)

    jf = minijit.jit(call)
    rng = random.Random(entry_name(info))
    results = []
    changes = (0,) if entry_name(info) in AS_THEY_ARE else CHANGES
    calls = [(index, sample, change) for index, sample in reuse_order(info, samples) for change in changes]
    for call_index, (index, sample, change) in enumerate(calls):
        results.append(run_sample(info, jf, call, sample, index, change, call_index, rng))
    return results


# A symbolic size that torch's Python checks as an `int` makes the trace raise where eager does not: that call
# runs eagerly, with a TracingRaisedWarning, and its values are compared all the same.
@pytest.mark.filterwarnings("ignore::minijit.runtime.fallback.TracingRaisedWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("info", entries(), ids=entry_name)
def test_gradients_of_an_entry_through_one_jitted_function_equal_eager(info: Any) -> None:
    samples = 2 if entry_name(info) in SLOW and STRIDE > 1 else SAMPLES
    bad = [r for r in run_entry(info, samples) if r.status in ("wrong", "error")]
    assert not bad, "; ".join(f"sample {r.index} resized by {r.change} (call {r.call}) {r.sizes} (hit={r.hit}, "
                              f"symbolic={r.symbolic}): {r.status}: {r.detail}" for r in bad)
