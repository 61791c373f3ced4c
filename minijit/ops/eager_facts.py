"""Facts of eager torch: the callable that runs each ltorch op, what eager's kernels do when the tensor an op
writes overlaps one of its operands, by torch op name, and where a foreach op rounds otherwise than its op.

The overlap facts are facts of `Effects` (minijit.ir.symbol) for the ops minijit knows by their torch
name only: opaque torch ops, and the in-place ltorch ops declared in a loop
(minijit/ops/ltorch/inplace.py). Ops declared one by one state them in their declaration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minijit.ir import Symbol, Tag
from minijit.ops import prims

# ltorch symbol -> the eager callable that implements it with the same signature (`ltorch_op` fills it in)
EAGER_BY_SYMBOL: dict[Symbol, Callable[..., Any]] = {}


def _convert(x: Any, dtype: Any) -> Any:
    """A conversion as the torch executor runs it, laid out as eager's `to` lays it out (the input's layout)."""
    return x.to(dtype, copy=True)


# Prims recorded at the top of a trace where the user's code called an op (autocast's casts in front of it): the
# eager callable they stand for, so that the layouts of the op's results are known.
_PRIMS_EAGER: dict[Symbol, Callable[..., Any]] = {prims.convert_element_type: _convert}


def eager_implementations() -> dict[Symbol, Callable[..., Any]]:
    """ltorch op -> its eager callable, for executors."""
    return dict(EAGER_BY_SYMBOL)


def eager_impl(sym: Symbol) -> Callable[..., Any] | None:
    """The eager callable that runs `sym` with a bound symbol's own arguments: an ltorch op's, or an opaque
    torch op itself; None for others."""
    found = EAGER_BY_SYMBOL.get(sym) or _PRIMS_EAGER.get(sym)
    if found is None and Tag.OPAQUE in sym.tags:
        return sym.fn
    return found

# Eager refuses any overlap of the written tensor with an operand (ATen's assert_no_overlap),
# the same elements in the same order included.
REFUSES_ANY_OVERLAP = frozenset({"index_copy_", "index_add_", "index_reduce_", "index_put_", "put_", "scatter_",
                                 "scatter_add_", "scatter_reduce_", "cat", "gather", "index_select", "take",
                                 "take_along_dim"})
# A 0-d tensor operand is read as a number before the write (`x.fill_(x[0])`).
READS_SCALAR_FIRST = frozenset({"fill_", "masked_fill_", "index_fill_"})


def write_facts(name: str) -> dict[str, bool]:
    """The `Effects` fields about overlapping writes for the torch op `name` (`index_copy_`, `Tensor.index_copy_`)."""
    op = name.rsplit(".", 1)[-1]
    return {"refuses_overlap": op in REFUSES_ANY_OVERLAP, "reads_scalar_first": op in READS_SCALAR_FIRST}


# The one foreach op on the CPU that computes otherwise than its per-tensor op: `torch._foreach_mul_(tensors, number)`
# on these dtypes rounds the number to the tensor's dtype first (`t.mul_(0.9)` on bfloat16 multiplies by 0.9, the
# foreach op by 0.8984375).
FOREACH_MUL_ROUNDS_NUMBER_FIRST = frozenset({torch.float16, torch.bfloat16})
