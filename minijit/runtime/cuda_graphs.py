"""CUDA graphs: a compiled trace replayed from a captured CUDA graph, one launch for all its kernels.

`minijit.jit(fn, cuda_graphs=True)` wraps each compiled callable of a cache entry (the
forward, the backward, or the whole computation when nothing is differentiated) in a
`GraphedCallable`. For each kind of call (the inputs' shapes, strides and dtypes, and any
numbers passed) it runs:

1. the first call with ordinary launches: it compiles the kernels (Triton, cuBLAS handles)
   and records where the input tensors live;
2. the second call captures the graph and replays it. An input found at the same address
   as on the first call (a parameter, an optimizer state, a forward's saved tensor that is
   itself a graph output) is read in place: the graph holds it. Any other input is copied
   into a buffer of the graph's own before each replay, and copied back after the replay
   where the trace writes into it;
3. later calls replay. An input read in place that moved gets its own buffer (the graph is
   captured again, a few times at most).

Results: what the user gets (outputs, gradients) is copied out of the graph's memory after
each replay, so a later replay never changes it. The tensors a forward saves for its
backward are handed out as views of the graph's memory instead, and a replay waits for
them to be released: when a view handed out by the last replay is still alive (two forwards
before one backward), the call runs with ordinary launches.

Each graph has its own memory pool (a pool shared by graphs of several shapes could hand
one graph's live outputs to another's temporaries). The random generator of the device is
registered by torch's capture, so each replay draws new numbers, as eager does.

A call that cannot be captured runs with ordinary launches, and the reason is counted in
`cache_info()`: an input on the CPU (torch.optim keeps `step` on the CPU unless
`capturable=True`), a trace that synchronizes with the CPU (`.item()`, a data-dependent
shape, a value guard), random numbers drawn on the CPU or from an explicit generator.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.ir import Trace, tree_flatten, tree_map

_use_count = torch._C._storage_Use_Count
MAX_CAPTURES = 4  # per kind of call: captures beyond the first are made when inputs read in place move


class CudaGraphs:
    """How graphs are captured and replayed: torch.cuda's graphs (tests on the CPU put a stand-in here)."""

    device_type = "cuda"

    @staticmethod
    def capture(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, Any]:
        """(the graph, the result tree of its static tensors): `fn(*args)` recorded, not run."""
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
            result = fn(*args)
        return graph, result

    @staticmethod
    def replay(graph: Any) -> None:
        graph.replay()


BACKEND: Any = CudaGraphs


def graph_refusal(trace: Trace) -> str | None:
    """Why `trace` can never be replayed from a CUDA graph, or None."""
    for b in _walk(trace.bound_symbols):
        if not b.sym.effects.random:
            continue
        if b.kwargs.get("generator") is not None:
            return f"{b.sym.name} draws from an explicit torch.Generator (line {b.source or '?'})"
        for out in tree_flatten(b.output):
            device = getattr(out, "device", None)
            if device is not None and torch.device(device).type != BACKEND.device_type:
                return f"{b.sym.name} draws random numbers on {device}, which a replay would not draw again"
    return None


def _walk(bsyms: Sequence[Any]) -> Any:
    for b in bsyms:
        yield b
        yield from _walk(b.subsymbols)


@dataclass
class GraphStats:
    """How a graphed callable's calls ran."""

    part: str
    replays: int = 0
    captures: int = 0
    ordinary: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def ordinary_run(self, reason: str) -> None:
        self.ordinary += 1
        if reason in self.reasons or len(self.reasons) < 10:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def describe(self) -> str:
        text = f"{self.part}: {self.replays} replay(s), {self.captures} capture(s), {self.ordinary} ordinary run(s)"
        return text + "".join(f"\n    ordinary ({n}x): {r}" for r, n in self.reasons.items())


