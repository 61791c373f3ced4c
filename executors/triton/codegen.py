"""From a fusion region to Triton kernel source.

The region's members become a small dataflow graph (`Node`s), evaluated in program
order so that a read of a tensor after a copy into it sees the copied value. Each
region output is then computed by a kernel over an iteration domain:

- a *pointwise* kernel iterates over the output's shape with flat indices;
- a *row* kernel (when the region reduces along the last dim of tensors of shape S)
  gives each program a block of rows of S, loads whole rows and reduces them with
  `tl.sum`/`tl.max`/`tl.min`; row values (shape S[:-1]) broadcast back over the row.
  Rows wider than `ROW_BLOCK_LIMIT` are *looped*: one pass over the row in chunks per
  level of reductions (softmax: the max, then the sum of exp(x - max)), then one
  pass computing and storing the outputs, so rows of any width get a kernel.

A value is generated under a *projection*: for each of its dims, the iteration dim
that indexes it (or None for a broadcast dim, index 0). `broadcast_in_dim`,
`transpose` and size-1 reshapes only change the projection, so a broadcast input is
a zero-stride load and no intermediate is ever materialized. A projection entry may
carry an offset, `(dim, offset)`: a `slice` shifts its input's indices by its starts,
and a `cat` computes each part under its own offset, its loads masked to the part's
range, and picks the part by the index (rotary embeddings' halves, their gradient's
zero padding: no copy of either). `full` is a constant under any projection, `iota` the
index of the iteration dim reading it (a one-hot pick: nll_loss's gather and scatter). Values load in their
dtype and compute in float32 (float16/bfloat16/float32; float64 stays float64);
stores cast to the output's dtype.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.extend import BoundSymbol, Region, Symbol, Tag, TensorProxy, check_table, prims

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int32, torch.int64)
DTYPES = (*FLOATS, *INTS, torch.bool)
_TL = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1",
}
# Last-dim reductions: the Triton reduction and its neutral element.
REDUCTIONS: dict[Symbol, tuple[str, str]] = {
    prims.sum: ("tl.sum", "0.0"), prims.amax: ("tl.max", "float('-inf')"), prims.amin: ("tl.min", "float('inf')")}
REMAPS = (prims.broadcast_in_dim, prims.reshape, prims.squeeze, prims.transpose)
# Index arithmetic: no kernel of their own, fused where they feed or are fed by pointwise work.
PLACEMENTS = (prims.slice_prim, prims.cat, prims.full, prims.iota)
# The widest row a row kernel holds whole in registers; wider rows are reduced in chunks of this many
# elements (a power of two).
ROW_BLOCK_LIMIT = 4096

# Elementwise prims: template over the arguments' generated names, and the dtype kinds they accept.
_F, _I, _B = "f", "i", "b"
ELEMENTWISE: dict[Symbol, tuple[str, str]] = {
    prims.add: ("({0} + {1})", _F + _I), prims.sub: ("({0} - {1})", _F + _I), prims.mul: ("({0} * {1})", _F + _I),
    prims.div: ("({0} / {1})", _F), prims.neg: ("(-{0})", _F + _I), prims.abs: ("tl.abs({0})", _F + _I),
    prims.exp: ("tl.exp({0})", _F), prims.exp2: ("tl.exp2({0})", _F), prims.log: ("tl.log({0})", _F),
    prims.log2: ("tl.log2({0})", _F), prims.log10: ("(tl.log({0}) * 0.4342944819032518)", _F),
    prims.sqrt: ("tl.sqrt({0})", _F), prims.rsqrt: ("tl.rsqrt({0})", _F), prims.sin: ("tl.sin({0})", _F),
    prims.cos: ("tl.cos({0})", _F), prims.erf: ("tl.math.erf({0})", _F), prims.floor: ("tl.floor({0})", _F),
    prims.ceil: ("tl.ceil({0})", _F), prims.reciprocal: ("(1.0 / {0})", _F),
    # tanh through exp of a non-positive argument, which cannot overflow.
    prims.tanh: ("(tl.where({0} >= 0, 1.0, -1.0) * (1.0 - tl.exp(-2.0 * tl.abs({0}))) / (1.0 + tl.exp(-2.0 * tl.abs({0}))))", _F),
    prims.sign: ("tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0 * {0}))", _F),
    prims.trunc: ("tl.where({0} >= 0, tl.floor({0}), tl.ceil({0}))", _F),
    # log1p/expm1 near 0 through u = 1 + x (or exp(x)) and the correction x / (u - 1), which
    # cancels u's rounding error (Goldberg); far from 0 the direct formula is accurate.
    prims.log1p: ("tl.where(tl.abs({0}) < 0.5, tl.where(1.0 + {0} == 1.0, {0}, tl.log(1.0 + {0}) * ({0} / ((1.0 + {0}) - 1.0))), "
                  "tl.log(1.0 + {0}))", _F),
    prims.expm1: ("tl.where(tl.abs({0}) < 0.5, tl.where(tl.exp({0}) == 1.0, {0}, "
                  "(tl.exp({0}) - 1.0) * ({0} / tl.log(tl.exp({0})))), tl.exp({0}) - 1.0)", _F),
    # pow with a number exponent (the executor claims no other): see `pow_source`.
    prims.pow: ("", _F),
    prims.maximum: ("tl.maximum({0}, {1})", _F + _I), prims.minimum: ("tl.minimum({0}, {1})", _F + _I),
    prims.eq: ("({0} == {1})", _F + _I + _B), prims.ne: ("({0} != {1})", _F + _I + _B),
    prims.lt: ("({0} < {1})", _F + _I),
    prims.le: ("({0} <= {1})", _F + _I), prims.gt: ("({0} > {1})", _F + _I), prims.ge: ("({0} >= {1})", _F + _I),
    prims.logical_and: ("(({0} != 0) & ({1} != 0))", _F + _I + _B),
    prims.logical_or: ("(({0} != 0) | ({1} != 0))", _F + _I + _B),
    prims.logical_xor: ("(({0} != 0) ^ ({1} != 0))", _F + _I + _B), prims.logical_not: ("({0} == 0)", _F + _I + _B),
    prims.isnan: ("({0} != {0})", _F), prims.isinf: ("(tl.abs({0}) == float('inf'))", _F),
    prims.isfinite: ("(({0} == {0}) & (tl.abs({0}) != float('inf')))", _F),
    prims.where: ("tl.where({0}, {1}, {2})", _F + _I + _B),
    # torch's lerp: from the nearer end, as its kernels compute it (the same rounding).
    prims.lerp: ("tl.where(tl.abs({2}) < 0.5, {0} + {2} * ({1} - {0}), {1} - ({1} - {0}) * (1.0 - {2}))", _F),
}

# Elementwise prims without a template, and why: each runs on torch, splitting the fused region where it stands.
# Every elementwise prim (`Tag.ELEMENTWISE`) is in ELEMENTWISE or here, checked below at import: a new prim
# must be given a template or a reason, never fall out of the fusion unnoticed.
NOT_FUSED: dict[Symbol, str] = {
    **{sym: "no template written yet (a libdevice call would do)" for sym in (
        prims.tan, prims.asin, prims.acos, prims.atan, prims.sinh, prims.cosh, prims.asinh, prims.acosh, prims.atanh,
        prims.erfc, prims.erfinv, prims.lgamma, prims.digamma, prims.atan2, prims.copysign)},
    **{sym: "no template written yet (integer and bit arithmetic, rounding modes as torch's)" for sym in (
        prims.round, prims.bitwise_not, prims.signbit, prims.floor_divide, prims.remainder, prims.fmod,
        prims.bitwise_and, prims.bitwise_or, prims.bitwise_xor, prims.bitwise_left_shift, prims.bitwise_right_shift)},
    **{sym: "views of complex tensors: the kernels hold real dtypes only" for sym in (prims.real, prims.imag)},
}


def check_lowerings(prim_symbols: Iterable[Symbol] | None = None) -> None:
    """Raise a MinijitError naming each elementwise prim (of `prim_symbols`, by default every one) without a
    template in ELEMENTWISE or a reason in NOT_FUSED."""
    check_table({**ELEMENTWISE, **NOT_FUSED}, prims.ALL_PRIMS.values() if prim_symbols is None else prim_symbols,
                lambda s: Tag.ELEMENTWISE in s.tags, "Triton template or reason (triton/codegen.py ELEMENTWISE, NOT_FUSED)")


check_lowerings()


class NotFusible(Exception):
    """The region cannot be compiled into kernels (the executor then declines it)."""


def kind(dtype: torch.dtype) -> str:
    """'f', 'i' or 'b': the family of a dtype."""
    return _B if dtype == torch.bool else _F if dtype.is_floating_point else _I


def compute_dtype(dtype: torch.dtype) -> str:
    """The Triton dtype values of `dtype` are computed in (float32 for 16-bit floats)."""
    return "tl.float32" if dtype in (torch.float16, torch.bfloat16) else _TL[dtype]


def remap_dims(bsym: BoundSymbol) -> tuple[int | None, ...] | None:
    """For a remap prim: the output dim each input dim reads (None: size 1), or None if it is not one."""
    sym = bsym.sym
    x: TensorProxy = bsym.args[0]
    out: TensorProxy = bsym.output
    if sym is prims.broadcast_in_dim:
        bdims = bsym.args[2] if len(bsym.args) > 2 else bsym.kwargs["broadcast_dims"]
        return tuple(None if s == 1 else d for s, d in zip(x.shape, bdims))
    if sym is prims.transpose:
        perm = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["permutation"]
        inverse = [0] * len(perm)
        for j, p in enumerate(perm):
            inverse[p] = j
        return tuple(None if x.shape[i] == 1 else inverse[i] for i in range(x.ndim))
    if sym in (prims.reshape, prims.squeeze):
        # Only reshapes that add or drop size-1 dims: the other dims keep their order.
        out_dims = [j for j, s in enumerate(out.shape) if s != 1]
        in_dims = [i for i, s in enumerate(x.shape) if s != 1]
        if [x.shape[i] for i in in_dims] != [out.shape[j] for j in out_dims]:
            return None
        mapping: list[int | None] = [None] * x.ndim
        for i, j in zip(in_dims, out_dims):
            mapping[i] = j
        return tuple(mapping)
    return None


@dataclass(eq=False)
class Node:
    """A value in a region: a load of an input, an op, a remap, a cast, or a row reduction."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    args: tuple[Any, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)

    def depends_on_reduction(self) -> bool:
        """Whether a row reduction feeds this value (it must then be computed in the row kernel)."""
        memo = self.attrs.get("_reduces")
        if memo is None:
            memo = self.op == "reduce" or any(isinstance(a, Node) and a.depends_on_reduction() for a in self.args)
            self.attrs["_reduces"] = memo
        return memo


