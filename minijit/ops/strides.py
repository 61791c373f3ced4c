"""Strides on proxies: a tensor's memory layout as eager torch would give it, worked out on demand.

Most of a trace does not depend on layout: the ops compute the same values whatever
the strides, and at run time the torch executor's calls give each output eager's
strides by themselves. A few results do depend on it — `view` raises where eager
cannot view, `reshape`/`contiguous`/`x[...]` copy or view as eager does, `as_strided`
reads the storage — and for those `eager_layout(p)` gives a meta tensor with `p`'s
eager shape, strides and storage offset:

- a trace input's layout is the real tensor's, noted when it became a proxy
  (`note_layout`);
- a computed tensor's comes from running the eager implementations of the ops that
  made it (ltorch ops and opaque torch ops) on meta tensors with their inputs'
  layouts, so every stride rule is torch's own (elementwise ops keeping a permuted
  layout, expand's zero strides, matmul's fresh outputs), the outputs of elementwise
  ops and a few others laid out as eager's C++ kernels do where their meta kernels
  differ (`minijit.ops.iterator_layouts`). The result is kept on the
  compile's layout table (`Trace.layouts`, `minijit.ir.layouts`), never on the proxy.

The layouts of the inputs a decision was worked out from become part of the cache
entry's guard, only then: `x.is_contiguous()` for an input that was contiguous, its
exact strides otherwise (and its storage offset where `as_strided` read it). A call
with differently strided inputs then misses instead of reusing a trace that would
view where eager raises, or write through a copy. An input that reaches the tensor
only through ops laying out a fresh output alike for any row-major input is an
order-only source (`_order_only_inputs`): the guard checks only `_row_major(x)`.

Symbolic sizes: strides follow them where torch's stride rules can be followed. A layout
query (`x.stride()`, a Python value the trace keeps) on a tensor whose sizes are symbolic
answers with expressions of the symbolic sizes (`minijit.ops.symbolic_strides`: the ops
that made the tensor replayed on fake tensors with symbolic sizes, each decision torch's
stride rules took on a size recorded as a constraint; the trace inputs' layouts it assumed,
contiguous for those with symbolic sizes, checked by the guard), and so does the choice
whether a `view` of a non-contiguous tensor is possible. `as_strided` then takes those
strides as arguments and has exactly the sizes asked for. Where that cannot be followed,
layouts are worked out from the sizes seen while tracing and the guard checks the sizes
too (`tuple(x.shape) == ...`): a layout query, functionalization's copy-or-view choice in
a trace that writes in place (`x[:, ::2].reshape(-1)` views only where x's last size is 1
or 2), and `view` of a non-contiguous tensor unless it only splits dimensions
(`q.split(C, -1)` then `view(B, T, nh, C // nh)` stays reusable across B and T).

A tensor made by something without an eager implementation (a prim recorded
directly, a value from inside a decomposition) has no known layout (None); the
decisions that need one then keep the layout-free behaviour (a view runs as a
reshape).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import MetaError, UnsupportedMethodError
from minijit.ir import TENSOR_METHODS, BoundSymbol, NumberProxy, Proxy, TensorProxy, Trace, tree_flatten, tree_map, tree_structure
from minijit.ir.context import add_layout_check, current_trace, where_now
from minijit.ir.layouts import (
    Layout,
    LayoutTable,
    contiguous_strides,
    guard_layout,
    guard_row_major,
    outside_inference_mode,
    row_major,
    same_memory,
)
from minijit.ir.proxies import guarded_compare, number_value, same_value
from minijit.ops.eager_facts import eager_impl
from minijit.ops.iterator_layouts import replay_layouts, results_as_tuple
from minijit.ops.symbolic_strides import symbolic_contiguous, symbolic_layout, symbolic_viewable


def known_layout(p: TensorProxy, trace: Trace | None = None) -> Layout | None:
    """`p`'s eager layout where `trace` (default: the one being recorded) knows it, else None."""
    trace = trace if trace is not None else current_trace()
    return trace.layouts.get(p) if trace is not None else None


