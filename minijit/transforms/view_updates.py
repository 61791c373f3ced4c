"""Views for functionalization: which outputs alias their input, replaying a view, writing a view back.

A view op declares it on its symbol (`Effects.views`, minijit/ir/symbol.py): its
outputs share memory with one of its arguments, the *viewed* tensor (the bound symbol
answers: `BoundSymbol.is_view`, `viewed_tensor`, `may_alias_input`). Functionalization
(docs/design.md, invariant 1) needs two things per view op: *replay* (recompute the view
from the base's new value, by calling the op again) and *scatter* (the inverse
update: given the base's current value and the view's new value, the base's new
value):

- the view prims (transpose, reshape, squeeze, slice, broadcast_in_dim as unsqueeze)
  have a scatter rule each, in `PRIM_SCATTER`, keyed by the prim: every prim whose
  effects say its output may share an argument's memory has an entry (None where a
  write through it is refused), checked when the table is built;
- an ltorch view op decomposes into view prims: `invert_decomposition` walks the
  decomposition back from the output to the input and applies the prim rules in
  reverse. A view op that may copy (`Effects.may_copy`: `x[idx_tensor]`, whose
  decomposition gathers; `x.t().reshape(-1)`, decided by running the view chain's
  eager implementations on meta tensors, `eager_returns_view`) returns a copy where
  eager does;
- an opaque torch view op (`x.unfold(...)`) has neither: `scatter_by_positions`
  writes the view's new value into the base by element positions.

A write through a view whose decomposition cannot be inverted is an
`UnsupportedOpError` naming the op and line. A write through an expanded view
(`x.expand(2, 3)[0]`) cannot go step by step; `scatter_by_positions` writes it into
the base by element positions instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from minijit.errors import InplaceError, LayoutDecidesView, MetaError, UnsupportedOpError, where
from minijit.ir import (
    VIEWS_ANY_LAYOUT,
    VIEWS_IF_BASIC_KEY,
    VIEWS_IF_SPLITS,
    BoundSymbol,
    NumberProxy,
    Proxy,
    Symbol,
    Tag,
    TensorProxy,
    Trace,
    check_table,
    tree_flatten,
    tree_map,
)
from minijit.ir.context import replaying_captured
from minijit.ir.layouts import outside_inference_mode, same_memory
from minijit.ir.proxies import number_value, same_shape, same_value
from minijit.ir.rewrite import ProxyMap, replay_bsym
from minijit.ops import prims
from minijit.ops.eager_facts import eager_impl
from minijit.ops.ltorch import shape as ltorch_shape
from minijit.ops.registry import ALL_LTORCH
from minijit.ops.strides import eager_layout, only_splits
from minijit.ops.utils import expand_to, shape_arg

# (view bsym, its output, current value of its input, new value of its output) -> new value of its input
ScatterRule = Callable[[BoundSymbol, Proxy, TensorProxy, TensorProxy], TensorProxy]


def output_position(bsym: BoundSymbol, out: Proxy) -> int:
    """Where `out` sits among `bsym`'s flattened outputs."""
    for i, o in enumerate(tree_flatten(bsym.output)):
        if o is out:
            return i
    raise ValueError(f"{out!r} is not an output of {bsym.sym.id}")


def replay(bsym: BoundSymbol, out: Proxy, new_input: TensorProxy) -> TensorProxy:
    """Record `bsym` again on `new_input` (in the current trace) and return its output at `out`'s position."""
    args, kwargs = _with_viewed(bsym, new_input)
    with replaying_captured():
        result = layout_free(bsym.sym)(*args, **kwargs)
    return tree_flatten(result)[output_position(bsym, out)]


def _with_viewed(bsym: BoundSymbol, new_input: Any) -> tuple[list[Any], dict[str, Any]]:
    """`bsym`'s arguments with the viewed tensor replaced by `new_input`."""
    old_input = bsym.viewed_tensor()
    args, kwargs = list(bsym.args), dict(bsym.kwargs)
    for i, a in enumerate(args):
        if a is old_input:
            args[i] = new_input
            return args, kwargs
    for k, v in kwargs.items():
        if v is old_input:
            kwargs[k] = new_input
            break
    return args, kwargs


