"""Every entry of PyTorch's OpInfo database under `minijit.jit`, against eager (tests/ops/opinfo_sweep.py).

Per entry: forward in float32, bfloat16 and an integer dtype (those it has CPU samples
for), gradients in float64 where it supports autograd. By default each entry runs on
its first two samples eager accepts per dtype, so CI covers every entry in about a
minute of CPU time;
`MINIJIT_OPINFO_FULL=1` runs every sample (about an hour on one core):

    MINIJIT_OPINFO_FULL=1 python -m pytest tests/ops/test_opinfo.py -n 2 -p no:warnings

A value that differs from eager's fails the test, and so does any exception that is not
a `MinijitError`. An entry minijit refuses must be listed below with the reason; an
entry listed as refused that runs equal on every sample fails the full sweep (so the
lists stay true). The coverage summary is printed at the end of the run
(tests/ops/opinfo_summary.py).
"""

from __future__ import annotations

import pytest

from tests.ops.opinfo_sweep import entry_name, forward_dtypes, op_db, run_entry, samples_per_entry

_DATA_DEPENDENT = "its output shape depends on the input's values"
_PYTHON_VALUE = "returns a Python value read from a tensor"
_VALUE_CHECK = "checks its input's values in Python (a .item() inside torch), which a trace cannot record"
_NO_META = "torch has no meta kernel for it, so its output shape is unknown"

# Entries minijit refuses (a MinijitError naming the op and line), forward and gradients alike.
REFUSED: dict[str, str] = {
    "item": _PYTHON_VALUE,
    "allclose": _PYTHON_VALUE,
    "equal": _PYTHON_VALUE,
    "nonzero": _DATA_DEPENDENT,
    "argwhere": _DATA_DEPENDENT,
    "masked_select": _DATA_DEPENDENT,
    "__getitem__": _DATA_DEPENDENT + " (a boolean mask index, x[mask])",
    "unique": _DATA_DEPENDENT,
    "unique_consecutive": _DATA_DEPENDENT,
    "bincount": _DATA_DEPENDENT,
    "combinations": "torch builds it with masked_select: " + _DATA_DEPENDENT,
    "repeat_interleave": _DATA_DEPENDENT + " (with a repeats tensor and no output_size)",
    "tensor_split": _DATA_DEPENDENT + " (with a tensor of indices)",
    "narrow": "a tensor start: eager returns a view at an offset read from the tensor",
    "linalg.lstsq": _DATA_DEPENDENT + " (the rank and singular values of some drivers)",
    "linalg.lstsq.grad_oriented": _DATA_DEPENDENT + " (as linalg.lstsq)",
    "nn.functional.one_hot": _DATA_DEPENDENT + " (num_classes=-1 reads the largest index)",
    "nn.functional.ctc_loss": _DATA_DEPENDENT + " (target lengths given as tensors)",
    "cov": _VALUE_CHECK,
    "corrcoef": _VALUE_CHECK,
    "istft": _VALUE_CHECK,
    "nn.functional.gaussian_nll_loss": _VALUE_CHECK,
    "histogram": _NO_META,
    "histogramdd": _NO_META,
    "geqrf": _NO_META,
    "sparse.sampled_addmm": _NO_META + " (sparse tensors)",
    "sparse.mm.reduce": _NO_META + " (sparse tensors)",
    "torch._scaled_mm": "a trace does not record strides, and this op requires a column-major argument",
    "torch._scaled_mm_v2": "as torch._scaled_mm",
    "resize_": "changes a tensor's shape in place, which a trace cannot follow",
    "to_sparse": "makes a sparse tensor; traced tensors are strided",
    "max_pool2d_with_indices_backward": "torch's meta kernel rejects some inputs its CPU kernel takes "
                                        "(ceil_mode with a stride tuple)",
}


def _cuda_only(info) -> str | None:
    return "no CPU dtypes in OpInfo (a CUDA-only entry)" if not forward_dtypes(info) else None


# Entries not run at all, with the reason (computed: OpInfo gives them no CPU samples).
SKIPPED: dict[str, str] = {entry_name(info): reason for info in op_db() if (reason := _cuda_only(info))}


@pytest.mark.parametrize("info", op_db(), ids=entry_name)
def test_opinfo_entry_matches_eager(info, record_property):
    name = entry_name(info)
    if name in SKIPPED:
        pytest.skip(SKIPPED[name])
    result = run_entry(info)
    record_property("opinfo", result.summary())
    outcomes = [("forward", result.forward)] + ([("grad", result.grad)] if result.grad is not None else [])
    for kind, outcome in outcomes:
        assert outcome.status != "wrong", f"{name} ({kind}) differs from eager: {outcome.detail}"
        assert outcome.status != "error", f"{name} ({kind}) raised a non-minijit error: {outcome.detail}"
        if outcome.status == "refused" and name not in REFUSED:
            pytest.fail(f"{name} ({kind}) is refused: {outcome.detail}; fix it, or add it to REFUSED with the reason")
    if samples_per_entry() is None and name in REFUSED:
        refused = any(outcome.status == "refused" for _, outcome in outcomes)
        assert refused, f"{name} now runs equal to eager on every sample: remove it from REFUSED"
