"""The Triton fusion executor: claims pointwise prims and last-dim reductions, runs regions as kernels."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from executors.triton.codegen import (
    DTYPES,
    ELEMENTWISE,
    FLOATS,
    INTS,
    PLACEMENTS,
    REDUCTIONS,
    REMAPS,
    KernelWriter,
    Node,
    NotFusible,
    Store,
    apply_view,
    build_graph,
    kind,
    next_pow2,
    pow_exponent_ok,
    remap_dims,
    slice_args,
)
from minijit.extend import BoundSymbol, FusionExecutor, Proxy, Region, TensorProxy, prims


def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class _KernelCache:
    """Compiled kernels by source hash: identical regions (one per layer, say) share a kernel."""

    def __init__(self) -> None:
        self.kernels: dict[str, Any] = {}
        self.directory = Path(tempfile.gettempdir()) / f"minijit_triton_{os.getuid() if hasattr(os, 'getuid') else 0}"

    def get(self, name: str, source: str) -> Any:
        """The compiled kernel `name` with this source (written to a file and imported on first use)."""
        kernel = self.kernels.get(name)
        if kernel is None:
            # triton.jit reads the kernel's source through inspect, so it must live in a real file.
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{name}.py"
            text = "import triton\nimport triton.language as tl\n\n\n" + source
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(text)
                tmp.replace(path)
            spec = importlib.util.spec_from_file_location(f"minijit_triton_kernels.{name}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            kernel = getattr(module, name)
            self.kernels[name] = kernel
        return kernel


KERNELS = _KernelCache()


class _Kernel:
    """One generated kernel of a region: its source, and how to launch it."""

    def __init__(self, writer: KernelWriter, stores: list[Store], source: str, name: str, params: list[str]):
        self.writer = writer
        self.stores = stores
        self.source = source
        self.name = name
        self.params = params
        dom = writer.domain
        budget = 1 << 16 if interpreting() else 4096
        if writer.row:
            self.block_n = writer.block_n  # the whole row, or a chunk of a looped one
            n_rows = math.prod(dom[:-1])
            self.block_m = max(1, min(next_pow2(n_rows), budget // self.block_n))
            self.grid = (max(1, -(-n_rows // self.block_m)),)
        else:
            numel = math.prod(dom)
            self.block_m = 1
            self.block_n = min(next_pow2(numel), budget if interpreting() else 1024)
            self.grid = (max(1, -(-numel // self.block_n)),)
        self.empty = math.prod(dom) == 0
        self.used = sorted(writer.used_inputs)
        self.grid3 = (*self.grid, 1, 1)[:3]
        # Compiled kernels by the specialization Triton compiled them for (see _launch_key): launched
        # through their compiled launcher, without Triton's per-call binding and cache lookup.
        self.compiled: dict[tuple[Any, ...], Any] = {}

    def launch(self, inputs: Sequence[Any], destinations: list[torch.Tensor]) -> None:
        """Run the kernel on the region's inputs, storing into `destinations` (one per store)."""
        if self.empty:
            return
        args: list[Any] = [inputs[i] for i in self.used] + destinations
        for i in self.used:
            args += inputs[i].stride()
        for d in destinations:
            args += d.stride()
        if self.compiled:
            compiled = self.compiled.get(_launch_key(args))
            device, stream, hooks = _runtime()
            if compiled is not None and _no_hook(hooks.launch_enter_hook) and _no_hook(hooks.launch_exit_hook):
                # Triton's own launch, less its per-call work: no hooks set, so no launch metadata.
                compiled.run(*self.grid3, stream(device()), compiled.function, compiled.packed_metadata, None,
                             None, None, *args, self.block_m, self.block_n)
                return
        kernel = KERNELS.get(self.name, self.source)
        compiled = kernel[self.grid](*args, BLOCK_M=self.block_m, BLOCK_N=self.block_n)
        if not interpreting() and hasattr(compiled, "packed_metadata") and len(self.compiled) < 8:
            self.compiled[_launch_key(args)] = compiled


def _launch_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What Triton specializes a kernel on, for these arguments: each pointer's dtype and 16-byte alignment,
    and each integer's being 1, a multiple of 16, and within 32 bits."""
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                 else (a == 1, a % 16 == 0, -2**31 <= a < 2**31) for a in args)