@dataclass
class Store:
    """A region result: `node` stored into a new tensor (`target` None) or into input `target`."""

    node: Node
    target: int | None
    output_index: int | None


# A projection entry: the iteration dim indexing a value's dim (None: index 0), (dim or None, offset), or
# ("x", source, dims): an index computed from several iteration dims (a reshape's regrouping).
Entry = int | None | tuple[Any, ...]


def entry_dims(e: Entry) -> frozenset[int]:
    """The iteration dims an entry reads (none for a constant index)."""
    if isinstance(e, tuple):
        return e[2] if e[0] == "x" else frozenset() if e[0] is None else frozenset({e[0]})
    return frozenset() if e is None else frozenset({e})


def shift(e: Entry, k: int) -> Entry:
    """The entry indexing `k` elements further along."""
    if k == 0:
        return e
    if isinstance(e, tuple) and e[0] == "x":
        return ("x", f"({e[1]} + {k})", e[2])
    d, o = e if isinstance(e, tuple) else (e, 0)
    return d if o + k == 0 else (d, o + k)


def index_of(e: Entry) -> str:
    """Source of the element index an entry gives."""
    if isinstance(e, tuple):
        if e[0] == "x":
            return e[1]
        d, o = e
        return str(o) if d is None else f"(i{d} + {o})"
    return "0" if e is None else f"i{e}"