def _sources(p: TensorProxy, trace: Trace, inputs: dict[int, TensorProxy]) -> tuple[TensorProxy, ...]:
    """The trace inputs `p`'s layout was worked out from."""
    if id(p) in inputs:
        return (p,)
    layout = trace.layouts.get(p)
    return layout.sources if layout is not None else ()


def note_layout(trace: Trace, p: TensorProxy, t: torch.Tensor) -> None:
    """Note the real tensor `t`'s strides and storage offset as the layout of its proxy `p` in `trace`
    (strided `t` only)."""
    if t.layout == torch.strided:
        trace.layouts.set(p, Layout(tuple(t.stride()), t.storage_offset(), conj=t.is_conj(), neg=t.is_neg(),
                                    address=t.data_ptr()))


def _sizes(p: TensorProxy) -> tuple[int, ...]:
    return tuple(int(number_value(d)) for d in p.shape)


def meta_like(p: TensorProxy, layout: Layout, requires_grad: bool = False) -> torch.Tensor:
    """A meta tensor with `p`'s shape and dtype and the `layout` known for it; a non-leaf with `requires_grad`."""
    shape = _sizes(p)
    strides, offset = layout.strides, layout.offset
    extent = offset + 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) if all(shape) else offset
    with outside_inference_mode():
        storage = torch.empty(extent, dtype=p.dtype, device="meta")
        if requires_grad:
            storage = storage.requires_grad_(True).clone()
        meta = storage.as_strided(shape, strides, offset)
        if layout.conj:
            torch._C._set_conj(meta, True)
        if layout.neg:
            torch._C._set_neg(meta, True)
        return meta


def eager_layout(p: TensorProxy, trace: Trace | None = None, *, offset_matters: bool = False,
                 guard: bool = True, sizes_matter: bool = False, flags_matter: bool = False,
                 strides_matter: bool = False) -> torch.Tensor | None:
    """A meta tensor with the shape, strides and storage offset eager torch gives `p`; None where unknown.

    `trace` (default: the one being recorded) holds the bound symbols that made `p`. With
    `guard`, the layouts of the trace inputs it was worked out from join the cache entry's
    guard (their storage offsets too with `offset_matters`, and their symbolic sizes with
    `sizes_matter`: a computed tensor's layout, and so a decision taken from it, may change
    with the sizes, as `x[:, ::2]`'s viewability with the parity of x's last size; their conjugate and
    negative view flags with `flags_matter`; the strides of their dims of size 1 with `strides_matter`, where
    the strides themselves are read: `guard_layout`).
    """
    trace = trace if trace is not None else current_trace()
    if trace is None:
        return None
    inputs = {id(a): a for a in trace.args if isinstance(a, TensorProxy)}
    if trace.layouts.get(p) is None:
        _work_out(p, trace, inputs)
    layout = trace.layouts.get(p)
    if layout is None:
        return None
    meta = meta_like(p, layout)
    if guard:
        for source in _sources(p, trace, inputs):
            guard_layout(source, trace, offset_matters, sizes_matter, flags_matter, strides_matter)
        for source in layout.order_only:
            if offset_matters or sizes_matter or flags_matter or strides_matter:
                guard_layout(source, trace, offset_matters, sizes_matter, flags_matter, strides_matter)
            else:
                guard_row_major(source)
    return meta


def _work_out(p: TensorProxy, trace: Trace, inputs: dict[int, TensorProxy]) -> None:
    """Note the layouts of `p` and the ancestors it needs in `trace`'s table, replaying their ops on meta
    tensors in trace order."""
    producers = trace.analysis("producers", _producers)
    needed: dict[int, BoundSymbol] = {}
    stack, seen = [p], set()
    while stack:
        q = stack.pop()
        if id(q) in seen or trace.layouts.get(q) is not None or id(q) in inputs:
            continue
        seen.add(id(q))
        found = producers.get(id(q))
        if found is None:
            continue  # made inside a decomposition, or by a pass: unknown
        needed[found[0]] = found[1]
        stack.extend(a for a in found[1].proxy_args() if isinstance(a, TensorProxy))
    for i in sorted(needed):
        _replay(needed[i], trace, inputs)


