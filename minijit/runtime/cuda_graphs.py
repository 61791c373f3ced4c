"""CUDA graphs: a compiled trace replayed from a captured CUDA graph, one launch for all its kernels.

`minijit.jit(fn, cuda_graphs=True)` wraps each compiled callable of a cache entry (the
forward, the backward, or the whole computation when nothing is differentiated) in a
`GraphedCallable`. For each kind of call (the inputs' shapes, strides and dtypes, the numbers
passed, the values of 0-dim CPU tensors) it runs:

1. the first call with ordinary launches: it compiles the kernels (Triton, cuBLAS handles),
   records where the input tensors live, and watches for a synchronization with the CPU
   (`.item()`, a data-dependent shape, a value guard), which no graph can hold;
2. the second call captures a graph and replays it. An input found at the same address as
   on the first call (a parameter, an optimizer state, a forward's saved tensor that is
   itself a graph's output) is read in place: the graph holds it. Any other input is copied
   into a buffer of the graph's own before each replay, and copied back after the replay
   where the trace writes into it;
3. later calls replay a graph whose inputs read in place are where the call's are.

Results are handed out as views of the graph's memory, except what a forward under autograd
returns to the user (copied out: autograd wraps those tensors). A graph whose views are still
alive is busy (its storages' use counts say so): a call then uses another graph of the same
kind, captured when needed (three at most), so a result is never overwritten while anyone
holds it: `y = f(x)` in a loop alternates two graphs, two forwards before one backward use
two, and gradients that autograd keeps as `.grad` keep their graph busy until zeroed.

A graphed callable remembers at most MAX_KINDS kinds of call (the oldest first seen is forgotten,
its graphs with it): a number passed with a new value on every call must not hold a graph per value.

Each graph has its own memory pool (a pool shared by graphs of several shapes could hand
one graph's live outputs to another's temporaries). Torch's capture registers the device's
random generator, so each replay draws new numbers, as eager does.

A call that cannot be replayed runs with ordinary launches, and the reason is counted in
`cache_info()`: a CPU tensor input other than an unwritten 0-dim one (torch.optim keeps
Adam's `step` on the CPU and increments it unless `capturable=True`), a trace that
synchronizes with the CPU, random numbers drawn on the CPU or from an explicit generator.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.ir import Tag, Trace, tree_flatten, tree_map
from minijit.runtime.checks import torch_tensor_check

_use_count = torch._C._storage_Use_Count
MAX_INSTANCES = 3  # graphs per kind of call: another is captured while the results of one are alive
MAX_CAPTURES = 6  # per kind of call, in all: inputs read in place may move
# Kinds of call a graphed callable remembers (first calls' addresses, graphs, capture counts), the oldest
# forgotten first: a number or CPU scalar passed with a new value each call is a new kind each call.
MAX_KINDS = 16


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
    def replay(graph: Any, inputs: tuple[Any, ...], buffers: list[Any]) -> None:
        """Run `graph` for a call of `inputs` (`buffers`: the graph's own, None where an input is read in place;
        the graph itself reads the addresses it was captured with)."""
        graph.replay()


BACKEND: Any = CudaGraphs


def graph_refusal(trace: Trace) -> str | None:
    """Why `trace` can never be replayed from a CUDA graph, or None."""
    for b in trace.bound_symbols:
        if b.sym.effects.external:
            return f"{b.sym.name} acts outside the trace's tensors (a value check), which a replay would not{_at(b)}"
        if _synchronizes(b):
            return f"{b.sym.name} synchronizes with the CPU (it reads a value of a device tensor){_at(b)}"
    for b in _walk(trace.bound_symbols):
        if not b.sym.effects.random:
            continue
        if b.kwargs.get("generator") is not None:
            return f"{b.sym.name} draws from an explicit torch.Generator{_at(b)}"
        devices = [torch.device(o.device) for o in tree_flatten(b.output) if getattr(o, "device", None) is not None]
        if not devices:
            return f"{b.sym.name} sets or reads the random generator's state, which a replay would not{_at(b)}"
        for device in devices:
            if device.type != BACKEND.device_type:
                return f"{b.sym.name} draws random numbers on {device}, which a replay would not draw again"
    return None


def _keep_newest(kinds: dict[Hashable, Any]) -> None:
    """Forget the kinds first seen longest ago past MAX_KINDS (one that comes back starts again as new)."""
    while len(kinds) > MAX_KINDS:
        del kinds[next(iter(kinds))]


def _synchronizes(b: Any) -> bool:
    """Whether a bound symbol waits for the device: a number or a tensor elsewhere made from a device tensor
    (`item`, a move to the CPU; not the shape). A capture of such a call would fail, and leave torch's random
    generator in its capture state."""
    if Tag.METADATA in b.sym.tags or not any(getattr(a, "device", None) is not None and
                                       torch.device(a.device).type == BACKEND.device_type for a in b.proxy_args()):
        return False
    for out in b.proxy_outputs():
        device = getattr(out, "device", None)
        if device is None or torch.device(device).type != BACKEND.device_type:
            return True
    return False


def _at(b: Any) -> str:
    return f" (at {b.source})" if b.source is not None else ""


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
    """One captured graph (an instance for its kind of call) and the buffers around it."""

    graph: Any  # torch.cuda.CUDAGraph
    args: list[Any]  # our buffers, at the positions copied in (None elsewhere)
    in_place: dict[int, int]  # position -> data_ptr of an input read in place
    buffered: tuple[int, ...]  # positions copied into args[i] before each replay
    copy_back: tuple[int, ...]  # buffered positions the trace writes into
    result: Any  # the static result tree
    leaves: list[Any]
    cloned: frozenset[int]  # leaf positions copied out (what the user gets from a forward with saved tensors)
    returned: dict[int, int]  # leaf positions that are inputs: the call's own input there is returned
    # leaf positions that are views of inputs: (input, storage offset from it, shape, strides), made on the call's
    viewed: dict[int, tuple[int, int, tuple[int, ...], tuple[int, ...]]]
    watched: list[tuple[Any, int]]  # (storage, its use count when nothing handed out is alive)

    def fits(self, inputs: tuple[Any, ...]) -> bool:
        """Whether the inputs read in place are where they were at the capture."""
        return all(inputs[i].data_ptr() == ptr for i, ptr in self.in_place.items())

    def free(self) -> bool:
        """Whether no view this graph handed out is alive (a replay would overwrite it)."""
        return all(_use_count(storage._cdata) == count for storage, count in self.watched)


class GraphFamily:
    """The graphed callables of one cache entry: a backward reads its forward's outputs in place."""

    def __init__(self) -> None:
        # (data_ptr, shape, strides, dtype) of the forward graphs' saved outputs: read in place by later graphs.
        self.outputs: set[tuple[Any, ...]] = set()
        self.parts: list[GraphStats] = []


