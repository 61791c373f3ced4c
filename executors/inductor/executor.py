"""The Inductor fusion executor: regions of prims become plain torch functions compiled by torch.compile.

Each region is written out as a Python function of torch calls (the torch executor's
implementations of its prims, see `codegen.py`) and compiled with
`torch.compile(fn, fullgraph=True)` with Inductor as its backend (`CompiledRegion.backend`, which also keeps
how to call the compiled graph without torch.compile's frame: `direct.py`). In-place members
(`copy_`, `copy_to_out_`) stay in that function: torch.compile keeps the mutation
semantics of eager code (it functionalizes the graph and Inductor stores the new
values straight into the input buffers), so a region writes its results into the
caller's tensors itself, with no copy afterwards, and a mutated input ends up
exactly as eager would leave it (docs/design.md, invariants 1 and 2). torch.compile does
not guard against inputs that share memory, so a call where a tensor the region
writes overlaps another input runs the same function uncompiled (torch calls in
trace order, eager's semantics). Where the trace's memory model shows that no input the
region writes can share memory with another (`Region.sharing`: each is an input of the
trace kept apart by the entry's guard, or memory the trace allocated), no call looks.

Symbolic sizes and numbers ("symbolic values" and automatic dynamic) enter a region as
inputs, and `prims.shape` and the integer number prims as members: such a region is
compiled with `dynamic=True`, so the compiled function serves every value, as the trace
does; the dims the trace holds constant are marked static in it (`codegen.static_marks`).

Compilation is lazy, as torch.compile's is: a region compiles on its first run, with the
call's own tensors, so that torch.compile's guards (on `nn.Parameter` against a plain
tensor, on `requires_grad`, on layouts) hold for the calls after it. Compiling from
example tensors at claim time cost a second compile of every region that reads a
parameter. `CompiledRegion.compile_s` is how long that first run took. Where a compile
fails (then, or later where torch.compile's guards fail and it compiles again), nothing
has run, and the region runs its torch calls from then on, with a warning.

Compiled regions live in a module-level cache keyed by the region's canonical
source and its inputs' metadata, so equal regions share one compiled function
across layers, cache entries and jitted functions.
"""

from __future__ import annotations

import importlib.util
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from executors.inductor.codegen import NotFusible, RegionSource, make_function, region_source, writable
from executors.inductor.direct import Direct, DirectGraph, GlobalState
from minijit.extend import (
    BoundSymbol,
    FusionExecutor,
    NumberProxy,
    Proxy,
    Region,
    TensorProxy,
    cuda_attention,
    prims,
    resolve_symbol,
)

# Prims left to other executors: real tensors captured into the trace (a cache keyed by source
# must not bake one in) and device moves. Random prims never reach `fusible`: FusionExecutor.claims
# keeps them with the torch executor, which draws as eager does.
EXCLUDED = frozenset({prims.tensor_constant, prims.device_put, prims.sdpa_flash, prims.sdpa_flash_backward,
                      cuda_attention.sdpa_cuda, cuda_attention.sdpa_cuda_backward})
# Composite ops a region calls whole, as torch.compile does, where torch's own kernel beats their decomposition
# compiled by Inductor: attention (Inductor calls torch's flash kernel for it; its math decomposition compiled is
# ~1.5x slower at 4 x 4 x 128 x 64). Never with dropout, which draws: random ops stay with the torch executor.
WHOLE = frozenset({resolve_symbol(torch.nn.functional.scaled_dot_product_attention)})
# Attention scores (query length x key length, on the traced call) from which torch's kernel is called whole; below,
# the decomposition fuses with its neighbours and wins (a decode step's single query: 411 against 455 µs a call).
WHOLE_FROM_SCORES = 64 * 64
# Prims whose results are Python numbers computed from sizes and numbers (never from a tensor's
# data): inside a region they become the compiled graph's symbolic size arithmetic.
NUMBER_RESULTS = frozenset({prims.shape, *prims.NUMBER_PRIMS.values()})
_PRIMS = frozenset(prims.ALL_PRIMS.values())
# Devices Inductor generates code for.
DEVICES = {"cpu", "cuda"}