def regroup(proj: tuple[Entry, ...], out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> tuple[Entry, ...]:
    """The input's entries of a reshape from `in_shape` to `out_shape` read under the output's `proj`: per group
    of dims holding the same elements, the output's flat index within the group split into the input's dims."""
    entries: list[Entry] = []
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        ins, outs = [i], [j]
        a = in_shape[i] if i < len(in_shape) else 1
        b = out_shape[j] if j < len(out_shape) else 1
        while a != b:
            if a < b:
                i += 1
                ins.append(i)
                a *= in_shape[i]
            else:
                j += 1
                outs.append(j)
                b *= out_shape[j]
        i, j = i + 1, j + 1
        ins = [d for d in ins if d < len(in_shape)]
        outs = [d for d in outs if d < len(out_shape)]
        if len(ins) == 1 and len(outs) == 1:
            entries.append(proj[outs[0]])
            continue
        dims = frozenset().union(*(entry_dims(proj[d]) for d in outs))
        flat, inner = [], 1
        for d in reversed(outs):
            flat.append(index_of(proj[d]) if inner == 1 else f"{index_of(proj[d])} * {inner}")
            inner *= out_shape[d]
        total = "(" + " + ".join(reversed(flat)) + ")" if flat else "0"
        inner = 1
        split: list[Entry] = []
        for d in reversed(ins):
            size = in_shape[d]
            part = total if inner == 1 else f"({total} // {inner})"
            split.append(("x", part if d == ins[0] else f"({part} % {size})", dims) if dims else None)
            inner *= size
        entries += reversed(split)
    return tuple(entries)


def view_of_input(node: Node) -> tuple[int, list[Node]] | None:
    """(input index, remaps or slices from it, outermost last) when `node` only re-indexes an input, else None."""
    base, chain = reindexing(node)
    if base.op != "load" or not chain:
        return None
    return base.attrs["input"], chain


def apply_view(t: torch.Tensor, chain: list[Node]) -> torch.Tensor:
    """`t` re-indexed by a chain of remap nodes, as a torch view (no copy)."""
    for node in chain:
        if node.op == "slice":
            t = t[tuple(slice(start, start + size) for start, size in zip(node.attrs["starts"], node.shape))]
            continue
        if node.op == "reshape":
            t = t.reshape(node.shape)
            continue
        prim, params = node.attrs["prim"], node.attrs["params"]
        if prim is prims.broadcast_in_dim:
            shape, bdims = params[0], params[1]
            view = [1] * len(shape)
            for size, d in zip(t.shape, bdims):
                view[d] = size
            t = t.reshape(view).expand(tuple(shape))
        elif prim is prims.transpose:
            t = t.permute(tuple(params[0]))
        else:
            t = t.reshape(node.shape)
    return t


def build_graph(region: Region) -> tuple[list[Node], list[Store], dict[int, int], dict[int, tuple[int, list[Node]]],
                                         dict[int, tuple[int, list[Node]]]]:
    """The region's dataflow graph: input loads, stores (outputs and copies), output -> input aliases,
    outputs that are views of inputs (a broadcast kept for backward is not worth a kernel store), and
    outputs that are views of other outputs (a value and its reshape both leave the region: one store).

    Raises `NotFusible` for a region that the kernels cannot express.
    """
    index = {p.name: i for i, p in enumerate(region.inputs)}
    loads = [Node("load", tuple(p.shape), p.dtype, attrs={"input": i}) if isinstance(p, TensorProxy) else None
             for i, p in enumerate(region.inputs)]
    env: dict[str, Node] = {p.name: n for p, n in zip(region.inputs, loads) if n is not None}
    copies: dict[int, Node] = {}

    def arg(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            return env[x.name]
        if isinstance(x, bool | int | float):
            return x
        raise NotFusible(f"unsupported argument {x!r}")

    for bsym in region.members:
        sym = bsym.sym
        out = bsym.output
        if sym.effects.copies:
            src, (dst,) = bsym.copied_value(), bsym.written()
            if dst.name in index:
                # Later reads of dst see src (through env); the input ends up holding the last copy.
                copies[index[dst.name]] = env[src.name]
            env[dst.name] = env[src.name]
            continue
        if sym in ELEMENTWISE:
            node = Node("elementwise", tuple(out.shape), out.dtype, tuple(arg(a) for a in bsym.args), {"prim": sym})
        elif sym is prims.convert_element_type or sym is prims.copy_in_format:  # (a copy: a cast to its own dtype)
            node = Node("cast", tuple(out.shape), out.dtype, (arg(bsym.args[0]),))
        elif sym in REMAPS:
            dims = remap_dims(bsym)
            if dims is not None:
                node = Node("remap", tuple(out.shape), out.dtype, (arg(bsym.args[0]),),
                            {"dims": dims, "prim": sym, "params": bsym.args[1:]})
            elif sym is prims.reshape and 0 not in bsym.args[0].shape:
                node = Node("reshape", tuple(out.shape), out.dtype, (arg(bsym.args[0]),),
                            {"in_shape": tuple(bsym.args[0].shape)})
            else:
                raise NotFusible(f"{sym.name} is not a broadcast, permutation or reshape")
        elif sym is prims.slice_prim:
            x, starts, _, steps = slice_args(bsym)
            if steps is not None and any(step != 1 for step in steps):
                raise NotFusible("a slice with steps")
            node = Node("slice", tuple(out.shape), out.dtype, (arg(x),), {"starts": tuple(starts)})
        elif sym is prims.cat:
            tensors = bsym.args[0] if bsym.args else bsym.kwargs["tensors"]
            dim = (bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs.get("dim", 0)) % out.ndim
            parts, bounds, lo = [], [], 0
            for t in tensors:
                if t.shape[dim]:
                    parts.append(arg(t))
                    bounds.append((lo, lo + t.shape[dim]))
                    lo += t.shape[dim]
            node = Node("cat", tuple(out.shape), out.dtype, tuple(parts), {"dim": dim, "bounds": tuple(bounds)})
        elif sym is prims.full:
            value = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["fill_value"]
            node = Node("full", tuple(out.shape), out.dtype, (), {"value": arg(value)})
        elif sym is prims.iota:
            node = Node("iota", tuple(out.shape), out.dtype, (),
                        {"start": arg(bsym.kwargs["start"]), "step": arg(bsym.kwargs["step"])})
        elif sym in REDUCTIONS:
            node = Node("reduce", tuple(out.shape), out.dtype, (arg(bsym.args[0]),),
                        {"kind": sym.name, "tl": REDUCTIONS[sym]})
        elif sym is prims.var_mean:
            x, correction = arg(bsym.args[0]), bsym.args[2]
            var, mean = out
            pair: dict[str, Node] = {}
            for part, proxy in (("var", var), ("mean", mean)):
                pair[part] = Node("reduce", tuple(proxy.shape), proxy.dtype, (x,),
                                  {"kind": part, "correction": correction, "pair": pair})
                env[proxy.name] = pair[part]
            continue
        else:
            raise NotFusible(sym.id)
        env[out.name] = node

    stores: list[Store] = []
    aliases: dict[int, int] = {}
    views: dict[int, tuple[int, list[Node]]] = {}
    derived: dict[int, tuple[int, list[Node]]] = {}
    stored: dict[int, int] = {}  # node id -> the output storing it
    chains: list[tuple[int, Node, list[Node]]] = []
    for k, p in enumerate(region.outputs):
        if p.name in index:
            aliases[k] = index[p.name]  # written by a copy, or passed through unchanged
        elif (view := view_of_input(env[p.name])) is not None and view[0] not in copies:
            views[k] = view
        elif (chain := reindexing(env[p.name]))[1]:
            chains.append((k, *chain))
        else:
            stores.append(Store(env[p.name], None, k))
            stored.setdefault(id(env[p.name]), k)
    # The shapes kernels iterate over anyway: the stores', and the rows of any reduction.
    domains = {s.node.shape for s in stores} | {n.args[0].shape for n in env.values() if n.op == "reduce"}
    for k, base, chain in chains:
        # A view (a reshape, a transpose) of a value the region computes: the value is stored (as a hidden
        # output, numbered after the region's own, unless it is one of them) and torch makes the view;
        # stored as the view itself where its shape is iterated over and the value's is not (one kernel).
        if id(base) not in stored and chain[-1].shape in domains and base.shape not in domains:
            stores.append(Store(env[region.outputs[k].name], None, k))
            continue
        if id(base) not in stored:
            stored[id(base)] = len(region.outputs) + sum(1 for s in stores if s.output_index is not None
                                                         and s.output_index >= len(region.outputs))
            stores.append(Store(base, None, stored[id(base)]))
        derived[k] = (stored[id(base)], chain)
    for target, node in copies.items():
        stores.append(Store(node, target, None))
    return [n for n in loads if n is not None], stores, aliases, views, derived


def reindexing(node: Node) -> tuple[Node, list[Node]]:
    """(the value `node` re-indexes, the remaps, reshapes and slices from it, outermost last)."""
    chain: list[Node] = []
    while node.op in ("remap", "slice", "reshape"):
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def slice_args(bsym: BoundSymbol) -> tuple[Any, Any, Any, Any]:
    """(x, start_indices, end_indices, strides) of a `prims.slice`, however they were passed."""
    names = ("x", "start_indices", "end_indices", "strides")
    values = list(bsym.args) + [bsym.kwargs.get(n) for n in names[len(bsym.args):]]
    return tuple(values)  # type: ignore[return-value]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (and >= 1)."""
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def pow_exponent_ok(exponent: Any) -> bool:
    """Whether `pow_source` handles `x ** exponent` exactly like torch (including negative x)."""
    if isinstance(exponent, bool) or not isinstance(exponent, int | float) or not math.isfinite(exponent):
        return False
    return float(exponent) != int(exponent) or abs(exponent) <= 4


def pow_source(exponent: float) -> str:
    """A template for `{0} ** exponent`: products for small integer exponents, exp2/log2 otherwise."""
    if float(exponent) == int(exponent):
        n = int(exponent)
        if n == 0:
            return "tl.where({0} == {0}, 1.0, 1.0)"  # x ** 0 is 1, NaN included
        product = " * ".join(["{0}"] * abs(n))
        return f"({product})" if n > 0 else f"(1.0 / ({product}))"
    if exponent == 0.5:
        return "tl.sqrt({0})"
    if exponent == -0.5:
        return "tl.rsqrt({0})"
    # exp2(e * log2(|x|)), with torch's special cases written out rather than left to how the device's
    # log2/exp2 approximations treat 0, -0 and negative inputs: NaN below 0 (a non-integer exponent),
    # 0 ** e is 0 for e > 0 and inf for e < 0; |x| keeps log2 away from negative arguments.
    e = float(exponent)
    at_zero = "0.0" if e > 0 else "float('inf')"
    return (f"tl.where({{0}} < 0, float('nan'), tl.where({{0}} == 0, {at_zero}, "
            f"tl.exp2({_literal(e)} * tl.log2(tl.abs({{0}}) + tl.where({{0}} == 0, 1.0, 0.0)))))")


def narrow(value: str, dtype: torch.dtype) -> str:
    """Source converting a computed value to `dtype`, rounding to nearest even."""
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # Round the float32 bits explicitly: Triton's interpreter truncates float32 -> bfloat16 (on a GPU the
        # conversion rounds to nearest even itself). NaN passes as is: the carry of the rounding would turn
        # a NaN with a full payload (CUDA's 0x7FFFFFFF) into -0.0.
        x = f"{value}.to(tl.float32)"
        bits = f"{x}.to(tl.uint32, bitcast=True)"
        rounded = f"(({bits} + 0x7FFF + (({bits} >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)"
        return f"tl.where({x} != {x}, {x}, {rounded}).to(tl.bfloat16)"
    return f"{value}.to({_TL[dtype]})"


def _literal(x: Any) -> str:
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, float) and not math.isfinite(x):
        return "float('nan')" if math.isnan(x) else ("float('inf')" if x > 0 else "float('-inf')")
    return repr(x)


_NEUTRAL = {"sum": "0.0", "mean": "0.0", "var": "0.0", "amax": "float('-inf')", "amin": "float('inf')"}


def _anchor_columns(lines: list[str], stores: list[str] = ()) -> list[str]:
    """`lines` of a row kernel's body (or of one loop over a row's chunks), with `stores` after them, laid out
    along the columns.

    Triton lays a tile out as the loads and stores that read and write it are laid out. Where the only ones are
    of row values (`[BLOCK_M, 1]`, masked by `rmask`), it lays the tile out along the rows: each thread then
    computes the whole row of BLOCK_N elements alone, every thread the same (a one-hot pick summed over a
    32,000-wide row: 4,096 additions per thread per chunk, 40 times the time of the kernel laid out right).
    Loading the first row value as a whole tile of that value (`+ cols * 0`, masked by `mask`) gives the loop a
    tile access laid out along the columns, the others follow it.
    """
    def whole_tile(line: str) -> bool:
        return ("= tl.load(" in line or line.startswith("tl.store(")) and ", mask=mask" in line

    if any(whole_tile(line) for line in (*lines, *stores)):
        return lines
    for k, line in enumerate(lines):
        if "= tl.load(" in line and ", mask=rmask" in line:
            return [*lines[:k], line.replace(", mask=rmask", " + cols * 0, mask=mask", 1), *lines[k + 1:]]
    return lines


def _reductions(roots: Any) -> list[Node]:
    """The reduce nodes the values `roots` depend on, each once, in a dependency order."""
    seen: set[int] = set()
    found: list[Node] = []

    def visit(node: Node) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for a in node.args:
            if isinstance(a, Node):
                visit(a)
        if node.op == "reduce":
            if node.attrs["kind"] == "var":
                visit(node.attrs["pair"]["mean"])
            found.append(node)

    for root in roots:
        visit(root)
    return found


def _level(node: Node) -> int:
    """How many reductions in a chain end at `node` (a looped kernel makes one pass over the row per level)."""
    memo = node.attrs.get("_level")
    if memo is None:
        below = max((_level(a) for a in node.args if isinstance(a, Node)), default=0)
        if node.op == "reduce" and node.attrs["kind"] == "var":
            below = max(below, _level(node.attrs["pair"]["mean"]))
        memo = below + 1 if node.op == "reduce" else below
        node.attrs["_level"] = memo
    return memo


class KernelWriter:
    """Writes one kernel computing some stores over one iteration domain.

    `row` kernels iterate over blocks of rows of `domain` (whole rows per program);
    pointwise kernels over flat blocks of `domain`.
    """

    def __init__(self, domain: tuple[int, ...], row: bool, input_shapes: dict[int, tuple[int, ...]]):
        self.domain = domain
        self.row = row
        # A looped row kernel: rows wider than ROW_BLOCK_LIMIT, visited in chunks of BLOCK_N columns.
        self.looped = row and domain[-1] > ROW_BLOCK_LIMIT
        self.block_n = min(ROW_BLOCK_LIMIT, next_pow2(domain[-1])) if row else 0
        self.input_shapes = input_shapes
        self.lines: list[str] = []
        self.memo: dict[tuple[Any, ...], str] = {}
        # Conditions the loads being generated are masked with too (a part of a cat: its index range).
        self.guards: tuple[str, ...] = ()
        self.used_inputs: set[int] = set()
        # input index -> projections it is loaded with (for the copy_to_out_ safety check)
        self.load_projections: dict[int, set[tuple[int | None, ...]]] = {}
        self.counter = 0
        self.ops: list[str] = []

    def fresh(self) -> str:
        """A new local variable name."""
        self.counter += 1
        return f"v{self.counter}"

    @property
    def last_dim(self) -> int:
        """The iteration dim that indexes columns in a row kernel."""
        return len(self.domain) - 1

    def index_expr(self, dims: tuple[Entry, ...], strides: list[str]) -> str:
        """The element offset of a tensor indexed by projection entries `dims` (None: index 0)."""
        terms = [f"{index_of(d)} * {s}" for d, s in zip(dims, strides) if d is not None]
        if not terms:
            return "(rows * 0)" if self.row else "(offs * 0)"
        return " + ".join(terms)

    def mask_for(self, dims: tuple[Entry, ...]) -> str:
        """The mask of a load or store indexed by `dims` (rows only, or the whole tile), with the guards."""
        base = "rmask" if self.row and not any(self.last_dim in entry_dims(d) for d in dims) else "mask"
        return " & ".join((base, *self.guards))

    def gen(self, node: Node, proj: tuple[int | None, ...]) -> str:
        """The variable holding `node` under projection `proj`, emitting its code once."""
        key = (id(node), proj, self.guards)
        name = self.memo.get(key)
        if name is not None:
            return name
        name = self._gen(node, proj)
        self.memo[key] = name
        return name

    def _gen(self, node: Node, proj: tuple[int | None, ...]) -> str:
        if node.op == "load":
            name = self.fresh()
            i = node.attrs["input"]
            self.used_inputs.add(i)
            self.load_projections.setdefault(i, set()).add(proj)
            offset = self.index_expr(proj, [f"in{i}_s{d}" for d in range(len(proj))])
            self.lines.append(f"{name} = tl.load(in{i} + {offset}, mask={self.mask_for(proj)}, other=1)"
                              f".to({compute_dtype(node.dtype)})")
            return name
        if node.op == "slice":
            (src,) = node.args
            return self.gen(src, tuple(shift(e, start) for e, start in zip(proj, node.attrs["starts"])))
        if node.op == "reshape":
            (src,) = node.args
            return self.gen(src, regroup(proj, node.shape, node.attrs["in_shape"]))
        if node.op == "cat":
            return self._cat(node, proj)
        if node.op == "full":
            name = self.fresh()
            value = _literal(node.attrs["value"])
            self.lines.append(f"{name} = tl.where({self.mask_for(proj)}, {value}, {value})"
                              f".to({compute_dtype(node.dtype)})")
            return name
        if node.op == "iota":  # start + step * the index of the iteration dim reading it
            name = self.fresh()
            index = index_of(proj[0])
            if not entry_dims(proj[0]):
                index = f"tl.where({self.mask_for(proj)}, {index}, {index})"
            start, step = _literal(node.attrs["start"]), _literal(node.attrs["step"])
            self.lines.append(f"{name} = ({start} + {step} * {index}).to({compute_dtype(node.dtype)})")
            return name
        if node.op == "remap":
            (src,) = node.args
            dims = node.attrs["dims"]
            return self.gen(src, tuple(None if d is None else proj[d] for d in dims))
        if node.op == "cast":
            (src,) = node.args
            x = self.gen(src, proj)
            if node.dtype not in (torch.float16, torch.bfloat16, torch.bool) and \
                    compute_dtype(node.dtype) == compute_dtype(src.dtype):
                return x  # bf16 -> f32 and the like: already computed in the target dtype
            name = self.fresh()
            self.ops.append("to")
            if node.dtype == torch.bool:
                self.lines.append(f"{name} = {x} != 0")
            elif node.dtype in (torch.float16, torch.bfloat16):
                # Round to the narrow dtype, as the cast does, then keep computing in float32.
                self.lines.append(f"{name} = {narrow(x, node.dtype)}.to(tl.float32)")
            else:
                self.lines.append(f"{name} = {x}.to({_TL[node.dtype]})")
            return name
        if node.op == "elementwise":
            prim = node.attrs["prim"]
            self.ops.append(prim.name)
            args = [self.gen(a, proj) if isinstance(a, Node) else _literal(a) for a in node.args]
            name = self.fresh()
            template = ELEMENTWISE[prim][0]
            if prim is prims.pow:
                template = pow_source(node.args[1])
            if prim is prims.lerp and not isinstance(node.args[2], Node):  # a number weight: its branch, chosen here
                template = "({0} + {2} * ({1} - {0}))" if abs(node.args[2]) < 0.5 else "({1} - ({1} - {0}) * (1.0 - {2}))"
            if prim in (prims.maximum, prims.minimum) and node.dtype.is_floating_point:
                # torch.maximum/minimum propagate NaN; Triton's do not unless asked.
                template = template.replace(")", ", propagate_nan=tl.PropagateNan.ALL)")
            self.lines.append(f"{name} = {template.format(*args)}")
            return name
        if node.op == "reduce":
            row_identity = tuple(range(len(self.domain) - 1))
            if not self.row or proj != row_identity:
                raise NotFusible("a reduction whose result is not indexed by rows")
            (src,) = node.args
            if tuple(src.shape) != self.domain:
                raise NotFusible("reductions over different shapes")
            if self.looped:
                raise NotFusible("a reduction the looped kernel did not plan")  # planned in `_looped_body`
            x = self.gen(src, tuple(range(len(self.domain))))
            if node.attrs["kind"] in ("var", "mean"):
                return self._var_mean(node, x, proj)
            name = self.fresh()
            fn, neutral = node.attrs["tl"]
            self.ops.append(node.attrs["kind"])
            self.lines.append(f"{name} = {fn}(tl.where(mask, {x}, {neutral}), axis=1, keep_dims=True)")
            if node.attrs["kind"] in ("amax", "amin"):
                # torch.amax/amin return NaN for a row holding one; tl.max/tl.min skip it.
                nans = self.fresh()
                self.lines.append(f"{nans} = tl.sum(tl.where(mask & ({x} != {x}), 1, 0), axis=1, keep_dims=True)")
                self.lines.append(f"{name} = tl.where({nans} > 0, float('nan'), {name})")
            return name
        raise NotFusible(node.op)

    def _cat(self, node: Node, proj: tuple[Entry, ...]) -> str:
        """A cat: each part computed at its offset, its loads guarded by its range; the index picks one."""
        dim = node.attrs["dim"]
        entry = proj[dim]
        if not entry_dims(entry):  # read at one index (a slice of one element): that part, no choice to make
            at = entry[1] if isinstance(entry, tuple) else 0
            (lo, _), part = next((b, p) for b, p in zip(node.attrs["bounds"], node.args) if b[0] <= at < b[1])
            return self.gen(part, tuple(shift(e, -lo) if k == dim else e for k, e in enumerate(proj)))
        index = index_of(entry)
        self.ops.append("cat")
        values = []
        for (lo, hi), part in zip(node.attrs["bounds"], node.args):
            outer = self.guards
            self.guards = (*outer, f"({index} >= {lo})", f"({index} < {hi})")
            values.append(self.gen(part, tuple(shift(e, -lo) if k == dim else e for k, e in enumerate(proj))))
            self.guards = outer
        expr = values[-1]
        for (_, hi), value in zip(reversed(node.attrs["bounds"][:-1]), reversed(values[:-1])):
            expr = f"tl.where({index} < {hi}, {value}, {expr})"
        name = self.fresh()
        self.lines.append(f"{name} = {expr}")
        return name

    def _var_mean(self, node: Node, x: str, proj: tuple[int | None, ...]) -> str:
        """Both halves of a var_mean (two passes over the row held in registers); returns `node`'s."""
        pair = node.attrs["pair"]
        n = self.domain[-1]
        mean, diff, var = self.fresh(), self.fresh(), self.fresh()
        self.ops.append("var_mean")
        self.lines.append(f"{mean} = tl.sum(tl.where(mask, {x}, 0.0), axis=1, keep_dims=True) / {n}")
        self.lines.append(f"{diff} = tl.where(mask, {x} - {mean}, 0.0)")
        self.lines.append(f"{var} = tl.sum({diff} * {diff}, axis=1, keep_dims=True) / {_literal(n - node.attrs['correction'])}")
        self.memo[(id(pair["mean"]), proj, self.guards)] = mean
        self.memo[(id(pair["var"]), proj, self.guards)] = var
        return mean if node is pair["mean"] else var

    def store_projection(self, shape: tuple[int, ...]) -> tuple[int | None, ...]:
        """How a stored value of `shape` is indexed in this domain."""
        if shape == self.domain:
            return tuple(range(len(shape)))
        if self.row and shape == self.domain[:-1]:
            return tuple(range(len(shape)))
        if self.row and shape == (*self.domain[:-1], 1):
            return (*range(len(shape) - 1), None)
        raise NotFusible(f"an output of shape {shape} in a kernel over {self.domain}")

    def _store(self, node: Node, ptr: str, dtype: torch.dtype) -> str:
        """The line storing `node` through pointer `ptr` as `dtype` (its value's code emitted first)."""
        proj = self.store_projection(node.shape)
        if node.op == "cast" and node.dtype == dtype and node.args[0].shape == node.shape:
            node = node.args[0]  # the store rounds to its dtype itself
        value = self.gen(node, proj)
        offset = self.index_expr(proj, [f"{ptr}_s{d}" for d in range(len(proj))])
        cast = f"({value} != 0)" if dtype == torch.bool else narrow(value, dtype)
        return f"tl.store({ptr} + {offset}, {cast}, mask={self.mask_for(proj)})"

    def source(self, kernel_name: str, stores: list[tuple[Node, str, torch.dtype]]) -> tuple[str, list[str]]:
        """The kernel's source and its parameter names; `stores` are (node, pointer name, dtype)."""
        if self.looped:
            body = self._looped_body(stores)
        else:
            body = [self._store(node, ptr, dtype) for node, ptr, dtype in stores]
            if self.row:
                self.lines = _anchor_columns(self.lines, body)
        params = [f"in{i}" for i in sorted(self.used_inputs)] + [p for _, p, _ in stores]
        strides = [f"in{i}_s{d}" for i in sorted(self.used_inputs) for d in range(len(self.input_shapes[i]))]
        strides += [f"{p}_s{d}" for n, p, _ in stores for d in range(len(n.shape))]
        head = [f"def {kernel_name}({', '.join([*params, *strides])}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):"]
        idx = self._index_lines()
        lines = head + ["    " + line for line in idx + self.lines + body]
        return "@triton.jit\n" + "\n".join(lines) + "\n", [*params, *strides]

    def _chunk_lines(self, start: str) -> list[str]:
        """The column index and mask of the chunk of each row that starts at column `start`."""
        return [f"cols = {start} + tl.arange(0, BLOCK_N)[None, :]", f"mask = rmask & (cols < {self.domain[-1]})",
                f"i{len(self.domain) - 1} = cols"]

    def _looped_body(self, stores: list[tuple[Node, str, torch.dtype]]) -> list[str]:
        """A looped row kernel's code after its index lines: per level of reductions, a loop over the row's
        chunks accumulating them; then the row-shaped stores; then a loop computing and storing the rest."""
        body: list[str] = []
        levels: dict[int, list[Node]] = {}
        for node in _reductions(n for n, _, _ in stores):
            levels.setdefault(_level(node), []).append(node)
        row = tuple(range(len(self.domain) - 1))
        full = tuple(range(len(self.domain)))
        for level in sorted(levels):
            finals: list[str] = []
            step: list[str] = []
            self.lines, kept = step, dict(self.memo)
            for node in levels[level]:
                x = self.gen(node.args[0], full)
                acc = self.fresh()
                body.append(f"{acc} = tl.full([BLOCK_M, 1], {_NEUTRAL[node.attrs['kind']]}, "
                            f"{compute_dtype(node.args[0].dtype)})")
                kind_ = node.attrs["kind"]
                self.ops.append(kind_)
                if kind_ in ("sum", "mean"):
                    step.append(f"{acc} += tl.sum(tl.where(mask, {x}, 0.0), axis=1, keep_dims=True)")
                    if kind_ == "mean":
                        finals.append(f"{acc} = {acc} / {self.domain[-1]}")
                elif kind_ == "var":
                    mean = kept[(id(node.attrs["pair"]["mean"]), row, ())]
                    diff = self.fresh()
                    step.append(f"{diff} = tl.where(mask, {x} - {mean}, 0.0)")
                    step.append(f"{acc} += tl.sum({diff} * {diff}, axis=1, keep_dims=True)")
                    finals.append(f"{acc} = {acc} / {_literal(self.domain[-1] - node.attrs['correction'])}")
                else:  # amax, amin: NaN wins, as in torch
                    fn, neutral = node.attrs["tl"]
                    pick = "tl.maximum" if kind_ == "amax" else "tl.minimum"
                    nans = self.fresh()
                    body.append(f"{nans} = tl.zeros([BLOCK_M, 1], tl.int32)")
                    step.append(f"{acc} = {pick}({acc}, {fn}(tl.where(mask, {x}, {neutral}), axis=1, keep_dims=True))")
                    step.append(f"{nans} += tl.sum(tl.where(mask & ({x} != {x}), 1, 0), axis=1, keep_dims=True)")
                    finals.append(f"{acc} = tl.where({nans} > 0, float('nan'), {acc})")
                kept[(id(node), row, ())] = acc
            body += self._loop(_anchor_columns(step)) + finals
            self.memo = kept  # values inside the loop were per chunk; the accumulated rows stay
        self.lines = body
        for node, ptr, dtype in stores:
            if self.store_projection(node.shape) != full:
                body.append(self._store(node, ptr, dtype))
        kept, step = dict(self.memo), []
        self.lines = step
        step += [self._store(node, ptr, dtype) for node, ptr, dtype in stores
                 if self.store_projection(node.shape) == full]
        self.memo = kept
        self.lines = []
        return body + (self._loop(step) if step else [])

    def _loop(self, step: list[str]) -> list[str]:
        """`step` run for each chunk of the rows."""
        inner = self._chunk_lines("start") + step
        return [f"for start in range(0, {self.domain[-1]}, BLOCK_N):"] + ["    " + line for line in inner]

    def _index_lines(self) -> list[str]:
        dom = self.domain
        if self.row:
            n_rows = math.prod(dom[:-1])
            lines = [
                "rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
                f"rmask = rows < {n_rows}",
            ]
            if not self.looped:
                lines += self._chunk_lines("0")
            inner = 1
            for d in reversed(range(len(dom) - 1)):
                lines.append(f"i{d} = (rows // {inner}) % {dom[d]}")
                inner *= dom[d]
            return lines
        lines = [
            "offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)",
            f"mask = offs < {math.prod(dom)}",
        ]
        inner = 1
        for d in reversed(range(len(dom))):
            lines.append(f"i{d} = (offs // {inner}) % {dom[d]}")
            inner *= dom[d]
        return lines
