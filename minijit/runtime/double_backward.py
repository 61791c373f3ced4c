"""Double backward: the backward of a jitted call, differentiable when autograd asks for it (`create_graph=True`).

The compiled backward reads residuals the forward saved under grad mode off (inside the
`autograd.Function`), so those it computed carry no history and its gradients would be
constants to a second differentiation: silently wrong. A backward run with grad mode on (a
gradient penalty's `autograd.grad(D(x).sum(), x, create_graph=True)`) takes one of two roads,
both running eager torch ops (the torch executor only, never a fusion kernel autograd cannot
see) that eager autograd differentiates, so every higher order is eager's too:

- `SavedBackward`: the backward trace runs again on the saved values, which carry their history. An
  input requiring grad carries its own; a value the forward computed from one (relu's result, read by the
  matmul's backward in `relu(x) @ w`; the split names them, `transforms/grad.py`) is returned by the
  call's autograd node as a hidden output, so its history is the node itself. When a further
  differentiation reaches the node through a hidden output, the node's backward runs a second backward
  trace, the VJP of the hidden outputs (the backward is linear in the cotangents, so the outputs' part is
  added), as eager ops on saved values that carry their history again: every higher order is eager's. The
  call keeps nothing but what the backward reads, as eager does: an input no gradient needs is freed. A
  backward without create_graph gets None for the hidden outputs (no zeros are made for them) and runs the
  compiled backward as before.
- `Recompute`: what remains, per call, where the saved values cannot carry their history: a CUDA graph's
  forward saved its own copy of an input, or a hidden output is an input or another output itself
  (`SavedBackward.holds`), or, per entry, the hidden outputs do not close (the second backward would read
  more computed values after a few rounds), or a backward reads a value a VJP rule computed on the way to its
  op's outputs (cross_entropy's log_softmax: on no tape, so no second backward differentiates it). The
  functional trace (the one the grad pass split) then runs again on the call's inputs, with grad mode on, and
  eager autograd differentiates it with `create_graph=True`. Such a call keeps its inputs until its result
  dies: the one case where it holds more than eager's saved tensors.

What the recompute must reproduce is checked when the entry is compiled, and a trace
it cannot reproduce is refused at the double backward with the reason:

- values computed under `torch.no_grad()` are detached in the recomputed trace, as eager
  computed them without history;
- a traced custom `autograd.Function` is refused: eager autograd would differentiate its
  forward's ops, not the user's backward;
- random ops (dropout) draw again what they drew: the call saves the generators' states
  before it runs (only for such traces), and the recompute starts from them, its own
  draws leaving the generators as they were (from the saved values, a dropout's mask is saved);
- a trace that writes into its inputs is refused: a second run would write them again.

Both roads are refused for a traced custom `autograd.Function` and for writes into inputs.
An input changed in place between the call and the double backward raises eager's
"modified by an inplace operation" error: the recompute would read its new value (the saved
values' own version check says so on the other road).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.errors import MinijitError
from minijit.extend import get_executor
from minijit.ir import BoundSymbol, Tag, TensorProxy, Trace, tracing, tree_flatten
from minijit.ir.rewrite import ProxyMap, rewrite
from minijit.ops import prims
from minijit.runtime.autocast import no_autocast
from minijit.transforms import claim_executors, dce

__all__ = ["Recompute", "SavedBackward", "recompute_for"]


def _eager(trace: Trace) -> Callable[..., Any]:
    """`trace` compiled as eager torch ops (the torch executor alone), to run with autocast off (`no_autocast`)."""
    return dce(claim_executors(trace, [get_executor("torch")])).python_callable()


@dataclass
class Recompute:
    """How a jitted call's backward becomes differentiable: the functional trace, run again eagerly.

    `refusal` says why it cannot (None when it can); the eager forward is compiled on first use.
    """

    name: str
    trace: Trace | None
    refusal: str | None = None
    # Whether the trace draws random numbers: each call then saves the generators' states for it.
    random: bool = False
    _forward: Callable[..., Any] | None = field(default=None, repr=False)

    def refused(self) -> MinijitError:
        """The error of a double backward through this call, which `refusal` says cannot run."""
        return MinijitError(f"double backward (create_graph=True) through the jitted function {self.name!r}: "
                            f"{self.refusal}; call backward without create_graph, or differentiate the function eagerly")

    def forward(self) -> Callable[..., Any]:
        """The trace as eager torch ops, compiled once: inputs -> the output's flattened leaves (never where the
        recompute is refused: the autograd.Function raises `refused()` instead)."""
        if self._forward is None:
            assert self.trace is not None
            run = _eager(self.trace)
            self._forward = lambda *inputs: tree_flatten(run(*inputs))
            self.trace = None  # the compiled function holds what it needs
        return self._forward

    def rng_state(self, inputs: Sequence[Any]) -> Any:
        """The generators' states a call starts from, when the trace draws random numbers (else None)."""
        if not self.random:
            return None
        cuda = sorted({t.device.index or 0 for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda})
        return torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in cuda]

    def gradients(self, inputs: Sequence[Any], versions: Sequence[int | None], positions: Sequence[int],
                  cotangents: Sequence[torch.Tensor | None], rng: Any = None) -> list[torch.Tensor | None]:
        """One gradient per input (None where none), with eager's graph, for the cotangents of the outputs at `positions`.

        `rng` (from `rng_state`) is where the call's random draws started.
        """
        run = self.forward()
        for t, v in zip(inputs, versions):
            if v is not None and t._version != v:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: an input of the jitted function {self.name!r} changed after the call, and the "
                    "double backward (create_graph=True) recomputes the call from its inputs")
        wanted = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        with torch.enable_grad(), _replaying(rng):
            with no_autocast():
                leaves = run(*inputs)
            pairs = [(leaves[p], c) for p, c in zip(positions, cotangents)
                     if c is not None and isinstance(leaves[p], torch.Tensor) and leaves[p].requires_grad]
            if not pairs or not wanted:
                return [None] * len(inputs)
            outs, cots = zip(*pairs)
            grads = torch.autograd.grad(outs, [inputs[i] for i in wanted], cots, create_graph=True,
                                        allow_unused=True)
        result: list[torch.Tensor | None] = [None] * len(inputs)
        for i, g in zip(wanted, grads):
            result[i] = g
        return result


