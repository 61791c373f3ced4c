"""A write into an op's result reaches the tensor it came from exactly where eager's does.

Ops that view where they can and copy where not (`reshape`, `flatten`, `ravel`, `reshape_as`, indexing) must be
told apart on every layout: `ravel` of a tensor it cannot view copies it contiguously and returns a view of the copy,
which a check of "is the result a view" took for a view of the input. And a view that reads memory (`as_strided`)
places its elements by the base's layout in its storage: a write through it is either placed as eager's or refused.
Each case is compared with eager on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import minijit

_LAYOUTS: dict[str, Callable[[], torch.Tensor]] = {
    "contiguous": lambda: torch.randn(3, 4, 5),
    "transposed": lambda: torch.randn(4, 3, 5).transpose(0, 1),
    "innermost permuted": lambda: torch.randn(3, 5, 4).transpose(1, 2),
    "sliced": lambda: torch.randn(3, 8, 5)[:, ::2],
}

_MAY_COPY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "ravel": torch.ravel,
    "flatten": lambda x: x.flatten(),
    "flatten(1)": lambda x: x.flatten(1),
    "reshape": lambda x: x.reshape(12, 5),
    "reshape_as": lambda x: x.reshape_as(torch.empty(60)),
    "basic index": lambda x: x[1:, ::2],
}


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("op", list(_MAY_COPY))
def test_a_write_into_a_view_or_copy_lands_as_eager(op: str, layout: str, mode: str) -> None:
    fn = _MAY_COPY[op]

    def program(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = fn(x)
        y.mul_(2)
        return x, y

    torch.manual_seed(0)
    theirs = _LAYOUTS[layout]()
    ours = torch.empty_strided(theirs.shape, theirs.stride()).copy_(theirs)  # the same strides
    want = program(theirs)
    have = minijit.jit(program, cache=mode)(ours)
    for w, h in zip(want, have, strict=True):
        torch.testing.assert_close(h, w)


def _write_through_as_strided(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.as_strided(x, (2, 2), (1, 2), 1)
    y.add_(1)
    return x, y


def _write_through_as_strided_of_a_computed_transpose(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = x * 2
    y = torch.as_strided(b.t(), (2, 2), (1, 2), 0)
    y.add_(1)
    return b, y


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("make", [lambda: torch.randn(3, 3), lambda: torch.randn(3, 3).t(),
                                  lambda: torch.randn(12)[2:11].view(3, 3)],
                         ids=["contiguous", "transposed", "offset"])
@pytest.mark.parametrize("program", [_write_through_as_strided, _write_through_as_strided_of_a_computed_transpose])
def test_a_write_through_as_strided_is_placed_as_eager_or_refused(program: Callable, make: Callable, mode: str) -> None:
    torch.manual_seed(0)
    theirs = make()
    base = theirs._base if theirs._base is not None else theirs
    ours = base.clone().as_strided(theirs.shape, theirs.stride(), theirs.storage_offset())  # the same memory layout
    want = program(theirs)
    try:
        have = minijit.jit(program, cache=mode)(ours)
    except minijit.MinijitError as refused:
        # Refused only where eager's view places the elements by a layout other than row-major from the start.
        assert "not row-major from the start of its memory" in str(refused)
        assert program is _write_through_as_strided_of_a_computed_transpose or not theirs.is_contiguous() \
            or theirs.storage_offset() != 0
        return
    for w, h in zip(want, have, strict=True):
        torch.testing.assert_close(h, w)