class CompiledRegion:
    """The callable a region runs as: the compiled function, plus the in-place outputs passed through.

    torch.compile compiles on the first call that does not overlap (`compile_s` is how long that call took):
    with the call's own tensors, whose types (`nn.Parameter`), `requires_grad` and layouts its guards check, so
    that the compiled function serves the calls after it without compiling again."""

    def __init__(self, compiled: Callable[..., Any], src: RegionSource, key: str, plain: Callable[..., Any],
                 checks_overlap: bool = True):
        self.compiled = compiled
        self.plain = plain
        # The inputs whose storages each call compares: none where the trace's memory model shows every input the
        # region writes to have memory of its own on every call its entry's guard lets through.
        self.written = src.written if checks_overlap else []
        self.source = src.source
        self.passthrough = src.passthrough
        self.key = key
        self.compile_s: float | None = None
        self.uses = 0
        self.note = "inductor"
        self._direct = all(i is None for i in src.passthrough)
        # The compiled graph called without torch.compile's frame, where it may be (`direct.py`); the backend
        # leaves the graph it compiles in `_captured`, taken up after the call that compiled it.
        self.graph: DirectGraph | None = None
        self._captured: tuple[int, DirectGraph | None] | None = None  # (the compiling thread, its graph)
        # Where no graph is called directly: the cache entry of `compiled` that served the last call through the
        # frame, run without it where its guards pass.
        self.direct: Direct | None = None
        self._numbers_at: list[bool] = []
        self._n_returned = src.n_returned

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        # torch.compile assumes the inputs it was compiled for do not overlap (their storages
        # are not guarded); where a tensor the region writes shares memory with another input,
        # the uncompiled function (torch calls in trace order) gives eager's result instead.
        if self.written and _writes_overlap(inputs, self.written):
            result = self.plain(*inputs)
        elif self.compile_s is None:
            import torch._inductor.config as inductor_config

            start = time.perf_counter()
            # One compile thread: a worker pool costs seconds to start and competes with the program for cores,
            # and a CPU region is one C++ file anyway.
            with inductor_config.patch(compile_threads=1):
                result = self._run_compiled(inputs)
            self.compile_s = time.perf_counter() - start
        else:
            result = self._run_compiled(inputs)
        if self._direct:
            return result
        returned = iter(result)
        return tuple(next(returned) if i is None else inputs[i] for i in self.passthrough)

    def _run_compiled(self, inputs: tuple[Any, ...]) -> Any:
        graph = self.graph
        if graph is not None and graph.admits(inputs):
            return graph(inputs)
        direct = self.direct
        if direct is not None:
            ran, result = direct.run(inputs)
            if ran:
                return result
        state = _global_state()
        try:
            result = self.compiled(*inputs)
        except torch._dynamo.exc.TorchDynamoException as e:
            # torch.compile compiles on the first call, and again where its guards fail (a new layout, a 0/1
            # size); a compile may fail: nothing has run yet, so the torch calls take this call and the later ones.
            warnings.warn(f"minijit: inductor could not compile a region, running it with torch from now on: "
                          f"{type(e).__name__}: {str(e)[:300]}", stacklevel=3)
            self.compiled = self.plain
            self.graph = self.direct = None
            return self.plain(*inputs)
        captured, self._captured = self._captured, None
        if captured is not None and captured[0] == threading.get_ident() and captured[1] is not None:
            # (this call compiled a graph: the next calls like it go to it directly)
            captured[1].state = state
            self.graph, self.direct = captured[1], None
        else:  # (the entry that served this call, run without the frame next time)
            self.direct = Direct.find(self.compiled, inputs)
        return result

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        """torch.compile's backend for this region: Inductor's (`compile_fx`, as `backend="inductor"`), keeping
        how to call the graph it compiles directly."""
        from torch._inductor.compile_fx import compile_fx

        graph = DirectGraph.capture(gm, example_inputs, self._numbers_at, self._n_returned)
        # A graph called directly has its inputs' layouts checked before each call (`DirectGraph.admits`), and
        # through the frame by torch.compile's guards: Inductor's own check of each input's sizes and strides
        # would be a third.
        patches = {"size_asserts": False} if graph is not None and _has_size_asserts() else {}
        fn = compile_fx(gm, example_inputs, config_patches=patches)
        if graph is not None:
            graph.fn = fn
        self._captured = (threading.get_ident(), graph)
        return fn