@dataclass
class _Graph:
    """One captured graph and the buffers around it."""

    graph: Any  # torch.cuda.CUDAGraph
    args: list[Any]  # what the capture was called with: the callers' tensors read in place, our buffers
    in_place: dict[int, int]  # position -> data_ptr of an input read in place
    buffered: tuple[int, ...]  # positions copied into args[i] before each replay
    copy_back: tuple[int, ...]  # buffered positions the trace writes into
    result: Any  # the static result tree
    leaves: list[Any]
    aliased: frozenset[int]  # leaf positions handed out as views (saved tensors)
    returned: dict[int, int]  # leaf positions that are inputs: the call's own input there is returned
    watched: list[tuple[Any, int]]  # (storage, use count when nothing we handed out is alive)


class GraphFamily:
    """The graphed callables of one cache entry: a backward reads its forward's outputs in place."""

    def __init__(self) -> None:
        # data_ptr -> a graph output handed out as views (saved tensors): read in place by later graphs,
        # which hold this tensor rather than the view they were called with (a view held would look alive).
        self.outputs: dict[int, torch.Tensor] = {}
        self.parts: list[GraphStats] = []


class GraphedCallable:
    """`fn` run from CUDA graphs captured per kind of call (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], family: GraphFamily, part: str, *,
                 saved_from: bool = False, mutated: Sequence[int] = (), refusal: str | None = None):
        self.fn = fn
        self.family = family
        self.stats = GraphStats(part)
        family.parts.append(self.stats)
        self.saved_from = saved_from  # the result is (outputs, saved): saved leaves are handed out as views
        self.mutated = frozenset(mutated)
        self.refusal = refusal
        self.first_addresses: dict[Hashable, dict[int, int]] = {}
        self.graphs: dict[Hashable, _Graph] = {}
        self.capture_counts: dict[Hashable, int] = {}

    def __call__(self, *inputs: Any) -> Any:
        if self.refusal is not None:
            self.stats.ordinary_run(self.refusal)
            return self.fn(*inputs)
        key = self._key(inputs)
        if isinstance(key, str):
            self.stats.ordinary_run(key)
            return self.fn(*inputs)
        graph = self.graphs.get(key)
        if graph is None:
            first = self.first_addresses.get(key)
            if first is None:
                self.first_addresses[key] = _addresses(inputs)
                self.stats.ordinary_run("first call of this kind (compiles kernels; the next call captures)")
                return self.fn(*inputs)
            return self._capture(key, inputs, first)
        for i, ptr in graph.in_place.items():
            if inputs[i].data_ptr() != ptr:
                del self.graphs[key]  # captured again with that input in a buffer of its own
                return self._capture(key, inputs, {j: p for j, p in graph.in_place.items() if j != i})
        for storage, count in graph.watched:
            if _use_count(storage._cdata) != count:
                self.stats.ordinary_run("a view handed out by the last replay is still alive (e.g. two forwards "
                                        "before one backward)")
                return self.fn(*inputs)
        return self._replay(graph, inputs)

    def _key(self, inputs: tuple[Any, ...]) -> Hashable | str:
        """The kind of call (metadata and numbers), or the reason it cannot be replayed."""
        parts: list[Any] = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                if x.device.type != BACKEND.device_type:
                    return f"input {i} is a {x.device.type} tensor (a graph replays device work only)"
                parts.append((x.shape, x.stride(), x.storage_offset(), x.dtype, x.device.index))
            elif x is None or isinstance(x, bool | int | float | str | torch.dtype | torch.device):
                parts.append((type(x), x))
            else:
                return f"input {i} is a {type(x).__name__}"
        return tuple(parts)

    def _capture(self, key: Hashable, inputs: tuple[Any, ...], stay: dict[int, int]) -> Any:
        """Capture the graph for `key` (inputs at `stay`'s addresses read in place), then replay it."""
        count = self.capture_counts.get(key, 0)
        if count >= MAX_CAPTURES:
            self.stats.ordinary_run(f"inputs read in place moved {MAX_CAPTURES} times")
            return self.fn(*inputs)
        self.capture_counts[key] = count + 1
        shared = _shared_storages(inputs)
        in_place: dict[int, int] = {}
        buffered: list[int] = []
        args = list(inputs)
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                continue
            ptr = x.data_ptr()
            output = self.family.outputs.get(ptr)
            if output is not None and (output.shape, output.stride(), output.dtype) == (x.shape, x.stride(), x.dtype):
                in_place[i] = ptr
                args[i] = output
            elif stay.get(i) == ptr or not _bufferable(x, shared):
                in_place[i] = ptr
            else:
                buffered.append(i)
                args[i] = torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)
        try:
            graph, result = BACKEND.capture(self.fn, args)
        except Exception as e:  # a trace that synchronizes, or an op capture does not allow
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            self.refusal = f"capture failed: {type(e).__name__}: {first}"
            self.stats.ordinary_run(self.refusal)
            return self.fn(*inputs)
        self.stats.captures += 1
        outputs, saved = (result[0], result[1]) if self.saved_from else (result, ())
        n_out = len(tree_flatten(outputs))
        leaves = tree_flatten(outputs) + tree_flatten(saved)
        aliased = frozenset(range(n_out, len(leaves))) if self.saved_from else frozenset()
        input_ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        positions = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        returned: dict[int, int] = {}  # leaf -> the input position it is (the call returns that input itself)
        for j, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or j in aliased:
                continue
            if id(leaf) in positions:
                returned[j] = positions[id(leaf)]
            elif leaf.untyped_storage().data_ptr() in input_ptrs:
                self.refusal = "a result is a view of an input"
                self.stats.ordinary_run(self.refusal)
                return self.fn(*inputs)
        for j in aliased:
            if isinstance(leaves[j], torch.Tensor):
                self.family.outputs[leaves[j].data_ptr()] = leaves[j]
        storages = {s.data_ptr(): s for s in
                    [leaves[j].untyped_storage() for j in aliased if isinstance(leaves[j], torch.Tensor)]
                    + [args[i].untyped_storage() for i in buffered]}
        watched = [(s, _use_count(s._cdata)) for s in storages.values()]
        captured = _Graph(graph, args, in_place, tuple(buffered), tuple(i for i in buffered if i in self.mutated),
                          result, leaves, aliased, returned, watched)
        self.graphs[key] = captured
        return self._replay(captured, inputs, counted=False)

    def _replay(self, graph: _Graph, inputs: tuple[Any, ...], counted: bool = True) -> Any:
        for i in graph.buffered:
            graph.args[i].copy_(inputs[i])
        BACKEND.replay(graph.graph)
        for i in graph.copy_back:
            inputs[i].copy_(graph.args[i])
        if counted:
            self.stats.replays += 1
        handed = iter([inputs[graph.returned[j]] if j in graph.returned else leaf.detach() if j in graph.aliased
                       else leaf.clone() if isinstance(leaf, torch.Tensor) else leaf
                       for j, leaf in enumerate(graph.leaves)])
        if not self.saved_from:
            return tree_map(lambda _: next(handed), graph.result)
        outputs = tree_map(lambda _: next(handed), graph.result[0])
        return outputs, tree_map(lambda _: next(handed), graph.result[1])


def _addresses(inputs: tuple[Any, ...]) -> dict[int, int]:
    return {i: x.data_ptr() for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}


def _shared_storages(inputs: tuple[Any, ...]) -> set[int]:
    """Storages that more than one input lives in (such inputs stay in place: a buffer each would part them)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for x in inputs:
        if isinstance(x, torch.Tensor):
            ptr = x.untyped_storage().data_ptr()
            (shared if ptr in seen else seen).add(ptr)
    return shared


def _bufferable(x: torch.Tensor, shared: set[int]) -> bool:
    """Whether a buffer of the graph's own can stand in for `x`: it fills its storage alone, densely."""
    storage = x.untyped_storage()
    return (x.is_contiguous() and x.storage_offset() == 0 and storage.data_ptr() not in shared
            and storage.nbytes() == x.numel() * x.element_size())
