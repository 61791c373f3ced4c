"""The nvFuser translation against eager torch, through a reference model of the FusionDefinition API.

`fake_nvfuser` runs each `fd.ops.*` call with torch, so a wrong translation (a wrong
op, dims, cast or alias) gives wrong numbers or an error here. Every prim the
executor claims is covered, per dtype family.
"""

from __future__ import annotations

import pytest
import torch

import minijit
from executors.nvfuser import NvFuserExecutor
from executors.nvfuser.translate import ELEMENTWISE, REDUCTIONS, InputMeta, contiguity_and_order
from minijit.extend import prims
from tests.executors import fake_nvfuser

ref_ex = NvFuserExecutor("nvref", backend=fake_nvfuser, device_type="cpu")
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-2, atol=1e-2),
       torch.bfloat16: dict(rtol=3e-2, atol=3e-2), torch.float64: dict(rtol=1e-7, atol=1e-7)}


def run(fn, eager, *args, dtype=torch.float32, regions=1):
    jf = minijit.jit(fn, executors=[ref_ex])
    out = jf(*args)
    ref = eager(*args)
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert o.dtype == r.dtype and o.shape == r.shape
        if r.dtype.is_floating_point:
            torch.testing.assert_close(o, r, **TOL.get(dtype, TOL[torch.float32]))
        else:
            assert torch.equal(o, r)
    src = minijit.last_traces(jf)[-1].python()
    assert src.count("nvrefex.fusion_") == regions, src
    assert "torchex." not in src, src
    return jf


# Inputs each float op is defined on: (low, high).
DOMAIN = {"acosh": (1.1, 3.0), "atanh": (-0.9, 0.9), "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "erfinv": (-0.9, 0.9),
          "log": (0.1, 3.0), "log1p": (0.1, 3.0), "log2": (0.1, 3.0), "log10": (0.1, 3.0), "sqrt": (0.1, 3.0),
          "rsqrt": (0.1, 3.0), "reciprocal": (0.5, 3.0), "lgamma": (0.5, 3.0), "div": (0.5, 3.0), "pow": (0.5, 2.0),
          "fmod": (0.5, 3.0), "remainder": (0.5, 3.0)}


def rand(shape, dtype, op=""):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-5, 6, shape, dtype=dtype)
    lo, hi = DOMAIN.get(op, (-2.0, 2.0))
    return (torch.rand(shape) * (hi - lo) + lo).to(dtype)


def _dtypes(kinds):
    out = []
    if "f" in kinds:
        out += FLOAT_DTYPES
    if "i" in kinds:
        out += [torch.int64, torch.int32]
    if "b" in kinds:
        out += [torch.bool]
    return out


CASES = [(sym.name, dtype) for sym, (_, kinds) in ELEMENTWISE.items() for dtype in _dtypes(kinds)
         if sym not in (prims.where, prims.lerp)]


@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_elementwise(name, dtype):
    prim = getattr(prims, name)
    x = rand((3, 5), dtype, name)
    y = rand((3, 5), dtype, name)
    arity = 1 if prim.meta is not None and name in {
        "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
        "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal", "erf", "erfc", "erfinv", "lgamma",
        "floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "isfinite", "neg", "abs", "bitwise_not",
        "logical_not"} else 2
    torch_fn = getattr(torch, name)
    if arity == 1:
        run(lambda x: prim(x), lambda x: torch_fn(x), x, dtype=dtype)
    else:
        run(lambda x, y: prim(x, y), lambda x, y: torch_fn(x, y), x, y, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_where_lerp_and_scalars(dtype):
    x, y = rand((4, 3), dtype), rand((4, 3), dtype)

    def f(x, y):
        return prims.where(prims.gt(x, y), x, prims.mul(y, 2.0)), prims.lerp(x, y, 0.25), prims.add(x, 3)

    def eager(x, y):
        return torch.where(x > y, x, y * 2.0), torch.lerp(x, y, 0.25), x + 3

    run(f, eager, x, y, dtype=dtype)


@pytest.mark.parametrize("name", [sym.name for sym in REDUCTIONS])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_reductions(name, dtype):
    x = rand((3, 4, 5), dtype, "div" if name == "prod" else "")
    prim = getattr(prims, name)
    eager_fns = {"sum": lambda x, d: x.sum(d), "amax": lambda x, d: x.amax(d), "amin": lambda x, d: x.amin(d)}

    def f(x):
        return prim(x, (0, 2)), prim(x, (-1,))

    def eager(x):
        both = x.prod(2).prod(0) if name == "prod" else eager_fns[name](x, (0, 2))
        return both, (x.prod(-1) if name == "prod" else eager_fns[name](x, (-1,)))

    run(f, eager, x, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_var_mean(dtype):
    x = rand((4, 6), dtype)
    run(lambda x: prims.var_mean(x, (1,), 1), lambda x: torch.var_mean(x, 1, correction=1), x, dtype=dtype)


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.int64, torch.bool], ids=str)
def test_convert_element_type(dtype):
    x = rand((4, 6), torch.float32) * 3

    def f(x):
        return prims.mul(prims.convert_element_type(prims.convert_element_type(x, dtype), torch.float32), 2.0)

    run(f, lambda x: x.to(dtype).float() * 2.0, x, dtype=torch.float32)