def _no_hook(hook: Any) -> bool:
    """Whether a Triton launch hook is unset: None, or (Triton 3.5+) a hook chain with nothing in it."""
    return hook is None or not getattr(hook, "calls", True)


_RUNTIME: list[Any] = []  # Triton's current-device and current-stream functions, and its runtime knobs


def _runtime() -> list[Any]:
    """(current device, current stream, runtime knobs) of Triton's driver, looked up once."""
    if not _RUNTIME:
        from triton import knobs
        from triton.runtime import driver

        _RUNTIME.extend((driver.active.get_current_device, driver.active.get_current_stream, knobs.runtime))
    return _RUNTIME


class FusedRegion:
    """The callable a Triton region runs as: launches its kernels, returns the region's outputs."""

    def __init__(self, region: Region, kernels: list[_Kernel], n_outputs: int, aliases: dict[int, int],
                 direct_copy_ok: dict[int, bool], views: dict[int, tuple[int, list[Node]]],
                 derived: dict[int, tuple[int, list[Node]]] | None = None):
        self.region_name = region.name
        # Where the outputs go: the region's own device (a region of fills has no tensor input to take it from).
        self.device = next((torch.device(p.device) for p in region.outputs if isinstance(p, TensorProxy)),
                           torch.device("cuda" if not interpreting() else "cpu"))
        self.kernels = kernels
        self.n_outputs = n_outputs
        self.aliases = aliases
        self.direct_copy_ok = direct_copy_ok
        self.views = views
        self.derived = derived or {}  # outputs that are views of other outputs
        # the region's outputs, then values stored only for a view of them to be an output
        self.slots = max([n_outputs - 1, *(s.output_index for k in kernels for s in k.stores
                                           if s.output_index is not None)]) + 1
        self.sources = [k.source for k in kernels]
        self.note = "triton kernels: " + ", ".join(k.name for k in kernels)

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        device = self.device
        outputs: list[Any] = [None] * self.slots
        late_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        storages: dict[int, int] | None = None  # storage -> how many inputs live in it (counted when needed)
        for kernel in self.kernels:
            destinations = []
            for s in kernel.stores:
                if s.target is None:
                    t = torch.empty(s.node.shape, dtype=s.node.dtype, device=device)
                    outputs[s.output_index] = t
                else:
                    target = inputs[s.target]
                    if storages is None and self.direct_copy_ok[s.target]:
                        storages = _storage_counts(inputs)
                    if self.direct_copy_ok[s.target] and storages[target.untyped_storage().data_ptr()] == 1:
                        t = target
                    else:
                        # Invariant 2: where writing straight into the target could be seen by a
                        # read of its old value, compute into a buffer and copy once at the end.
                        t = torch.empty(s.node.shape, dtype=target.dtype, device=device)
                        late_copies.append((target, t))
                destinations.append(t)
            kernel.launch(inputs, destinations)
        for target, t in late_copies:
            target.copy_(t)
        for k, i in self.aliases.items():
            outputs[k] = inputs[i]
        for k, (i, chain) in self.views.items():
            outputs[k] = apply_view(inputs[i], chain)
        for k, (j, chain) in self.derived.items():
            outputs[k] = apply_view(outputs[j], chain)
        return tuple(outputs[:self.n_outputs])


def _storage_counts(inputs: Sequence[Any]) -> dict[int, int]:
    """How many of the inputs live in each storage (a target sharing one with another input is written late)."""
    counts: dict[int, int] = {}
    for x in inputs:
        if isinstance(x, torch.Tensor):
            ptr = x.untyped_storage().data_ptr()
            counts[ptr] = counts.get(ptr, 0) + 1
    return counts


def _regroups_rows(b: BoundSymbol, domain: tuple[int, ...]) -> bool:
    """Whether `b` is a reshape a row kernel over `domain` cannot index: one making a value of the domain's
    shape without keeping its last dim whole, or a value of another shape (row values regroup freely)."""
    if b.sym is not prims.reshape or remap_dims(b) is not None:
        return False
    x, out = b.args[0], tuple(b.output.shape)
    if out == domain:
        return not (x.ndim and x.shape[-1] == domain[-1])
    return not _row_like(out, domain)


