"""The executor plugin API: executors defined here through `minijit.extend` only, registry, discovery, fusion."""

from __future__ import annotations

import importlib.metadata
import math
import re
import types
import warnings

import pytest
import torch

import minijit
import minijit.extend as extend
from minijit.extend import (
    ExecutorUnavailableError,
    FusionExecutor,
    OperatorExecutor,
    get_executor,
    register_executor,
)
from minijit.transforms import claim_executors
from tests.oputil import tensors_of, trace_call

F = torch.nn.functional


def final(jf):
    return minijit.last_traces(jf)[-1].python()


@pytest.fixture
def restore_registry():
    registry, defaults = dict(extend._REGISTRY), list(extend._DEFAULTS)
    yield
    extend._REGISTRY.clear()
    extend._REGISTRY.update(registry)
    extend._DEFAULTS[:] = defaults
    extend._WARNED.clear()


@pytest.fixture
def cuda_present(monkeypatch):
    """A process that has not yet decided its device defaults, where a CUDA device is present (so it is told)."""
    extend.get_executor("torch"), importlib.import_module("executors.triton")  # (registered before the defaults are kept)
    monkeypatch.setattr(extend, "_DEFAULTS", list(extend._DEFAULTS))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(extend, "_device_defaults_added", False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if extend.get_executor("triton").unavailable_reason() is not None:
        pytest.skip(f"triton cannot run here: {extend.get_executor('triton').unavailable_reason()}")


def test_triton_is_a_default_executor_where_a_cuda_device_is_present(cuda_present):
    assert [e.name for e in extend.get_default_executors()] == ["triton", "torch"]
    assert [e.name for e in minijit.jit(lambda x: x).executors] == ["triton", "torch"]
    assert [e.name for e in minijit.jit(lambda x: x, executors=["torch"]).executors] == ["torch"]  # named: as named


def test_a_cpu_call_runs_as_before_where_triton_is_a_default(cuda_present):
    def f(x, y):
        return (x * 2 + y).exp().sum(-1)

    x, y = torch.randn(4, 8), torch.randn(8)
    jf = minijit.jit(f)
    torch.testing.assert_close(jf(x, y), f(x, y))
    assert jf.executors[0].name == "triton"
    assert "tritonex" not in final(jf) and "torchex.exp" in final(jf)


def test_removing_triton_from_the_defaults_before_the_first_jit_keeps_it_out(cuda_present):
    extend.remove_default_executor("triton")
    assert [e.name for e in extend.get_default_executors()] == ["torch"]


def test_triton_is_no_default_where_no_cuda_device_is_present_or_under_its_interpreter(cuda_present, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (the tests' CPU machines: kernels on CPU tensors, slowly)
    assert [e.name for e in extend.get_default_executors()] == ["torch"]
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(extend, "_device_defaults_added", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [e.name for e in extend.get_default_executors()] == ["torch"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton fuses by default on a CUDA device only")
def test_a_default_jit_fuses_cuda_tensors_with_triton():
    importlib.import_module("executors.triton")
    if extend.get_executor("triton").unavailable_reason() is not None:
        pytest.skip(f"triton cannot run here: {extend.get_executor('triton').unavailable_reason()}")

    def f(x, y):
        return (x * 2 + y).exp().sum(-1)

    x, y = torch.randn(4, 8, device="cuda"), torch.randn(8, device="cuda")
    jf = minijit.jit(f)
    torch.testing.assert_close(jf(x, y), f(x, y))
    assert "tritonex.fusion_0" in final(jf)


# -- an operator executor defined in this file -------------------------------------------

calls: list[str] = []


def reference_scaled_tanh(x):
    return (x * 2).tanh()


def kernel_scaled_tanh(x):
    calls.append("scaled_tanh")
    return torch.tanh(x * 2)


myex = OperatorExecutor("myex", version="1.0")
scaled_tanh = myex.register_operator("scaled_tanh", like=reference_scaled_tanh, fn=kernel_scaled_tanh)


def my_exp(a):
    calls.append("exp")
    return torch.exp(a)


myex.register_implementation(torch.exp, my_exp, checker=lambda a: a.dtype == torch.float32)


def test_operator_executor_claims_registered_symbol_and_checker_refuses():
    calls.clear()

    def f(x):
        return x.exp() + 1

    x = torch.randn(3)
    jf = minijit.jit(f, executors=[myex])
    torch.testing.assert_close(jf(x), torch.exp(x) + 1)
    assert calls == ["exp"]
    assert "myex.exp(x)" in final(jf)

    calls.clear()
    x64 = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(jf(x64), torch.exp(x64) + 1)
    assert calls == []  # the checker refused float64: the torch executor ran it
    assert "myex.exp" not in final(jf)


def test_register_operator_like_reuses_metadata_and_runs():
    calls.clear()

    def f(x):
        return scaled_tanh(x) * 3

    x = torch.randn(2, 5, dtype=torch.float64)
    jf = minijit.jit(f, executors=[myex])
    torch.testing.assert_close(jf(x), torch.tanh(x * 2) * 3)
    assert calls == ["scaled_tanh"]
    src = final(jf)
    assert "myex.scaled_tanh(x)" in src and "f64[2, 5]" in src
    # Outside tracing the operator runs its implementation.
    torch.testing.assert_close(scaled_tanh(x), torch.tanh(x * 2))


def test_register_operator_with_meta():
    ex = OperatorExecutor("metaex")
    twice = ex.register_operator("twice", meta=lambda a: extend.TensorProxy.like(a), fn=lambda a: a * 2)
    jf = minijit.jit(lambda x: twice(x) + 1, executors=[ex])
    x = torch.randn(4)
    torch.testing.assert_close(jf(x), x * 2 + 1)
    assert "metaex.twice(x)" in final(jf)
    with pytest.raises(ValueError, match="exactly one of like= and meta="):
        ex.register_operator("bad", fn=lambda a: a)


def test_execution_transform_rewrites_into_operators():
    ex = OperatorExecutor("gelutx")
    fast_gelu = ex.register_operator("fast_gelu", like=F.gelu, fn=lambda a, approximate="none": F.gelu(a))
    ex.register_implementation(F.gelu, execution_transform=lambda a, approximate="none": fast_gelu(a),
                               checker=lambda a, approximate="none": approximate == "none")
    from minijit.ops import ltorch

    def f(x):
        return ltorch.gelu(x) * 2

    x = torch.randn(6)
    jf = minijit.jit(f, executors=[ex])
    torch.testing.assert_close(jf(x), F.gelu(x) * 2)
    assert "gelutxex.fast_gelu(x)" in final(jf)


def test_names_and_unknown_executor(restore_registry):
    register_executor(myex)
    assert get_executor("myex") is myex
    jf = minijit.jit(lambda x: x.exp(), executors=["myex"])
    x = torch.randn(2)
    torch.testing.assert_close(jf(x), x.exp())
    with pytest.raises(minijit.MinijitError, match="no executor named 'nope'"):
        minijit.jit(lambda x: x, executors=["nope"])
    # torch is always the last fallback
    assert jf.executors[-1] is get_executor("torch")


class Unavailable(OperatorExecutor):
    def unavailable_reason(self):
        return "the frobnicator package is not installed"


def test_unavailable_requested_executor_is_an_error():
    with pytest.raises(ExecutorUnavailableError, match=r"'frob' cannot run here: the frobnicator package is not installed"):
        minijit.jit(lambda x: x, executors=[Unavailable("frob")])


def test_unavailable_default_executor_is_a_warning(restore_registry):
    extend.add_default_executor(Unavailable("frobdefault"))
    with pytest.warns(UserWarning, match="default executor 'frobdefault' is unavailable.*frobnicator"):
        jf = minijit.jit(lambda x: x + 1)
    assert all(e.name != "frobdefault" for e in jf.executors)
    torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), 2.0))


def test_builtin_executors_report_why_they_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name in ("nvfuser", "triton"):
        reason = get_executor(name).unavailable_reason()
        if reason is None:
            continue  # runs here (a GPU machine)
        assert ("not installed" in reason or "CUDA" in reason or "import" in reason), reason
        with pytest.raises(ExecutorUnavailableError, match=name):
            minijit.jit(lambda x: x, executors=[name])


def test_entry_point_discovery(monkeypatch, restore_registry):
    plugin = types.ModuleType("fake_minijit_plugin")
    plugin.ex = OperatorExecutor("pluginex")
    monkeypatch.setitem(__import__("sys").modules, "fake_minijit_plugin", plugin)
    ep = importlib.metadata.EntryPoint("pluginex", "fake_minijit_plugin:ex", "minijit.executors")
    broken = importlib.metadata.EntryPoint("broken", "no_such_module_xyz:ex", "minijit.executors")
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == "minijit.executors":
            return importlib.metadata.EntryPoints([ep, broken])
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(extend, "_entry_points_loaded", False)
    assert get_executor("pluginex") is plugin.ex
    with pytest.warns(UserWarning, match="could not load the executor plugin 'broken'"):
        extend.get_default_executors()


# -- a fusion executor defined in this file ----------------------------------------------

class EagerFuser(FusionExecutor):
    """Fuses mul/add/exp/copy_ prims and runs a region by evaluating its members with torch."""

    OPS = {"mul": torch.mul, "add": torch.add, "exp": torch.exp, "broadcast_in_dim": None, "copy_": None}

    def __init__(self):
        super().__init__("eagerfuse")
        self.regions = []

    def fusible(self, bsym):
        return bsym.sym.namespace == "prims" and bsym.sym.name in self.OPS

    def fuse(self, region):
        self.regions.append([b.sym.name for b in region.members])
        members, inputs, outputs = region.members, region.inputs, region.outputs

        def run(*args):
            env = {p.name: a for p, a in zip(inputs, args)}
            val = lambda x: env[x.name] if isinstance(x, extend.TensorProxy) else x
            for b in members:
                name = b.sym.name
                if name == "copy_":
                    env[b.args[1].name].copy_(val(b.args[0]))
                elif name == "broadcast_in_dim":
                    x, shape, dims = b.args
                    view = [1] * len(shape)
                    for s, d in zip(x.shape, dims):
                        view[d] = s
                    env[b.output.name] = val(x).reshape(view).expand(shape)
                else:
                    env[b.output.name] = self.OPS[name](*[val(a) for a in b.args])
            return tuple(env[p.name] for p in outputs)

        return run


def test_fusion_region_is_one_bound_symbol_with_members_as_comments():
    ex = EagerFuser()

    def f(x, y):
        a = x * y
        b = a.exp() + y
        return a, b

    x, y = torch.randn(3), torch.randn(3)
    jf = minijit.jit(f, executors=[ex])
    a, b = jf(x, y)
    torch.testing.assert_close(a, x * y)
    torch.testing.assert_close(b, (x * y).exp() + y)
    src = final(jf)
    # One bound symbol binding both outputs; the members follow as indented comments.
    assert re.search(r"\n  \((t\d+), (t\d+)\) = eagerfuseex\.fusion_0\(x, y\)", src), src
    assert re.search(r"\n    # t\d+ = prims\.mul\(x, y\)", src), src
    assert src.count("eagerfuseex") == 1
    assert ex.regions == [["mul", "exp", "add"]]


def test_unrelated_non_fusible_work_is_hoisted_not_splitting_the_region():
    ex = EagerFuser()

    def f(x, y, w):
        a = x * 2
        m = w @ w          # not fusible, independent of the region
        b = a.exp()
        return b, m

    x, y, w = torch.randn(3), torch.randn(3), torch.randn(2, 2)
    jf = minijit.jit(f, executors=[ex])
    b, m = jf(x, y, w)
    torch.testing.assert_close(b, (x * 2).exp())
    torch.testing.assert_close(m, w @ w)
    assert ex.regions == [["mul", "exp"]]


def test_opaque_torch_op_is_a_region_boundary():
    ex = EagerFuser()

    def f(x, w):
        a = x * 2
        m = torch.logcumsumexp(w, 0)  # no ltorch decomposition: one opaque torch op, never hoisted
        b = a.exp()
        return b, m

    x, w = torch.randn(3), torch.randn(4)
    jf = minijit.jit(f, executors=[ex])
    b, m = jf(x, w)
    torch.testing.assert_close(b, (x * 2).exp())
    torch.testing.assert_close(m, torch.logcumsumexp(w, 0))
    assert ex.regions == [["mul"], ["exp"]]
    names = [b.sym.id for b in minijit.last_traces(jf)[-1].bound_symbols]
    assert names[:3] == ["eagerfuseex.fusion_0", "torch.logcumsumexp", "eagerfuseex.fusion_1"], names


def claim_traced(fn, *args, executors):
    """Trace fn on proxies (no functionalization: in-place ops stay where they are), claim, and run."""
    trace = trace_call(fn, *args)
    final_trace = claim_executors(trace, [*executors, get_executor("torch")])
    return final_trace, final_trace.python_callable()(*tensors_of(args))


def test_write_into_a_tensor_the_region_read_is_not_hoisted_before_it():
    """docs/design.md invariant 1: a read of x's old value stays before the copy into x."""
    ex = EagerFuser()

    def f(x, y):
        a = x * 2           # reads old x (fusible)
        x.sub_(1)           # writes x: claimed by torch as one op, not fusible here
        b = a.exp() * y     # fusible, after the write
        return a, b

    x, y = torch.randn(4), torch.randn(4)
    x_eager = x.clone()
    a_ref, b_ref = f(x_eager, y)
    trace, (a, b) = claim_traced(f, x, y, executors=[ex])
    torch.testing.assert_close(a, a_ref)
    torch.testing.assert_close(b, b_ref)
    torch.testing.assert_close(x, x_eager)
    assert ex.regions == [["mul"], ["exp", "mul"]]
    names = [b.sym.id for b in trace.bound_symbols]
    assert names == ["eagerfuseex.fusion_0", "torchex.sub_", "eagerfuseex.fusion_1"], names


def test_unrelated_write_is_hoisted_but_a_read_of_the_copied_tensor_stays_after_the_region():
    ex = EagerFuser()

    def f(x, y, z):
        x.mul_(y)           # mul + copy_ into x, both fusible
        z.sub_(1)           # not fusible, touches nothing the region reads or writes: hoisted
        w = y.exp()         # fusible: joins the region
        return x.sub(1), w  # x.sub: not fusible, reads the new x, so it stays after the region

    x, y, z = torch.randn(4), torch.randn(4), torch.randn(4)
    xe, ze = x.clone(), z.clone()
    refs = f(xe, y, ze)
    trace, outs = claim_traced(f, x, y, z, executors=[ex])
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x, xe)
    torch.testing.assert_close(z, ze)
    assert ex.regions == [["mul", "copy_", "exp"]]
    names = [b.sym.id for b in trace.bound_symbols]
    assert names == ["torchex.sub_", "eagerfuseex.fusion_0", "torchex.sub"], names


def test_declined_region_falls_back_to_later_executors():
    class Decliner(EagerFuser):
        def fuse(self, region):
            super().fuse(region)
            return None

    ex = Decliner()
    x = torch.randn(3)
    jf = minijit.jit(lambda x: (x * 2).exp(), executors=[ex])
    torch.testing.assert_close(jf(x), (x * 2).exp())
    assert "eagerfuseex" not in final(jf) and "torchex.prims_exp(" in final(jf)


def test_grad_transform_of_a_claimed_symbol_is_used_for_its_calls():
    ex = OperatorExecutor("gradex")
    grad_op = ex.register_operator("exp_grad", like=lambda a, g: a * g, fn=lambda e, g: e * g)

    def forward(a):
        out = a.exp()
        return out, (out,)

    def backward(saved, g):
        return (grad_op(saved[0], g),)

    # Claims exp only in float64; its grad transform then replaces exp's own VJP rule.
    ex.register_implementation(torch.exp, torch.exp, checker=lambda a: a.dtype == torch.float64,
                               grad_transform=(forward, backward))
    jf = minijit.jit(lambda a: (a.exp() * 3).sum(), executors=[ex])
    for dtype, uses_transform in ((torch.float64, True), (torch.float32, False)):
        a = torch.randn(5, dtype=dtype, requires_grad=True)
        ea = a.detach().clone().requires_grad_()
        jf(a).backward()
        (ea.exp() * 3).sum().backward()
        torch.testing.assert_close(a.grad, ea.grad)
        backward_source = minijit.last_backward_traces(jf)[-1].python()
        assert ("gradex.exp_grad" in backward_source) == uses_transform, backward_source


def test_ops_namespace_is_not_shadowed():
    # The torch executor prints as torchex, so `torch.` in a final trace is the torch module.
    jf = minijit.jit(lambda x: x * math.pi)
    jf(torch.ones(1))
    assert "torchex.mul" in final(jf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        minijit.jit(lambda x: x)  # the defaults: no warnings (nvfuser and inductor are opt-in, triton a default
        # only where a CUDA device is present)


def test_an_operator_that_implements_an_op_shows_under_its_registered_name():
    """`my_ex` registering `my_gelu` for gelu: the trace calls `my_ex.my_gelu(x)` (not `my_exex.gelu`)."""
    ex = OperatorExecutor("my_ex")
    my_gelu = ex.register_operator("my_gelu", like=torch.nn.functional.gelu, fn=torch.nn.functional.gelu)
    ex.register_implementation(torch.nn.functional.gelu, my_gelu)
    jf = minijit.jit(lambda x: torch.nn.functional.gelu(x) * 2, executors=[ex])
    x = torch.randn(5)
    torch.testing.assert_close(jf(x), torch.nn.functional.gelu(x) * 2)
    assert "my_ex.my_gelu(x)" in final(jf)