@dataclass
class SavedBackward:
    """A double backward from the saved values alone: the backward trace (before its passes) run again as eager
    torch ops with grad mode on, on saved values that carry their history. An input requiring grad carries its
    own (`pairs`: saved position, input position), which `holds` checks per call (a CUDA graph's forward saves its
    own copy of an input); a value the forward computed from one (`hidden`: saved positions) is returned by the
    autograd node as a hidden output, so its history is the node, whose backward then takes a cotangent for it
    and runs `second`, the backward differentiating them too, on the saved values at `second_saved`."""

    trace: Trace | None
    pairs: tuple[tuple[int, int], ...]
    first_order_saved: int = 0  # how many saved values (a prefix) `trace` takes
    hidden: tuple[int, ...] = ()
    second: Trace | None = None
    second_saved: tuple[int, ...] = ()
    _backward: Callable[..., Any] | None = field(default=None, repr=False)
    _second: Callable[..., Any] | None = field(default=None, repr=False)

    def holds(self, saved: Sequence[Any], inputs: Sequence[Any], returned: Sequence[Any]) -> bool:
        """Whether the saved values of this call carry their history: the inputs they stand for are these inputs,
        and the hidden outputs are tensors of their own (not an input, not returned already)."""
        if not all(saved[s] is inputs[i] for s, i in self.pairs):
            return False
        seen = {id(t) for t in (*inputs, *returned)}
        for h in self.hidden:
            if not isinstance(saved[h], torch.Tensor) or id(saved[h]) in seen:
                return False
            seen.add(id(saved[h]))
        return True

    def gradients(self, saved: Sequence[Any], cotangents: Sequence[Any]) -> list[Any]:
        """One gradient per input (None where none), with eager's graph: the backward on `saved` and `cotangents`."""
        if self._backward is None:
            assert self.trace is not None
            self._backward = _eager(self.trace)
            self.trace = None  # the compiled function holds what it needs
        with torch.enable_grad(), no_autocast():
            return list(self._backward(*saved[:self.first_order_saved], *cotangents))

    def hidden_gradients(self, saved: Sequence[Any], hidden_cotangents: Sequence[Any]) -> list[Any]:
        """One gradient per input (None where none) for the cotangents of the hidden outputs (None: zeros), as eager
        ops: differentiable again where grad mode is on, since the saved values carry their history."""
        if self._second is None:
            assert self.second is not None
            self._second = _eager(self.second)
            self.second = None
        hidden = [torch.zeros_like(saved[h]) if c is None else c for h, c in zip(self.hidden, hidden_cotangents)]
        with no_autocast():
            return list(self._second(*(saved[i] for i in self.second_saved), *hidden))


@contextmanager
def _replaying(rng: Any) -> Iterator[None]:
    """Draw from the generators' states `rng` (None: as they are), leaving them as they were after."""
    if rng is None:
        yield
        return
    cpu, cuda = rng
    with torch.random.fork_rng(devices=[d for d, _ in cuda]):
        torch.set_rng_state(cpu)
        for d, state in cuda:
            torch.cuda.set_rng_state(state, d)
        yield


def _walk(bsyms: Iterable[BoundSymbol]) -> Iterable[BoundSymbol]:
    for b in bsyms:
        yield b
        yield from _walk(b.subsymbols)


def _refusal(trace: Trace, mutated_inputs: Sequence[str]) -> str | None:
    """Why running `trace` again eagerly would not reproduce the call's gradients, or None."""
    if mutated_inputs:
        return f"it writes into its input(s) {', '.join(mutated_inputs)}, which a recompute would write again"
    for b in _walk(trace.bound_symbols):
        if Tag.CUSTOM_FUNCTION in b.sym.tags:
            return (f"it calls the custom autograd.Function {b.sym.name}, whose backward eager autograd "
                    "cannot differentiate from a recompute of its forward")
    return None


def _detach_no_grad(trace: Trace, no_grad: frozenset[str]) -> Trace:
    """`trace` with each value computed under torch.no_grad() detached, so an eager run gives it no history."""
    if not no_grad:
        return trace

    def rule(bsym: BoundSymbol, env: ProxyMap) -> Sequence[BoundSymbol] | None:
        outs = [p for p in bsym.proxy_outputs() if isinstance(p, TensorProxy) and p.name in no_grad]
        if not outs:
            return None
        scratch = trace.derive([], pass_name="detach no_grad values")
        with tracing(scratch):
            for p in outs:
                env[p] = prims.detach(p)
        return [bsym, *scratch.bound_symbols]

    return rewrite(trace, rule, pass_name="detach no_grad values")


def recompute_for(trace: Trace, name: str, no_grad: frozenset[str], mutated_inputs: Sequence[str]) -> Recompute:
    """The recompute of a functional trace (before the grad split) for a double backward, or why there is none."""
    refusal = _refusal(trace, mutated_inputs)
    if refusal is not None:
        return Recompute(name, None, refusal)
    random = any(b.is_random() for b in trace.bound_symbols)
    return Recompute(name, _detach_no_grad(trace, no_grad), random=random)