def _producers(trace: Trace) -> dict[int, tuple[int, BoundSymbol]]:
    """id of each proxy a top-level bound symbol of `trace` makes -> (the position of the first that makes it, it);
    cached on the trace (`Trace.analysis`): one walk answers every layout asked of the trace as it is."""
    producers: dict[int, tuple[int, BoundSymbol]] = {}
    for i, bsym in enumerate(trace.bound_symbols):
        for out in bsym.proxy_outputs():
            producers.setdefault(id(out), (i, bsym))
    return producers


def _replay(bsym: BoundSymbol, trace: Trace, inputs: dict[int, TensorProxy]) -> None:
    impl = eager_impl(bsym.sym)
    args = [a for a in bsym.proxy_args() if isinstance(a, TensorProxy)]
    layouts = trace.layouts
    if impl is None or any(layouts.get(a) is None for a in args):
        return
    if any(isinstance(a, Proxy) and not isinstance(a, TensorProxy | NumberProxy) for a in bsym.proxy_args()):
        return
    result = _run_on_meta(bsym, impl, layouts.get)
    outs = tree_flatten(bsym.output)
    if result is None and bsym.sym.effects.data_dependent:
        # Sizes only the data tells, which meta tensors cannot replay: the one result of such an op, where 1-d,
        # is a fresh tensor (`x[mask]` of a 1-d x, `masked_select`), laid out densely; others stay unknown
        # (`nonzero` is column-major, `torch.where(c)` gives views into it, a mask over a permuted tensor's first
        # dims keeps its order), and a decision that needs one is refused (`user_layout`).
        tensors = [out for out in outs if isinstance(out, TensorProxy)]
        if len(tensors) == 1 and tensors[0].ndim == 1 and layouts.get(tensors[0]) is None:
            layouts.set(tensors[0], Layout((1,), 0))
        return
    if result is None or len(result) != len(outs):
        return
    sources: dict[int, TensorProxy] = {}
    order_only: dict[int, TensorProxy] = {}
    for a in args:
        for source in _sources(a, trace, inputs):
            sources[id(source)] = source
        layout = layouts.get(a)
        if id(a) not in inputs and layout is not None:
            order_only.update((id(q), q) for q in layout.order_only)
    for key in _order_only_inputs(bsym, impl, args, trace, inputs, _facts(result)):
        order_only[key] = sources.pop(key)
    for key in sources:
        order_only.pop(key, None)
    for out, value in zip(outs, result, strict=True):
        if isinstance(out, TensorProxy) and isinstance(value, torch.Tensor) and layouts.get(out) is None \
                and tuple(value.shape) == _sizes(out):
            layouts.set(out, Layout(tuple(value.stride()), value.storage_offset(), tuple(sources.values()),
                                    tuple(order_only.values()), conj=value.is_conj(), neg=value.is_neg()))


def _run_on_meta(bsym: BoundSymbol, impl: Callable[..., Any],
                 layout_of: Callable[[TensorProxy], Layout | None]) -> list[Any] | None:
    """`bsym`'s eager implementation run on meta tensors laid out as `layout_of` says, its results flattened;
    None where it does not run on meta tensors.

    Where it raises on meta tensors and takes 0-dim tensors, it runs again with those as CPU tensors: an
    overload taking a Scalar reads a 0-dim tensor's value (`torch.clamp(x, 0, t)`), which a meta tensor has
    not; a CPU 0-dim tensor goes with tensors of any device, as in eager. Its value (zero) cannot change a
    result's layout, only sizes, which `_replay` compares; a result viewing it is refused (its offset would be
    the stand-in's).
    """
    for scalars_on_cpu in (False, True):
        metas: dict[int, torch.Tensor] = {}

        def to_meta(x: Any, scalars_on_cpu: bool = scalars_on_cpu, metas: dict[int, torch.Tensor] = metas) -> Any:
            if isinstance(x, TensorProxy):
                if scalars_on_cpu and x.ndim == 0:
                    return metas.setdefault(id(x), torch.zeros((), dtype=x.dtype))
                return metas.setdefault(id(x), meta_like(x, layout_of(x)))
            return number_value(x) if isinstance(x, NumberProxy) else x

        margs, mkwargs = tree_map(to_meta, (bsym.args, bsym.kwargs))
        margs = [torch.device("meta") if isinstance(a, torch.device) else a for a in margs]
        if not metas or "device" in mkwargs:
            # A factory (`torch.zeros(n, device=d)`) or a move (`x.to(device=d)`): nothing allocated on d.
            mkwargs["device"] = "meta"
        try:
            with outside_inference_mode(), torch.no_grad(), replay_layouts(bsym, impl):
                result = tree_flatten(results_as_tuple(impl(*margs, **mkwargs)))
        except Exception:
            # The eager implementation does not run on meta tensors: layout unknown, unless 0-dim ones were why.
            if scalars_on_cpu or not any(isinstance(a, TensorProxy) and a.ndim == 0 for a in bsym.proxy_args()):
                return None
            continue
        if scalars_on_cpu:
            stand_ins = {t.untyped_storage().data_ptr() for t in metas.values() if t.device.type == "cpu"}
            if any(isinstance(v, torch.Tensor) and v.device.type == "cpu"
                   and v.untyped_storage().data_ptr() in stand_ins for v in result):
                return None
        return result
    return None


