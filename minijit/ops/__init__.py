"""Ops: `prims` (the functional core) and `ltorch` (torch-level ops decomposed into prims)."""

from minijit.ops import ltorch, prims
from minijit.ops.autocast import key_policies
from minijit.ops.eager_facts import eager_impl
from minijit.ops.opaque import aten_name
from minijit.ops.registry import ALL_LTORCH, TORCH_TO_LTORCH, check_eager_table, ltorch_op, ltorch_symbol_for

__all__ = ["ALL_LTORCH", "TORCH_TO_LTORCH", "ltorch", "ltorch_op", "ltorch_symbol_for", "prims"]

check_eager_table()  # every ltorch op declared by now has its eager callable
key_policies(ALL_LTORCH, lambda sym: aten_name(eager_impl(sym)))  # autocast's policies, by ltorch op
