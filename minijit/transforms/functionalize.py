"""Functionalization: in-place ops become functional ops, and writes into inputs become copies at the end.

The captured trace records in-place ops (`x.add_(1)`, `x[0].zero_()`, `x.copy_(y)`)
with mutation semantics: the bound symbol's output is the mutated proxy itself,
and its decomposition ends with `prims.copy_(new_value, x)`. This pass rewrites
the trace so that (docs/design.md, invariant 1)

- every in-place op is replaced by its decomposition minus the copy (so `add_`
  becomes one `ltorch.add`), and later reads of the mutated tensor read the new
  value;
- a write into a view updates the view's base, through the inverse ("scatter") of
  each view op between them (minijit/transforms/view_updates.py); other views of
  that base read later are recomputed from the base's new value;
- each mutated trace input gets exactly one `prims.copy_to_out_(final, out=x)`,
  after everything else, ordered so that no copy overwrites an input whose old
  value a later copy reads; intermediates need no copy at all;
- the trace's output refers to final values.

State, per tensor of the captured trace: a *base* tensor has a current value and a
version (bumped by each write into it or into one of its views); a *view* caches its
current value together with the base version that value belongs to. What views what
(a view's parent, the view op that made it, the chain back to its base) is asked of
`MustShare` (minijit/transforms/memory.py), built on the captured trace's view graph,
not tracked here: it decides each view op as this pass reaches it (a `reshape` that
eager copies is a base of its own), and this pass tells it of the views it makes in
the new trace (a synthetic base's members, a setitem's region).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.errors import AliasError, InplaceError, UnsupportedOpError, where
from minijit.ir import BoundSymbol, Proxy, Tag, TensorProxy, Trace, tracing, tree_flatten, tree_map
from minijit.ir.proxies import same_shape, same_value
from minijit.ir.rewrite import replay_bsym
from minijit.ops import prims
from minijit.ops.opaque import opaque_call
from minijit.ops.registry import ALL_LTORCH
from minijit.ops.utils import expand_to, to_dtype
from minijit.transforms import memory
from minijit.transforms.memory import MustShare, ViewStep, memory_model
from minijit.transforms.overlap import check_overlaps
from minijit.transforms.view_updates import (
    ExpandedWrite,
    is_view_step,
    layout_free,
    replay,
    scatter,
    scatter_by_positions,
    view_shares_memory,
)

__all__ = ["FunctionalizeResult", "SyntheticBase", "functionalize"]


@dataclass(frozen=True)
class FunctionalizeResult:
    """What `functionalize` found besides the functional trace."""

    # The names of the trace inputs written in place, each now the target of one copy at the end
    # (in the order of the inputs); the runtime bumps their autograd version counters.
    mutated_inputs: tuple[str, ...] = ()
    # For each of `mutated_inputs`, the op and line of the first write into it (for the runtime's errors).
    write_sites: tuple[str, ...] = ()
    # In-place ops, as the value each wrote -> the value it read from the tensor it wrote (`x * k` -> `x`
    # for `x.mul_(k)`): eager's in-place op keeps its own copy of the latter for its backward.
    inplace_originals: Mapping[str, str] = field(default_factory=dict)
    # The mutated inputs written at least once with grad on (the others only under torch.no_grad()).
    written_with_grad: frozenset[str] = frozenset()
    # Names of the values this pass recorded again for ops the code ran under torch.no_grad() (`p.addcdiv_(...)`
    # reading an earlier write's value): constant for VJP as the values they stand for were.
    made_without_grad: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SyntheticBase:
    """Inputs (by position) that view one storage differently, at least one of them written.

    The functional trace takes one more input, the base: the 1-D view of the storage's
    first `length` elements. Each member is read as `as_strided(base, size, stride,
    storage_offset)` of it (its `layouts`, in member order), so that a write through
    any member updates the base and every later read of any member sees it.
    """

    members: tuple[int, ...]
    layouts: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]
    length: int


def functionalize(trace: Trace, *, input_aliases: Sequence[Sequence[int]] = (), grad_enabled: bool | None = None,
                  non_leaf_inputs: Sequence[int] = (), no_grad: Collection[str] = (),
                  synthetic_bases: Sequence[SyntheticBase] = ()) -> tuple[Trace, FunctionalizeResult]:
    """Replace in-place ops by functional ones; write each mutated input back once, at the end.

    `input_aliases` lists groups of input positions that are the same memory (the
    same tensor passed twice, or identical views); a write into one is seen by all,
    and the group gets one copy (the new trace's `input_alias_groups` names them).
    `grad_enabled` (default: torch's grad mode now) turns on eager's refusal to mutate
    a leaf that requires grad; inputs listed in `non_leaf_inputs` are not leaves and
    may be mutated, and so may any input through an op whose outputs are in `no_grad`
    (the values the code computed under `torch.no_grad()`, as capture recorded them).
    Each of `synthetic_bases` (inputs that overlap without being the same view) adds one
    input to the trace, the storage they share: writes through any member land in it, and
    it gets the group's one copy. `trace` is left as it is.

    Example::

        # def f(x): x.add_(1); return x * 2
        # t0 = ltorch.add(x, 1); t1 = ltorch.mul(t0, 2); prims.copy_to_out_(t0, out=x); return t1
        functional, result = functionalize(captured)  # result.mutated_inputs == ("x",)
    """
    if grad_enabled is None:
        grad_enabled = torch.is_grad_enabled()
    return _Functionalizer(trace, input_aliases, grad_enabled, set(non_leaf_inputs), no_grad, synthetic_bases).run()


class _Functionalizer:
    def __init__(self, trace: Trace, input_aliases: Sequence[Sequence[int]], grad_enabled: bool,
                 non_leaf_inputs: set[int], no_grad: Collection[str], synthetic_bases: Sequence[SyntheticBase] = ()):
        self.trace = trace
        self.new = trace.derive([], pass_name="functionalize")
        self.grad_enabled = grad_enabled
        # Outputs of ops recorded under torch.no_grad() inside the function (an in-place op's output is
        # the tensor it writes): eager lets those write into leaves that require grad.
        self.no_grad = no_grad
        self.constants: set[int] = set()  # ids of prims.tensor_constant outputs
        self.unwrapped: dict[int, TensorProxy] = {}  # id(no_grad_update output) -> the value written
        self.leaves = {id(p) for i, p in enumerate(trace.args)
                       if isinstance(p, TensorProxy) and p.requires_grad and i not in non_leaf_inputs}
        self.inputs = {id(p) for p in trace.args}
        self.position = 0  # that of the top-level op being visited
        self.value: dict[int, Any] = {}  # id(original proxy) -> current value (bases and non-tensors)
        self.version: dict[int, int] = {}  # id(base) -> number of writes so far
        self.cache: dict[int, tuple[int, TensorProxy]] = {}  # id(view) -> (base version, value)
        # id(a view of one of several tensors) -> (those tensors, their bases' versions when it was made, the op
        # that made it): a write into one of them, or into it, cannot be followed (`_check_unsure`).
        self.unsure: dict[int, tuple[tuple[TensorProxy, ...], tuple[int, ...], BoundSymbol]] = {}
        same_as: dict[int, TensorProxy] = {}  # id(aliased input) -> the input standing for its memory
        groups = []
        for group in input_aliases:
            members = [trace.args[i] for i in group]
            leader = members[0]
            for m in members[1:]:
                if not isinstance(m, TensorProxy) or not same_shape(m.shape, leader.shape) or m.dtype != leader.dtype:
                    raise AliasError(f"inputs {leader.name} and {m.name} share memory but are not the same view "
                                     "of it; minijit supports aliased inputs only when they are identical")
                same_as[id(m)] = leader
            groups.append([m.name for m in members])
        # (base input, its members, their layouts); the base leads its group of storage-sharing inputs.
        self.bases: list[tuple[TensorProxy, list[TensorProxy], SyntheticBase]] = []
        self.synthetic: set[int] = set()  # ids of the synthetic bases
        for synthetic in synthetic_bases:
            members = [trace.args[i] for i in synthetic.members]
            lead = members[0]
            with tracing(self.new):
                base = TensorProxy((synthetic.length,), lead.dtype, lead.device, False)
            self.new.add_input(base, f"{lead.name}_storage")
            self.inputs.add(id(base))
            self.synthetic.add(id(base))
            self.bases.append((base, members, synthetic))
            groups.append([base.name, *(m.name for m in members)])
        self.new.input_alias_groups = groups
        # What must share memory (memory.MustShare): the graph's views that eager makes views (a reshape it
        # copies is a base), decided as the walk reaches them, and the views this pass makes in the new trace
        # (each synthetic base's members, the region `a[key]` of a setitem). `same_memory`: the inputs the call
        # passed sharing memory (identical, or members of one synthetic base).
        same_memory = [[trace.args[i] for i in group]
                       for group in [*input_aliases, *(s.members for s in synthetic_bases)]]
        self.shares = MustShare(trace, view_shares_memory, same_memory, same_as)
        self.graph = self.shares.graph  # what may view what in the captured trace

    # -- values ----------------------------------------------------------------
    def resolve(self, p: Any) -> Any:
        """The current value of the captured trace's proxy `p` (recomputing a stale view)."""
        if not isinstance(p, Proxy):
            return p
        p = self.shares.canon(p)
        view = self.shares.step(p)
        if view is None:
            if id(p) in self.unsure:
                self._check_unsure(p)
            return self.value.get(id(p), p)
        version = self.version.get(id(self.shares.base_of(p)), 0)
        cached = self.cache.get(id(p))
        if cached is not None and cached[0] == version:
            return cached[1]
        value = replay(view.bsym, view.out, self.resolve(view.parent))
        self.cache[id(p)] = (version, value)
        return value

    def _check_unsure(self, p: TensorProxy, op: BoundSymbol | None = None) -> None:
        """Refuse a read of (or, with `op`, a write into) `p`, a view of one of several tensors (the view graph's
        `views_one_of`), once one of those was written: which memory `p` is, this pass cannot tell."""
        among, versions, bsym = self.unsure[id(p)]
        written = [t for t, v in zip(among, versions, strict=True)
                   if self.version.get(id(self.shares.base_of(self.shares.canon(t))), 0) != v]
        if op is None and not written:
            return
        what = f"{op.sym.id}{where(op.source)} writes into" if op is not None else \
            f"reading, after {written[0].name} was written in place,"
        raise UnsupportedOpError(
            f"{what} {p.name}, which {bsym.sym.id}{where(bsym.source)} returned as a view of one of "
            f"{', '.join(t.name for t in among)}; minijit cannot tell which, so cannot follow the write "
            "(clone() the views, or write before the call)")

    def write(self, dst: TensorProxy, new: TensorProxy, op: BoundSymbol) -> None:
        """Record that `dst` (a base or a view) now holds `new`, updating its base."""
        dst = self.shares.canon(dst)
        if id(dst) in self.unsure:
            self._check_unsure(dst, op)
        if new.dtype != dst.dtype:
            new = prims.convert_element_type(new, dst.dtype)
        base = self.shares.base_of(dst)
        if id(base) in self.constants:
            # A tensor from outside the call that minijit could not trace back to where it lives (made
            # natively, or reached through native code): the write could not be repeated on it.
            raise UnsupportedOpError(
                f"{op.sym.id}{where(op.source)} writes in place into {base.name}, a tensor the function did not "
                "receive and minijit could not trace back to where it lives outside the call; pass it as an "
                "argument, or read it from a global, closure or attribute")
        under_no_grad = self._recorded_without_grad(op) or self._through_detached(dst)
        if self.grad_enabled and id(base) in self.leaves and not under_no_grad:
            what = "a view of a leaf Variable" if base is not dst else "a leaf Variable"
            raise InplaceError(f"{op.sym.id}{where(op.source)}: {what} that requires grad is being used in an "
                               f"in-place operation (input {base.name}, as in eager); use torch.no_grad() or "
                               "write into a clone")
        if self.grad_enabled and base is not dst and not under_no_grad:
            self._check_view_for_grad(dst, op)
        if id(base) in self.inputs:
            self.write_sites.setdefault(base.name, f"{op.sym.name}{where(op.source)}")
            if not under_no_grad:
                self.written_with_grad.add(base.name)
        before = self.resolve(base) if under_no_grad and base.requires_grad else None
        moved = not self._computed_by_this_op(new)  # a value moved as it is (`a.copy_(w)`, `a[:] = w`)
        if moved and under_no_grad and self.grad_enabled and self._carries_grad(new):
            # Under no_grad eager's `a` gets w's values, not its history, so neither may the trace's (its output
            # would require grad, a backward would reach w).
            new = prims.detach(new)
        if moved and id(base) not in self.inputs:
            # Eager's `a` has memory of its own: where the trace returns, keeps or views it, it must not be w's.
            # (An input's value is copied back into it at the end.)
            new = prims.clone(new)
        if (dst is base and self.grad_enabled and not under_no_grad and not self._carries_grad(new)
                and self._carries_grad(old := self.resolve(base))):
            # A tensor that requires grad, written whole with a value that does not (`y.zero_()`, `y.fill_(2)`,
            # `y[:] = 1`, `y.copy_(c)`): eager's in-place op keeps it in the graph, its old value getting a zero
            # gradient. The new value is taken from the old one, so that it requires grad as eager's does and a
            # backward gives the tensors before it zeros, not None.
            new = prims.where(prims.full(new.shape, True, dtype=torch.bool, device=new.device), new, old)
        if id(base) in self.synthetic:
            # A synthetic base (its members may repeat elements, `o.expand(4, 4)`): one scatter
            # by element positions through the whole view chain.
            self._write_by_positions(dst, base, new, op)
        else:
            try:
                self._write_through_views(dst, new)
            except ExpandedWrite:
                # Through an expanded view (`x.expand(2, 3)[0].add_(1)`): scatter straight into
                # the base by element positions. The failed attempt recorded only functional,
                # unused bound symbols (dce drops them) and changed no state.
                self._write_by_positions(dst, base, new, op)
        if before is not None:
            # Written under no_grad: the input keeps its autograd identity (gradients still reach it).
            # Later reads see the wrapped value; the write-back at the end copies the plain one.
            written = self.value[id(base)]
            self.value[id(base)] = prims.no_grad_update(before, written)
            self.unwrapped[id(self.value[id(base)])] = written

    def _computed_by_this_op(self, value: TensorProxy) -> bool:
        """Whether `value` was computed by the op being visited (recorded since it began), not an earlier value."""
        return any(value is out for b in self.new.bound_symbols[self.op_start:] for out in b.proxy_outputs())

    def _carries_grad(self, value: TensorProxy) -> bool:
        """Whether `value` may carry autograd history: it requires grad and was not computed with grad off."""
        return value.requires_grad and value.name not in self.no_grad and value.name not in self.made_without_grad

    def _recorded_without_grad(self, op: BoundSymbol) -> bool:
        return _recorded_without_grad(op, self.no_grad)

    def _through_detached(self, dst: TensorProxy) -> bool:
        """Whether `dst` reaches its base through a detach (`w.detach()`, `w.data`): eager's autograd does not
        see a write through such an alias (F.embedding's max_norm renormalises `weight.detach()` in place), so it
        is a write without grad, whatever the grad mode."""
        return any(_stops_gradient(step) for step, _ in self.shares.chain(dst))

    def _check_view_for_grad(self, dst: TensorProxy, op: BoundSymbol) -> None:
        """Eager's refusals of an in-place op that needs grad on a view made by an op returning several
        views, by a custom Function (`Tag.FUNCTION_VIEW`), or under `torch.no_grad()` / `torch.inference_mode()`."""
        if not any(isinstance(a, TensorProxy) and a.requires_grad for a in op.proxy_args()):
            return
        for step, out in self.shares.chain(dst):
            if sum(isinstance(o, TensorProxy) for o in tree_flatten(step.output)) > 1:
                why = f"{step.sym.name} returned among several views (eager: such functions do not allow the output " \
                      "views to be modified inplace)"
            elif Tag.FUNCTION_VIEW in step.sym.tags:
                why = f"{step.sym.id} returned (eager: a view created inside a custom Function, BackwardHookFunction, " \
                      "is being modified inplace)"
            elif out.name in self.no_grad:
                why = f"{step.sym.name} made with grad off (eager: a view was created in no_grad mode and is being " \
                      "modified inplace with grad mode enabled)"
            else:
                continue
            raise InplaceError(f"{op.sym.id}{where(op.source)}: writes in place, with grad, into a view that {why}; "
                               "use the out-of-place op, or clone() the view")

    def _write_by_positions(self, dst: TensorProxy, base: TensorProxy, new: TensorProxy, op: BoundSymbol) -> None:
        masked_fill = None
        if Tag.MASKED_FILL in op.sym.tags and len(op.args) == 3 and isinstance(op.args[1], TensorProxy):
            masked_fill = (self.resolve(op.args[1]), self.resolve(op.args[2]))
        self._write_through_views(base, scatter_by_positions(self.resolve(base), self.shares.chain(dst), new, op,
                                                             uniform=self._is_fill(new), masked_fill=masked_fill))
        if base is not dst and masked_fill is None:
            # (A masked fill's view reads again from the base: a position whose mask was False
            # shows the value where another position on its element was masked.)
            self.cache[id(dst)] = (self.version[id(base)], new)

    def _write_through_views(self, dst: TensorProxy, new: TensorProxy) -> None:
        view = self.shares.step(dst)
        if view is None:
            self.value[id(dst)] = self._laid_out_as(dst, new)
            self.version[id(dst)] = self.version.get(id(dst), 0) + 1
            return
        parent = self.shares.canon(view.parent)
        self._write_through_views(parent, scatter(view.bsym, view.out, self.resolve(parent), new))
        self.cache[id(dst)] = (self.version[id(self.shares.base_of(dst))], new)

    def _laid_out_as(self, base: TensorProxy, new: TensorProxy) -> TensorProxy:
        """`new`, the written base's new value, copied into the layout of the base's value before the write (eager
        writes in place: the base keeps its strides), where an op reads memory computed from the base
        (`as_strided`): the ops recorded on it again then lay out their results as eager's did, size-1 dims
        included, which broadcasting carries into the others. (A rebuilt value has the layout its scatter gave
        it.) `aten.copy` copies into its first argument's exact strides, symbolic sizes too. Not for an input (its
        value before the write is the caller's tensor) nor where gradients flow (`aten.copy` has no derivative)."""
        if id(base) not in memory.layout_read(self.trace) or id(base) in self.inputs \
                or (self.grad_enabled and (new.requires_grad or base.requires_grad)):
            return new
        return opaque_call(torch.ops.aten.copy.default, (self.value.get(id(base), base), new), {})

    def _is_fill(self, value: TensorProxy) -> bool:
        """Whether `value` was made by prims.full (one value everywhere)."""
        for bsym in reversed(self.new.bound_symbols):
            if any(o is value for o in bsym.proxy_outputs()):
                return bsym.sym is prims.full
        return False

    # -- bound symbols -----------------------------------------------------------
    def visit(self, bsym: BoundSymbol, top: BoundSymbol) -> None:
        name = bsym.sym.id
        if bsym.sym.effects.copies:
            (target,) = bsym.written()
            self.write(target, self.resolve(bsym.copied_value()), top)
        elif Tag.INDEXED_WRITE in bsym.sym.tags and _is_basic_key(bsym.args[1]) and self.setitem_into_view(bsym, top):
            pass
        elif bsym.written():
            if not bsym.subsymbols:
                raise UnsupportedOpError(f"{name}{where(bsym.source)}: an in-place op without a decomposition "
                                         "cannot be functionalized")
            before = [self.resolve(t) for t in bsym.written()]
            for sub in bsym.subsymbols:
                self.visit(sub, top)
            for t, old_value in zip(bsym.written(), before, strict=True):
                new_value = self.resolve(t)
                if isinstance(new_value, Proxy) and isinstance(old_value, Proxy) and new_value is not old_value:
                    self.inplace_originals[new_value.name] = old_value.name
            for old in tree_flatten(bsym.output):
                if isinstance(old, Proxy) and id(old) not in self.value and not self._known(old):
                    raise UnsupportedOpError(f"{name}{where(bsym.source)}: its output {old.name} is not "
                                             "computed by its decomposition")
        else:
            if bsym.sym is prims.tensor_constant:
                self.constants.add(id(bsym.output))
            self.emit(bsym)

    def setitem_into_view(self, bsym: BoundSymbol, top: BoundSymbol) -> bool:
        """`a[key] = value` with ints, slices, None and Ellipsis: a write into the view a[key].

        Writing only the region (one slice_scatter, in place into an input where allowed)
        beats the decomposition's update of the whole tensor, and works through expanded
        views. Returns False (use the decomposition) where the value does not fit.
        """
        a, key, value = bsym.args
        getitem = ALL_LTORCH.get("getitem")
        if getitem is None or not isinstance(a, TensorProxy):
            return False
        a = self.shares.canon(a)
        value = self.resolve(value)
        if isinstance(value, TensorProxy):
            while value.ndim > 0 and same_value(value.shape[0], 1) and value.ndim > len(a.shape):
                value = prims.reshape(value, tuple(value.shape[1:]))
        a_now = self.resolve(a)  # may record a replay: before counting the region's bound symbol
        count = len(self.new.bound_symbols)
        region = getitem(a_now, key)
        if isinstance(value, TensorProxy):
            if value.ndim > region.ndim or any(not same_value(v, 1) and not same_value(v, r)
                                               for v, r in zip(reversed(value.shape), reversed(region.shape))):
                return False
            new = expand_to(to_dtype(value, a.dtype), region.shape)
        else:
            new = prims.full(region.shape, value, dtype=a.dtype, device=a.device)
        if len(self.new.bound_symbols) == count or region is a_now:
            self.write(a, new, top)  # the key selects all of a
            return True
        # The getitem's bound symbol (arithmetic on symbolic sizes may have been recorded before it).
        view_bsym = next(b for b in self.new.bound_symbols[count:] if any(o is region for o in b.proxy_outputs()))
        self.shares.add_view(region, ViewStep(a, view_bsym, region))
        self.cache[id(region)] = (self.version.get(id(self.shares.base_of(a)), 0), region)
        self.write(region, new, top)
        return True

    def _known(self, p: Proxy) -> bool:
        return id(p) in self.inputs or id(p) in self.value or id(p) in self.produced

    def emit(self, bsym: BoundSymbol) -> None:
        """Append `bsym` reading current values: as it is, or recorded again where an argument changed."""
        # An op the code ran under torch.no_grad() is recorded again with grad off, as captured: a torch op's
        # meta run asks autograd (an `out=` op refuses arguments that require grad only with grad on).
        with torch.no_grad() if self._recorded_without_grad(bsym) else contextlib.nullcontext():
            result = replay_bsym(bsym, self.resolve, sym=layout_free(bsym.sym), reuse_unchanged=True)
        parent = bsym.viewed_tensor()
        is_view = parent is not None and bsym.is_view()
        for old, new in zip(tree_flatten(bsym.output), tree_flatten(result), strict=True):
            if not isinstance(old, Proxy):
                continue
            if new is not old and old.name in self.no_grad and isinstance(new, Proxy):
                self.made_without_grad.add(new.name)
            self.produced.add(id(old))
            among = self.graph.views_one_of(old)
            if among:
                versions = tuple(self.version.get(id(self.shares.base_of(self.shares.canon(t))), 0) for t in among)
                self.unsure[id(old)] = (among, versions, bsym)
            if is_view and isinstance(old, TensorProxy) and is_view_step(bsym, old) and \
                    self.shares.decide(parent, bsym, old, self.position):
                self.cache[id(old)] = (self.version.get(id(self.shares.base_of(self.shares.canon(parent))), 0), new)
            elif new is not old:
                self.value[id(old)] = new

    # -- the pass ------------------------------------------------------------------
    def run(self) -> tuple[Trace, FunctionalizeResult]:
        self.produced: set[int] = set()
        self.write_sites: dict[str, str] = {}
        self.inplace_originals: dict[str, str] = {}
        self.written_with_grad: set[str] = set()
        self.made_without_grad: set[str] = set()
        self.op_start = 0  # where the bound symbols of the top-level op being visited begin in the new trace
        with tracing(self.new):
            self._members_as_views()
            for position, bsym in enumerate(self.trace.bound_symbols):
                self.position = position
                self.op_start = len(self.new.bound_symbols)
                self.new.source = bsym.source
                if bsym.written():
                    # Before the write: eager refuses (or computes in its own order) what reads memory it writes.
                    check_overlaps(bsym, self.trace, lambda p: self.shares.base_of(self.shares.canon(p)))
                self.visit(bsym, bsym)
            self.new.source = None
            output = tree_map(self.resolve, self.trace.output)
            self.new.output = self._write_back(output, [self.shares.base_of(self.shares.canon(p)).name
                                                        if isinstance(p, TensorProxy) else None
                                                        for p in tree_flatten(self.trace.output)])
        sites = tuple(self.write_sites.get(n, "") for n in self.mutated)
        return self.new, FunctionalizeResult(mutated_inputs=tuple(self.mutated), write_sites=sites,
                                             inplace_originals=self.inplace_originals,
                                             written_with_grad=frozenset(self.written_with_grad),
                                             made_without_grad=frozenset(self.made_without_grad))

    def _members_as_views(self) -> None:
        """Each member of a synthetic base becomes a view of it; it reads as the input itself until written."""
        for base, members, synthetic in self.bases:
            for member, (size, stride, offset) in zip(members, synthetic.layouts, strict=True):
                # Offsets are absolute in the storage, and every value of the base starts at its
                # storage's first element (the input is the storage's prefix; scatters are fresh).
                view = opaque_call(torch.as_strided, (base, size, stride, offset), {})
                self.shares.add_view(member, ViewStep(base, self.new.bound_symbols[-1], view))
                self.cache[id(member)] = (0, member)

    def _write_back(self, output: Any, bases: list[str | None]) -> Any:
        """Materialize outputs that alias overwritten inputs, or that view one (`bases`: the base of each output
        in the captured trace) as another input's memory, then emit one ordered copy per mutated input."""
        finals: dict[str, TensorProxy] = {}
        outs: dict[str, TensorProxy] = {}
        for p in self.new.args:
            if id(p) in self.shares.same_as or self.version.get(id(p), 0) == 0:
                continue
            final = self.resolve(p)
            final = self.unwrapped.get(id(final), final)
            if final is not p:
                finals[p.name], outs[p.name] = final, p
        self.mutated = list(finals)
        if not finals:
            return output
        memory = memory_model(self.new)
        written = set(finals)

        clones: dict[int, TensorProxy] = {}

        def materialize(x: Any, base: str | None = None) -> Any:
            storages = memory.input_storages(x) if isinstance(x, TensorProxy) else set()
            # (`a.copy_(w); return a[:2]`: the value is w's memory as w came in, where eager's result views a)
            if storages & written or (base in written and storages and base not in storages):
                if id(x) not in clones:
                    clones[id(x)] = prims.clone(x)
                return clones[id(x)]
            return x

        base_of_output = iter(bases)
        output = tree_map(lambda x: materialize(x, next(base_of_output)), output)
        # A copy into y must follow every copy whose value reads y's old value (invariant 1);
        # a value that aliases its own destination, or a cycle of such reads, is cloned first.
        reads = {n: set(memory.input_storages(v) & written) for n, v in finals.items()}
        for n in finals:
            if n in reads[n]:
                finals[n] = materialize(finals[n])
                reads[n] = set()
        pending = list(finals)
        while pending:
            ready = [n for n in pending if not any(n in reads[m] for m in pending if m != n)]
            if not ready:
                stuck = pending[0]
                finals[stuck] = materialize(finals[stuck])
                reads[stuck] = set()
                continue
            for n in ready:
                prims.copy_to_out_(finals[n], out=outs[n])
                pending.remove(n)
        return output


def _is_basic_key(key: Any) -> bool:
    """Whether an index is made of ints, slices, None and Ellipsis only (basic indexing: a view)."""
    items = key if isinstance(key, tuple) else (key,)
    return all(type(k) is int or k is None or k is Ellipsis or
               (type(k) is slice and all(type(v) is int or v is None for v in (k.start, k.stop, k.step)))
               for k in items)


def _recorded_without_grad(op: BoundSymbol, no_grad: Collection[str]) -> bool:
    """Whether the user's code ran `op` under `torch.no_grad()` (or inference mode), by `no_grad`, the names the
    capture recorded then.

    An in-place op's output is the tensor it writes, which may have been made with grad
    off while the op itself runs with grad on: what its decomposition computed tells.
    """
    own = {p.name for p in op.proxy_outputs()}
    fresh = [p.name for sub in op.subsymbols for p in sub.proxy_outputs() if p.name not in own]
    # An op with no outputs of its own (a fused optimizer step) tells by the tensors it writes.
    return any(n in no_grad for n in (fresh or own or [p.name for p in op.written()]))


def _stops_gradient(bsym: BoundSymbol) -> bool:
    """Whether `bsym` (a view step) cuts its output from autograd, itself or in its decomposition (`detach`)."""
    return Tag.STOPS_GRADIENT in bsym.sym.tags or any(_stops_gradient(sub) for sub in bsym.subsymbols)
