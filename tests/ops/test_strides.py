"""Strides on proxies: layout-dependent ops (view, reshape, contiguous, as_strided) follow eager torch.

Each program runs on contiguous and non-contiguous inputs (`t()`, slices with steps,
expand, permute), eagerly and under `minijit.jit`: the same values and the same strides,
or the same error (eager raises -> jit raises a MinijitError naming the user's line).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import minijit
from minijit.errors import MinijitError


def make_input(layout: str) -> torch.Tensor:
    """A (4, 6) float tensor with the memory layout `layout`, over a base tensor of its own."""
    if layout == "t":
        return torch.arange(24.0).reshape(6, 4).t()
    if layout == "step_slice":
        return torch.arange(48.0).reshape(4, 12)[:, ::2]
    if layout == "expand":
        return torch.arange(6.0).reshape(1, 6).expand(4, 6)
    if layout == "permute":
        return torch.arange(24.0).reshape(6, 1, 4).permute(2, 1, 0).squeeze(1)
    if layout == "offset":
        return torch.arange(30.0).reshape(5, 6)[1:]
    return torch.arange(24.0).reshape(4, 6)


LAYOUTS = ["contiguous", "t", "step_slice", "expand", "permute", "offset"]

PROGRAMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "view_flat": lambda x: x.view(-1),
    "view_split": lambda x: x.view(2, 2, 6),
    "view_merge_rows": lambda x: x.view(4, 2, 3),
    "view_as": lambda x: x.view_as(torch.empty(24)),
    "t_view": lambda x: x.t().view(-1),
    "t_view_back": lambda x: x.t().view(6, 4),
    "transpose_view": lambda x: x.transpose(0, 1).view(3, 8),
    "step_view": lambda x: x[:, ::2].view(-1),
    "column_view": lambda x: x[:, 1:3].view(-1),
    "add_then_view": lambda x: (x + 1).view(-1),
    "t_add_then_view": lambda x: (x.t() * 2).view(-1),
    "permute_view": lambda x: x.unsqueeze(0).permute(2, 0, 1).view(6, 4),
    "expand_view": lambda x: x[:, :1].expand(4, 3).view(-1),
    "reshape_flat": lambda x: x.reshape(-1),
    "t_reshape": lambda x: x.t().reshape(-1),
    "step_reshape": lambda x: x[:, ::2].reshape(2, 6),
    "flatten": lambda x: x.flatten(),
    "contiguous": lambda x: x.contiguous(),
    "t_contiguous": lambda x: x.t().contiguous(),
    "t_contiguous_view": lambda x: x.t().contiguous().view(-1),
    "as_strided": lambda x: x.as_strided((3, 2), (1, 2)),
    "t_as_strided": lambda x: x.t().as_strided((2, 3), (3, 1)),
    "slice_as_strided": lambda x: x[1:].as_strided((2, 2), (2, 1)),
    "elementwise": lambda x: x * 3 - 1,
    "t_elementwise": lambda x: torch.sin(x.t()),
    "sum_keepdim": lambda x: x.sum(dim=0, keepdim=True),
}


def _run(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> tuple[str, object]:
    try:
        return "ok", fn(*args)
    except RuntimeError as e:  # a MinijitError is not a RuntimeError: it fails the comparison below
        return "raised", e


def _shares_memory(out: torch.Tensor, x: torch.Tensor) -> bool:
    return out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def _check(program: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """`program(x)` under jit gives eager's values, strides and aliasing of x, or eager's error."""
    expected_kind, expected = _run(program, x)
    jitted = minijit.jit(program)
    if expected_kind == "raised":
        with pytest.raises(MinijitError) as info:
            jitted(x)
        assert str(expected).splitlines()[0] in str(info.value)
        assert "test_strides.py:" in str(info.value)  # the user's line
        return
    got = jitted(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert got.stride() == expected.stride()
    assert got.storage_offset() == expected.storage_offset() or not _shares_memory(expected, x)
    assert _shares_memory(got, x) == _shares_memory(expected, x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_layout_program_like_eager(name: str, layout: str) -> None:
    _check(PROGRAMS[name], make_input(layout))
