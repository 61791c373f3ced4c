"""The Inductor executor: fused regions of prims compiled by torch.compile's Inductor backend.

Opt-in: `minijit.jit(fn, executors=["inductor"])`. See `executor.py`.
"""

from executors.inductor.executor import CACHE, CompiledRegion, InductorExecutor, cache_info
from minijit.extend import register_executor

ex = InductorExecutor()
register_executor(ex)

__all__ = ["CACHE", "CompiledRegion", "InductorExecutor", "cache_info", "ex"]
