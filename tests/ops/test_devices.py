"""Devices as eager allows them: a 0-dim CPU tensor is a scalar next to tensors of any device (with eager's
dtype rules), moves between devices inside a trace, and a DeviceError where eager raises for mixed devices.

The `meta` device stands in for an accelerator here (eager runs `torch.randn(4, device="meta") * torch.tensor(2.)`):
the jitted results are compared with eager's shapes, dtypes and devices on meta, and the same code on the CPU with
eager's values. The `cuda`-marked tests run the same cases on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import minijit

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _scalar(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(0.5, dtype=dtype)


def _foreach(op: Callable[..., object], tensors: list[torch.Tensor], *args: object) -> list[torch.Tensor]:
    op(tensors, *args)
    return tensors


# Each case: f(x, s) for x a tensor on the device under test and s a 0-dim CPU tensor.
CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
    "mul": lambda x, s: x * s,
    "rsub": lambda x, s: s - x,
    "div f64 scalar": lambda x, s: x / s.double(),
    "int x float scalar": lambda x, s: x.to(torch.int32) * s,
    "bf16 x f64 scalar": lambda x, s: x.bfloat16() + s.double(),
    "0-dim x f64 scalar": lambda x, s: x.sum() * s.double(),
    "pow scalar base": lambda x, s: torch.pow(s, x),
    "where": lambda x, s: torch.where(x > 0, x, s),
    "clamp": lambda x, s: torch.clamp(x, (s - 1).to(x.device), s.to(x.device)),
    "lerp weight": lambda x, s: torch.lerp(x, x * 2, s),
    "addcdiv value": lambda x, s: x.addcdiv(x, x + 3, value=-s),
    "mul_": lambda x, s: x.clone().mul_(s),
    "add_ alpha": lambda x, s: x.clone().add_(x, alpha=s),
    "out=": lambda x, s: torch.mul(x, s, out=torch.empty_like(x)),
    "foreach div_": lambda x, s: _foreach(torch._foreach_div_, [x.clone(), x * 2], s),
    "foreach addcdiv_": lambda x, s: _foreach(torch._foreach_addcdiv_, [x.clone()], [x], [x + 3], s.reshape(1)),
    "copy_ from cpu": lambda x, s: x.clone().copy_(torch.ones(4, device="cpu")),
    "fill_": lambda x, s: x.clone().fill_(s),
    "factory device=": lambda x, s: torch.zeros(4, device=x.device) + s,
    "to(device)": lambda x, s: s.to(x.device) * x,
    "to(other)": lambda x, s: s.to(x) * x,
    "to non_blocking": lambda x, s: s.to(x.device, non_blocking=True) + x,
    "cpu()": lambda x, s: x.cpu() * s,
    "step counter": lambda x, s: (s.add_(1), x / (1 - 0.9 ** s))[1],
}


def _flat(out: object) -> list[torch.Tensor]:
    return list(out) if isinstance(out, list | tuple) else [out]


def _run(case: str, device: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    fn = CASES[case]
    x = torch.linspace(-1, 1, 4, device=device)
    expected = _flat(fn(x, _scalar()))
    got = _flat(minijit.jit(fn)(x, _scalar()))
    return expected, got


@pytest.mark.parametrize("case", [c for c in CASES if c != "cpu()"])  # no data to copy off meta
def test_cpu_scalar_on_meta_matches_eager(case: str) -> None:
    expected, got = _run(case, "meta")
    assert [(e.shape, e.dtype, e.device) for e in expected] == [(g.shape, g.dtype, g.device) for g in got]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])])
@pytest.mark.parametrize("case", list(CASES))
def test_same_code_matches_eager_values(case: str, device: str) -> None:
    """On the CPU, and with the 0-dim CPU scalar beside CUDA tensors where there is a GPU."""
    expected, got = _run(case, device)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype and g.device == e.device
        torch.testing.assert_close(g, e)


def test_trace_moves_the_scalar_to_the_device() -> None:
    jf = minijit.jit(lambda x, s: x * s)
    jf(torch.ones(4, device="meta"), _scalar())
    text = str(minijit.last_traces(jf)[0])
    assert "ltorch.mul(x, s)" in text and "prims.device_put(s, torch.device('meta'))" in text


# Mixed devices eager refuses on an accelerator (checked against eager where the meta device refuses too).
REFUSED: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
    "two devices": lambda x, c: x + c,
    "0-dim on the device with a CPU tensor": lambda x, c: x.sum() + c,
    "in place into a CPU tensor": lambda x, c: c.clone().add_(x.sum()),
    "out= on the CPU": lambda x, c: torch.mul(x, 2, out=c),
    "cat": lambda x, c: torch.cat([x, c]),
}


def test_clamp_takes_no_cpu_scalar_bounds_on_an_accelerator() -> None:
    """Eager's clamp on CUDA refuses a 0-dim CPU bound (its device check is strict; the meta device's is not)."""
    with pytest.raises(minijit.DeviceError, match=r"clamp: min is on cpu.*test_devices.py"):
        minijit.jit(lambda x, s: torch.clamp(x, s))(torch.ones(4, device="meta"), _scalar())


@pytest.mark.cuda
@needs_cuda
def test_clamp_cpu_scalar_bound_raises_as_eager_on_cuda() -> None:
    x = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match="same device"):
        torch.clamp(x, _scalar())
    with pytest.raises(minijit.DeviceError, match="clamp: min is on cpu"):
        minijit.jit(lambda x, s: torch.clamp(x, s))(x, _scalar())


@pytest.mark.parametrize("case", list(REFUSED))
def test_mixed_devices_raise_device_error(case: str) -> None:
    x, c = torch.ones(4, device="meta"), torch.ones(4)
    with pytest.raises(minijit.MetaError, match=r"test_devices.py:\d+"):
        minijit.jit(REFUSED[case])(x, c)


def test_device_error_names_the_op() -> None:
    with pytest.raises(minijit.DeviceError, match=r"add: expected all tensors on one device.*test_devices.py"):
        minijit.jit(lambda x, c: x + c)(torch.ones(4, device="meta"), torch.ones(4))


def test_device_moves_have_gradients() -> None:
    def f(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (x.to("cpu", non_blocking=True) * s.cpu()).sum()

    x, s = torch.randn(4, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    f(x, s).backward()
    expected = x.grad.clone(), s.grad.clone()
    x.grad = s.grad = None
    minijit.jit(f)(x, s).backward()
    torch.testing.assert_close((x.grad, s.grad), expected)


@pytest.mark.cuda
@needs_cuda
def test_cuda_and_cpu_moves_have_gradients_on_cuda() -> None:
    def f(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        y = x.cuda(non_blocking=True) * s  # s: a 0-dim CPU tensor that requires grad
        return (y.cpu() + y.to("cpu").sin()).sum()

    x, s = torch.randn(4, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    f(x, s).backward()
    expected = x.grad.clone(), s.grad.clone()
    x.grad = s.grad = None
    minijit.jit(f)(x, s).backward()
    torch.testing.assert_close((x.grad, s.grad), expected)
