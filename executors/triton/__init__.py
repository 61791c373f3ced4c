"""The Triton executor: fuses pointwise and last-dim reduction regions into generated Triton kernels.

It is available where triton imports and a CUDA device exists, or on CPU under
`TRITON_INTERPRET=1` (Triton's interpreter; slow, for tests). Triton itself is only
imported when a region is compiled, so importing this module is cheap everywhere. Where a
CUDA device is present it is one of `jit`'s defaults: `minijit.jit(fn)` on CUDA tensors fuses
with Triton, and a call on CPU tensors runs as without it.

Example::

    jf = minijit.jit(lambda x: (x * 2).exp().sum(-1), executors=["triton"])
    jf(torch.randn(4, 8, device="cuda"))
    print(minijit.last_traces(jf)[-1])           # ... = tritonex.fusion_0(x)  [triton kernels: ...]
    print(executors.triton.kernel_source(jf, "fusion_0"))
"""

from __future__ import annotations

from typing import Any

from executors.triton.executor import KERNELS, FusedRegion, TritonExecutor, interpreting
from minijit.extend import register_executor

ex = TritonExecutor()
# A default executor where a CUDA device is present (`TritonExecutor.default_device`: minijit.extend adds it, once
# per process); elsewhere ask for it by name. `minijit.extend.remove_default_executor("triton")` turns it off.
register_executor(ex)
triton_executor = ex


def kernel_source(traced: Any, name: str) -> str:
    """The generated Triton source of region `name` ("fusion_0") or kernel `name` in the last final trace.

    `traced` is a jitted function (its last call's final trace is searched) or a trace.

    Example::

        print(kernel_source(jf, "fusion_0"))
    """
    trace = traced.last_traces()[-1] if hasattr(traced, "last_traces") else traced
    found = []
    for bsym in trace.bound_symbols:
        fn = getattr(bsym.sym.fn, "__wrapped__", bsym.sym.fn)
        if not isinstance(fn, FusedRegion):
            continue
        if fn.region_name == name:
            return "\n\n".join(fn.sources)
        found.append(fn.region_name)
        for kernel in fn.kernels:
            if kernel.name == name:
                return kernel.source
    raise KeyError(f"no Triton region or kernel named {name!r} in the trace; its regions: {found}")


__all__ = ["KERNELS", "FusedRegion", "TritonExecutor", "ex", "interpreting", "kernel_source", "triton_executor"]
