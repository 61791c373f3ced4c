"""The nvFuser executor: translates fusion regions to `nvfuser.FusionDefinition`s.

Available only where nvFuser imports and a CUDA device exists; elsewhere it reports
itself unavailable with the reason. The translation (`translate.define_region`) is
written against nvFuser's Python API and takes the module providing it as a
parameter, so tests run it on CPU against a reference model of that API.

Example::

    jf = minijit.jit(fn, executors=["nvfuser"])
"""

from __future__ import annotations

import torch

from executors.nvfuser.executor import NvFuserExecutor
from minijit.extend import register_executor

ex = NvFuserExecutor()
# A default executor only where there is a GPU for it; on CPU ask for it by name (and get the reason).
register_executor(ex, default=torch.cuda.is_available())
nvfuser_executor = ex

__all__ = ["NvFuserExecutor", "ex", "nvfuser_executor"]
