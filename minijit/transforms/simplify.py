"""Simplify: remove lossless cast round trips (docs/design.md, invariant 5), and compute each number once.

`y = x.to(float32); z = y.to(bfloat16)` with x in bfloat16 gives z == x exactly,
because every bfloat16 value is a float32 value: z is replaced by x. The other
direction, float32 -> bfloat16 -> float32, rounds and must stay.

`f3 = num_mul(lr, 0.01)` after `f1 = num_mul(lr, 0.01)` is `f1`: arithmetic on Python
numbers is pure, so a repeat is dropped and its uses read the first (an optimizer
computes its weight decay factor once per parameter; each repeat is one more float a
fused region takes as an input, and torch.compile wraps each float in a tensor per call).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from minijit.ir import BoundSymbol, NumberProxy, Proxy, Tag, TensorProxy, Trace, tree_flatten
from minijit.ir.rewrite import ProxyMap, Rule, rewrite
from minijit.ops import prims
from minijit.transforms.memory import MemoryModel, layout_read, memory_model

_INT_BITS = {torch.bool: 1, torch.uint8: 8, torch.int8: 7, torch.int16: 15, torch.int32: 31, torch.int64: 63}


def is_lossless_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """True when every value of dtype `src` is exactly representable in dtype `dst`."""
    if src == dst:
        return True
    if src.is_complex:
        return dst.is_complex and is_lossless_cast(src.to_real(), dst.to_real())
    if dst.is_complex:
        return is_lossless_cast(src, dst.to_real())
    if src.is_floating_point:
        if not dst.is_floating_point:
            return False
        s, d = torch.finfo(src), torch.finfo(dst)
        # More mantissa bits, a larger range and smaller subnormals.
        return d.eps <= s.eps and d.max >= s.max and d.smallest_normal * d.eps <= s.smallest_normal * s.eps
    if src == torch.bool:
        return True  # x != 0 in any dtype gives x back
    if src not in _INT_BITS or dst == torch.bool:
        return False
    if dst.is_floating_point:
        return _significand_bits(dst) >= _INT_BITS[src]
    # Integer casts wrap around, so a round trip through a type at least as wide is exact.
    return dst in _INT_BITS and dst.itemsize >= src.itemsize


def _significand_bits(dtype: torch.dtype) -> int:
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def _cast_of(bsym: BoundSymbol) -> tuple[TensorProxy, TensorProxy] | None:
    """(input, output) when `bsym` only converts a tensor's dtype (a prim or an op decomposing to one)."""
    if Tag.CAST in bsym.sym.tags and bsym.sym.is_prim:  # the prim, or an executor's symbol running it
        x, out = bsym.args[0], bsym.output
        if isinstance(x, TensorProxy) and isinstance(out, TensorProxy):
            return x, out
        return None
    if not bsym.sym.is_prim and len(bsym.subsymbols) == 1:
        inner = _cast_of(bsym.subsymbols[0])
        if inner is not None and inner[1] is bsym.output and any(inner[0] is a for a in bsym.proxy_args()):
            return inner
    return None


def simplify(trace: Trace) -> Trace:
    """`trace` with lossless cast round trips removed and each repeated number computed once, in one walk."""
    drop_round_trip, merge_number = _cast_round_trip_rule(trace), _repeated_number_rule()

    def rule(bsym: BoundSymbol, env: ProxyMap) -> list[BoundSymbol] | None:
        merged = merge_number(bsym, env)
        return merged if merged is not None else drop_round_trip(bsym, env)

    return rewrite(trace, rule, pass_name="simplify")


def _cast_round_trip_rule(trace: Trace) -> Rule:
    """Replaces `cast(cast(x, d1), x.dtype)` by x when the cast to d1 is lossless."""
    source_of = ProxyMap()  # cast output -> the tensor it was cast from
    # Returning an input or a view of one where the user got a fresh tensor would alias the two
    # (and the trace's final copies into inputs would change the returned value).
    outputs = {id(p) for p in tree_flatten(trace.output) if isinstance(p, Proxy)}
    # A copy whose memory an op reads (`as_strided`) is laid out otherwise than the tensor it copies.
    laid_out = layout_read(trace)
    memory: list[MemoryModel] = []  # built on first need
    returned_storages: list[frozenset[Any]] = []  # the memory the outputs live in, on first need

    def in_input_memory(p: Proxy) -> bool:
        if not memory:
            memory.append(memory_model(trace))
        return bool(memory[0].input_storages(p))

    def returned(p: Proxy) -> bool:
        """Whether `p` is returned, itself or through a view (`x.clone().detach()`)."""
        if id(p) in outputs:
            return True
        if not memory:
            memory.append(memory_model(trace))
        if not returned_storages:
            returned_storages.append(frozenset().union(*(memory[0].storages(o) for o in tree_flatten(trace.output)
                                                         if isinstance(o, TensorProxy))))
        return bool(memory[0].storages(p) & returned_storages[0])

    def drop_round_trip(bsym: BoundSymbol, env: ProxyMap) -> list[BoundSymbol] | None:
        cast = _cast_of(bsym)
        if cast is None:
            return None
        x, out = cast
        origin = source_of.get(x)
        aliases_input = origin is not None and returned(out) and in_input_memory(origin)
        if (origin is not None and origin.dtype == out.dtype and is_lossless_cast(origin.dtype, x.dtype)
                and not aliases_input and id(out) not in laid_out):
            env[out] = origin
            return []
        source_of[out] = x
        return None

    return drop_round_trip


_NUMBER_PRIMS = frozenset(prims.NUMBER_PRIMS.values())


def _repeated_number_rule() -> Rule:
    """Drops each number prim (`prims.num_mul`, ...) that repeats an earlier one on the same arguments; its uses
    read the earlier result."""
    first: dict[tuple[Any, ...], NumberProxy] = {}

    def merge(bsym: BoundSymbol, env: ProxyMap) -> list[BoundSymbol] | None:
        if bsym.sym not in _NUMBER_PRIMS or bsym.kwargs or not isinstance(bsym.output, NumberProxy):
            return None
        key = (bsym.sym, *map(_argument_key, bsym.args))
        if None in key:
            return None
        earlier = first.setdefault(key, bsym.output)
        if earlier is bsym.output:
            return None
        env[bsym.output] = earlier
        return []

    return merge


def _argument_key(x: Any) -> tuple[Any, ...] | None:
    """What decides a number prim's argument: a proxy by identity, a Python number by type and exact value (a
    float by its bits: -0.0 is not 0.0, and nan is nan); None for anything else (never merged)."""
    if isinstance(x, NumberProxy):
        return ("proxy", id(x))
    if type(x) is float:
        return (float, x.hex())
    if type(x) in (int, bool):
        return (type(x), x)
    return None
