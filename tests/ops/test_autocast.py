"""The autocast policy table (minijit/ops/autocast.py) against eager on CPU and torch's own lists for CUDA.

CPU: every OpInfo case minijit tests, on its first float32 sample, run under
`torch.autocast("cpu", bfloat16)` eagerly and jitted: the same dtypes and close values
(this also covers composites, whose policy comes from the ops inside them).
CUDA (no GPU needed): the ops of PyTorch's autocast test lists that minijit has, traced
on CUDA proxies with CUDA autocast on, give the dtype those lists expect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.autocast_test_lists import AutocastCPUTestLists, AutocastTestLists

import minijit
from minijit.ir import CaptureState, TensorProxy, Trace, tracing
from minijit.ops.autocast import ATEN_POLICIES
from minijit.ops.opaque import OPAQUE
from minijit.ops.registry import ALL_LTORCH, ltorch_symbol_for
from tests.ops.opinfo_util import ALL_CASES, OpCase, sample_summary

BF16 = torch.bfloat16


def test_every_policy_names_a_declared_op() -> None:
    # An ltorch op, or an ATen operator with its own autocast kernel for that device (an opaque op).
    unknown = {(device, name) for device, table in ATEN_POLICIES.items() for name in table if name not in ALL_LTORCH
               and not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", f"Autocast{device.upper()}")}
    assert not unknown


def _outputs(x: Any) -> list[torch.Tensor]:
    return [t for t in (x if isinstance(x, tuple | list) else (x,)) if isinstance(t, torch.Tensor)]


CPU_CASES = [pytest.param(case, id=case.id) for case in ALL_CASES if torch.float32 in case.dtypes()]


@pytest.mark.parametrize("case", CPU_CASES)
def test_cpu_autocast_matches_eager(case: OpCase) -> None:
    fn = case.as_op()
    jf = minijit.jit(lambda *args, **kwargs: fn(*args, **kwargs))
    sample = case.samples(torch.float32).supported[0]
    args = (sample.input, *sample.args)
    with torch.autocast("cpu", dtype=BF16):
        torch.manual_seed(0)
        want = case.info.op(*args, **sample.kwargs)
        torch.manual_seed(0)
        got = jf(*args, **sample.kwargs)
    what = f"{case.id} on {sample_summary(sample)}"
    want, got = _outputs(want), _outputs(got)
    assert [g.dtype for g in got] == [w.dtype for w in want], what
    if case.compare_values:
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=0.1, rtol=0.05, equal_nan=True, msg=lambda m: f"{what}: {m}")


# -- opaque torch ops under CPU autocast ----------------------------------------------------------------

def _cpu_list_cases() -> list[Any]:
    """PyTorch's own CPU autocast test lists: (op, args, kwargs), for torch.* and torch._C._nn.* ops."""
    lists = AutocastCPUTestLists(torch.device("cpu"))
    params = []
    for name, namespace in (("torch_16", torch), ("torch_fp32", torch), ("nn_16", torch._C._nn),
                            ("nn_fp32", torch._C._nn)):
        for entry in getattr(lists, name):
            kwargs = entry[2] if len(entry) > 2 and isinstance(entry[2], dict) else {}
            params.append(pytest.param(getattr(namespace, entry[0]), entry[1], kwargs, id=f"{name}-{entry[0]}"))
    return params


def _run_under_cpu_autocast(op: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    jf = minijit.jit(lambda *a, **k: op(*a, **k))
    with torch.autocast("cpu", dtype=BF16):
        want = op(*args, **kwargs)
        got = jf(*args, **kwargs)
    return _outputs(want), _outputs(got)


@pytest.mark.parametrize("op, args, kwargs", _cpu_list_cases())
def test_torchs_cpu_autocast_lists_match_eager_or_are_refused(op: Any, args: tuple[Any, ...],
                                                              kwargs: dict[str, Any]) -> None:
    # Traces run with autocast off: each op gets eager's casts, or is refused naming autocast (never left uncast).
    name = op.__name__
    try:
        want, got = _run_under_cpu_autocast(op, args, kwargs)
    except minijit.UnsupportedOpError as e:
        assert "torch.autocast('cpu')" in str(e)
        assert name not in ATEN_POLICIES["cpu"], f"{name} has a policy, yet was refused: {e}"
        return
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=0.1, rtol=0.05, equal_nan=True)


def _opaque_names(jf: Any) -> list[str]:
    return [b.sym.id for b in minijit.last_traces(jf)[0].bound_symbols if OPAQUE in b.sym.tags]