def _facts(result: list[Any]) -> list[Any]:
    """What a replay's results say of their layouts: shape, strides, offset and view flags of each tensor."""
    return [(tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.is_conj(), v.is_neg())
            if isinstance(v, torch.Tensor) else None for v in result]


def _order_only_inputs(bsym: BoundSymbol, impl: Callable[..., Any], args: list[TensorProxy], trace: Trace,
                       inputs: dict[int, TensorProxy], expected: list[Any]) -> set[int]:
    """The trace inputs among `bsym`'s arguments whose exact strides its outputs' layouts do not depend on.

    Only for an op that makes fresh outputs (no view, no write), and an input taken directly whose layout is
    `row_major` and that is no source of another argument: the op is replayed with the input laid out
    contiguously, with gaps (the contiguous strides of each size + 1), with gaps and an inner stride of 2, and
    with its leading size-1 dims' strides doubled; where every output is laid out as with its real layout each
    time (alone, and with all such inputs together), the input's strides matter only as far as `row_major`.
    """
    effects = bsym.sym.effects
    if effects.views is not None or effects.writes or effects.unread or effects.result_into is not None:
        return set()
    layouts = trace.layouts
    elsewhere = {id(q) for a in args if id(a) not in inputs for q in _sources(a, trace, inputs)}
    candidates = {id(a): a for a in args if id(a) in inputs and id(a) not in elsewhere
                  and 0 not in _sizes(a) and row_major(_sizes(a), layouts.get(a).strides)}
    if not candidates:
        return set()
    first: dict[int, int] = {}  # a tensor argument -> the position of its first appearance in `args`
    for i, a in enumerate(args):
        first.setdefault(id(a), i)
    key = _replay_key(bsym, impl, first, candidates, layouts)
    if key is not None and (known := _ORDER_ONLY_SEEN.get(key)) is not None:
        return {id(args[i]) for i in known}
    loose = _loose_candidates(bsym, impl, candidates, layouts, expected)
    if key is not None:
        if len(_ORDER_ONLY_SEEN) >= _ORDER_ONLY_SEEN_MAX:
            _ORDER_ONLY_SEEN.clear()
        _ORDER_ONLY_SEEN[key] = tuple(first[k] for k in loose)
    return loose


# The answers of `_order_only_inputs` by what decides them (`_replay_key`): each takes up to 4 replays per
# candidate input, and a compile asks again for every layer alike, a process for every compile alike (a
# training step of identical blocks; an optimizer step over parameters of a few shapes).
_ORDER_ONLY_SEEN: dict[Any, tuple[int, ...]] = {}
_ORDER_ONLY_SEEN_MAX = 4096


