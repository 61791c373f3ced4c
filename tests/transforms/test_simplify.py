"""simplify: lossless cast round trips go, lossy ones stay; repeated numbers are computed once; values match eager."""

from __future__ import annotations

import itertools

import pytest
import torch

import minijit
from minijit.ir import TensorProxy, Trace, tracing
from minijit.ops import prims
from minijit.transforms.simplify import is_lossless_cast, simplify

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _samples(dtype: torch.dtype) -> torch.Tensor:
    """Extreme and ordinary values of `dtype`."""
    if dtype == torch.bool:
        return torch.tensor([True, False])
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        vals = [fi.max, fi.min, fi.tiny, fi.tiny * fi.eps, 1 + fi.eps, -(1 + fi.eps), 0.1, 1 / 3, 12345.678, 0.0]
        return torch.tensor(vals, dtype=torch.float64).to(dtype)
    ii = torch.iinfo(dtype)
    vals = [ii.max, ii.min, ii.max - 1, 0, 1, -1 if ii.min < 0 else 2, 2**24 + 1 if ii.max > 2**24 else 3]
    return torch.tensor(vals, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(DTYPES, DTYPES)))
def test_is_lossless_cast_agrees_with_torch_round_trips(src, dst):
    x = _samples(src)
    exact = torch.equal(x.to(dst).to(src), x)
    if is_lossless_cast(src, dst):
        assert exact, f"{src} -> {dst} claimed lossless but {x} round trips to {x.to(dst).to(src)}"
    else:
        assert not exact, f"{src} -> {dst} round trips these samples exactly; is_lossless_cast says lossy"


def _cast_chain_trace(dtype: torch.dtype, middle: torch.dtype) -> Trace:
    t = Trace()
    with tracing(t):
        x = t.add_input(TensorProxy((3,), dtype, torch.device("cpu")), "x")
        y = prims.convert_element_type(x, middle)
        z = prims.convert_element_type(y, dtype)
        t.output = prims.mul(z, 2)
    return t


def test_bf16_f32_bf16_round_trip_is_removed():
    t = simplify(_cast_chain_trace(torch.bfloat16, torch.float32))
    (mul,) = [b for b in t.bound_symbols if b.sym is prims.mul]
    assert mul.args[0] is t.args[0]
    assert sum(b.sym is prims.convert_element_type for b in t.bound_symbols) == 1  # dce removes the rest


def test_f32_bf16_f32_round_trip_stays():
    before = _cast_chain_trace(torch.float32, torch.bfloat16)
    after = simplify(before)
    assert [b.sym for b in after.bound_symbols] == [b.sym for b in before.bound_symbols]
    (mul,) = [b for b in after.bound_symbols if b.sym is prims.mul]
    assert mul.args[0] is not after.args[0]


@pytest.mark.parametrize(("dtype", "middle"), [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                               (torch.float16, torch.float64), (torch.float64, torch.float16)])
def test_jit_values_match_eager(dtype, middle):
    x = torch.randn(64, dtype=torch.float64).to(dtype) * 3

    def f(x):
        return prims.convert_element_type(prims.convert_element_type(x, middle), dtype) * 2

    jf = minijit.jit(f)
    assert torch.equal(jf(x), x.to(middle).to(dtype) * 2)
    final = minijit.last_traces(jf)[-1].python(subsymbol_depth=0)
    assert ("torchex.convert_element_type(" in final) == (not is_lossless_cast(dtype, middle))


def test_returned_round_trip_of_an_input_is_not_aliased():
    # z = x.float().bfloat16() is a fresh tensor in eager; the pass must not return x itself.
    x = torch.randn(4, dtype=torch.bfloat16)
    jf = minijit.jit(lambda x: prims.convert_element_type(prims.convert_element_type(x, torch.float32), torch.bfloat16))
    out = jf(x)
    assert torch.equal(out, x)
    assert out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("shared", [False, True])
def test_returned_clone_of_a_clone_of_a_written_input_view_keeps_its_value(shared):
    # clone(clone(v)) of a view v of an input the trace then writes: returning v itself would give
    # the written value (a held-out fuzzer found it with inputs sharing one storage).
    def f(x0, x1):
        kept = x0[0::3].clone()
        x0.sub_(x0.reshape(-1))
        x1.mul_(1)
        return kept.clone()

    def inputs(base):
        return (base[0:4], base[3:7]) if shared else (base[0:4], base[4:8])

    base = torch.randn(8)
    ours, theirs = base.clone(), base.clone()
    torch.testing.assert_close(minijit.jit(f)(*inputs(ours)), f(*inputs(theirs)))
    torch.testing.assert_close(ours, theirs)


def _number_ops(jf: minijit.JitFunction) -> list[str]:
    return [str(b.args) for b in jf.last_traces()[-1].bound_symbols if b.sym.id.startswith(("num_", "torchex.num_"))]


def test_a_number_computed_again_from_the_same_arguments_is_computed_once():
    # An optimizer's weight decay factor, once per parameter: `1 - lr * wd`.
    def step(params, lr, wd):
        return [p * (1 - lr * wd) for p in params]

    params = [torch.randn(3) for _ in range(4)]
    jf = minijit.jit(step, cache="symbolic values")
    for lr in (0.1, 0.25):
        for have, want in zip(jf(params, lr, 0.01), step(params, lr, 0.01), strict=True):
            torch.testing.assert_close(have, want, rtol=0, atol=0)
    assert len(_number_ops(jf)) == 2, _number_ops(jf)  # lr * wd and 1 - it, once


def test_numbers_that_differ_only_in_a_zero_sign_or_type_stay_apart():
    # s + 0.0 and s + -0.0 differ for s == -0.0; s * 2 and s * 2.0 differ in type.
    def f(x, s):
        return x / (s + 0.0), x / (s + -0.0), x * (s * 2), x * (s * 2.0), type(s * 2) is type(s * 2.0)

    x = torch.ones(2)
    jf = minijit.jit(f, cache="symbolic values")
    for s in (1.5, -0.0, 3):
        for have, want in zip(jf(x, s), f(x, s), strict=True):
            if isinstance(want, torch.Tensor):
                torch.testing.assert_close(have, want, rtol=0, atol=0)
            else:
                assert have == want
