"""The bridge to torch.autograd: a compiled forward and backward trace as one `autograd.Function`.

The forward trace returns `(outputs, saved)`. The differentiable output tensors go
through the Function, so autograd records one node for the whole jitted call; the
saved tensors go to `ctx.save_for_backward`, so eager autograd's version counter
check still catches a saved tensor that is modified in place before backward
(docs/design.md, invariant 3). The backward trace takes the saved values and one
cotangent per differentiable output and returns one gradient per input.

In-place writes follow eager autograd too:

- an input that requires grad and that the call writes in place (a non-leaf: writing
  into a leaf raises eager's error) is returned by the Function and marked dirty, so
  autograd rebases its history onto the call, and its version counter bump makes
  nodes that saved it raise "modified by an inplace operation" at backward;
- a saved input that the forward overwrote makes the backward raise that same error;
- a backward that writes into an input that requires grad (a traced custom
  Function's backward) raises when it runs with grad mode on (`create_graph=True`),
  checking only the inputs listed when the call was compiled.

A backward run with grad mode on (`create_graph=True`: a gradient penalty, a Hessian-vector
product) runs the backward again as eager ops on the saved values, which carry the history it
needs: the inputs their own, the values computed from them that of this node, which returns them
as hidden outputs (their cotangents, when a further differentiation reaches them, are
differentiated by a second backward). Where they cannot (`SavedBackward.holds`), it recomputes the
call eagerly from its inputs and differentiates it with eager autograd
(`minijit/runtime/double_backward.py`), so its gradients are differentiable again. Only in that
second case does the call keep its inputs (until its result dies); otherwise it keeps what eager
keeps, the values its backward reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import InplaceError, MinijitError
from minijit.ir import tree_flatten, tree_map
from minijit.runtime.double_backward import Recompute, SavedBackward


@dataclass(frozen=True)
class CompiledGrad:
    """A compiled forward/backward pair and how their values line up."""

    forward: Callable[..., Any]  # tensors -> (outputs, saved)
    backward: Callable[..., Any]  # *saved, *cotangents -> one gradient per input
    # Positions among the flattened output leaves that receive cotangents, in backward order.
    differentiable_outputs: tuple[int, ...]
    name: str = "computation"
    input_names: tuple[str, ...] = ()
    # Inputs requiring grad that the forward writes in place (returned and marked dirty).
    dirty_inputs: tuple[int, ...] = ()
    # Saved inputs whose old value the forward overwrote: the backward raises, as eager's would.
    overwritten_saved: tuple[str, ...] = ()
    # Inputs the backward writes into.
    backward_mutated_inputs: tuple[int, ...] = ()
    # How a backward under grad mode (create_graph=True) recomputes the call differentiably, or why it cannot.
    recompute: Recompute | None = None
    # How it runs from the saved values instead, where they carry the history it needs (else None).
    saved_backward: SavedBackward | None = None
    # How many saved values (a prefix) `backward` takes (None: all); the rest only a double backward reads.
    first_order_saved: int | None = None


class _JitFunction(torch.autograd.Function):
    """One node in autograd's graph per call of a jitted function."""

    @staticmethod
    def forward(ctx: Any, compiled: CompiledGrad, box: list[Any], *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.rng = compiled.recompute.rng_state(tensors) if compiled.recompute is not None else None
        out, saved = compiled.forward(*tensors)
        leaves = tree_flatten(out)
        box.append((out, leaves))
        tensor_positions = [i for i, s in enumerate(saved) if isinstance(s, torch.Tensor)]
        ctx.save_for_backward(*(saved[i] for i in tensor_positions))
        ctx.saved_layout = (len(saved), tensor_positions,
                            {i: s for i, s in enumerate(saved) if not isinstance(s, torch.Tensor)})
        ctx.compiled = compiled
        ctx.num_inputs = len(tensors)
        returned = tuple(leaves[i] for i in compiled.differentiable_outputs)
        dirty = tuple(tensors[i] for i in compiled.dirty_inputs)
        # A double backward runs from the saved values where they carry their history: the inputs they stand
        # for, and the values computed from them returned as hidden outputs of this node (history: the node).
        # Else it recomputes from the inputs, kept for it (not saved: no version check of its own on a backward
        # without create_graph, where eager saves only what it reads). Kept only where it can run, so never
        # for inputs written in place (returned, marked dirty: a cycle).
        from_saved = compiled.saved_backward
        ctx.from_saved = from_saved is not None and from_saved.holds(saved, tensors, (*returned, *dirty))
        hidden = tuple(saved[h] for h in from_saved.hidden) if ctx.from_saved and from_saved is not None else ()
        ctx.hidden_count = len(hidden)
        if hidden:
            # A backward without a double one gets None for the hidden outputs (no zeros made for them), and makes
            # the zeros of the outputs not used itself, as autograd would.
            ctx.set_materialize_grads(False)
            ctx.output_layouts = [(t.shape, t.dtype, t.device) for t in (*returned, *dirty)]
        recompute = compiled.recompute is not None and compiled.recompute.refusal is None and not ctx.from_saved
        ctx.inputs = tensors if recompute else ()
        if not recompute:
            ctx.rng = None
        ctx.input_versions = tuple(t._version if isinstance(t, torch.Tensor) and not t.is_inference() else None
                                   for t in ctx.inputs)
        ctx.mutated_requiring_grad = [i for i in compiled.backward_mutated_inputs if tensors[i].requires_grad]
        if dirty:
            ctx.mark_dirty(*dirty)
        return (*returned, *dirty, *hidden)

    @staticmethod
    def backward(ctx: Any, *cotangents: torch.Tensor | None) -> Any:
        compiled: CompiledGrad = ctx.compiled
        if compiled.overwritten_saved:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"the jitted function {compiled.name!r} overwrote its input(s) {', '.join(compiled.overwritten_saved)} "
                "in place after reading them for the gradient"
            )
        if ctx.hidden_count:
            cut = len(cotangents) - ctx.hidden_count
            if any(c is not None for c in cotangents[cut:]):  # a double backward differentiates a hidden output
                return (None, None, *_hidden_gradients(ctx, cotangents[:cut], cotangents[cut:]))
            cotangents = _materialized(ctx, cotangents[:cut])
        if torch.is_grad_enabled():
            if ctx.mutated_requiring_grad:
                names = ", ".join(compiled.input_names[i] for i in ctx.mutated_requiring_grad)
                raise MinijitError(
                    f"the backward of the jitted function {compiled.name!r} writes in place into {names}, which "
                    "requires grad, while grad mode is on (create_graph=True); run backward without create_graph"
                )
            if ctx.from_saved:
                assert compiled.saved_backward is not None
                return (None, None, *compiled.saved_backward.gradients(_saved(ctx), cotangents))
            if compiled.recompute is None:
                raise MinijitError(
                    f"double backward (create_graph=True) through the jitted function {compiled.name!r} is not "
                    "supported; call backward without create_graph, or differentiate the function eagerly"
                )
            grads = compiled.recompute.gradients(ctx.inputs, ctx.input_versions, compiled.differentiable_outputs,
                                                 cotangents[:len(compiled.differentiable_outputs)], ctx.rng)
            return (None, None, *grads)
        saved = _saved(ctx)
        grads = compiled.backward(*saved[:compiled.first_order_saved], *cotangents)
        return (None, None, *grads)