def _has_size_asserts() -> bool:
    """Whether this Inductor has the setting that leaves out its input size checks."""
    import torch._inductor.config as inductor_config

    return isinstance(getattr(inductor_config, "size_asserts", None), bool)


def _global_state() -> GlobalState | None:
    """The global state a graph compiles under; None where this torch cannot record it (then no graph is called
    directly)."""
    guard = getattr(torch._C._dynamo.guards, "GlobalStateGuard", None)
    return GlobalState(guard()) if guard is not None else None


class _RegionCache:
    """Compiled regions by signature, shared by every jitted function in the process."""

    def __init__(self) -> None:
        self.entries: dict[str, CompiledRegion] = {}
        self.hits = 0
        self.misses = 0
        self.lock = threading.Lock()

    def clear(self) -> None:
        """Forget every compiled region (the next equal region compiles again)."""
        with self.lock:
            self.entries.clear()
            self.hits = self.misses = 0


CACHE = _RegionCache()


def cache_info() -> dict[str, int]:
    """How the compiled-region cache has done: hits, misses (compilations) and size.

    Example::

        executors.inductor.cache_info()   # {'hits': 3, 'misses': 2, 'size': 2}
    """
    return {"hits": CACHE.hits, "misses": CACHE.misses, "size": len(CACHE.entries)}


def _dims(t: TensorProxy) -> list[int]:
    return [d if type(d) is int else int(d.value) for d in t.shape]


def _symbolic(t: TensorProxy) -> bool:
    return any(type(d) is not int for d in t.shape)


def _metadata(p: Proxy) -> str:
    if isinstance(p, NumberProxy):
        return f"{p.python_type.__name__}?"
    if not isinstance(p, TensorProxy):
        raise NotFusible(f"non-tensor input {p.name}")
    dims = ",".join(str(d) if type(d) is int else "?" for d in p.shape)
    return f"{p.dtype}[{dims}]{p.device}{'g' if p.requires_grad else ''}"


def _example(p: Proxy) -> Any:
    """A value for the run of the region's torch calls that finds which results are contiguous."""
    if isinstance(p, NumberProxy):
        return p.python_type(p.value)  # (a number `Tensor.item()` computes is nan here: values do not matter)
    # Zeros, not empty: index inputs of gathers must be in bounds for the one example run.
    t = torch.zeros(_dims(p), dtype=p.dtype, device=p.device)
    if p.requires_grad and (p.dtype.is_floating_point or p.dtype.is_complex):
        # A non-leaf, like most tensors a region writes into in place while grad is on.
        t = t.requires_grad_().clone()
    return t


