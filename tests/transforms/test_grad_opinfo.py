"""Gradients of every ltorch op with an OpInfo entry, on OpInfo's samples, against torch.autograd.

Each sample is run through `minijit.jit` of the ltorch symbol the OpInfo's torch
callable maps to (the op is called directly on proxies; no interpreter needed), and
the outputs and the gradients for a random cotangent are compared with eager torch.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import minijit
from minijit.ir import tree_flatten, tree_map
from minijit.ops.registry import ltorch_symbol_for
from tests.ops.opinfo_util import no_test_fn_lookup

SAMPLES_PER_OP = {torch.float64: 4, torch.float32: 2}
# Ops whose gradients have cases the first samples miss (zeros for prod; other dims, ties and
# 0-d inputs for sort and topk; a dim for repeat_interleave): every sample runs.
ALL_SAMPLES = {"prod", "sort", "topk", "digamma", "lgamma", "repeat_interleave"}


def _name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


OPS = [op for op in op_db if ltorch_symbol_for(op.op) is not None and op.supports_autograd
       and torch.float64 in op.supported_dtypes("cpu")]

# Failures that are not the grad transform's: the op's forward is unsupported or differs.
KNOWN = {
    "__getitem__": "slices in arguments are not hashable in the cache key (CPython 3.11)",
    "flip": "ltorch.flip takes dims positionally only",
    "gather": "ltorch.gather refuses int32 indices",
    "narrow": "tensor start is data-dependent",
    "norm.nuc": "nuclear norm not supported",
    "round.decimals_0": "round(decimals=) not supported",
    "round.decimals_3": "round(decimals=) not supported",
    "round.decimals_neg_3": "round(decimals=) not supported",
    "tensor_split": "tensor indices are data-dependent",
    "transpose": "ltorch.transpose fails on 0-d inputs",
    "take_along_dim": "the decomposition does not wrap negative indices (the forward under grad runs it)",
    "scatter": "differentiating scatter is not supported yet",
}

# Samples whose output shape depends on a tensor's values: minijit must refuse them with a clear error.
DATA_DEPENDENT = {
    "repeat_interleave": lambda sample: isinstance(sample.kwargs.get("repeats"), torch.Tensor),
}


def _outputs(x):
    if type(x).__module__ == "torch.return_types":
        x = tuple(x)
    return [t for t in tree_flatten(x) if isinstance(t, torch.Tensor)]


def _check_sample(op, sym, sample, atol: float, rtol: float) -> None:
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    leaves = [t for t in tree_flatten((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves:
        return
    want = _outputs(op.op(*args, **kwargs))
    # Tensors that need no gradient are cloned for minijit's run: an op that updates one in place
    # (batch norm's running statistics) must not change what eager's graph saved.
    fresh = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and not t.requires_grad else t, (args, kwargs))
    got = _outputs(minijit.jit(lambda *a, **k: sym(*a, **k))(*fresh[0], **fresh[1]))
    assert len(got) == len(want)
    pairs = []
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, equal_nan=True, atol=atol, rtol=rtol)
        if w.requires_grad and g.requires_grad:
            pairs.append((w, g))
        elif w.requires_grad:
            # Only where no gradient flows: eager marks the output of any op on inputs that
            # require grad; minijit's output then depends on them only through constants.
            zero = torch.autograd.grad(w, leaves, torch.ones_like(w), allow_unused=True)
            assert all(z is None or not z.any() for z in zero), "output lost its gradient"
    if not pairs:
        return
    cts = [torch.randn_like(w) for w, _ in pairs]
    want_g = torch.autograd.grad([w for w, _ in pairs], leaves, cts, allow_unused=True)
    got_g = torch.autograd.grad([g for _, g in pairs], leaves, cts, allow_unused=True)
    for i, (g, w) in enumerate(zip(got_g, want_g)):
        if w is None or w.numel() == 0:
            assert g is None or g.numel() == 0 or not g.any()
            continue
        if g is None:
            assert not w.any(), f"no gradient for input {i}"
            continue
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, equal_nan=True, atol=atol, rtol=rtol, msg=lambda m, i=i: f"grad {i}: {m}")


def _run(op, dtype: torch.dtype, atol: float, rtol: float) -> None:
    if _name(op) in KNOWN:
        pytest.xfail(KNOWN[_name(op)])
    sym = ltorch_symbol_for(op.op)
    data_dependent = DATA_DEPENDENT.get(_name(op), lambda sample: False)
    with no_test_fn_lookup():
        samples = op.sample_inputs("cpu", dtype, requires_grad=True)
    for i, sample in enumerate(samples):
        if data_dependent(sample):
            with pytest.raises(minijit.UnsupportedOpError, match="depends on the tensor's values"):
                minijit.jit(lambda *a, **k: sym(*a, **k))(sample.input, *sample.args, **sample.kwargs)
            continue
        if i >= SAMPLES_PER_OP[dtype] and _name(op) not in ALL_SAMPLES:
            break
        _check_sample(op, sym, sample, atol, rtol)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("op", OPS, ids=_name)
def test_grad_float64(op):
    torch.manual_seed(0)
    _run(op, torch.float64, atol=1e-7, rtol=1e-7)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("op", [op for op in OPS if torch.float32 in op.supported_dtypes("cpu")], ids=_name)
def test_grad_float32(op):
    torch.manual_seed(0)
    _run(op, torch.float32, atol=1e-4, rtol=1e-3)


def test_most_ops_are_covered():
    assert len(OPS) >= 100, [_name(op) for op in OPS]
