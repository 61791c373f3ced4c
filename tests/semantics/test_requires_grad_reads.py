"""`Tensor.requires_grad` read inside a jitted function answers as eager's does, under `torch.no_grad()` too.

Eager's result of an op made while grad is off does not require grad, whatever its inputs; a view keeps its
base's flag. Code branches on it (`torch.utils.checkpoint`, a library's "only when training" paths), so a wrong
answer is a wrong result: each case is compared with eager, with the whole call under `torch.no_grad()` as well.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minijit


def _flags_inside_no_grad(x: torch.Tensor, w: torch.Tensor) -> tuple[bool, ...]:
    y = x * 2
    with torch.no_grad():
        z = x * 3
        lin = F.linear(x, w)
        summed = x.sum()
        opaque = torch.xlogy(x, x.abs() + 1)
        view, reshaped, sliced = x.view(-1), x.reshape(-1), x[0]
        copied, same, converted, gathered = x.t().contiguous(), x.contiguous(), x.double(), x[[0, 1]]
    return (y.requires_grad, z.requires_grad, lin.requires_grad, summed.requires_grad, opaque.requires_grad,
            view.requires_grad, reshaped.requires_grad, sliced.requires_grad, (z * y).requires_grad,
            copied.requires_grad, same.requires_grad, converted.requires_grad, gathered.requires_grad)


def _branch_on_the_flag(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        h = F.linear(x, w).relu()
    return h * 2 if h.requires_grad else h * 3  # eager: always * 3 (h made without grad)


def _set_grad_enabled_false(x: torch.Tensor, w: torch.Tensor) -> tuple[bool, bool]:
    with torch.set_grad_enabled(False):
        a = x @ w.t()
    b = x @ w.t()
    return a.requires_grad, b.requires_grad


def _reshapes_that_copy(x: torch.Tensor, w: torch.Tensor) -> tuple[bool, ...]:
    # reshape, flatten, ravel and reshape_as view where they can and copy where not: a copy made under no_grad does
    # not require grad, a view keeps its base's flag
    with torch.no_grad():
        t = x.t()
        flags = (t.reshape(-1).requires_grad, t.flatten().requires_grad, t.ravel().requires_grad,
                 t.reshape_as(w[0, :2].repeat(3)).requires_grad, t.reshape(3, 2).requires_grad,
                 t.flatten(1).requires_grad, x.reshape(3, 2).requires_grad, x.flatten().requires_grad,
                 x.view(-1)[::2].ravel().requires_grad, x.view(-1)[::2].reshape(-1).requires_grad)
        r = t.reshape(-1)
    return (*flags, (r * 2 if r.requires_grad else r * 3).sum().item())


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("program", [_flags_inside_no_grad, _branch_on_the_flag, _set_grad_enabled_false,
                                     _reshapes_that_copy])
@pytest.mark.parametrize("outside", ["grad", "no_grad"])
def test_requires_grad_reads_match_eager(mode: str, program: Callable, outside: str) -> None:
    jitted = minijit.jit(program, cache=mode)
    for requires_grad in (True, False):
        x = torch.randn(2, 3, requires_grad=requires_grad)
        w = torch.randn(4, 3)
        with torch.no_grad() if outside == "no_grad" else torch.enable_grad():
            want = program(x, w)
            have = jitted(x, w)
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(have, want)
        else:
            assert have == want
