"""A region's compiled code called without torch.compile's frame around it.

torch.compile runs a compiled function through Dynamo's frame: a C callback that looks up
the function's cache entries, checks each entry's guards (each tensor input's type, dtype,
sizes, strides, aliasing; relations between symbolic sizes; the global state), and runs
the code Dynamo made for the entry that passes, which builds the graph's arguments, calls
the graph Inductor compiled, and rebuilds the results. Around a region of minijit's, that
frame cost ~300 µs of a 2.8 ms optimizer step over 60 parameters (302 tensor inputs), and
~4 ms of a 41 ms generate() (a decode step's region, 17 inputs).

Two ways around it, tried in this order:

- `DirectGraph`: where the graph's inputs are exactly the region's (each one a placeholder,
  tensors of constant sizes and strides, numbers lifted to 0-dim tensors) and its outputs
  exactly the values the region returns, the backend records how to call the graph itself.
  Most of Dynamo's guards are settled for such a region: the compiled-region cache keys it
  by each input's dtype, device, `requires_grad` and constant sizes, and by grad mode, and
  the region's overlap check (or the trace's memory model) keeps written inputs apart. What
  is left is checked on each call (`DirectGraph.admits`): the global state the graph was
  compiled under (Dynamo's own `GlobalStateGuard`, and inference mode), no torch function,
  dispatch or functorch mode active, and each tensor input's strides. Inductor's own check
  of each input's sizes and strides is left out of such a graph.
- `Direct`, for any other region (symbolic sizes): the cache entry that served the
  region's last call through the frame, its guards (Dynamo's guard manager, run on the
  region's arguments as the frame's locals) and its code, made a plain function over the
  region function's globals, where Dynamo installed the compiled graph. The guards are the
  frame's, word for word, and the code is the frame's: only the lookup and the callback's
  set-up are left out.

Any call that neither admits goes through the frame, which picks or compiles an entry as
always; the graph it compiles, or the entry it runs, is the one used next.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Dynamo names a graph's placeholder after the source it reads: the region's input `i3` becomes `l_i3_`.
_PLACEHOLDER = re.compile(r"l_i(\d+)_")


class DirectGraph:
    """How to call one compiled graph of a region with the region's own inputs (see the module's docstring)."""

    __slots__ = ("fn", "numbers", "order", "state", "strides", "tensors")

    def __init__(self, order: list[int], numbers: list[tuple[int, torch.dtype]], tensors: list[int],
                 strides: list[tuple[int, ...]]):
        self.fn: Callable[..., Any] | None = None  # the compiled graph (set once compiled)
        self.order = order  # per graph input, the region input it is
        self.numbers = numbers  # per number input (graph position): the dtype of the 0-dim tensor it becomes
        self.tensors = tensors  # the region inputs that are tensors
        self.strides = strides  # their strides, as the graph was compiled for
        self.state: GlobalState | None = None  # the state it was compiled under (set by the caller, outside the compile)

    @staticmethod
    def capture(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], numbers_at: Sequence[bool],
                n_returned: int) -> DirectGraph | None:
        """The direct call of the graph `gm` once compiled, for a region whose inputs are numbers where
        `numbers_at` says so and tensors elsewhere, returning `n_returned` tensors; None where the graph takes or
        returns anything else (a size as a symbol, an input left out or read twice, an output Dynamo makes
        outside the graph)."""
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        n_inputs = len(numbers_at)
        if len(placeholders) != n_inputs or len(example_inputs) != n_inputs:
            return None
        order: list[int] = []
        numbers: list[tuple[int, torch.dtype]] = []
        tensors: dict[int, tuple[int, ...]] = {}
        for position, (node, example) in enumerate(zip(placeholders, example_inputs, strict=True)):
            match = _PLACEHOLDER.fullmatch(node.name)
            if match is None or not isinstance(example, torch.Tensor) or not _constant(example):
                return None
            index = int(match.group(1))
            order.append(index)
            if index >= n_inputs:
                return None
            if numbers_at[index]:  # (a number Dynamo lifted into a 0-dim tensor)
                if example.dim() != 0:
                    return None
                numbers.append((position, example.dtype))
            else:
                tensors[index] = tuple(example.stride())
        if sorted(order) != list(range(n_inputs)):
            return None
        outputs = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
        if not isinstance(outputs, tuple | list) or len(outputs) != n_returned:
            return None
        if any(not isinstance(o, torch.fx.Node) or o.op == "placeholder"
               or not isinstance(o.meta.get("example_value"), torch.Tensor) for o in outputs):
            return None
        if len(set(outputs)) != len(outputs):
            return None
        return DirectGraph(order, numbers, sorted(tensors), [tensors[k] for k in sorted(tensors)])

    def admits(self, inputs: Sequence[Any]) -> bool:
        """Whether this call may skip torch.compile's frame: compiled under today's global state, no mode active,
        every tensor input laid out as compiled for."""
        return (self.state is not None and self.state.holds()
                and [inputs[k].stride() for k in self.tensors] == self.strides)

    def __call__(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        args = [inputs[k] for k in self.order]
        for position, dtype in self.numbers:
            args[position] = torch.as_tensor(args[position], dtype=dtype)
        return tuple(self.fn(*args))


class GlobalState:
    """The global state a graph was compiled under, as Dynamo's guards check it (`GlobalStateGuard`: grad mode,
    autocast, deterministic algorithms, default dtype, ...), plus what they check elsewhere: inference mode, and no
    torch function mode, dispatch mode or functorch transform active."""

    __slots__ = ("guard", "inference")

    def __init__(self, guard: Any):
        self.guard = guard
        self.inference = torch.is_inference_mode_enabled()

    def holds(self) -> bool:
        """Whether the state now is the one recorded."""
        return (self.guard.check() and torch.is_inference_mode_enabled() == self.inference
                and not torch._C._is_torch_function_mode_enabled() and torch._C._len_torch_dispatch_stack() == 0
                and torch._C._functorch.peek_interpreter_stack() is None)


def _constant(example: torch.Tensor) -> bool:
    """Whether a (fake) example tensor has constant sizes and strides."""
    return all(type(d) is int for d in (*example.shape, *example.stride()))


class Direct:
    """A cache entry of a region's compiled function, called without the frame (see the module's docstring)."""

    __slots__ = ("code", "guards", "names")

    def __init__(self, guards: Any, code: Callable[..., Any], names: tuple[str, ...]):
        self.guards = guards
        self.code = code
        self.names = names

    @staticmethod
    def find(compiled: Callable[..., Any], inputs: Sequence[Any]) -> Direct | None:
        """The cache entry of `compiled` (a torch.compile'd function) that the frame runs for `inputs`, as a
        `Direct`; None where there is none or this torch keeps its cache entries otherwise."""
        fn = getattr(compiled, "_torchdynamo_orig_callable", None)
        try:
            from torch._dynamo.eval_frame import _debug_get_cache_entry_list

            entries = _debug_get_cache_entry_list(fn.__code__)
        except (ImportError, AttributeError, TypeError):
            return None
        names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
        if len(names) != len(inputs) or fn.__code__.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
            return None
        frame_locals = dict(zip(names, inputs, strict=True))
        for entry in entries:  # (in the frame's order: the first whose guards pass is the one it runs)
            guards = getattr(entry, "guard_manager", None)
            if guards is not None and guards.check(frame_locals):
                try:
                    code = types.FunctionType(entry.code, fn.__globals__, fn.__name__)
                except TypeError:  # (code that needs a closure: the frame runs it)
                    return None
                return Direct(guards, code, names)
        return None

    def run(self, inputs: Sequence[Any]) -> tuple[bool, Any]:
        """(True, the results) where `inputs` pass the entry's guards; (False, None) where they do not."""
        if not self.guards.check(dict(zip(self.names, inputs, strict=True))):
            return False, None
        return True, self.code(*inputs)
