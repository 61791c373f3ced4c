"""One jitted function per OpInfo entry, several of its samples through it, against eager.

The OpInfo sweep (tests/ops/test_opinfo.py) gives each sample a fresh `jit`. Here the samples of an entry share one,
in the default cache mode and with symbolic values from the first call. After the first sample, a call hits an entry
traced for another sample (other sizes, other layouts), or misses by its key or guard and traces. Either way its
results and its inputs afterwards must equal eager's: a hit is only as right as the guard that let it through. The
inputs are laid out at random (permuted, or strided views into larger buffers), from a seed per entry. Each CI lane
runs its own slice of the entries with CPU samples (tests.lanes); `MINIJIT_REUSE_STRIDE=1` runs every one.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_map

import minijit
from minijit.errors import MinijitError
from tests.lanes import LANE, LANES
from tests.ops.opinfo_sweep import (
    UNSPECIFIED_VALUES,
    as_arguments,
    as_user_code,
    clone_arguments,
    compare,
    entry_name,
    entry_samples,
    forward_dtypes,
    is_random,
    op_db,
    reseed,
)

STRIDE = int(os.environ.get("MINIJIT_REUSE_STRIDE", "8"))
SAMPLES = 6


def _entries() -> list[Any]:
    """This lane's slice of the database: every STRIDE-th entry, from an offset per lane."""
    chosen = op_db()[(LANE * max(STRIDE // LANES, 1)) % STRIDE::STRIDE]
    return [info for info in chosen if entry_name(info) not in UNSPECIFIED_VALUES and forward_dtypes(info)]


def _laid_out(rng: random.Random) -> Any:
    def relayout(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.ndim == 0 or t.requires_grad or rng.random() < 0.4:
            return t
        if t.ndim >= 2 and rng.random() < 0.5:
            order = list(range(t.ndim))
            rng.shuffle(order)
            return t.permute(order).contiguous().permute([order.index(i) for i in range(t.ndim)])
        big = torch.zeros([2 * s for s in t.shape], dtype=t.dtype)
        view = big[tuple(slice(None, None, 2) for _ in t.shape)]
        return view.copy_(t)

    return relayout


def _same_memory_copy(x: Any) -> Any:
    """`x` with each tensor a copy of its whole storage, viewed as the tensor views it: the elements between a
    strided view's own hold the same values too (an aten op reading them, `native_group_norm` of a strided weight,
    reads the same in eager and under minijit)."""
    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())

    return tree_map(copy, x)


# A symbolic size that torch's Python checks as an `int` (`linear_cross_entropy`'s chunk size) makes the trace raise
# where eager does not: that call runs eagerly, with a TracingRaisedWarning, and its values are compared all the same.
@pytest.mark.filterwarnings("ignore::minijit.runtime.fallback.TracingRaisedWarning")
@pytest.mark.parametrize("mode", ["automatic", "symbolic values"])
@pytest.mark.parametrize("info", _entries(), ids=entry_name)
def test_the_samples_of_an_entry_through_one_jitted_function_equal_eager(info: Any, mode: str) -> None:
    dtype = forward_dtypes(info)[0]
    op = as_user_code(info.op)

    def call(a: Any, b: Any, k: Any) -> Any:
        return op(a, *b, **k)

    jf = minijit.jit(call, cache=mode)
    rng = random.Random(entry_name(info))
    relayout = _laid_out(rng)
    tested = 0
    for sample in list(entry_samples(info, dtype, requires_grad=False))[:SAMPLES]:
        try:
            if is_random(info, sample):
                continue
            args = tree_map(relayout, clone_arguments(as_arguments(sample)))
            theirs = _same_memory_copy(args)
            reseed(0)
            want = call(*theirs)
        except Exception:  # eager refuses the sample: nothing to compare
            continue
        ours = _same_memory_copy(args)
        try:
            reseed(0)
            have = jf(*ours)
        except MinijitError:
            continue  # refused, with a message naming the op (the OpInfo sweep lists which)
        diff = compare(have, want, dtype, True, "output") or compare(ours, theirs, dtype, True, "input")
        assert diff is None, f"{entry_name(info)}, sample {tested} ({minijit.cache_info(jf)}): {diff}"
        tested += 1