@pytest.mark.parametrize("op, make_args", [
    pytest.param(torch.addbmm, lambda: (torch.randn(4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5)), id="lower"),
    pytest.param(torch.cdist, lambda: (torch.randn(4, 5), torch.randn(3, 5).to(BF16)), id="fp32-cdist"),
    pytest.param(torch.trace, lambda: (torch.randn(4, 4).to(BF16),), id="fp32-trace"),
    pytest.param(torch.kron, lambda: (torch.randn(2, 2), torch.randn(2, 3).to(BF16)), id="no-policy"),
])
def test_opaque_op_under_cpu_autocast_gets_eagers_casts(op: Any, make_args: Callable[[], tuple[Any, ...]]) -> None:
    args = make_args()
    jf = minijit.jit(lambda *a: op(*a))
    with torch.autocast("cpu", dtype=BF16):
        want = op(*args)
        got = jf(*args)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
    # One opaque op, run under the autocast state it was called in (`torch.cdist` runs `_VF.cdist`).
    assert any(name.startswith(f"opaque.{op.__name__}_under_autocast") for name in _opaque_names(jf))


def uses_polar(a, b):
    return torch.polar(a, b)


def uses_tensordot(a, b):
    return torch.tensordot(a, b, dims=([1], [1]))


def uses_cdist_forward(a, b):
    return torch.ops.aten._cdist_forward(a, b, 2.0, 1)


@pytest.mark.parametrize("fn, op, why", [
    (uses_polar, "torch.polar", "by a policy minijit does not know for aten::polar"),
    (uses_tensordot, "torch.tensordot", "where eager casts inside it"),  # seen by the meta run: refused when traced
    # Its CPU kernel calls matmul, which the meta run does not see: refused where it runs under autocast.
    (uses_cdist_forward, "torch.ops.aten._cdist_forward", "where eager casts inside it"),
])
def test_opaque_op_with_an_unknown_autocast_policy_is_refused(fn: Any, op: str, why: str) -> None:
    a, b = torch.randn(32, 8), torch.randn(32, 8)
    jf = minijit.jit(fn)
    with torch.autocast("cpu", dtype=BF16), pytest.raises(minijit.UnsupportedOpError) as info:
        jf(a, b)
    message = str(info.value)
    assert op in message and why in message and "test_autocast.py:" in message
    torch.testing.assert_close(jf(a, b), fn(a, b))  # outside autocast, it runs


# -- CUDA, without a GPU: the trace's dtypes ----------------------------------------------------------

@contextmanager
def cuda_autocast(dtype: torch.dtype = torch.float16) -> Iterator[None]:
    """CUDA autocast state on while tracing (torch.autocast('cuda') would turn itself off without a GPU)."""
    enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)


def trace_on_cuda(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Record fn on CUDA proxies of `args` as the user's code would (capture only: nothing runs)."""
    trace = Trace("cuda_autocast")
    trace.capture = CaptureState(captures_user_code=True)

    def proxy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return trace.add_input(TensorProxy(tuple(x.shape), x.dtype, torch.device("cuda"), x.requires_grad))
        return type(x)(proxy(v) for v in x) if isinstance(x, tuple | list) else x

    with tracing(trace), cuda_autocast():
        return fn(*(proxy(a) for a in args), **kwargs)


def _torch_list_cases() -> list[Any]:
    lists = AutocastTestLists("cpu")  # the argument tensors on the CPU; the trace puts them on CUDA
    params = []
    for name, expected in (("torch_fp16", torch.float16), ("nn_fp16", torch.float16), ("torch_fp32", torch.float32),
                           ("nn_fp32", torch.float32), ("torch_need_autocast_promote", torch.float32)):
        for i, entry in enumerate(getattr(lists, name)):
            op, args = entry[0], entry[1]
            kwargs = entry[2] if len(entry) > 2 and isinstance(entry[2], dict) else {}
            sym = next((ltorch_symbol_for(getattr(ns, op, None)) for ns in (torch, F)
                        if ltorch_symbol_for(getattr(ns, op, None)) is not None), None)
            if sym is not None:
                params.append(pytest.param(sym, args, kwargs, expected, id=f"{name}-{op}-{i}"))
    return params


CUDA_CASES = _torch_list_cases()


def test_most_of_torchs_cuda_lists_are_checked() -> None:
    assert len(CUDA_CASES) >= 40


@pytest.mark.parametrize("sym, args, kwargs, expected", CUDA_CASES)
def test_cuda_autocast_dtypes_match_torchs_lists(sym: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                                                 expected: torch.dtype) -> None:
    out = trace_on_cuda(sym, args, kwargs)
    first = out[0] if isinstance(out, tuple) else out
    assert first.dtype == expected