def test_shape_ops_and_full():
    x = rand((2, 1, 3), torch.float32)
    row = rand((3,), torch.float32)

    def f(x, row):
        b = prims.broadcast_in_dim(row, (4, 2, 3), (2,))
        t = prims.transpose(b, (2, 0, 1))
        r = prims.reshape(prims.squeeze(x, (1,)), (3, 2))
        filled = prims.full((3, 2), 1.5, dtype=torch.float32, device=torch.device("cpu"))
        return prims.exp(t), prims.add(r, filled)

    def eager(x, row):
        return row.expand(4, 2, 3).permute(2, 0, 1).exp(), x.squeeze(1).reshape(3, 2) + 1.5

    run(f, eager, x, row)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_copy_becomes_an_aliased_output(dtype):
    x, y = rand((4, 5), dtype), rand((5,), dtype)
    x_ref = x.clone()
    x_ref.mul_(y).add_(1)

    def f(x, y):
        x.mul_(y)
        x.add_(1)
        return x.exp()

    jf = run(f, lambda x, y: x_ref.exp(), x, y, dtype=dtype)
    torch.testing.assert_close(x, x_ref, **TOL[dtype])
    fused = minijit.last_traces(jf)[-1].bound_symbols[0].sym.fn
    fused = getattr(fused, "__wrapped__", fused)
    (fd, _), = fused.definitions.values()
    assert [alias is not None for _, alias in fd.outputs] == [False, True]


def test_strided_inputs_define_their_layout():
    base = rand((6, 8), torch.float32)
    x = base.t()[:, ::2]   # (8, 3) with strides (1, 16)
    jf = run(lambda x: prims.mul(x, 2.0), lambda x: x * 2.0, x)
    fused = minijit.last_traces(jf)[-1].bound_symbols[0].sym.fn
    fused = getattr(fused, "__wrapped__", fused)
    jf(x.contiguous())  # another layout: another definition
    assert len(fused.definitions) == 2
    assert contiguity_and_order(InputMeta((8, 3), (1, 16), torch.float32)) == ([True, False], [0, 1])
    assert contiguity_and_order(InputMeta((2, 1, 3), (3, 3, 1), torch.float32)) == ([True, None, True], [2, 1, 0])


def test_reference_model_rejects_a_wrong_definition():
    fd = fake_nvfuser.FusionDefinition()
    with fd:
        t = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=fake_nvfuser.DataType.Float, stride_order=[1, 0])
        fd.add_output(fd.ops.add(t, t))
    with pytest.raises(ValueError, match="does not match"):
        fd.execute([torch.ones(2, 2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="not contiguous"):
        fd.execute([torch.ones(2, 4)[:, ::2]])


def test_copy_to_out_prim():
    x, y = rand((4, 5), torch.float32), rand((4, 5), torch.float32)
    x_ref = x * y

    def f(x, y):
        t = prims.mul(x, y)
        prims.copy_to_out_(t, out=x)
        return prims.exp(t)

    run(f, lambda x, y: x_ref.exp(), x, y)
    torch.testing.assert_close(x, x_ref)


def test_copies_stay_outside_regions_when_asked():
    x, y = rand((4, 5), torch.float32), rand((4, 5), torch.float32)

    def f(x, y):
        t = prims.mul(x, y)
        prims.copy_to_out_(t, out=x)
        return prims.exp(t)

    jf = minijit.jit(f, executors=[ref_ex])
    jf(x.clone(), y)
    (region,) = [b for b in minijit.last_traces(jf)[-1].bound_symbols if b.sym.namespace == "nvrefex"]
    assert [p.name for p in region.written()] == ["x"]

    no_copies = NvFuserExecutor("nvrefnocopy", backend=fake_nvfuser, device_type="cpu")
    no_copies.fuse_copies_to_out = False
    x_ref = x * y
    jf = minijit.jit(f, executors=[no_copies])
    torch.testing.assert_close(jf(x, y), x_ref.exp())
    torch.testing.assert_close(x, x_ref)
    src = minijit.last_traces(jf)[-1].python()
    assert "nvrefnocopyex.fusion_0" in src and "torchex.copy_to_out_(" in src, src
