"""OpInfo samples of one structure, other sizes, through one function jitted with symbolic values, against eager.

The OpInfo sweep (tests/ops/test_opinfo.py) gives each sample a fresh `jit`, traced on constant sizes. Here an
entry's samples are grouped by structure (the same arguments, tensor ranks and dtypes, non-tensor values) and
each group runs through one `minijit.jit(fn, cache="symbolic values")`: its first call traces with symbolic sizes
and later calls reuse that trace wherever its guards hold. A rule that bakes a size-dependent decision in without
a guard gives a wrong answer on the next size. A group of one sample is completed with copies where every dim of
one size is changed (to that size + 1, to 1, to 0) and eager accepts them. Each call's outputs and inputs afterwards,
and in float64 where the entry supports autograd its input gradients, must equal eager's; a refusal is skipped
(the OpInfo sweep lists them). Each CI lane runs its slice of the entries (tests.lanes);
`MINIJIT_OPINFO_SYMBOLIC_FULL=1` runs every entry, and all its groups (CI: the first three per dtype).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._pytree import tree_flatten, tree_unflatten

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
    supports_grad,
)

FULL = os.environ.get("MINIJIT_OPINFO_SYMBOLIC_FULL", "") not in ("", "0")
STRIDE = 1 if FULL else 12
SAMPLES = 8  # the first samples of an entry that are grouped
GROUP = 3  # samples of other sizes per group
GROUPS = None if FULL else 3  # groups per entry and dtype (each traces anew)


def _entries() -> list[Any]:
    chosen = op_db()[(LANE * max(STRIDE // LANES, 1)) % STRIDE::STRIDE]
    return [info for info in chosen if entry_name(info) not in UNSPECIFIED_VALUES and forward_dtypes(info)]


def _structure(sample: Any) -> tuple[str, tuple[Any, ...]]:
    leaves, spec = tree_flatten(as_arguments(sample))
    return str(spec), tuple(("tensor", x.ndim, x.dtype, x.requires_grad) if isinstance(x, torch.Tensor) else repr(x)
                            for x in leaves)


def _shapes(sample: Any) -> tuple[Any, ...]:
    return tuple(tuple(x.shape) for x in tree_flatten(as_arguments(sample))[0] if isinstance(x, torch.Tensor))


def _regrown(x: Any, old: int, new: int) -> Any:
    """`x` with every dim of size `old` of size `new`, new values in its range (indices stay in range)."""
    if not isinstance(x, torch.Tensor) or old not in x.shape:
        return x
    shape = [new if d == old else d for d in x.shape]
    if x.dtype.is_floating_point or x.dtype.is_complex:
        t = torch.randn(shape, dtype=x.dtype)
    elif x.dtype == torch.bool:
        t = torch.rand(shape) < 0.5
    elif x.numel():
        t = torch.randint(int(x.min()), int(x.max()) + 1, shape, dtype=x.dtype)
    else:
        t = torch.zeros(shape, dtype=x.dtype)
    return t.requires_grad_(x.requires_grad)


def _resized(info: Any, sample: Any) -> list[Any]:
    """Copies of `sample` with one size changed everywhere (v -> v + 1, 1, 0) that eager accepts."""
    leaves, spec = tree_flatten(as_arguments(sample))
    if any(isinstance(x, torch.Tensor) and not (x.dtype.is_floating_point or x.dtype.is_complex) for x in leaves):
        return []  # integer tensors are indices or offsets into the others (eager's embedding_bag crashes on some)
    sizes = sorted({d for x in leaves if isinstance(x, torch.Tensor) for d in x.shape if d > 1})
    made = []
    for v in sizes[:2]:
        # eager's native_batch_norm dies of SIGFPE on a 0-size copy of its samples
        for new in (v + 1, 1) if "batch_norm" in info.name else (v + 1, 1, 0):
            reseed(len(made) + 7)
            a, b, k = tree_unflatten([_regrown(x, v, new) for x in leaves], spec)
            copy = SampleInput(a, args=tuple(b), kwargs=k)
            try:
                args = clone_arguments(as_arguments(copy))
                as_user_code(info.op)(args[0], *args[1], **args[2])
            except Exception:
                continue
            made.append(copy)
    return made[:GROUP - 1]


def _groups(info: Any, dtype: torch.dtype, grad: bool) -> list[list[Any]]:
    groups: dict[Any, list[Any]] = {}
    for i, sample in enumerate(entry_samples(info, dtype, requires_grad=grad)):
        if i >= SAMPLES:
            break
        group = groups.setdefault(_structure(sample), [])
        if len(group) < GROUP and _shapes(sample) not in [_shapes(s) for s in group]:
            group.append(sample)
    for group in groups.values():
        if len(group) == 1:
            group.extend(_resized(info, group[0]))
    return [g for g in groups.values() if len(g) > 1][:GROUPS]


def _grads(outputs: Any, args: Any, cotangents: list[torch.Tensor] | None) -> tuple[list[Any], list[Any]]:
    outs = [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves = [x for x in tree_flatten(args)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
    if cotangents is None:
        reseed(1)
        cotangents = [torch.randn_like(t) for t in outs]
    if not outs or len(outs) != len(cotangents):
        return cotangents, outs
    grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
    return cotangents, [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]


def _run_group(info: Any, group: list[Any], dtype: torch.dtype, grad: bool) -> None:
    op = as_user_code(info.op)

    def call(a: Any, b: Any, k: Any) -> Any:
        return op(a, *b, **k)

    jf = minijit.jit(call, cache="symbolic values")
    for n, sample in enumerate(group + group[:1]):
        try:
            if is_random(info, sample):  # random, or eager reads uninitialized memory (an empty batch)
                continue
            theirs = clone_arguments(as_arguments(sample))
            reseed(0)
            want = call(*theirs)
            cotangents, want_grads = _grads(want, theirs, None) if grad else ([], [])
        except Exception:  # eager refuses the sample: nothing to compare
            continue
        ours = clone_arguments(as_arguments(sample))
        try:
            reseed(0)
            have = jf(*ours)
        except MinijitError:
            continue  # refused, with a message naming the op (the OpInfo sweep lists which)
        where = f"{entry_name(info)} {dtype}, call {n} of shapes {[_shapes(s) for s in group]} ({minijit.cache_info(jf)})"
        diff = compare(have, want, dtype, True, "output") or compare(ours, theirs, dtype, True, "input")
        assert diff is None, f"{where}: {diff}"
        if grad:
            _, have_grads = _grads(have, ours, cotangents)
            diff = compare(have_grads, want_grads, dtype, True, "grad")
            assert diff is None, f"{where}: {diff}"


@pytest.mark.filterwarnings("ignore::minijit.runtime.fallback.TracingRaisedWarning")
@pytest.mark.parametrize("info", _entries(), ids=entry_name)
def test_samples_of_one_structure_and_other_sizes_equal_eager_under_symbolic_values(info: Any) -> None:
    dtypes = forward_dtypes(info)
    dtype = torch.float32 if torch.float32 in dtypes else dtypes[0]
    for group in _groups(info, dtype, False):
        _run_group(info, group, dtype, False)
    if supports_grad(info):
        for group in _groups(info, torch.float64, True):
            _run_group(info, group, torch.float64, True)