def _replay_key(bsym: BoundSymbol, impl: Callable[..., Any], first: dict[int, int], candidates: dict[int, TensorProxy],
                layouts: LayoutTable) -> Any | None:
    """What the replays of `_order_only_inputs` depend on: the op and its eager implementation, each tensor
    argument's sizes, dtype, device, layout and whether it is a candidate (by the position of its first
    appearance, so that a tensor passed twice stays one tensor), the other arguments' types and values, whether
    the outputs require grad, and the default dtype; None where an argument has no hashable value."""
    parts: list[Any] = [bsym.sym, impl, any(isinstance(o, TensorProxy) and o.requires_grad for o in bsym.proxy_outputs()),
                        torch.get_default_dtype(), tree_structure((bsym.args, bsym.kwargs))]
    for x in tree_flatten((bsym.args, bsym.kwargs)):
        if isinstance(x, TensorProxy):
            layout = layouts.get(x)
            parts.append((first[id(x)], id(x) in candidates, _sizes(x), x.dtype, x.device, layout.strides,
                          layout.offset, layout.conj, layout.neg))
        elif isinstance(x, NumberProxy):
            parts.append((x.python_type, number_value(x)))
        elif isinstance(x, Proxy | torch.Tensor):  # (a tensor's == is not a truth value)
            return None
        else:
            parts.append((type(x), x))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:  # an unhashable argument: answered without the table
        return None
    return key


def _loose_candidates(bsym: BoundSymbol, impl: Callable[..., Any], candidates: dict[int, TensorProxy],
                      layouts: LayoutTable, expected: list[Any]) -> set[int]:
    """The `candidates` whose exact strides the outputs' layouts do not depend on, by replays (`_order_only_inputs`)."""

    def same(chosen: set[int], vary: Callable[[tuple[int, ...]], tuple[int, ...]]) -> bool:
        def layout_of(x: TensorProxy) -> Layout | None:
            real = layouts.get(x)
            if id(x) not in chosen or real is None:
                return real
            return Layout(vary(_sizes(x)), 0, conj=real.conj, neg=real.neg)

        found = _run_on_meta(bsym, impl, layout_of)
        return found is not None and _facts(found) == expected

    loose = {key for key in candidates if all(same({key}, vary) for vary in _VARIANTS)}
    if len(loose) > 1 and not all(same(loose, vary) for vary in _VARIANTS):
        return set()
    return loose


def _padded(sizes: tuple[int, ...]) -> tuple[int, ...]:
    return contiguous_strides(tuple(n + 1 for n in sizes))