class GraphedCallable:
    """`fn` run from CUDA graphs captured per kind of call (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], family: GraphFamily, part: str, *,
                 saved_from: bool = False, mutated: Sequence[int] = (), refusal: str | None = None,
                 names: Sequence[str] = ()):
        self.fn = fn
        self.names = tuple(names)  # the trace's input names, for the reasons
        self.family = family
        self.stats = GraphStats(part)
        family.parts.append(self.stats)
        self.saved_from = saved_from  # the result is (outputs, saved): the outputs are copied out
        self.mutated = frozenset(mutated)
        self.refusal = refusal
        self.first_addresses: dict[Hashable, dict[int, int]] = {}
        # The kinds of call seen: (tensor metadata check, the other inputs, positions among the tensors of the
        # CPU scalars, the kind's structure): the key of a call is (structure, the CPU scalars' values).
        self.kinds: list[tuple[Callable[..., bool], list[tuple[int, type, Any]], tuple[int, ...], Hashable]] = []
        self.graphs: dict[Hashable, list[_Graph]] = {}
        self.capture_counts: dict[Hashable, int] = {}

    def __call__(self, *inputs: Any) -> Any:
        if self.refusal is not None:
            self.stats.ordinary_run(self.refusal)
            return self.fn(*inputs)
        key = self._kind(inputs)
        if isinstance(key, str):
            self.stats.ordinary_run(key)
            return self.fn(*inputs)
        graphs = self.graphs.get(key)
        if graphs is None:
            first = self.first_addresses.get(key)
            if first is None:
                # The first call of a kind: ordinary launches (the kernels compile, lazy handles are made).
                self.first_addresses[key] = _addresses(inputs)
                _keep_newest(self.first_addresses)
                self.stats.ordinary_run("first call of this kind (compiles kernels; the next call captures)")
                return self.fn(*inputs)
            return self._capture(key, inputs, first)
        busy = False
        for graph in graphs:
            if graph.fits(inputs):
                if graph.free():
                    return self._replay(graph, inputs)
                busy = True
        if len(graphs) >= MAX_INSTANCES:
            self.stats.ordinary_run(
                f"{MAX_INSTANCES} graphs of this kind hold results still alive (e.g. three forwards before one "
                "backward)" if busy else f"inputs read in place moved (the last {MAX_INSTANCES} graphs read others)")
            return self.fn(*inputs)
        stay = {i: p for g in graphs for i, p in g.in_place.items() if inputs[i].data_ptr() == p}
        return self._capture(key, inputs, stay)

    def _kind(self, inputs: tuple[Any, ...]) -> Hashable | str:
        """The kind of call: one C check of the tensors' metadata against the kinds seen (torch's tensor guard),
        the other inputs compared by value; the full key (`_key`) for a kind not seen yet."""
        tensors: list[torch.Tensor] = []
        others: list[tuple[int, type, Any]] = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                tensors.append(x)
            else:
                others.append((i, type(x), x))
        for check, known, scalars, structure in self.kinds:
            if known == others and check(*tensors):
                return (structure, tuple(tensors[k].item() for k in scalars))
        key = self._key(inputs)
        if isinstance(key, str):
            return key
        check = torch_tensor_check(tensors) if tensors else lambda: True
        if check is not None and len(self.kinds) < 8:
            scalars = tuple(k for k, t in enumerate(tensors) if t.device.type != BACKEND.device_type)
            self.kinds.append((check, others, scalars, key[0]))
        return key

    def _key(self, inputs: tuple[Any, ...]) -> Hashable | str:
        """(the kind's structure: metadata and numbers, the values of the CPU scalars, read by value at the
        capture), or why the call cannot be replayed."""
        parts: list[Any] = []
        values: list[Any] = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                if x.device.type != BACKEND.device_type:
                    if x.device.type != "cpu" or x.dim() != 0 or i in self.mutated:
                        return (f"input {self._name(i)} is a {x.device.type} tensor of shape {tuple(x.shape)}"
                                f"{' written by the trace' if i in self.mutated else ''} (a graph replays device "
                                "work only)")
                    parts.append(("cpu scalar", x.dtype))
                    values.append(x.item())
                    continue
                parts.append((x.shape, x.stride(), x.dtype, x.device.index))
            elif x is None or isinstance(x, bool | int | float | str | torch.dtype | torch.device):
                parts.append((type(x), x))
            else:
                return f"input {self._name(i)} is a {type(x).__name__}"
        return (tuple(parts), tuple(values))

    def _name(self, i: int) -> str:
        return f"{i} ({self.names[i]})" if i < len(self.names) else str(i)

    def _capture(self, key: Hashable, inputs: tuple[Any, ...], stay: dict[int, int]) -> Any:
        """Capture a graph for `key` (inputs at `stay`'s addresses, or a graph's outputs, read in place), replay it."""
        count = self.capture_counts.get(key, 0)
        if count >= MAX_CAPTURES:
            self.stats.ordinary_run(f"{MAX_CAPTURES} graphs were captured for this kind of call, the most allowed")
            return self.fn(*inputs)
        self.capture_counts[key] = count + 1
        shared = _shared_storages(inputs)
        in_place: dict[int, int] = {}
        buffered: list[int] = []
        args = list(inputs)
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor) or x.device.type != BACKEND.device_type:
                continue
            ptr = x.data_ptr()
            if (ptr, x.shape, x.stride(), x.dtype) in self.family.outputs or stay.get(i) == ptr \
                    or not _bufferable(x, shared):
                in_place[i] = ptr
            else:
                buffered.append(i)
                args[i] = torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)
        try:
            graph, result = BACKEND.capture(self.fn, args)
        except Exception as e:  # an op capture does not allow
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            self.refusal = f"capture failed: {type(e).__name__}: {first}"
            self.stats.ordinary_run(self.refusal)
            return self.fn(*inputs)
        self.stats.captures += 1
        outputs, saved = (result[0], result[1]) if self.saved_from else (result, ())
        n_out = len(tree_flatten(outputs))
        leaves = tree_flatten(outputs) + tree_flatten(saved)
        cloned = frozenset(j for j in range(n_out) if isinstance(leaves[j], torch.Tensor)) if self.saved_from \
            else frozenset()
        input_ptrs = {a.untyped_storage().data_ptr(): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        positions = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        returned: dict[int, int] = {}  # leaf -> the input position it is (the call returns that input itself)
        viewed: dict[int, tuple[int, int]] = {}  # leaf -> (input position, storage offset from that input's)
        handed_out: list[int] = []
        for j, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                continue
            if id(leaf) in positions:
                returned[j] = positions[id(leaf)]
            elif (i := input_ptrs.get(leaf.untyped_storage().data_ptr())) is not None:
                viewed[j] = (i, leaf.storage_offset() - args[i].storage_offset())  # made again on the call's input
            elif j not in cloned:
                handed_out.append(j)
                if self.saved_from:
                    self.family.outputs.add((leaf.data_ptr(), leaf.shape, leaf.stride(), leaf.dtype))
        # Nothing of the caller's is kept: an input read in place is the call's own tensor at each replay
        # (a reference kept would also make a graph's output passed here look alive to its graph).
        args = [a if i in buffered else None for i, a in enumerate(args)]
        layouts = {j: (tuple(leaves[j].shape), leaves[j].stride()) for j in viewed}
        leaves = [None if j in returned or j in viewed else leaf for j, leaf in enumerate(leaves)]
        result = tree_map(lambda _: None, result)  # the structure (the leaves are `leaves`)
        storages = {s.data_ptr(): s for s in [leaves[j].untyped_storage() for j in handed_out]
                    + [args[i].untyped_storage() for i in buffered]}
        watched = [(s, _use_count(s._cdata)) for s in storages.values()]
        captured = _Graph(graph, args, in_place, tuple(buffered), tuple(i for i in buffered if i in self.mutated),
                          result, leaves, cloned, returned, {j: (i, d, *layouts[j]) for j, (i, d) in viewed.items()},
                          watched)
        self.graphs.setdefault(key, []).append(captured)
        _keep_newest(self.graphs)  # a graph dropped whose results are alive: its memory lives as long as they do
        _keep_newest(self.capture_counts)
        return self._replay(captured, inputs, counted=False)

    def _replay(self, graph: _Graph, inputs: tuple[Any, ...], counted: bool = True) -> Any:
        for i in graph.buffered:
            graph.args[i].copy_(inputs[i])
        BACKEND.replay(graph.graph, inputs, graph.args)
        for i in graph.copy_back:
            inputs[i].copy_(graph.args[i])
        if counted:
            self.stats.replays += 1
        handed = iter([inputs[graph.returned[j]] if j in graph.returned
                       else _view_of(inputs, *graph.viewed[j]) if j in graph.viewed
                       else leaf.clone() if j in graph.cloned
                       else leaf.detach() if isinstance(leaf, torch.Tensor) else leaf
                       for j, leaf in enumerate(graph.leaves)])
        if not self.saved_from:
            return _rebuilt(graph.result, handed)
        outputs = _rebuilt(graph.result[0], handed)
        return outputs, _rebuilt(graph.result[1], handed)


def _rebuilt(tree: Any, leaves: Any) -> Any:
    """`tree` with its leaves taken in order from the iterator `leaves` (a flat tuple, the saved tensors'
    usual form, without a walk)."""
    if type(tree) is tuple and not any(isinstance(x, tuple | list | dict | slice) for x in tree):
        return tuple(next(leaves) for _ in tree)
    return tree_map(lambda _: next(leaves), tree)


def _view_of(inputs: tuple[Any, ...], i: int, delta: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> Any:
    """The view of the call's input `i` that a result was of the captured one (what an ordinary run returns)."""
    x = inputs[i]
    return x.as_strided(shape, stride, x.storage_offset() + delta)


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
