"""Python values read from a tensor's metadata inside a jitted function: every one equals eager's on every call.

A trace keeps such a value as a constant, so the entry's guard must check whatever the value depends on:
a later call whose tensors have the same sizes but another storage offset, strides, view flag or memory must
miss (or hit an entry made for that value), never return the first call's answer. The fuzz below reads each
query on each call of a random sequence of same-shaped inputs laid out differently, in both cache modes.
"""

from __future__ import annotations

import random

import pytest
import torch

import minijit
from minijit.errors import MinijitError

_BASE = torch.randn(200, dtype=torch.complex64)


def _laid_out(kind: str) -> torch.Tensor:
    """A (4, 6) complex tensor laid out as `kind` says."""
    if kind == "contiguous":
        return torch.randn(4, 6, dtype=torch.complex64)
    if kind == "offset 10":
        return _BASE[10:34].view(4, 6)
    if kind == "offset 0":
        return _BASE[0:24].view(4, 6)
    if kind == "transposed":
        return torch.randn(6, 4, dtype=torch.complex64).t()
    if kind == "column slice":
        return torch.randn(4, 9, dtype=torch.complex64)[:, 2:8]
    if kind == "expanded":
        return torch.randn(1, 6, dtype=torch.complex64).expand(4, 6)
    if kind == "conj":
        return torch.randn(4, 6, dtype=torch.complex64).conj()
    if kind == "conj offset 10":
        return _BASE[10:34].view(4, 6).conj()
    raise AssertionError(kind)


KINDS = ["contiguous", "offset 10", "offset 0", "transposed", "column slice", "expanded", "conj", "conj offset 10"]

# Each query: what user code reads, on the input and on tensors the function computes from it.
QUERIES = {
    "storage_offset": lambda x: x.storage_offset(),
    "stride": lambda x: x.stride(),
    "stride(1)": lambda x: x.stride(1),
    "is_contiguous": lambda x: x.is_contiguous(),
    "is_contiguous channels_last": lambda x: x.reshape(1, 4, 6, 1).is_contiguous(memory_format=torch.channels_last),
    "is_conj": lambda x: x.is_conj(),
    "is_neg": lambda x: x.imag.is_neg(),
    "conj of input is_conj": lambda x: x.conj().is_conj(),
    "conj imag is_neg": lambda x: x.conj().imag.is_neg(),
    "computed is_conj": lambda x: (x * 2).is_conj(),
    "layout": lambda x: x.layout,
    "dim_order": lambda x: x.dim_order(),
    "slice offset": lambda x: x[1:].storage_offset(),
    "transpose stride": lambda x: x.t().stride(),
    "nbytes": lambda x: x.nbytes,
    "itemsize": lambda x: x.itemsize,
    "element_size": lambda x: x.element_size(),
    "device.index": lambda x: x.device.index,
    "is_sparse": lambda x: x.is_sparse,
    "offset branch": lambda x: x * 2 if x.storage_offset() == 0 else x - 1,
    "aligned": lambda x: x.data_ptr() % 64 == 0,
    "same memory as itself": lambda x: x.data_ptr() == x.data_ptr(),
}


def _outcome(fn, x):
    try:
        return ("value", fn(x))
    except Exception as e:
        return ("raised", type(e))


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "raised":
        return issubclass(b[1], a[1]) or issubclass(a[1], b[1])
    if isinstance(a[1], torch.Tensor):
        return isinstance(b[1], torch.Tensor) and torch.equal(a[1], b[1])
    return type(a[1]) is type(b[1]) and a[1] == b[1]


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
@pytest.mark.parametrize("query", list(QUERIES))
def test_metadata_reads_equal_eager_on_every_call(query, cache):
    fn = QUERIES[query]
    rng = random.Random(f"{query}/{cache}")
    jf = minijit.jit(fn, cache=cache)
    for kind in [rng.choice(KINDS) for _ in range(12)]:
        x = _laid_out(kind)
        eager, jitted = _outcome(fn, x), _outcome(jf, x)
        if jitted[0] == "raised" and issubclass(jitted[1], MinijitError):
            pytest.fail(f"{query} on a {kind} input: refused ({jitted[1].__name__}) where eager gives {eager}")
        assert _same(eager, jitted), f"{query} on a {kind} input: eager {eager}, minijit {jitted}"


def test_data_ptr_relations_follow_the_inputs_memory():
    def same_memory(a, b):
        return a.data_ptr() == b.data_ptr()

    jf = minijit.jit(same_memory)
    t, u = torch.randn(3), torch.randn(3)
    for a, b in [(t, t), (t, u), (u, u), (u, t), (t, t)]:
        assert jf(a, b) == same_memory(a, b)


def test_a_computed_tensor_s_data_ptr_is_refused_by_name():
    jf = minijit.jit(lambda x: (x + 1).data_ptr())
    with pytest.raises(MinijitError, match="data_ptr"):
        jf(torch.randn(3))


def test_a_sparse_input_is_refused_even_after_a_strided_call_of_the_same_shape():
    def f(x):
        return x.layout, x * 2

    jf = minijit.jit(f)
    dense = torch.randn(2, 3)
    assert jf(dense)[0] == f(dense)[0]
    with pytest.raises(MinijitError, match="sparse"):
        jf(dense.to_sparse())
