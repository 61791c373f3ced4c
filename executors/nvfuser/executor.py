"""The nvFuser fusion executor: one FusionDefinition per region and input signature."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

import torch

from executors.nvfuser.translate import InputMeta, define_region, fusible
from minijit.extend import BoundSymbol, FusionExecutor, Region


class FusedRegion:
    """The callable a region runs as: builds (once per input signature) and executes its FusionDefinition."""

    def __init__(self, nv: ModuleType, region: Region):
        self.nv = nv
        self.region = region
        self.definitions: dict[tuple[Any, ...], tuple[Any, list[int]]] = {}
        self.note = "nvFuser FusionDefinition"

    def definition(self, inputs: tuple[Any, ...]) -> tuple[Any, list[int]]:
        """The FusionDefinition for inputs like these (built on first use), and the output aliases."""
        metas = tuple(InputMeta.of(x) if isinstance(x, torch.Tensor) else None for x in inputs)
        entry = self.definitions.get(metas)
        if entry is None:
            with self.nv.FusionDefinition() as fd:
                aliases = define_region(self.nv, fd, self.region, metas)
            entry = (fd, aliases)
            self.definitions[metas] = entry
        return entry

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        fd, aliases = self.definition(inputs)
        results = iter(fd.execute(list(inputs)))
        # Outputs aliasing an input are written into it; fd.execute returns the others in order.
        return tuple(inputs[a] if a >= 0 else next(results) for a in aliases)


class NvFuserExecutor(FusionExecutor):
    """Fuses regions of prims into nvFuser FusionDefinitions.

    `backend` is the module providing nvFuser's Python API (default: `nvfuser`, imported
    when first needed); tests pass a reference model of it, with `device_type="cpu"`.

    Example::

        jf = minijit.jit(fn, executors=["nvfuser"])
    """

    def __init__(self, name: str = "nvfuser", backend: ModuleType | None = None, device_type: str = "cuda"):
        super().__init__(name)
        self._backend = backend
        self.device_type = device_type

    @property
    def nv(self) -> ModuleType:
        """The nvFuser module (imported on first use)."""
        if self._backend is None:
            self._backend = importlib.import_module("nvfuser")
        return self._backend

    def unavailable_reason(self) -> str | None:
        """Why nvFuser cannot run here: not installed, failing to import, or no CUDA device."""
        if self._backend is not None:
            return None
        if importlib.util.find_spec("nvfuser") is None:
            return ("the nvfuser package is not installed (it needs a CUDA build of torch: "
                    "pip install nvfuser-cu12X-torch2Y matching your CUDA and torch)")
        if not torch.cuda.is_available():
            return "there is no CUDA device (nvFuser only generates CUDA kernels)"
        try:
            importlib.import_module("nvfuser")
        except Exception as e:  # a broken install shows up as any exception
            return f"importing nvfuser failed: {e!r}"
        return None

    def fusible(self, bsym: BoundSymbol) -> bool:
        """Elementwise prims, casts, broadcasts, reshapes, permutes, reductions, var_mean, full, copies."""
        if bsym.sym.effects.copies and not self.fuse_copies_to_out:
            return False
        return fusible(bsym, self.device_type)

    def fuse(self, region: Region) -> FusedRegion | None:
        """A FusedRegion for `region`, or None for a region of views only."""
        if all(b.sym.effects.views is not None for b in region.members):
            return None
        return FusedRegion(self.nv, region)
