"""The nvFuser executor: translates fusion regions to `nvfuser.FusionDefinition`s.

Available only where nvFuser imports and a CUDA device exists; elsewhere it reports
itself unavailable with the reason. The translation (`translate.define_region`) is
written against nvFuser's Python API and takes the module providing it as a
parameter, so tests run it on CPU against a reference model of that API.

Example::

    jf = minijit.jit(fn, executors=["nvfuser"])
"""

from __future__ import annotations

from executors.nvfuser.executor import NvFuserExecutor
from minijit.extend import register_executor

ex = NvFuserExecutor()
# Not a default executor yet: the translation has only run against a reference model of nvFuser.
# Ask for it by name, or make it a default with `minijit.extend.add_default_executor("nvfuser")`.
register_executor(ex)
nvfuser_executor = ex

__all__ = ["NvFuserExecutor", "ex", "nvfuser_executor"]