def _materialized(ctx: Any, cotangents: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, ...]:
    """The outputs' cotangents, zeros where autograd passed None (as it would have made them)."""
    return tuple(torch.zeros(shape, dtype=dtype, device=device) if c is None else c
                 for c, (shape, dtype, device) in zip(cotangents, ctx.output_layouts))


def _hidden_gradients(ctx: Any, cotangents: tuple[torch.Tensor | None, ...],
                      hidden_cotangents: tuple[torch.Tensor | None, ...]) -> list[Any]:
    """The gradients for cotangents of hidden outputs (a double backward), plus the outputs' where there are any:
    the backward is linear in them. Eager ops, so differentiable again under grad mode."""
    saved_backward: SavedBackward = ctx.compiled.saved_backward
    saved = _saved(ctx)
    grads = saved_backward.hidden_gradients(saved, hidden_cotangents)
    if any(c is not None for c in cotangents):
        more = saved_backward.gradients(saved, _materialized(ctx, cotangents)) if torch.is_grad_enabled() \
            else ctx.compiled.backward(*saved[:ctx.compiled.first_order_saved], *_materialized(ctx, cotangents))
        grads = [b if a is None else a if b is None else a + b for a, b in zip(grads, more)]
    return grads


def _saved(ctx: Any) -> list[Any]:
    """The values the forward saved, in order: the tensors through autograd (its version check), the others as they were."""
    count, tensor_positions, others = ctx.saved_layout
    saved: list[Any] = [None] * count
    for i, t in zip(tensor_positions, ctx.saved_tensors):
        saved[i] = t
    for i, v in others.items():
        saved[i] = v
    return saved


def autograd_callable(compiled: CompiledGrad) -> Callable[..., Any]:
    """A function of the call's tensors that runs `compiled` as one `torch.autograd.Function`."""
    positions = compiled.differentiable_outputs
    dirty = compiled.dirty_inputs

    def run_with_grad(*tensors: torch.Tensor) -> Any:
        if not positions and not dirty:
            # Nothing to differentiate: no autograd node, and no eager graph built by the forward's ops
            # on inputs that require grad (everything was constant for VJP, e.g. computed under no_grad).
            # Writes into leaves that require grad were made under torch.no_grad() in the function
            # (functionalize refuses the others), so they run under it here too.
            with torch.no_grad():
                return compiled.forward(*tensors)[0]
        for i in dirty:
            if tensors[i].is_leaf and tensors[i].requires_grad:
                raise InplaceError(f"a leaf Variable that requires grad is being used in an in-place operation "
                                   f"(input {compiled.input_names[i]} of {compiled.name!r}, as in eager); use "
                                   "torch.no_grad() or write into a clone")
        box: list[Any] = []
        results = _JitFunction.apply(compiled, box, *tensors)
        out, leaves = box[0]
        leaves = list(leaves)
        for i, r in zip(positions, results):
            leaves[i] = r
        it = iter(leaves)
        return tree_map(lambda _: next(it), out)

    run_with_grad.compiled = compiled  # type: ignore[attr-defined]  # for inspection
    return run_with_grad
