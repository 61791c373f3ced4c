"""The bridge to torch.autograd: a compiled forward and backward trace as one `autograd.Function`.

The forward trace returns `(outputs, saved)`. The differentiable output tensors go
through the Function, so autograd records one node for the whole jitted call; the
saved tensors go to `ctx.save_for_backward`, so eager autograd's version counter
check still catches a saved tensor that is modified in place before backward
(DESIGN.md, invariant 3). The backward trace takes the saved values and one
cotangent per differentiable output and returns one gradient per input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import MinijitError
from minijit.ir import tree_flatten, tree_map


@dataclass(frozen=True)
class CompiledGrad:
    """A compiled forward/backward pair and how their values line up."""

    forward: Callable[..., Any]  # tensors -> (outputs, saved)
    backward: Callable[..., Any]  # *saved, *cotangents -> one gradient per input
    # Positions among the flattened output leaves that receive cotangents, in backward order.
    differentiable_outputs: tuple[int, ...]
    name: str = "computation"


class _JitFunction(torch.autograd.Function):
    """One node in autograd's graph per call of a jitted function."""

    @staticmethod
    def forward(ctx: Any, compiled: CompiledGrad, box: list[Any], *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        out, saved = compiled.forward(*tensors)
        leaves = tree_flatten(out)
        box.append((out, leaves))
        tensor_positions = [i for i, s in enumerate(saved) if isinstance(s, torch.Tensor)]
        ctx.save_for_backward(*(saved[i] for i in tensor_positions))
        ctx.saved_layout = (len(saved), tensor_positions,
                            {i: s for i, s in enumerate(saved) if not isinstance(s, torch.Tensor)})
        ctx.compiled = compiled
        ctx.num_inputs = len(tensors)
        return tuple(leaves[i] for i in compiled.differentiable_outputs)

    @staticmethod
    def backward(ctx: Any, *cotangents: torch.Tensor) -> Any:
        compiled: CompiledGrad = ctx.compiled
        if torch.is_grad_enabled():
            raise MinijitError(
                f"double backward (create_graph=True) through the jitted function {compiled.name!r} is not "
                "supported; call backward without create_graph, or differentiate the function eagerly"
            )
        count, tensor_positions, others = ctx.saved_layout
        saved: list[Any] = [None] * count
        for i, t in zip(tensor_positions, ctx.saved_tensors):
            saved[i] = t
        for i, v in others.items():
            saved[i] = v
        grads = compiled.backward(*saved, *cotangents)
        return (None, None, *grads)


def autograd_callable(compiled: CompiledGrad) -> Callable[..., Any]:
    """A function of the call's tensors that runs `compiled` as one `torch.autograd.Function`."""
    positions = compiled.differentiable_outputs

    def run_with_grad(*tensors: torch.Tensor) -> Any:
        if not positions:  # nothing to differentiate: no autograd node
            return compiled.forward(*tensors)[0]
        box: list[Any] = []
        results = _JitFunction.apply(compiled, box, *tensors)
        out, leaves = box[0]
        leaves = list(leaves)
        for i, r in zip(positions, results):
            leaves[i] = r
        it = iter(leaves)
        return tree_map(lambda _: next(it), out)

    return run_with_grad
