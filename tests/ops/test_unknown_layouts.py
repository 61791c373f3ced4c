"""Decisions that depend on a layout minijit does not know are refused, never guessed.

Whether `contiguous()` returns its tensor or a copy, and `reshape` a view or a copy, depend on the tensor's eager
layout. Some layouts minijit cannot work out: `nonzero`'s result (column-major, its size known only from the
data), a gradient from `torch.autograd.grad` (autograd's kernels lay it out). A write through the result then
lands in eager's tensor or not: a guess could give a wrong value, so minijit refuses, naming the tensor
(`reshape` only where a write makes it matter); decisions that do not depend on the layout still go through.
Layouts it can work out (`sort`, `topk`, `max` along a dim, whose results are torch's named tuples) are followed
as eager's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minijit


def _written_through_contiguous(make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def program(x: torch.Tensor) -> torch.Tensor:
        y = make(x)
        y.contiguous().add_(1)  # y itself where contiguous in eager, a copy where not
        return y

    return program


def _written_through_reshape(x: torch.Tensor) -> torch.Tensor:
    n = x.flatten(1).nonzero()
    n.reshape(-1).add_(1)  # nonzero's result is column-major: eager's reshape copies
    return n


def _grad_of_a_convolution(x: torch.Tensor) -> torch.Tensor:
    g, = torch.autograd.grad(F.conv2d(x, torch.ones(2, 3, 3, 3), padding=1).square().sum(), x)
    return g  # channels-last for a channels-last x


REFUSED = {
    "nonzero, contiguous": _written_through_contiguous(lambda x: x.flatten(1).nonzero()),
    "autograd.grad, contiguous": _written_through_contiguous(_grad_of_a_convolution),
    "nonzero, reshape written through": _written_through_reshape,
}


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("name", list(REFUSED))
def test_a_decision_on_an_unknown_layout_is_refused(mode: str, name: str) -> None:
    program = REFUSED[name]
    x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last).requires_grad_()
    program(x)  # eager runs it
    with pytest.raises(minijit.MinijitError, match="memory layout"):
        minijit.jit(program, cache=mode)(x)


ALLOWED = {
    # The layout decides nothing here: a view for any layout, a read of a copy, a 1-d result.
    "nonzero, unsqueeze": lambda x: x.flatten(1).nonzero().unsqueeze(0) + 1,
    "nonzero, reshape read": lambda x: x.flatten(1).nonzero().reshape(-1) + 1,
    "nonzero, written, then reshaped": lambda x: (lambda n: n.add_(1).reshape(-1) * 2)(x.flatten(1).nonzero()),
    "1-d nonzero, view": lambda x: x.flatten().nonzero().view(-1) + 1,
    "where, view": lambda x: torch.where(x.flatten(1) > 0)[1].view(-1, 1) + 1,
    "mask, view": lambda x: x.flatten()[x.flatten() > 0].view(-1, 1) * 2,
    # Known: torch's named result tuples.
    "sort, contiguous": _written_through_contiguous(lambda x: x.transpose(1, 3).sort(1)[0]),
    "topk, contiguous": _written_through_contiguous(lambda x: x.transpose(1, 3).topk(2, 1)[0]),
    # Known from a replay with the 0-dim tensor on the CPU: the Scalar overload reads its value, which a meta
    # tensor has not (DeBERTa's relative positions clamp by a 0-dim tensor).
    "clamp by a 0-dim tensor, contiguous": _written_through_contiguous(lambda x: torch.clamp(x.transpose(1, 3), 0,
                                                                                             x.amax())),
    "max, strides": lambda x: torch.tensor(x.transpose(1, 3).max(1)[0].stride()),
    "sort indices, strides": lambda x: torch.tensor(x.transpose(1, 3).sort(1)[1].stride()),
}


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("name", list(ALLOWED))
def test_decisions_the_layout_does_not_change_or_that_minijit_knows_match_eager(mode: str, name: str) -> None:
    program = ALLOWED[name]
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(minijit.jit(program, cache=mode)(x), program(x))
