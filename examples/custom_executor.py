"""A third-party executor in one file: a fused RMSNorm kernel, with its gradient, claiming `rms_norm` calls.

Run it as a script: it jits a small function that calls `F.rms_norm`, prints the final
trace (where the call is claimed as `fastnormex.fused_rms_norm`), checks the result and
the gradients against eager PyTorch, and shows a `torch.float64` call that the
executor's checker refuses (the torch executor runs that one).

To ship such an executor as a package, expose it in your pyproject.toml::

    [project.entry-points."minijit.executors"]
    fastnorm = "my_package.custom_executor:ex"

and users write `minijit.jit(fn, executors=["fastnorm"])`.
"""

from __future__ import annotations

import torch

import minijit
from minijit.extend import OperatorExecutor, TensorProxy, register_executor

F = torch.nn.functional
ex = OperatorExecutor("fastnorm", version="0.1")


# -- the "kernels" (here eager torch; a real plugin would launch Triton or CUDA code) --------------

def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32, in one call."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


def rms_norm_backward_kernel(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of rms_norm_kernel with respect to x and weight."""
    xf, gf, wf = x.float(), g.float(), weight.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    normed = xf * rstd
    gw = (gf * normed).reshape(-1, x.shape[-1]).sum(0)
    gn = gf * wf
    gx = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
    return gx.to(x.dtype), gw.to(weight.dtype)


# -- the operators: new symbols that this executor runs -------------------------------------------

fused_rms_norm_backward = ex.register_operator(
    "fused_rms_norm_backward",
    meta=lambda g, x, weight, eps: (TensorProxy.like(x, requires_grad=False), TensorProxy.like(weight, requires_grad=False)),
    fn=rms_norm_backward_kernel,
)


def _forward(x, weight, eps):
    return fused_rms_norm(x, weight, eps), (x, weight, eps)


def _backward(saved, g):
    x, weight, eps = saved
    gx, gw = fused_rms_norm_backward(g, x, weight, eps)
    return gx, gw, None


fused_rms_norm = ex.register_operator(
    "fused_rms_norm",
    meta=lambda x, weight, eps: TensorProxy.like(x, requires_grad=x.requires_grad or weight.requires_grad),
    fn=rms_norm_kernel,
    grad_transform=(_forward, _backward),
)


# -- claiming F.rms_norm calls: rewrite each accepted call into the fused operator ----------------

def _accepts(input, normalized_shape, weight=None, eps=None):  # noqa: A002 - F.rms_norm's names
    """Checked on proxies at compile time: last-dim norms with a weight, in 16/32-bit floats."""
    return (weight is not None and len(normalized_shape) == 1 and input.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and weight.dtype == input.dtype)


def _to_fused(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    return fused_rms_norm(input, weight, torch.finfo(input.dtype).eps if eps is None else eps)


ex.register_implementation(F.rms_norm, execution_transform=_to_fused, checker=_accepts)
register_executor(ex)


def block(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A model fragment: RMSNorm, then a residual connection."""
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6) * 2 + x


def eager_block(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same fragment in eager PyTorch."""
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6) * 2 + x


def main() -> None:
    """Jit the block with the executor, print the trace, and compare with eager."""
    torch.manual_seed(0)
    x = torch.randn(4, 16, requires_grad=True)
    weight = torch.randn(16, requires_grad=True)

    jblock = minijit.jit(block, executors=["fastnorm"])
    out = jblock(x, weight)
    final = minijit.last_traces(jblock)[-1]
    print(final)
    for trace in minijit.last_traces(jblock):
        if "backward" in trace.pass_name:
            print(trace)
    assert "fastnormex.fused_rms_norm(" in final.python(), "the executor did not claim the rms_norm call"

    expected = eager_block(x, weight)
    torch.testing.assert_close(out, expected)
    if out.requires_grad:  # the grad transform is part of this minijit
        g = torch.randn_like(out)
        gx, gw = torch.autograd.grad(out, (x, weight), g)
        ex_gx, ex_gw = torch.autograd.grad(expected, (x, weight), g)
        torch.testing.assert_close(gx, ex_gx)
        torch.testing.assert_close(gw, ex_gw)
        print("gradients match eager")

    # float64 is refused by the checker: the torch executor runs the call instead.
    x64, w64 = x.detach().double(), weight.detach().double()
    torch.testing.assert_close(jblock(x64, w64), eager_block(x64, w64))
    assert "fastnormex" not in minijit.last_traces(jblock)[-1].python()
    print("custom executor: results match eager")


if __name__ == "__main__":
    main()