class InductorExecutor(FusionExecutor):
    """Fuses every prim it can into regions compiled by TorchInductor (C++/OpenMP on CPU).

    Not a default executor: name it. Matmuls join regions (Inductor calls its own matmul
    kernels; set `fuse_matmul = False` to leave them to the torch executor), so a decode
    step's forward is one region. Symbolic sizes, and the integer arithmetic on them, are
    inputs and members of a region, compiled as torch.compile's dynamic sizes; a float the
    trace computes (an lr) is an input, its arithmetic stays outside.

    Example::

        jf = minijit.jit(adam_step, executors=["inductor"])
        jf(params, grads, exp_avgs, exp_avg_sqs)   # one compiled region updates every parameter
    """

    fuse_matmul = True
    # An optimizer's step count stays a tensor, as under torch.compile: a step is then one region, not one per
    # parameter split at each `item()` (and its bias corrections round as torch.compile's do).
    numbers_stay_tensors = True
    # Regions with fewer compute members (views not counted) run as torch calls: one torch
    # op gains nothing from Inductor and costs torch.compile's per-call guard check.
    min_ops = 2

    def __init__(self) -> None:
        super().__init__("inductor", version=torch.__version__)
        self._reason: str | bool | None = False

    def unavailable_reason(self) -> str | None:
        """Why Inductor cannot compile here (no torch._inductor, no C++ compiler), or None."""
        if self._reason is False:
            self._reason = _find_unavailable_reason()
        return self._reason  # type: ignore[return-value]

    def fusible(self, bsym: BoundSymbol) -> bool:
        """Prims on tensors of a device Inductor compiles for, and the size arithmetic on symbolic numbers."""
        sym = bsym.sym
        if sym in WHOLE:
            return (_draws_nothing(bsym) and _scores(bsym) >= WHOLE_FROM_SCORES and self._tensors_ok(bsym)
                    and writable(bsym))
        if sym not in _PRIMS or sym in EXCLUDED:
            return False
        if sym is prims.matmul and not self.fuse_matmul:
            return False
        if (sym.effects.copies and not self.fuse_copies_to_out) or sym.effects.external:
            return False  # an external prim (a value check that may end the call) stays where it is
        if not self._tensors_ok(bsym) or not writable(bsym):
            return False
        outs = list(bsym.proxy_outputs())
        if sym in NUMBER_RESULTS:
            # Size arithmetic only: torch.compile mis-handles some float arithmetic on numbers it does not
            # specialise (`s ** 2` fails to recompile for a negative `s`, torch 2.13), so float results stay
            # outside, and the region takes them as inputs.
            return all(isinstance(p, NumberProxy) and p.python_type is int for p in outs) and all(
                not isinstance(x, NumberProxy) or x.python_type is int for x in bsym.args)
        return bool(outs) and all(isinstance(p, TensorProxy) and _tensor_ok(p) for p in outs)

    @staticmethod
    def _tensors_ok(bsym: BoundSymbol) -> bool:
        """Every tensor `bsym` takes is on a device Inductor compiles for, and it takes no other proxy than
        tensors and numbers."""
        for x in _flatten([*bsym.args, *bsym.kwargs.values()]):
            if isinstance(x, TensorProxy) and not _tensor_ok(x):
                return False
            if isinstance(x, Proxy) and not isinstance(x, TensorProxy | NumberProxy):
                return False
        return True

    def can_join(self, members: Sequence[BoundSymbol], bsym: BoundSymbol) -> bool:
        """Any fusible prim may join: Inductor splits a region into kernels itself."""
        return True

    def fuse(self, region: Region) -> CompiledRegion | None:
        """The region's compiled function (compiled on its first run) or the cache's equal one; None for regions too
        small to gain."""
        compute = [b for b in region.members if b.sym.effects.views is None]  # views compute nothing
        if len(compute) < self.min_ops:
            return None
        try:
            src = region_source(region)
            checks_overlap = region.sharing is None or not region.sharing.isdisjoint(src.written)
            key = (src.source + "|" + ";".join(_metadata(p) for p in region.inputs)
                   + f"|grad={torch.is_grad_enabled()}|overlap={checks_overlap}")
        except NotFusible:
            return None
        with CACHE.lock:
            hit = CACHE.entries.get(key)
            if hit is not None:
                CACHE.hits += 1
                hit.uses += 1
                return hit
        try:
            compiled = self._compile(region, src, key, checks_overlap)
        except Exception as e:  # a region torch.compile cannot take leaves it to the torch executor
            warnings.warn(f"minijit: inductor could not compile {region.name} ({len(region.members)} prims), "
                          f"running it with torch instead: {type(e).__name__}: {str(e)[:300]}", stacklevel=2)
            return None
        with CACHE.lock:
            CACHE.misses += 1
            compiled.uses += 1
            CACHE.entries[key] = compiled
        return compiled

    def _compile(self, region: Region, src: RegionSource, key: str, checks_overlap: bool) -> CompiledRegion:
        # Inductor lays out a result its own way even where the torch calls give a contiguous one (keys put after
        # an empty cache come out transposed), and the next call's guard then sees a layout the trace did not: a
        # result contiguous when the torch calls run on example inputs is returned `.contiguous()`, which
        # Inductor writes contiguously at no cost. So is a value whose views the region returns (their strides
        # follow it), where it is computed; views themselves, and the values they view, are returned as they are.
        try:
            plain = make_function(region_source(region, probe=True))(*[_example(p) for p in region.inputs])
        except Exception:  # (an example the torch calls refuse: the layouts stay Inductor's)
            plain = ()
        dense = [isinstance(t, torch.Tensor) and t.is_contiguous() for t in plain]
        contiguous = frozenset(k for k in range(src.n_returned) if k < len(dense) and dense[k])
        bases = frozenset(b for b, d in zip(src.view_bases, dense[src.n_returned:], strict=False) if d)
        if contiguous or bases:
            src = region_source(region, contiguous, bases)
        fn = make_function(src)
        # Symbolic sizes or numbers: torch.compile specializes none of them; the dims the trace holds constant are
        # marked static inside the compiled function (codegen.static_marks).
        dynamic = any(isinstance(p, NumberProxy) or _symbolic(p) for p in region.inputs)
        region_call = CompiledRegion(fn, src, key, fn, checks_overlap)
        region_call._numbers_at = [isinstance(p, NumberProxy) for p in region.inputs]
        region_call.compiled = torch.compile(make_function(src, marked=dynamic), backend=region_call.backend,
                                             dynamic=dynamic, fullgraph=True)
        return region_call


