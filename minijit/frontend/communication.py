"""torch.distributed called from traced code: refused, never run once at trace time and dropped.

A collective on a traced tensor is refused like any torch function minijit has no symbol
for. What remains are calls with no traced tensor that still talk to other processes or
keep the books of a distributed wrapper: `dist.barrier()`, the methods of DDP's C++
`Reducer` (`prepare_for_forward`, `prepare_for_backward`, ...), a process group's collectives,
`Work.wait()`. Run natively they would happen once, while the trace is recorded, and never
on later calls (docs/design.md, invariant 8). minijit keeps communication out of traces instead:
DDP and FSDP2 wrapped around or applied to a jitted module run it eagerly
(minijit.runtime.distributed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.lookasides import LOOKASIDES
from minijit.ir.context import where_now

# A process group's methods that only read what the group is.
_PROCESS_GROUP_READS = {"rank", "size", "name", "group_name", "group_desc", "bound_device_id", "options"}


def _refused(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedSyntaxError(
            f"{what}{where_now()} communicates with other processes (or keeps the books of a distributed wrapper); "
            "a trace would do it once, while it is recorded. Keep it outside the jitted function: DDP and FSDP2 "
            "run their communication eagerly around a jitted module (DDP(minijit.jit(m)), minijit.jit(DDP(m)), "
            "fully_shard(minijit.jit(m)))")

    refuse.__doc__ = f"{what}: refused inside traced code (see minijit.frontend.communication)."
    return refuse


def _register() -> None:
    if not torch.distributed.is_available():
        return
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    for name in ("barrier", "monitored_barrier"):
        if (fn := getattr(dist, name, None)) is not None:
            LOOKASIDES[fn] = _refused(f"torch.distributed.{name}()")
    for cls in (c10d.Reducer, c10d.ProcessGroup, c10d.Work):
        for name, member in vars(cls).items():
            if name.startswith("_") or not callable(member) or isinstance(member, type):
                continue
            if cls is c10d.ProcessGroup and name in _PROCESS_GROUP_READS:
                continue
            # pybind's instancemethod is no dict key; the function it binds (what a bound method calls) is.
            LOOKASIDES[getattr(member, "__func__", member)] = _refused(f"{cls.__name__}.{name}()")


_register()

__all__: list[str] = []