# What the kernels compute: row reductions (var_mean computes both of its parts in one), and every prim claimed.
_ROW_REDUCTIONS = frozenset({*REDUCTIONS, prims.var_mean})
_CLAIMED = frozenset({*ELEMENTWISE, *REMAPS, *_ROW_REDUCTIONS, *PLACEMENTS, prims.convert_element_type,
                      prims.copy_in_format})
_PRIMS = frozenset(prims.ALL_PRIMS.values())


def _row_like(shape: tuple[int, ...], domain: tuple[int, ...]) -> bool:
    return shape in (domain, domain[:-1], (*domain[:-1], 1))


class TritonExecutor(FusionExecutor):
    """Fuses pointwise prims, casts, broadcasts and last-dim reductions (sum, amax, amin) into Triton kernels.

    Example::

        jf = minijit.jit(fn, executors=["triton"])
        jf(x)
        print(executors.triton.kernel_source(jf, "fusion_0"))
    """

    def __init__(self) -> None:
        super().__init__("triton")

    def unavailable_reason(self) -> str | None:
        """Why Triton cannot run here: not installed, not importable, or no CUDA device (and no interpreter)."""
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed (pip install 'minijit[triton]')"
        if not interpreting() and not torch.cuda.is_available():
            return ("there is no CUDA device (set TRITON_INTERPRET=1 before importing triton to run its kernels "
                    "on CPU through the Triton interpreter, slowly)")
        try:
            import triton  # noqa: F401
        except Exception as e:  # a broken install shows up as any exception
            return f"importing triton failed: {e!r}"
        return None

    def default_device(self) -> str | None:
        """CUDA: `jit` fuses with Triton by default where a CUDA device is present (its regions take CUDA tensors
        only, so a CPU call runs as without it); not under the interpreter, which is for tests."""
        return None if interpreting() else "cuda"

    def _device_ok(self, t: TensorProxy) -> bool:
        return t.device.type == ("cpu" if interpreting() else "cuda")

    def fusible(self, bsym: BoundSymbol) -> bool:
        """Pointwise prims, casts, broadcasts/permutes/size-1 reshapes, slices, cats, fills, copies, and last-dim
        sum/amax/amin."""
        sym = bsym.sym
        if sym not in _CLAIMED and not (sym.effects.copies and sym in _PRIMS):
            return False
        if sym is prims.copy_in_format and bsym.args[1:] != (torch.contiguous_format,):
            return False  # a kernel stores its results row-major: `contiguous()`'s copy, not a channels-last one
        if sym.effects.copies and not self.fuse_copies_to_out:
            return False
        values = [*bsym.args, *bsym.kwargs.values()]
        tensors = [x for x in values if isinstance(x, TensorProxy)]
        if sym is prims.cat:
            tensors = list(bsym.args[0] if bsym.args else bsym.kwargs["tensors"])
        outs = [p for p in bsym.proxy_outputs()]
        if sym in (prims.full, prims.iota):
            values = [bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs.get("fill_value")] if sym is prims.full \
                else [bsym.kwargs.get("start"), bsym.kwargs.get("step")]
            out = bsym.output
            return (all(isinstance(v, bool | int | float) for v in values) and out.dtype in (*FLOATS, *INTS)
                    and self._device_ok(out) and all(type(d) is int for d in out.shape))
        if not tensors or any(not isinstance(p, TensorProxy) for p in outs):
            return False
        for t in tensors + outs:
            if t.dtype not in DTYPES or not self._device_ok(t) or any(type(d) is not int for d in t.shape):
                return False
        if sym in ELEMENTWISE:
            if any(isinstance(x, Proxy) and not isinstance(x, TensorProxy) for x in values):
                return False
            if any(isinstance(x, complex) for x in values):
                return False
            if sym is prims.pow and not (isinstance(bsym.args[0], TensorProxy) and pow_exponent_ok(bsym.args[1])):
                return False
            data = tensors[1:] if sym is prims.where else tensors
            return all(kind(t.dtype) in ELEMENTWISE[sym][1] for t in data)
        if sym in _ROW_REDUCTIONS:
            x = bsym.args[0]
            if sym is prims.var_mean and not isinstance(bsym.args[2], int | float):
                return False
            dims = tuple(bsym.args[1]) if len(bsym.args) > 1 else tuple(bsym.kwargs.get("dims", ()))
            return (x.dtype in FLOATS and x.ndim >= 1 and tuple(d % x.ndim for d in dims) == (x.ndim - 1,)
                    and 0 < x.shape[-1])
        if sym in REMAPS:
            x = bsym.args[0]
            # Any reshape regroups indices (a row-major flat index split again); zero-size ones make no kernel.
            return remap_dims(bsym) is not None or (sym is prims.reshape and 0 not in x.shape and x.ndim > 0)
        if sym is prims.slice_prim:
            steps = slice_args(bsym)[3]
            return steps is None or all(step == 1 for step in steps)
        if sym is prims.cat:
            return all(isinstance(t, TensorProxy) and t.dtype == bsym.output.dtype for t in tensors)
        return True

    def can_join(self, members: Sequence[BoundSymbol], bsym: BoundSymbol) -> bool:
        """Keep one reduction domain per region, and row results only flowing back into rows of it."""
        domain: tuple[int, ...] | None = None
        derived: set[str] = set()
        syms = {b.sym for b in [*members, bsym]}
        if syms & {prims.slice_prim, prims.cat} and syms & _ROW_REDUCTIONS:
            return False  # shifted indices stay in pointwise kernels (a row kernel's loads assume its rows)
        reductions = [b for b in [*members, bsym] if b.sym in _ROW_REDUCTIONS]
        if reductions and any(_regroups_rows(b, tuple(reductions[0].args[0].shape)) for b in [*members, bsym]):
            return False
        for b in [*members, bsym]:
            outs = {p.name for p in b.proxy_outputs()}
            if b.sym in _ROW_REDUCTIONS:
                x = b.args[0]
                # A row result cannot be reduced again (its shape differs from the domain), but a
                # full-shape value computed from one can (softmax: exp(x - max) is summed).
                if domain is not None and tuple(x.shape) != domain:
                    return False
                domain = tuple(x.shape)
                derived |= outs
            elif any(p.name in derived for p in b.proxy_args()):
                if not _row_use_ok(b, domain):
                    return False
                derived |= outs
        return True

    def fuse(self, region: Region) -> FusedRegion | None:
        """Generate (or reuse) the region's kernels; None for a region not worth a kernel."""
        syms = {b.sym for b in region.members}
        if syms <= {*REMAPS, prims.slice_prim}:
            return None  # views only: torch does them without copying
        if syms <= {prims.full, prims.iota}:
            return None  # a fill is one kernel either way
        try:
            return self._compile(region)
        except NotFusible:
            return None

    def _compile(self, region: Region) -> FusedRegion:
        _, stores, aliases, views, derived = build_graph(region)
        input_shapes = {i: tuple(p.shape) for i, p in enumerate(region.inputs) if isinstance(p, TensorProxy)}
        domain = None
        for b in region.members:
            if b.sym in _ROW_REDUCTIONS:
                domain = tuple(b.args[0].shape)
                break
        groups: dict[tuple[bool, tuple[int, ...]], list[Store]] = {}
        for s in stores:
            if domain is not None and (s.node.depends_on_reduction() or _row_like(s.node.shape, domain)):
                groups.setdefault((True, domain), []).append(s)
            else:
                groups.setdefault((False, s.node.shape), []).append(s)
        packs = [(row, dom, pack) for (row, dom), group in groups.items()
                 for pack in ([group] if row else _packs(group, input_shapes, math.prod(dom)))]
        kernels: list[_Kernel] = []
        loads_by_kernel: dict[int, list[tuple[int, set[Any]]]] = {}
        store_kernel: dict[int, int] = {}
        for row, dom, group in packs:
            writer = KernelWriter(dom, row, input_shapes)
            ptrs = []
            for j, s in enumerate(group):
                dtype = s.node.dtype if s.target is None else region.inputs[s.target].dtype
                ptrs.append((s.node, f"out{j}", dtype))
                if s.target is not None:
                    store_kernel[s.target] = len(kernels)
            source, params = writer.source("KERNEL", ptrs)
            digest = hashlib.sha256(source.encode()).hexdigest()[:10]
            ops = "_".join(dict.fromkeys(writer.ops))[:40] or "copy"
            name = f"triton_{'red' if row else 'pw'}_{ops}_{digest}"
            source = source.replace("def KERNEL(", f"def {name}(", 1)
            loads_by_kernel[len(kernels)] = list(writer.load_projections.items())
            kernels.append(_Kernel(writer, group, source, name, params))
        direct = {t: _direct_copy_ok(t, k, kernels, loads_by_kernel) for t, k in store_kernel.items()}
        return FusedRegion(region, kernels, len(region.outputs), aliases, direct, views, derived)