def _leading_ones_doubled(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides = list(contiguous_strides(sizes))
    for k, n in enumerate(sizes):
        if n != 1:
            break
        strides[k] *= 2
    return tuple(strides)


# The row-major layouts an order-only input is tried with (see `_order_only_inputs`).
_VARIANTS: tuple[Callable[[tuple[int, ...]], tuple[int, ...]], ...] = (
    contiguous_strides, _padded, lambda sizes: tuple(2 * s for s in _padded(sizes)), _leading_ones_doubled)


def user_layout(p: TensorProxy, decides: str | None = None) -> torch.Tensor | None:
    """`p`'s eager layout when the op being recorded is one the user's code called, else None.

    Ops called by other ops' decompositions keep the layout-free behaviour: their
    eager counterparts handle layouts themselves. `decides`: what the layout decides for the user's call
    (`Tensor.contiguous`), refused where minijit does not know it (a guess would give a wrong result where
    eager's differs).
    """
    trace = current_trace()
    if trace is None or not trace.in_user_op:
        return None
    meta = eager_layout(p, trace)
    if meta is None and decides is not None:
        raise UnsupportedMethodError(
            f"Tensor.{decides}{where_now()}: minijit does not know the memory layout of {p.name} (made by an op "
            "without an eager implementation, or by autograd), which decides whether eager returns a view or a "
            "copy; call it outside the jitted function, or make the layout known first (`.clone()`)")
    return meta


def check_viewable(op: str, p: TensorProxy, shape: tuple[Any, ...], requested: tuple[Any, ...] | None = None) -> None:
    """Raise eager's error where `Tensor.view` cannot give `p` the `shape` without copying.

    `requested` is the shape as the user gave it (a -1 in it inferred as `shape` says). With
    symbolic sizes, a view of a non-contiguous tensor that does more than split its dimensions
    may be possible at some sizes only: the guard then checks the sizes too.
    """
    meta = user_layout(p)  # (unknown: a view, as eager's where it does not raise; no value depends on it)
    if meta is None:
        return
    try:
        meta.view(tuple(int(number_value(d)) for d in shape))
    except RuntimeError as e:
        text = str(e).strip().splitlines()[0]
        error = MetaError(f"Tensor.{op}: torch raised RuntimeError: {text}{where_now()}")
        error.eager_raised = type(e)  # type: ignore[attr-defined]
        raise error from e
    if _sizes_symbolic(p) and not only_splits(tuple(p.shape), requested if requested is not None else shape):
        hold_for_every_size(p, lambda trace: symbolic_viewable(p, trace, shape),
                            structural=meta.is_contiguous() and not _through_slices(p))


def reshape_copies(p: TensorProxy, shape: tuple[Any, ...]) -> bool | None:
    """Whether eager's `p.reshape(shape)`, called by the user's code, copies `p` rather than viewing it; None where
    `p`'s layout is unknown or a decomposition calls it. With symbolic sizes, the answer holds for every call the
    guard lets through (as `check_viewable`'s)."""
    meta = user_layout(p)
    if meta is None:
        return None
    viewed = same_memory(meta.reshape(tuple(int(number_value(d)) for d in shape)), meta)
    if _sizes_symbolic(p) and not only_splits(tuple(p.shape), shape):
        if viewed:
            hold_for_every_size(p, lambda trace: symbolic_viewable(p, trace, shape),
                                structural=meta.is_contiguous() and not _through_slices(p))
        else:
            eager_layout(p, sizes_matter=True)
    return not viewed


def is_already_contiguous(p: TensorProxy, memory_format: torch.memory_format,
                          decides: str | None = "contiguous") -> bool | None:
    """Whether `Tensor.contiguous(memory_format)` returns `p` itself in eager (None where `p`'s layout is unknown:
    a decomposition's call, or, where it `decides` nothing, an unknown layout). With symbolic sizes, the guard checks
    what the answer relied on."""
    meta = user_layout(p, decides)
    if meta is None:
        return None
    already = meta.is_contiguous(memory_format=memory_format)
    # Contiguous: maybe only at these sizes. Not contiguous, and not through a slice: not at any other size either
    # (a size of 1 only makes a layout more contiguous, its stride not counting), unless the layout is made at a
    # size of 1 otherwise than at 2, and contiguous there (a reshape that viewed at 1 copies at 2): the sizes
    # traced at 1 then stay 1, where torch's rules followed with symbolic sizes say so.
    if _sizes_symbolic(p) and (already or _through_slices(p)):
        hold_for_every_size(p, lambda trace: symbolic_contiguous(p, trace, memory_format) is already,
                            structural=not _through_slices(p))
    elif _sizes_symbolic(p):
        if _traced_ones(p) and symbolic_contiguous(p, current_trace(), memory_format):
            _keep_ones(p)
        # At a size of 1 it may be contiguous (`(x[:, ::2].transpose(0, 1) * 1)` at x's dim 1 of 2), and a size
        # traced at 2 or more may be 1 at another call, an input's or one computed from it.
        for d in p.shape:
            if isinstance(d, NumberProxy) and d.value > 1:
                guarded_compare(d, ">", 1)
    return already


def hold_for_every_size(p: TensorProxy, on_fakes: Callable[[Trace], bool], structural: bool) -> None:
    """Make a decision taken on `p`'s eager layout at the traced sizes hold for every call the guard lets through.

    `on_fakes(trace)` takes the decision again on fake tensors with symbolic sizes (`minijit.ops.symbolic_strides`,
    which records what it relied on) and says whether it is the same. `structural`: the layout's shape of
    strides (which dims are contiguous with which) decided it, the same at every size of 2 or more; sizes traced
    at 1 are then kept 1 (`_keep_ones`). Else the guard checks the sizes themselves.
    """
    trace = current_trace()
    if trace is None:
        return
    if _traced_ones(p) and on_fakes(trace):
        return  # decided for sizes traced at 1 and for sizes of 2 or more alike
    _keep_ones(p)
    if not structural and not on_fakes(trace):
        eager_layout(p, sizes_matter=True)


def _sizes_symbolic(p: TensorProxy) -> bool:
    """Whether `p`'s layout may change with symbolic sizes: its own, or those of the inputs it was worked out from."""
    return any(isinstance(d, NumberProxy) for q in (p, *_computed_from(p)) for d in q.shape)


def _computed_from(p: TensorProxy) -> tuple[TensorProxy, ...]:
    """The trace inputs `p`'s layout was worked out from (order-only ones too: their sizes may still matter), as
    the trace being recorded knows it."""
    layout = known_layout(p)
    return (*layout.sources, *layout.order_only) if layout is not None else ()


def _traced_ones(p: TensorProxy) -> bool:
    """Whether a symbolic size of `p` (or of the inputs its layout was worked out from) was traced at 1."""
    return any(isinstance(d, NumberProxy) and d.value == 1 for q in (p, *_computed_from(p)) for d in q.shape)


def _keep_ones(p: TensorProxy) -> None:
    """Guard `== 1` the symbolic sizes of `p` (and of the inputs its layout was worked out from) traced at 1.

    Contiguity ignores the stride of a size-1 dim, so a layout contiguous at size 1 may not be at other
    sizes (`gelu(x.transpose(1, 2))` with x's dim 1 of size 1): whether a view that merges dims is
    possible holds for the sizes it was traced at only.
    """
    for q in (p, *_computed_from(p)):
        for d in q.shape:
            if isinstance(d, NumberProxy) and d.value == 1:
                guarded_compare(d, "==", 1)


def _through_slices(p: TensorProxy) -> bool:
    """Whether `p` views a tensor through an op that may leave gaps (`x[:, :4]` is contiguous only
    where x's last size is 4): following `p` back through view ops to a tensor of its own memory."""
    trace = current_trace()
    producers = {id(out): b for b in trace.bound_symbols for out in b.proxy_outputs()} if trace is not None else {}
    q: Any = p
    while (bsym := producers.get(id(q))) is not None:
        base = bsym.viewed_argument(q)
        if base is None:
            return False
        # A view that only reshapes or reorders keeps its contiguity whatever the sizes (0, which
        # symbolic sizes keep constant, and 1, which `_keep_ones` guards, aside).
        if not bsym.sym.effects.reorders:
            return True
        q = base
    return False


def only_splits(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    """Whether `new` (which may hold one -1) only splits `old`'s dimensions, whatever the symbolic sizes are.

    Such a view is possible for any strides; merging dimensions depends on the strides, which
    may depend on the sizes. Groups are matched from both ends: a size kept (the same number
    or the same symbolic size), or a constant size split into constants of the same product.
    At most one dimension of `old` may be left between them, split into any sizes: the
    element counts agree (`infer_shape` raises, or with symbolic sizes guards, where they do
    not), so what is left of `new` multiplies to that dimension. Sizes 1 come and go freely.
    """
    if any(type(d) is int and d == 0 for d in old):
        return True  # an empty tensor views to any shape of its element count
    old = tuple(d for d in old if not (type(d) is int and d == 1))
    new = tuple(d for d in new if not (type(d) is int and d == 1))
    i, j = _matched(old, new)
    i2, _ = _matched(old[i:][::-1], new[j:][::-1])
    return len(old) - i - i2 <= 1


def _matched(old: tuple[Any, ...], new: tuple[Any, ...]) -> tuple[int, int]:
    """How many leading sizes of `old` and of `new` match group by group (kept, or a constant split into constants)."""
    i = j = 0
    while i < len(old) and j < len(new):
        d = old[i]
        if same_value(new[j], d):
            i, j = i + 1, j + 1
            continue
        if type(d) is not int:
            break
        product, end = 1, j
        while end < len(new) and type(new[end]) is int and new[end] > 0 and product < d:
            product *= new[end]
            end += 1
        if product != d:
            break
        i, j = i + 1, end
    return i, j


# -- the layout queries user code can make on a traced tensor ------------------------------------

def _known_layout(p: TensorProxy, what: str, offset_matters: bool = False, flags_matter: bool = False,
                  strides_matter: bool = False) -> torch.Tensor:
    # The answer is a Python value the trace keeps: with symbolic sizes it holds for these sizes only.
    meta = eager_layout(p, offset_matters=offset_matters, sizes_matter=True, flags_matter=flags_matter,
                        strides_matter=strides_matter)
    if meta is None:
        raise UnsupportedMethodError(f"Tensor.{what}{where_now()}: minijit does not know the memory layout of "
                                     f"{p.name} (made by an op without an eager implementation); call it outside "
                                     "the jitted function")
    return meta


def stride(p: TensorProxy, dim: int | None = None) -> Any:
    """Tensor.stride on a proxy: eager's strides (the trace then specialises on its inputs' layouts).

    With symbolic sizes, strides that follow them where torch's stride rules can be followed
    (`minijit.ops.symbolic_strides`); else the strides of the traced sizes, the guard checking the sizes.
    """
    followed = _symbolic_layout(p)
    if followed is not None:
        strides = followed[0]
        return strides if dim is None else strides[dim]
    meta = _known_layout(p, "stride", strides_matter=True)
    return meta.stride() if dim is None else meta.stride(dim)


def _symbolic_layout(p: TensorProxy) -> tuple[tuple[Any, ...], Any] | None:
    """`p`'s strides and storage offset as expressions of the symbolic sizes; None where its sizes and
    those of the inputs its layout comes from are all constant, or where they cannot be followed."""
    trace = current_trace()
    if trace is None or eager_layout(p, trace, guard=False) is None or not _sizes_symbolic(p):
        return None
    return symbolic_layout(p, trace)


def is_contiguous(p: TensorProxy, memory_format: torch.memory_format = torch.contiguous_format) -> bool:
    """Tensor.is_contiguous on a proxy, from its eager layout."""
    return _known_layout(p, "is_contiguous").is_contiguous(memory_format=memory_format)


def storage_offset(p: TensorProxy) -> int:
    """Tensor.storage_offset on a proxy, from its eager layout."""
    return _known_layout(p, "storage_offset", offset_matters=True).storage_offset()


def dim_order(p: TensorProxy, **kwargs: Any) -> tuple[int, ...]:
    """Tensor.dim_order on a proxy, from its eager layout."""
    return _known_layout(p, "dim_order", strides_matter=True).dim_order(**kwargs)  # (ties broken by strides)


def is_conj(p: TensorProxy) -> bool:
    """Tensor.is_conj on a proxy: whether eager's tensor is a lazily conjugated view (`x.conj()` of a complex x),
    from the view flags of the inputs it comes from, which the guard then checks."""
    return _known_layout(p, "is_conj", flags_matter=True).is_conj()


def is_neg(p: TensorProxy) -> bool:
    """Tensor.is_neg on a proxy: whether eager's tensor is a lazily negated view (`x.conj().imag`)."""
    return _known_layout(p, "is_neg", flags_matter=True).is_neg()


def data_ptr(p: TensorProxy) -> int:
    """Tensor.data_ptr on a trace input: its address, which the guard then checks (any use of the number,
    an alignment test or a comparison with another tensor's, holds only for that memory). A computed tensor's
    memory is only known when the trace runs: refused."""
    trace = current_trace()
    layout = known_layout(p, trace) if trace is not None else None
    if trace is None or layout is None or layout.address is None or all(a is not p for a in trace.args):
        raise UnsupportedMethodError(f"Tensor.data_ptr{where_now()}: {p.name} is computed by the trace, and its "
                                     "memory is only known when the trace runs; call data_ptr() on the function's "
                                     "input tensors, or outside the jitted function")
    add_layout_check(f"{p.name}.data_ptr() == {layout.address}")
    return layout.address


# The Tensor methods that read a traced tensor's layout.
LAYOUT_QUERIES = {"stride": stride, "is_contiguous": is_contiguous, "storage_offset": storage_offset,
                  "dim_order": dim_order, "is_conj": is_conj, "is_neg": is_neg, "data_ptr": data_ptr}
TENSOR_METHODS.update(LAYOUT_QUERIES)
