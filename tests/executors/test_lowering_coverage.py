"""Every executor's per-op table is keyed by `Symbol` and checked for coverage where it is built.

A prim added without a Triton template used to split fused regions silently (`fusion_0`, `torchex.softplus`,
`fusion_1`) with every test green; now the import fails, naming the prim, until it is given a lowering or a reason.
"""

import pytest
import torch

import executors.torch as torch_executor
import minijit
from executors.nvfuser import translate as nvfuser_lowerings
from executors.triton import codegen as triton_lowerings
from minijit.errors import MinijitError
from minijit.ir import Symbol, Tag
from minijit.ops import ALL_LTORCH, prims
from minijit.ops.autocast import POLICIES, key_policies

FUSERS = [triton_lowerings, nvfuser_lowerings]


def _meta(x):
    return x


def _throwaway_elementwise() -> Symbol:
    return Symbol("throwaway_unary", _meta, namespace="prims", is_prim=True, tags=frozenset({Tag.ELEMENTWISE}))


@pytest.mark.parametrize("lowerings", FUSERS, ids=["triton", "nvfuser"])
def test_every_elementwise_prim_is_lowered_or_has_a_reason(lowerings):
    lowerings.check_lowerings()  # as at import, on every prim declared by now
    lowered, reasons = set(lowerings.ELEMENTWISE), lowerings.NOT_FUSED
    assert sorted(s.id for s in lowered & set(reasons)) == []  # one or the other, never both
    assert all(isinstance(why, str) and why for why in reasons.values())


@pytest.mark.parametrize("lowerings", FUSERS, ids=["triton", "nvfuser"])
def test_an_elementwise_prim_without_a_lowering_is_named(lowerings):
    with pytest.raises(MinijitError, match=r"no .*(Triton|nvFuser).* for prims\.throwaway_unary"):
        lowerings.check_lowerings([*prims.ALL_PRIMS.values(), _throwaway_elementwise()])


def test_a_prim_without_a_torch_implementation_is_named():
    torch_executor.check_implementations()
    throwaway = Symbol("throwaway_prim", _meta, namespace="prims", is_prim=True)
    with pytest.raises(MinijitError, match=r"no torch implementation .* for prims\.throwaway_prim"):
        torch_executor.check_implementations([*prims.ALL_PRIMS.values(), throwaway])


def test_tables_are_keyed_by_symbol():
    tables = [triton_lowerings.ELEMENTWISE, triton_lowerings.NOT_FUSED, triton_lowerings.REDUCTIONS,
              triton_lowerings.REMAPS, triton_lowerings.PLACEMENTS, nvfuser_lowerings.ELEMENTWISE,
              nvfuser_lowerings.NOT_FUSED, nvfuser_lowerings.REDUCTIONS, nvfuser_lowerings.SUPPORTED,
              torch_executor._PRIM_IMPLS, torch_executor.ex.implementations, *POLICIES.values()]
    assert all(isinstance(key, Symbol) for table in tables for key in table)


def test_an_ltorch_op_eager_casts_without_a_policy_is_named():
    throwaway = Symbol("throwaway_mm", _meta, namespace="ltorch")
    ops = {**ALL_LTORCH, throwaway.name: throwaway}
    saved = dict(POLICIES)
    try:
        with pytest.raises(MinijitError, match=r"no cpu autocast policy .* for ltorch\.throwaway_mm"):
            # Its ATen operator, aten::mm, has an autocast kernel of its own.
            key_policies(ops, lambda s: "aten::mm" if s is throwaway else None)
    finally:
        POLICIES.clear()
        POLICIES.update(saved)


def test_an_ltorch_op_eager_casts_on_cpu_gets_eager_s_dtype():
    # adaptive_max_pool3d has a CPU autocast kernel (float32); the check above found it without a policy.
    def f(x):
        return torch.nn.functional.adaptive_max_pool3d(x, 2)

    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = f(x), minijit.jit(f)(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