# The most whole-tensor inputs one pointwise kernel loads, where its stores are independent computations:
# more (a foreach optimizer step over 20 parameters in one kernel) keeps too many values live per element.
LOADS_PER_KERNEL = 8


def _packs(group: list[Store], input_shapes: dict[int, tuple[int, ...]], numel: int) -> list[list[Store]]:
    """`group`'s stores (over a domain of `numel` elements) in kernels: stores computed from shared whole-size
    values or inputs stay together; independent computations are packed into kernels of at most
    LOADS_PER_KERNEL whole-tensor loads. Smaller values (a bias correction, a broadcast row) join nothing:
    each kernel computes them again."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x: tuple[str, int]) -> tuple[str, int]:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    reads: list[set[int]] = []  # per store: the whole-tensor inputs it loads
    for k, s in enumerate(group):
        seen: set[int] = set()
        inputs: set[int] = set()
        stack = [s.node]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op == "load":
                i = node.attrs["input"]
                if math.prod(input_shapes[i]) == numel:
                    inputs.add(i)
                    parent[find(("input", i))] = find(("store", k))
            else:
                if math.prod(node.shape) == numel:
                    parent[find(("node", id(node)))] = find(("store", k))
                stack += [a for a in node.args if isinstance(a, Node)]
        if s.target is not None:
            parent[find(("input", s.target))] = find(("store", k))
        reads.append(inputs)
    components: dict[tuple[str, int], list[int]] = {}
    for k in range(len(group)):
        components.setdefault(find(("store", k)), []).append(k)
    packs: list[list[Store]] = []
    loads: set[int] = set()
    for members in components.values():
        needed = set().union(*(reads[k] for k in members))
        if packs and len(loads | needed) <= LOADS_PER_KERNEL:
            packs[-1] += [group[k] for k in members]
            loads |= needed
        else:
            packs.append([group[k] for k in members])
            loads = needed
    return packs


def _direct_copy_ok(target: int, kernel_index: int, kernels: list[_Kernel],
                    loads_by_kernel: dict[int, list[tuple[int, set[Any]]]]) -> bool:
    """Whether a copy into input `target` may write straight into it (docs/design.md, invariant 2).

    Safe when every read of the target's old value happens in the kernel that writes it, at the
    very element it writes (each program reads an element before writing it, and no other
    program reads it); otherwise a later read could see the new value.
    """
    kernel = kernels[kernel_index]
    store = next(s for s in kernel.stores if s.target == target)
    store_proj = kernel.writer.store_projection(store.node.shape)
    for k, loads in loads_by_kernel.items():
        for i, projections in loads:
            if i != target:
                continue
            if k != kernel_index or projections != {store_proj}:
                return False
    return True


def _row_use_ok(b: BoundSymbol, domain: tuple[int, ...] | None) -> bool:
    """Whether `b`, which reads a row result, keeps it indexed by rows of the reduction domain."""
    if domain is None:
        return False
    out = b.output
    if not isinstance(out, TensorProxy) or not _row_like(tuple(out.shape), domain):
        return False
    if b.sym is prims.transpose:
        return False
    if b.sym is prims.broadcast_in_dim:
        x = b.args[0]
        dims = tuple(b.args[2] if len(b.args) > 2 else b.kwargs["broadcast_dims"])
        return dims == tuple(range(x.ndim)) and _row_like(tuple(x.shape), domain)
    return True


__all__ = ["FusedRegion", "Node", "TritonExecutor", "interpreting"]
