"""Every elementwise prim has a lowering in each fusion executor, or a reason there why not.

A prim added without a Triton template used to split fused regions silently (`fusion_0`, `torchex.softplus`,
`fusion_1`) with every test green; now it fails here until it is given a template or a reason.
"""

import pytest

from executors.nvfuser import translate as nvfuser_lowerings
from executors.triton import codegen as triton_lowerings
from minijit.ops import prims

ELEMENTWISE_PRIMS = (*prims.UNARY, *prims.BINARY, *prims.TERNARY)


@pytest.mark.parametrize("executor", [triton_lowerings, nvfuser_lowerings], ids=["triton", "nvfuser"])
def test_every_elementwise_prim_is_lowered_or_has_a_reason(executor):
    lowered, reasons = set(executor.ELEMENTWISE), executor.NOT_FUSED
    assert [n for n in ELEMENTWISE_PRIMS if n not in lowered and n not in reasons] == []
    assert sorted(lowered & set(reasons)) == []  # one or the other, never both
    assert [n for n in reasons if n not in ELEMENTWISE_PRIMS] == []  # no reason left for a prim that is gone
    assert all(isinstance(why, str) and why for why in reasons.values())