# Recomputed values may have any memory layout (a scattered base is often a transpose),
# and `Tensor.view` refuses some layouts; functionally it is the same as reshape.
LAYOUT_FREE: dict[Symbol, Symbol] = {
    ltorch_shape.view: ltorch_shape.reshape,
    ltorch_shape.view_as: ltorch_shape.reshape_as,
}


def layout_free(sym: Symbol) -> Callable[..., Any]:
    """`sym`, or the op computing the same values on tensors of any layout (view -> reshape). A recorded
    `contiguous()` made a copy (one that returned its input left nothing in the trace), and makes a contiguous copy
    again: recorded anew, where the layout is not known, it would return its input, and an op reading memory after it
    (`as_strided`) would read the input's."""
    if sym is ltorch_shape.contiguous:
        return _contiguous_copy
    return LAYOUT_FREE.get(sym, sym)


def _contiguous_copy(a: TensorProxy, memory_format: torch.memory_format = torch.contiguous_format) -> TensorProxy:
    return ltorch_shape.clone(a, memory_format=memory_format)


# -- prim rules ----------------------------------------------------------------------

def _scatter_transpose(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    perm = bsym.args[1]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return prims.transpose(new, tuple(inverse))


def _scatter_reshape(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    return prims.reshape(new, tuple(current.shape))


def _scatter_slice(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    return prims.slice_scatter(current, new, *bsym.args[1:], **bsym.kwargs)


def _scatter_same(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    return new


class ExpandedWrite(InplaceError):
    """A write through an expanded view: one element of the base appears several times in the view."""


def _scatter_broadcast(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    _, shape, dims = bsym.args[:3]
    expanded = any(not same_value(size, shape[d]) for size, d in zip(current.shape, dims, strict=True))
    if expanded or any(not same_value(shape[d], 1) for d in range(len(shape)) if d not in dims):
        # Writing a part of the expanded view (`x.expand(2, 3)[0]`) is fine in eager; the
        # functionalizer then scatters by element positions (scatter_by_positions).
        raise ExpandedWrite(f"{bsym.sym.id}{where(bsym.source)}: unsupported operation: more than one element of "
                            "the written-to tensor refers to a single memory location (an in-place write into an "
                            "expanded tensor, as in eager); clone() the tensor before writing into it")
    return prims.reshape(new, tuple(current.shape))


# Per prim whose output may share an argument's memory: its scatter rule, or None where a write
# through it cannot update the argument (it is refused).
PRIM_SCATTER: dict[Symbol, ScatterRule | None] = {
    prims.transpose: _scatter_transpose,
    prims.reshape: _scatter_reshape,
    prims.squeeze: _scatter_reshape,
    prims.slice_prim: _scatter_slice,
    prims.broadcast_in_dim: _scatter_broadcast,
    prims.detach: _scatter_same,
    prims.real: None,  # views reinterpreting a complex tensor's memory
    prims.imag: None,
    prims.convert_element_type: None,  # the argument itself only where nothing changes
    prims.device_put: None,
}


def _may_view(sym: Symbol) -> bool:
    return sym.effects.views is not None


# The shape a view-or-copy op asks for, as given (a -1 in it stands for what is left of the
# dimension it splits): whether it only splits dimensions decides whether eager views or copies.
REQUESTED_SHAPE: dict[Symbol, Callable[[BoundSymbol, TensorProxy], tuple[Any, ...]]] = {
    ltorch_shape.reshape: lambda step, out: shape_arg(step.args[1:]) if not step.kwargs else tuple(out.shape),
    ltorch_shape.reshape_as: lambda step, out: tuple(out.shape),
    ltorch_shape.flatten: lambda step, out: tuple(out.shape),
}


def check_view_tables(prim_symbols: Iterable[Symbol] | None = None, ltorch_symbols: Iterable[Symbol] | None = None,
                      ) -> None:
    """Raise a MinijitError naming each symbol that lacks an entry its facts need in this module's tables.

    Every prim that may view an argument needs a scatter rule (or None); every op with
    `Tag.LAYOUT_STRICT` a layout-free twin; every `VIEWS_IF_SPLITS` view the shape it asks for.
    By default all the prims and ltorch ops declared; run when this module is imported.
    """
    prim_symbols = list(prims.ALL_PRIMS.values()) if prim_symbols is None else list(prim_symbols)
    ltorch_symbols = list(ALL_LTORCH.values()) if ltorch_symbols is None else list(ltorch_symbols)
    check_table(PRIM_SCATTER, prim_symbols, _may_view, "scatter rule (view_updates.PRIM_SCATTER)")
    check_table(LAYOUT_FREE, ltorch_symbols, lambda s: Tag.LAYOUT_STRICT in s.tags,
                "layout-free twin (view_updates.LAYOUT_FREE)")
    check_table(REQUESTED_SHAPE, ltorch_symbols, lambda s: s.effects.view_layouts == VIEWS_IF_SPLITS,
                "requested shape (view_updates.REQUESTED_SHAPE)")


check_view_tables()


# -- ltorch rules ----------------------------------------------------------------------

def view_path(bsym: BoundSymbol, out: Proxy) -> list[tuple[BoundSymbol, Proxy]] | None:
    """The steps (sub-bsym, its output) from `bsym`'s input to `out` inside its decomposition, or None.

    None means `out` is not reached from the input through view ops only.
    """
    source = bsym.viewed_tensor()
    producers = {id(o): sub for sub in bsym.subsymbols for o in sub.proxy_outputs()}
    steps: list[tuple[BoundSymbol, Proxy]] = []
    cur: Any = out
    while cur is not source:
        sub = producers.get(id(cur))
        if sub is None or not is_view_step(sub, cur):
            return None
        steps.append((sub, cur))
        cur = sub.viewed_tensor()
    return steps[::-1]


def is_view_step(bsym: BoundSymbol, out: Proxy) -> bool:
    """Whether `out` (an output of `bsym`) is a view of the tensor `bsym` views (per its symbol's effects)."""
    if not bsym.is_view() or not isinstance(bsym.viewed_argument(out), TensorProxy):
        return False
    if bsym.sym.is_prim or view_path(bsym, out) is not None:
        return True
    # A view torch always returns as a view, but made of ops we cannot invert: reads of it
    # replay fine, a write through it raises in invert_decomposition.
    return not bsym.sym.effects.may_copy


def scatter(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    """The new value of `bsym`'s input after its output `out` became `new` (records into the current trace)."""
    if not bsym.sym.is_prim:
        return invert_decomposition(bsym, out, current, new)
    if bsym.sym in PRIM_SCATTER:
        rule = PRIM_SCATTER[bsym.sym]
        if rule is not None:
            return rule(bsym, out, current, new)
        raise UnsupportedOpError(f"{bsym.sym.id}{where(bsym.source)}: an in-place write through this view cannot "
                                 "update its base; clone() the view before writing into it")
    # An opaque torch view op: write the new values at the element positions the view shows.
    return scatter_by_positions(current, [(bsym, out)], new, bsym)


def invert_decomposition(bsym: BoundSymbol, out: Proxy, current: TensorProxy, new: TensorProxy) -> TensorProxy:
    """Scatter rule of a view op made of view ops: redo its decomposition on `current`, scatter back in reverse."""
    path = view_path(bsym, out)
    if path is None:
        raise UnsupportedOpError(
            f"{bsym.sym.id}{where(bsym.source)}: an in-place write through this view cannot update its base, "
            "because its decomposition is not made of invertible view ops; clone() the view before writing "
            "into it")
    # The decomposition's own proxies (sizes computed inside it, in symbolic mode) exist
    # only inside `bsym`; record the decomposition again so that the scatters can use them.
    env = _inline(bsym, current)
    for step, step_out in reversed(path):
        step_input = env.value(step.viewed_tensor())
        rule = PRIM_SCATTER.get(step.sym)
        if rule is not None:
            args, kwargs = env((step.args, step.kwargs))
            new = rule(step.replace(args=args, kwargs=kwargs), step_out, step_input, new)
        else:
            new = scatter(step, step_out, step_input, new)
    return new


def _inline(bsym: BoundSymbol, new_input: TensorProxy) -> ProxyMap:
    """Record `bsym`'s subsymbols on `new_input` in the current trace; their old proxies -> the new ones."""
    env = ProxyMap()
    env[bsym.viewed_tensor()] = new_input
    for sub in bsym.subsymbols:
        replay_bsym(sub, env, sym=layout_free(sub.sym))
    return env


def scatter_by_positions(base: TensorProxy, chain: list[tuple[BoundSymbol, Proxy]], new: TensorProxy,
                         op: BoundSymbol, *, uniform: bool = False,
                         masked_fill: tuple[TensorProxy, Any] | None = None) -> TensorProxy:
    """The new value of `base` after the view `chain` (steps from base outwards) of it became `new`.

    Replays the chain on the tensor of base's element positions, then writes `new`
    at those positions with one index_copy. Works through any view, expanded ones
    included, as long as the written view itself has no repeated element (checked
    at trace time by running the chain's eager implementations) or `new` is
    `uniform` (one value everywhere, as `zero_` and `fill_` write, which eager allows).
    With `masked_fill` (mask, value), `new` is the view's `masked_fill(mask, value)`: an
    element of base gets the value where any of the view's positions on it is masked.
    """
    numel = math.prod(base.shape)
    if not uniform and masked_fill is None and _has_repeated_elements(base, chain):
        raise InplaceError(f"{op.sym.id}{where(op.source)}: an in-place write into an expanded tensor, where more "
                           "than one element of the written-to tensor refers to a single memory location; minijit "
                           "supports it only for one value written everywhere (zero_, fill_), and eager refuses most "
                           "such writes; clone() the tensor before writing into it")
    _check_memory_order(base, chain)
    positions = prims.reshape(prims.iota(numel, start=0, step=1, dtype=torch.int64, device=base.device), base.shape)
    reinterprets = False
    for step, out in chain:
        try:
            positions = replay(step, out, positions)
        except MetaError:  # a view only of some dtypes (`torch.view_as_real` of a complex tensor)
            reinterprets = True
            break
    if reinterprets or not same_shape(positions.shape, new.shape) or new.dtype != base.dtype:
        # A view that reinterprets memory (`x.real` of a complex x, `x.view(dtype)`) shows no element positions.
        step = chain[-1][0]
        raise UnsupportedOpError(f"{step.sym.id}{where(op.source)}: an in-place write through this view cannot "
                                 "update its base (the view reinterprets the base's memory); clone() the view "
                                 "before writing into it")
    n = math.prod(new.shape)
    if masked_fill is not None:
        return _fill_where_masked(base, positions, *masked_fill)
    flat = prims.index_copy(prims.reshape(base, (numel,)), prims.reshape(positions, (n,)), prims.reshape(new, (n,)), 0)
    return prims.reshape(flat, tuple(base.shape))


def _check_memory_order(base: TensorProxy, chain: list[tuple[BoundSymbol, Proxy]]) -> None:
    """Refuse a write through a view that reads memory (`as_strided`) where `base` is not laid out row-major from
    the start of its memory: the positions replayed are row-major from 0, and eager's view picks the elements at
    those places of `base`'s memory (a transposed `base`'s others, an offset one's memory before its first element).
    The guard checks the layout the answer relied on. (Where the layout is not known, as for an op without an eager
    implementation's result, row-major from the start is assumed: left alone.)"""
    reading = next((step for step, _ in chain if Tag.READS_LAYOUT in step.sym.tags), None)
    if reading is None:
        return
    if eager_layout(base, guard=False) is None:
        return  # (a synthetic base of inputs sharing memory is its storage's prefix, row-major from its start)
    meta = eager_layout(base, offset_matters=True, sizes_matter=any(isinstance(d, Proxy) for d in base.shape))
    if meta is not None and meta.is_contiguous() and meta.storage_offset() == 0:
        return
    laid_out = f"strides {tuple(meta.stride())}, storage offset {meta.storage_offset()}" if meta is not None else "?"
    raise UnsupportedOpError(
        f"{reading.sym.id}{where(reading.source)}: an in-place write through this view of {base.name}, whose memory "
        f"layout ({laid_out}) is not row-major from the start of its memory: minijit cannot place the written "
        "elements as eager does; take the view of a contiguous tensor (.contiguous(), or .clone() first)")


def _fill_where_masked(base: TensorProxy, positions: TensorProxy, mask: TensorProxy, value: Any) -> TensorProxy:
    """`base` with `value` at each element that one of `positions` (the view's) reaches where `mask` is True.

    Eager's `masked_fill_` through an expanded view writes the one value once per masked
    position, so an element shared by several positions gets it when any of them is masked.
    """
    numel, n = math.prod(base.shape), math.prod(positions.shape)
    masked = prims.convert_element_type(prims.reshape(expand_to(mask, tuple(positions.shape)), (n,)), torch.int64)
    hits = prims.index_add(prims.full((numel,), 0, dtype=torch.int64, device=base.device),
                           prims.reshape(positions, (n,)), masked, 0)
    if isinstance(value, TensorProxy):
        fill = expand_to(prims.convert_element_type(value, base.dtype), (numel,))
    else:
        fill = prims.full((numel,), value, dtype=base.dtype, device=base.device)
    flat = prims.where(prims.gt(hits, 0), fill, prims.reshape(base, (numel,)))
    return prims.reshape(flat, tuple(base.shape))


def _has_repeated_elements(base: TensorProxy, chain: list[tuple[BoundSymbol, Proxy]]) -> bool:
    value = eager_chain(base, chain)
    # Unknown chains (prims, proxies among the arguments) count as free of repeats.
    if value is None:
        return False
    overlap = torch._debug_has_internal_overlap(value[-1])
    # Too hard for torch to tell from the strides (`unfold` with a step below its size, `as_strided`), where eager
    # writes each element once per place it has in the view: the places are counted.
    return _places_repeat(value[-1]) if overlap == 2 else overlap == 1


def _places_repeat(view: torch.Tensor) -> bool:
    """Whether two elements of `view` (an eager or meta tensor) sit at one place of its memory; a view over more
    than `_COUNTED_UP_TO` places is taken to."""
    if view.numel() == 0:
        return False
    extent = view.storage_offset() + sum((n - 1) * s for n, s in zip(view.shape, view.stride(), strict=True)) + 1
    if extent > _COUNTED_UP_TO:
        return True
    places = torch.arange(extent).as_strided(view.shape, view.stride(), view.storage_offset())
    return places.unique().numel() < view.numel()


_COUNTED_UP_TO = 1 << 24


def eager_chain(base: TensorProxy, chain: list[tuple[BoundSymbol, Proxy]],
                trace: Trace | None = None) -> list[torch.Tensor] | None:
    """The chain's views run by their eager implementations on a meta tensor like `base`.

    The meta tensor has `base`'s eager layout where `trace` (which made `base`) tells it
    (minijit.ops.strides), else it is contiguous. Returns the base and each step's
    result, or None where a step has no eager implementation or depends on a proxy
    other than the tensor it views.
    """
    # With symbolic sizes the answer holds for the sizes seen only (a computed tensor's
    # viewability may depend on them): the guard then checks the inputs' sizes too.
    symbolic = any(isinstance(d, Proxy) for d in base.shape)
    known = eager_layout(base, trace, sizes_matter=symbolic) if trace is not None else None
    shape = tuple(int(number_value(d)) for d in base.shape)
    with outside_inference_mode():
        return _run_chain(known if known is not None else torch.empty(shape, dtype=base.dtype, device="meta"), chain)


def _run_chain(start: torch.Tensor, chain: list[tuple[BoundSymbol, Proxy]]) -> list[torch.Tensor] | None:
    """`start` and each step's eager result along `chain` (see eager_chain), or None."""
    values = [start]
    for step, out in chain:
        impl = eager_impl(step.sym)
        viewed = step.viewed_tensor()
        if impl is None or any(isinstance(a, Proxy) and a is not viewed and not isinstance(a, NumberProxy | TensorProxy)
                               for a in tree_flatten((step.args, step.kwargs))):
            return None

        def value(a: Any, before: torch.Tensor = values[-1], viewed: Any = viewed) -> Any:
            # Another tensor argument counts by its shape alone (`reshape_as`'s, an index's): whether the step views
            # is the viewed tensor's layout's to decide.
            if a is viewed:
                return before
            if isinstance(a, NumberProxy):
                return number_value(a)
            if isinstance(a, TensorProxy):
                return torch.zeros([int(number_value(d)) for d in a.shape], dtype=a.dtype, device="meta")
            return a

        args, kwargs = tree_map(value, (step.args, step.kwargs))
        try:
            values.append(tree_flatten(impl(*args, **kwargs))[output_position(step, out)])
        except Exception:
            return None
    return values


def eager_returns_view(base: TensorProxy, chain: list[tuple[BoundSymbol, Proxy]],
                       trace: Trace | None = None) -> bool | None:
    """Whether eager torch makes the last step of `chain` a view (True) or a copy (False) of `base`.

    `reshape`, `flatten` and `x[...]` copy a tensor that they cannot view; None: unknown.
    `base` has its eager layout where `trace` tells it, else it is taken as contiguous.
    """
    if all(_views_any_layout(step, out) for step, out in chain):
        return True  # no need to know the layout (which, for a computed tensor, may depend on symbolic sizes)
    values = eager_chain(base, chain, trace)
    if values is None:
        return None
    last, before = values[-1], values[-2]
    viewed = same_memory(last, before)
    if trace is not None and base.ndim > 1 and eager_layout(base, trace, guard=False) is None:
        # `base`'s layout unknown (an op without an eager implementation, autograd): taken contiguous above; where
        # a column-major `base` answers otherwise, the layout decides (refused where a write makes it matter).
        shape = tuple(int(number_value(d)) for d in base.shape)
        with outside_inference_mode():
            start = torch.empty(shape[::-1], dtype=base.dtype, device="meta").permute(*reversed(range(len(shape))))
            other = _run_chain(start, chain)
        if other is not None and same_memory(other[-1], other[-2]) != viewed:
            step = chain[-1][0]
            raise LayoutDecidesView(
                f"{step.sym.id}{where(step.source)}: whether eager returns a view of {base.name} or a copy depends "
                "on its memory layout, which minijit does not know (made by an op without an eager implementation, "
                "or by autograd), and a write makes it matter; call it outside the jitted function, or make the "
                "layout known first (`.clone()`)")
    return viewed


def view_shares_memory(trace: Trace, base: TensorProxy, chain: list[tuple[BoundSymbol, Proxy]]) -> bool:
    """Whether the last step of `chain` (view steps from `base`, a tensor of `trace`) shares its viewed tensor's
    memory, as functionalization decides it: a view step (`is_view_step`) that eager does not make a copy.

    A `minijit.transforms.memory.ViewRule`: the memory model built with it knows which inputs a trace
    writes (`inputs_written`) as functionalizing the trace finds them.
    """
    step, out = chain[-1]
    if not is_view_step(step, out):
        return False
    if not step.sym.effects.may_copy or step.sym.is_prim:
        return True
    return eager_returns_view(base, chain, trace) is not False


def _views_any_layout(step: BoundSymbol, out: Proxy) -> bool:
    """Whether `step` makes `out` a view of the tensor it views for every layout that tensor may have.

    Asked of the op's declared `view_layouts`: any layout (`view` raises where it cannot), a
    basic key (ints, slices, None, Ellipsis: no tensor in it), or a new shape that only splits
    the viewed tensor's dimensions (`only_splits`).
    """
    layouts = step.sym.effects.view_layouts
    if layouts is None or not isinstance(out, TensorProxy):
        return False
    viewed = step.viewed_tensor()
    if layouts == VIEWS_ANY_LAYOUT:
        return True
    if layouts == VIEWS_IF_BASIC_KEY:
        return not any(isinstance(a, TensorProxy) and a is not viewed for a in tree_flatten((step.args, step.kwargs)))
    if layouts != VIEWS_IF_SPLITS or not isinstance(viewed, TensorProxy):
        return False
    return only_splits(tuple(viewed.shape), REQUESTED_SHAPE[step.sym](step, out))