def _draws_nothing(bsym: BoundSymbol) -> bool:
    """An attention call without dropout (`dropout_p` 0, a Python number: a symbolic one may not be 0)."""
    dropout = bsym.kwargs.get("dropout_p", bsym.args[4] if len(bsym.args) > 4 else 0.0)
    return type(dropout) in (int, float) and dropout == 0


def _scores(bsym: BoundSymbol) -> int:
    """The number of attention scores per head of an attention call, on the call traced (a symbolic size's value
    there: it decides only which kernel computes the same values)."""
    query, key = bsym.args[0], bsym.args[1]
    lengths = [d.value if isinstance(d, NumberProxy) else d for d in (query.shape[-2], key.shape[-2])]
    if any(type(n) is not int for n in lengths):  # (a size only the trace knows has no value here: few, then)
        return 0
    return lengths[0] * lengths[1]


def _writes_overlap(inputs: Sequence[Any], written: list[int]) -> bool:
    """Whether an input the region writes into shares its storage with any other input."""
    storages = [x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)]
    if len(set(storages)) == len(storages):  # (the usual case, told at once: every tensor has its own storage)
        return False
    count: dict[int, int] = {}
    for p in storages:
        count[p] = count.get(p, 0) + 1
    return any(count.get(inputs[i].untyped_storage().data_ptr(), 0) > 1 for i in written
               if isinstance(inputs[i], torch.Tensor))


def _tensor_ok(t: TensorProxy) -> bool:
    return t.device.type in DEVICES and not t.dtype.is_complex


def _flatten(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, tuple | list):
            out.extend(_flatten(v))
        else:
            out.append(v)
    return out


def _find_unavailable_reason() -> str | None:
    if importlib.util.find_spec("torch._inductor") is None:
        return "this torch build has no torch._inductor"
    try:
        from torch._inductor import cpp_builder

        compiler = cpp_builder.get_cpp_compiler()
    except Exception as e:  # any failure to find or run the compiler means no CPU kernels
        return f"Inductor found no working C++ compiler for CPU kernels: {type(e).__name__}: {e}"
    if not compiler:
        return "Inductor found no C++ compiler for CPU kernels"
    return None


__all__ = ["CACHE", "CompiledRegion", "InductorExecutor", "cache_info"]
