"""The bridge to torch.autograd: a compiled forward and backward trace as one `autograd.Function` per entry.

Each split entry's epilogue (minijit.runtime.epilogue) generates its own `torch.autograd.Function` subclass,
printed with the rest of the call, from a `CompiledGrad`: every branch below that depends only on the entry is
decided there, and this module holds what the generated class calls.

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

Autograd's engine calls the generated backward from wherever `backward()` was called, also from code running
under `torch.compile`, whose frame evaluation would capture minijit's backward (and what it calls) as user code
and compile it again: the backward's code is marked for Dynamo to skip, with everything it calls
(`hidden_from_dynamo`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import InplaceError, MinijitError
from minijit.ir import tree_map
from minijit.runtime.autocast import no_autocast
from minijit.runtime.double_backward import Recompute, SavedBackward


def hidden_from_dynamo(fn: Callable[..., Any]) -> None:
    """Mark `fn`'s code so that Dynamo's frame evaluation skips it and every frame it calls (the skip
    `torch.compiler.disable` makes, without importing Dynamo: torch's C extension holds the per-code table)."""
    frames = getattr(torch._C, "_dynamo", None)
    frames = getattr(frames, "eval_frame", None)
    set_strategy = getattr(frames, "set_code_exec_strategy", None)
    if set_strategy is not None:
        skip = frames._FrameAction.SKIP
        set_strategy(fn.__code__, frames._FrameExecStrategy(skip, skip))


@dataclass(frozen=True)
class CompiledGrad:
    """What a split entry's autograd.Function is generated from: its compiled backward, how the values line up."""

    backward: Callable[..., Any]  # *saved, *cotangents -> one gradient per input
    # Positions among the flattened output leaves that receive cotangents, in backward order.
    differentiable_outputs: tuple[int, ...]
    # How a backward under grad mode (create_graph=True) recomputes the call differentiably, or why it cannot.
    recompute: Recompute
    # Inputs requiring grad that the forward writes in place (returned and marked dirty).
    dirty_inputs: tuple[int, ...] = ()
    # Saved inputs whose old value the forward overwrote: the backward raises, as eager's would.
    overwritten_saved: tuple[str, ...] = ()
    # Inputs the backward writes into.
    backward_mutated_inputs: tuple[int, ...] = ()
    # How it runs from the saved values instead, where they carry the history it needs (else None).
    saved_backward: SavedBackward | None = None
    # How many saved values (a prefix) `backward` takes (None: all); the rest only a double backward reads.
    first_order_saved: int | None = None


def save(ctx: Any, saved: Sequence[Any]) -> None:
    """Keep the forward's saved values on `ctx`: the tensors through autograd (its version check), the others as they are."""
    positions = [i for i, s in enumerate(saved) if isinstance(s, torch.Tensor)]
    ctx.save_for_backward(*(saved[i] for i in positions))
    ctx.saved_layout = (len(saved), positions, {i: s for i, s in enumerate(saved) if not isinstance(s, torch.Tensor)})


def saved_values(ctx: Any) -> list[Any]:
    """The values the forward saved (`save`), in order."""
    count, positions, others = ctx.saved_layout
    saved = [others.get(i) for i in range(count)]
    for i, t in zip(positions, ctx.saved_tensors):
        saved[i] = t
    return saved


def versions(inputs: Sequence[Any]) -> tuple[int | None, ...]:
    """The version counters of the inputs a recompute will read (None for inference tensors, which have none)."""
    return tuple(t._version if isinstance(t, torch.Tensor) and not t.is_inference() else None for t in inputs)


def materialized(ctx: Any, cotangents: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    """The outputs' cotangents, zeros where autograd passed None (as it would have made them)."""
    return tuple(torch.zeros(shape, dtype=dtype, device=device) if c is None else c
                 for c, (shape, dtype, device) in zip(cotangents, ctx.output_layouts))


def hidden_gradients(ctx: Any, saved_backward: SavedBackward, backward: Callable[..., Any], first_order: int | None,
                     cotangents: Sequence[torch.Tensor | None],
                     hidden_cotangents: Sequence[torch.Tensor | None]) -> list[Any]:
    """The gradients for cotangents of hidden outputs (a double backward), plus the outputs' where there are any:
    the backward is linear in them. Eager ops, so differentiable again under grad mode."""
    saved = saved_values(ctx)
    grads = saved_backward.hidden_gradients(saved, hidden_cotangents)
    if any(c is not None for c in cotangents):
        if torch.is_grad_enabled():
            more = saved_backward.gradients(saved, materialized(ctx, cotangents))
        else:
            with no_autocast():
                more = backward(*saved[:first_order], *materialized(ctx, cotangents))
        grads = [b if a is None else a if b is None else a + b for a, b in zip(grads, more)]
    return grads


def rebuilt(tree: Any, leaves: Sequence[Any]) -> Any:
    """`tree` with its leaves replaced by `leaves`, in order."""
    it = iter(leaves)
    return tree_map(lambda _: next(it), tree)


def leaf_write(name: str, fn_name: str) -> InplaceError:
    """Eager's error for an in-place write into a leaf requiring grad, the input `name` of the jitted `fn_name`."""
    return InplaceError(f"a leaf Variable that requires grad is being used in an in-place operation (input {name} of "
                        f"{fn_name!r}, as in eager); use torch.no_grad() or write into a clone")


def overwritten(fn_name: str, names: Sequence[str]) -> RuntimeError:
    """Eager's error at the backward of a call that overwrote the inputs `names` after saving them."""
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"the jitted function {fn_name!r} overwrote its input(s) {', '.join(names)} in place after reading them for "
        "the gradient")


def backward_write(fn_name: str, names: Sequence[str]) -> MinijitError:
    """The error of a backward under grad mode that writes into the inputs `names`, which require grad."""
    return MinijitError(
        f"the backward of the jitted function {fn_name!r} writes in place into {', '.join(names)}, which requires "
        "grad, while grad mode is on (create_graph=True); run backward without create_graph")
