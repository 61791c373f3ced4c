"""The error inputs of PyTorch's OpInfo database (`error_inputs`) under `minijit.jit`: what eager refuses, minijit
refuses too, never returning a value. Its error is eager's type (user code may catch it), or a `MinijitError`
naming the op and the line where minijit refuses the call on its own (an out= tensor it would have to resize).

Also the out= cases found through them: an out= tensor of another dtype, which eager's elementwise ops cast into
and `gather`, `mm`, `amax`... refuse; an out= tensor sharing memory with an operand of an op that refuses any
overlap.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import minijit
from minijit.errors import InplaceError, MinijitError

ENTRIES = [info for info in op_db if info.error_inputs_func is not None]


def _error_cases(info: Any) -> list[Any]:
    torch.manual_seed(0)
    return list(info.error_inputs(device="cpu"))


# Ops some of whose error inputs minijit refuses with a MinijitError not of eager's type (its own refusal: an out= it
# would resize, an out= that is a view overlapping an operand, a data-dependent size, no meta kernel; or a check
# whose eager type is not found yet). Every other op raises eager's type.
OWN_REFUSALS = frozenset({
    "kthvalue", "masked_select", "__rdiv__", "index_select",
    "take", "histogramdd", "cat", "jiterator_binary", "jiterator_binary_return_by_ref",
})


@pytest.mark.parametrize("info", ENTRIES, ids=[f"{i.name}.{i.variant_test_name}".rstrip(".") for i in ENTRIES])
def test_what_eager_refuses_minijit_refuses(info: Any) -> None:
    for case in _error_cases(info):
        sample = case.sample_input
        args, kwargs = (sample.input, *sample.args), sample.kwargs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                info.op(*args, **kwargs)
            except Exception as error:  # what eager raises, minijit must raise
                eager = error
            else:
                continue  # this build of torch accepts it
            with pytest.raises(Exception) as raised:
                minijit.jit(lambda *a, **k: info.op(*a, **k))(*args, **kwargs)
        allowed = type(eager) | MinijitError if info.name in OWN_REFUSALS else type(eager)
        assert isinstance(raised.value, allowed), f"{info.name}: eager raised {eager!r}, minijit {raised.value!r}"


OUT_OF_ANOTHER_DTYPE = {
    "gather": lambda x, i, out: torch.gather(x, 1, i, out=out),
    "take": lambda x, i, out: torch.take(x, i, out=out),
    "index_select": lambda x, i, out: torch.index_select(x, 0, i[:, 0], out=out),
    "amax": lambda x, i, out: torch.amax(x, 1, keepdim=True, out=out),
    "mm": lambda x, i, out: torch.mm(x, x.t(), out=out),
    "clamp": lambda x, i, out: torch.clamp(x, 0, 1, out=out),
    "tril": lambda x, i, out: torch.tril(x, out=out),
    "add": lambda x, i, out: torch.add(x, 1, out=out),
    "cumsum": lambda x, i, out: torch.cumsum(x, 1, out=out),
    "sum": lambda x, i, out: torch.sum(x, 1, keepdim=True, out=out),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("name", list(OUT_OF_ANOTHER_DTYPE))
def test_out_of_another_dtype_as_eager(name: str, dtype: torch.dtype) -> None:
    """Eager casts into an out= tensor of another dtype for some ops and refuses it for others; minijit cast for all."""
    fn = OUT_OF_ANOTHER_DTYPE[name]
    x, index = torch.rand(3, 3), torch.tensor([[0, 2, 1], [1, 1, 0], [2, 0, 0]])
    shape = fn(x, index, None).shape
    expected_out, out = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    try:
        fn(x, index, expected_out)
    except RuntimeError as error:
        with pytest.raises(RuntimeError) as raised:
            minijit.jit(fn)(x, index, out)
        assert str(error).strip().splitlines()[0] in str(raised.value)  # eager's own words
        assert torch.equal(out, torch.zeros(shape, dtype=dtype))  # nothing written
    else:
        minijit.jit(fn)(x, index, out)
        torch.testing.assert_close(out, expected_out)


@pytest.mark.parametrize("name", ["gather", "take", "index_select", "take_along_dim"])
def test_out_sharing_memory_with_the_input_refused_as_eager(name: str) -> None:
    """These ops refuse any overlap of out= with an operand, the same elements included (as cat does)."""
    fn = {
        "gather": lambda x, i: torch.gather(x, 1, i, out=x),
        "take": lambda x, i: torch.take(x, i, out=x),
        "index_select": lambda x, i: torch.index_select(x, 0, i[:, 0], out=x),
        "take_along_dim": lambda x, i: torch.take_along_dim(x, i, 1, out=x),
    }[name]
    index = torch.tensor([[0, 2, 1], [1, 1, 0], [2, 0, 0]])
    with pytest.raises(RuntimeError):
        fn(torch.rand(3, 3), index)
    x = torch.rand(3, 3)
    before = x.clone()
    with pytest.raises(InplaceError, match="share memory"):
        minijit.jit(fn)(x, index)
    assert torch.equal(x, before)
