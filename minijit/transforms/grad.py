"""Grad: split a trace into a forward trace that saves residuals and a backward trace that uses them.

`split_forward_backward` walks the trace's bound symbols in order, keeping track of
which proxies require grad (the inputs that do, then the outputs of every symbol
that is not constant for VJP):

- a symbol that is constant for VJP (`is_constant_for_vjp`) is kept as it is in the
  forward and adds nothing to the backward (docs/design.md, invariant 4);
- a symbol with a VJP rule (`minijit.transforms.vjp`) runs the rule's forward, which
  records the symbol again and names its residuals; the backward later calls the
  rule's backward on those residuals, so a high-level op (`ltorch.linear`) stays one
  bound symbol in the forward and gets a compact backward;
- a symbol without a rule is differentiated through its subsymbols (its decomposition);
- a prim without a rule is an error naming the op and the user's source line.

Residuals are kept per bound symbol (with all of its outputs), never keyed by one
output, so multi-output symbols (`var_mean`, `shape`, `max` with indices) are safe.
The backward trace takes the saved residuals and one cotangent per differentiable
output and returns one gradient per forward input (None where there is none); only
the residuals the backward actually reads are saved.

Both traces are new by design, built in order as the walk goes (the forward from the
kept bound symbols and what each rule's forward records, `record` of minijit/ir/rewrite.py;
the backward recorded from the rules' backwards); the edits after that (clones before the
writes into inputs, sizes bound at the top, recomputed residuals, `del`s) go through `Edits`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minijit.errors import MinijitError, UnsupportedOpError, where
from minijit.ir import BoundSymbol, NumberProxy, Proxy, Symbol, Tag, TensorProxy, Trace, tracing, tree_flatten
from minijit.ir.printing import Constants
from minijit.ir.proxies import rule_same_shape
from minijit.ir.rewrite import Edits, ProxyMap, record
from minijit.ir.symbol import SourceLocation
from minijit.ops import aten_prims, prims
from minijit.ops.eager_facts import eager_impl
from minijit.ops.opaque import OPAQUE
from minijit.transforms.dce import dce
from minijit.transforms.memory import layout_read, memory_model
from minijit.transforms.vjp import KeywordGrads, VjpRule, rule_for
from minijit.transforms.vjp.opaque import eager_autograd_rule


def is_differentiable(x: Any) -> bool:
    """True for tensor proxies of a floating point or complex dtype."""
    return isinstance(x, TensorProxy) and (x.dtype.is_floating_point or x.dtype.is_complex)


def is_constant_for_vjp(bsym: BoundSymbol, requires_grad: Container[str], no_grad: Container[str] = ()) -> bool:
    """True when `bsym` contributes nothing to any gradient.

    That is when none of its outputs is a differentiable tensor (`prims.shape`
    returns ints, `argmax` int64, comparisons bool), when none of its tensor
    inputs is in `requires_grad` (the names of proxies that require grad),
    when it stops gradients (`prims.detach`) or is a random prim whose outputs do
    not require grad (`rand_like(x)`), or when it was recorded under
    `torch.no_grad()` (its outputs are in `no_grad`). Constant symbols stay in
    the forward and add nothing to the backward.
    """
    if Tag.STOPS_GRADIENT in bsym.sym.tags:
        return True
    if bsym.sym.is_prim and bsym.sym.effects.random and not any(
            isinstance(p, TensorProxy) and p.requires_grad for p in bsym.proxy_outputs()):
        return True  # fresh random numbers (a tensor argument only gives them a size and layout)
    if no_grad and any(p.name in no_grad for p in bsym.proxy_outputs()):
        return True
    if not any(is_differentiable(p) for p in bsym.proxy_outputs()):
        return True
    return not any(isinstance(p, TensorProxy) and p.name in requires_grad for p in bsym.proxy_args())


@dataclass
class _TapeEntry:
    """What the backward needs of one differentiated bound symbol."""

    rule: VjpRule
    bsym: BoundSymbol
    args: tuple[Any, ...]
    saved: Any
    kwargs: dict[str, Any]


_SIGNATURES: dict[Callable[..., Any], inspect.Signature | None] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    if fn not in _SIGNATURES:
        try:
            _SIGNATURES[fn] = inspect.signature(fn)
        except (TypeError, ValueError):
            _SIGNATURES[fn] = None
    return _SIGNATURES[fn]


def _bind(bsym: BoundSymbol, rule: VjpRule) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The bound symbol's arguments in the order of its signature, defaults filled in.

    A rule's parameters are its symbol's (checked when it is registered:
    `minijit.transforms.vjp.registry.check_rule_signature`). None when the call does
    not bind (then its decomposition is differentiated instead, which is always correct).
    """
    sig = _signature(bsym.sym.meta) if bsym.sym.meta is not None else None
    if sig is None:
        return bsym.args, bsym.kwargs
    try:
        bound = sig.bind(*bsym.args, **bsym.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return tuple(bound.args), dict(bound.kwargs)


@dataclass(frozen=True)
class SplitResult:
    """What `split_forward_backward` tells the runtime about the forward and backward it made."""

    # Positions among the output leaves that get a cotangent in the backward.
    differentiable_outputs: tuple[int, ...]
    # Positions of the inputs that require grad and are written in place: the forward returns
    # each one's new value too, and the backward takes a cotangent for it (ctx.mark_dirty).
    dirty_inputs: tuple[int, ...]
    # Names of saved values the forward overwrites: saved as None, so a backward needing one raises.
    overwritten_saved: tuple[str, ...]
    # (position among the saved values, input position) of each saved value that is an input requiring grad:
    # it carries its own history to a double backward. None where the saved values cannot all carry theirs
    # (the hidden outputs below do not close: a double backward then recomputes from the inputs).
    saved_inputs_with_history: tuple[tuple[int, int], ...] | None = None
    # How many saved values (a prefix) the backward takes; the others only `second_backward` reads.
    first_order_saved: int = 0
    # Positions among the saved values of those computed from inputs requiring grad (not outputs): the autograd
    # node returns them as hidden outputs, so they carry history through it to a double backward.
    hidden_saved: tuple[int, ...] = ()
    # The backward taking a cotangent for each hidden output (instead of the outputs'), on the saved values at
    # `second_saved`: what the node runs when a double backward differentiates a hidden output. None: no hidden.
    second_backward: Trace | None = None
    second_saved: tuple[int, ...] = ()


class _Splitter:
    """The state of one forward/backward split."""

    def __init__(self, trace: Trace, executors: Sequence[Any], no_grad: Collection[str],
                 written_with_grad: Collection[str] | None = None):
        self.trace = trace
        self.written_with_grad = written_with_grad
        self.executors = executors
        self.requires = {p.name for p in trace.args if is_differentiable(p) and p.requires_grad}
        self.inputs_requiring = set(self.requires)
        self.no_grad = no_grad
        # The forward's bound symbols, in order (`split_forward_backward` makes the trace of them), and the
        # source location of the last one a VJP rule recorded (where later recorded ones are placed).
        self.fwd: list[BoundSymbol] = []
        self.source: SourceLocation | None = None
        self.tape: list[_TapeEntry] = []
        # (input requiring grad, its new value) for each write-back into such an input
        self.dirty: list[tuple[TensorProxy, Any]] = []
        # Values a VJP rule's forward computed from values requiring grad on the way to its op's outputs (the
        # log_softmax inside cross_entropy's rule): off the tape, so no backward differentiates them
        self.intermediates: set[str] = set()

    # -- forward ------------------------------------------------------------------------------
    def forward(self, bsym: BoundSymbol) -> None:
        if is_constant_for_vjp(bsym, self.requires, self.no_grad):
            self.fwd.append(bsym)
            return
        if bsym.written():
            self._inplace(bsym)
            return
        complex_value = None if OPAQUE in bsym.sym.tags else next(
            (p for p in (*bsym.proxy_outputs(), *(a for a in bsym.proxy_args() if a.name in self.requires))
             if isinstance(p, TensorProxy) and p.dtype.is_complex), None)
        if complex_value is not None:
            # minijit's rules are written for real values (no conjugates): an op on complex values is differentiated
            # by torch's autograd over its eager implementation, as an opaque torch op is.
            eager = eager_impl(bsym.sym)
            if eager is None:
                raise UnsupportedOpError(
                    f"cannot differentiate {bsym.sym.id}{where(bsym.source)}: its value {complex_value.name} is "
                    "complex, and it has no torch implementation for torch's autograd to differentiate; compute it "
                    "under torch.no_grad() or outside the jitted function")
            # The arguments as recorded, which the eager callable takes as they are (no defaults filled in).
            if self._apply_rule(bsym, eager_autograd_rule(bsym.sym, eager), bsym.args, bsym.kwargs):
                return
        if self._layout_read(bsym):
            return
        rule = self._executor_rule(bsym) or rule_for(bsym.sym)
        bound = _bind(bsym, rule) if rule is not None else None
        if rule is not None and bound is not None and self._apply_rule(bsym, rule, *bound):
            return
        if bsym.subsymbols:
            for sub in bsym.subsymbols:
                self.forward(sub)
            return
        raise UnsupportedOpError(
            f"cannot differentiate {bsym.sym.id}{where(bsym.source)}: it has no VJP rule and no decomposition; "
            "compute it under torch.no_grad() or outside the jitted function"
        )

    def _executor_rule(self, bsym: BoundSymbol) -> VjpRule | None:
        """The VJP rule of the executor that will run `bsym`, if it has its own for this call (`Executor.grad_rule_for`)."""
        for ex in self.executors:
            if ex.implementation_for(bsym) is not None:
                return ex.grad_rule_for(bsym)  # None: the executor runs it with the symbol's own rule
        return None

    def _inplace(self, bsym: BoundSymbol) -> None:
        # After functionalization the only writes left copy final values into inputs, at the
        # end; they are side effects kept in the forward, and gradients follow the values.
        # A write into an input that requires grad (functionalize refused leaves) makes its
        # new value one more output of the jitted call: autograd rebases the input's history
        # onto it (ctx.mark_dirty in minijit/runtime/autograd.py), as eager in-place ops do.
        # A write into an intermediate tensor (an unfunctionalized trace, whose later reads
        # would see the wrong value) is refused.
        inputs = {p.name for p in self.trace.args}
        for p in tree_flatten(bsym.output):
            if not isinstance(p, TensorProxy):
                continue
            if p.name in self.inputs_requiring and self.written_with_grad is not None \
                    and p.name not in self.written_with_grad:
                pass  # written under torch.no_grad() only: a side effect, the input keeps its history
            elif p.name in self.inputs_requiring:
                if not bsym.sym.effects.copies:
                    raise MinijitError(
                        f"{bsym.sym.id}{where(bsym.source)} writes in place into {p.name}, an input that requires "
                        "grad, outside the write-backs of the functionalize pass"
                    )
                self.dirty.append((p, bsym.copied_value()))
            elif p.name in inputs and self._takes_history(p, bsym):
                # An input that does not require grad, written with a value that does: in eager the input
                # takes the value's history (`buf.copy_(x.sum(0))` makes buf require grad); so here.
                self.dirty.append((p, bsym.copied_value()))
            elif p.name not in inputs:
                raise MinijitError(
                    f"{bsym.sym.id}{where(bsym.source)} writes in place into the intermediate tensor {p.name}, which "
                    "depends on inputs that require grad; differentiating it needs the functionalize pass, so use "
                    "the out-of-place op instead"
                )
        self.fwd.append(bsym)

    def _layout_read(self, bsym: BoundSymbol) -> bool:
        """Differentiate `bsym` by torch's autograd over its eager callable where an op reads the layout of a result
        (`as_strided`): its decomposition's prims lay results out otherwise than eager's op (`flip`, `masked_fill`).
        Ops that may return views or their input (`contiguous`, `reshape`) keep their rules. Whether it did."""
        if OPAQUE in bsym.sym.tags or bsym.sym.effects.views is not None \
                or not any(id(p) in layout_read(self.trace) for p in bsym.proxy_outputs()):
            return False
        eager = eager_impl(bsym.sym)
        return eager is not None and self._apply_rule(bsym, eager_autograd_rule(bsym.sym, eager), bsym.args,
                                                      bsym.kwargs)

    def _takes_history(self, p: TensorProxy, bsym: BoundSymbol) -> bool:
        """Whether the write-back `bsym` into input `p` (not requiring grad) gives it a value requiring grad."""
        if not bsym.sym.effects.copies or not is_differentiable(p):
            return False
        if self.written_with_grad is not None and p.name not in self.written_with_grad:
            return False  # written under torch.no_grad() only
        value = bsym.copied_value()
        return isinstance(value, TensorProxy) and is_differentiable(value) and value.name in self.requires

    def _apply_rule(self, bsym: BoundSymbol, rule: VjpRule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        self.source = bsym.source
        result, recorded = record(self.trace, rule.forward, args, kwargs, source=bsym.source)
        if result is NotImplemented:
            return False
        out, saved = result
        # The rule recorded the symbol again with fresh output proxies; give them the
        # original ones, which the rest of the trace refers to.
        new_leaves, old_leaves = tree_flatten(out), tree_flatten(bsym.output)
        if len(new_leaves) != len(old_leaves):
            raise MinijitError(f"the VJP rule of {bsym.sym.id} returned {len(new_leaves)} outputs, expected {len(old_leaves)}")
        rename = ProxyMap()
        rename.bind(new_leaves, old_leaves, keep=bsym.proxy_args())
        # Where the rule recorded the symbol itself, keep the original bound symbol: it has
        # the user's argument form (keywords stay keywords), which executors call as is.
        renamed = list(map(rename.bsym, recorded))
        self.fwd.extend(bsym if b.sym is bsym.sym and b.output is bsym.output else b for b in renamed)
        self.intermediates |= _intermediates(renamed, {p.name for p in bsym.proxy_outputs()}, self.requires)
        saved = rename(saved)
        self.tape.append(_TapeEntry(rule, bsym, args, saved, kwargs))
        # An opaque op's outputs require grad as torch's autograd says on its meta run: the new running statistics
        # `aten._native_batch_norm_legit` computes do not, and written back into a buffer they leave it without
        # history, as eager does.
        opaque = OPAQUE in bsym.sym.tags
        self.requires.update(p.name for p in bsym.proxy_outputs() if is_differentiable(p) and (p.requires_grad or not opaque))
        return True

    # -- backward -----------------------------------------------------------------------------
    def backward(self, hidden: Sequence[TensorProxy] | None = None) -> tuple[Trace, list[Proxy]]:
        """The backward trace and the saved values it reads; given `hidden`, the one taking a cotangent for each
        of those values instead of the outputs'."""
        bwd = Trace(f"{self.trace.fn_name}_backward", _names=self.trace.names, _layouts=self.trace.layouts)
        bwd.pass_name = "split forward/backward"
        cotangents: dict[str, TensorProxy] = {}
        ct_args: list[TensorProxy] = []

        def cotangent_input(like: TensorProxy, name: str) -> TensorProxy:
            ct = TensorProxy.like(like, requires_grad=False)
            bwd.names.used.discard(ct.name)
            ct.name = bwd.names.claim(name)
            ct_args.append(ct)
            return ct

        with tracing(bwd):
            for leaf in tree_flatten(self.trace.output) if hidden is None else ():
                if is_differentiable(leaf) and leaf.name in self.requires:
                    self._accumulate(cotangents, leaf, cotangent_input(leaf, f"grad_{leaf.name}"), None)
            for p, new_value in self.dirty if hidden is None else ():
                # The cotangent of the input's new value (autograd passes it for the dirty output).
                ct = cotangent_input(p, f"grad_{p.name}_updated")
                if is_differentiable(new_value) and new_value.name in self.requires:
                    self._accumulate(cotangents, new_value, ct, None)
            for h in hidden or ():
                self._accumulate(cotangents, h, cotangent_input(h, f"grad_{h.name}_saved"), None)
            for entry in reversed(self.tape):
                outs = tree_flatten(entry.bsym.output)
                gs = [cotangents.get(o.name) if isinstance(o, TensorProxy) else None for o in outs]
                if all(g is None for g in gs):
                    continue
                bwd.source = entry.bsym.source
                grads = entry.rule.bwd(entry.saved, *gs)
                pairs: list[tuple[Any, Any]] = []
                if isinstance(grads, KeywordGrads):
                    pairs = [(entry.kwargs.get(k), g) for k, g in grads.keywords.items()]
                    grads = grads.positional
                grads = tuple(grads) + (None,) * (len(entry.args) - len(grads))
                for arg, grad in [*zip(entry.args, grads), *pairs]:
                    if grad is None:
                        continue
                    for a, ga in zip(tree_flatten(arg), tree_flatten(grad)):
                        if ga is not None and isinstance(a, TensorProxy) and a.name in self.requires:
                            self._accumulate(cotangents, a, ga, entry.bsym)
        bwd.output = tuple(cotangents.get(p.name) if p.name in self.inputs_requiring else None
                           for p in self.trace.args)
        saved: dict[int, Proxy] = {}
        for entry in self.tape:
            for x in tree_flatten(entry.saved):
                if isinstance(x, Proxy):
                    saved.setdefault(id(x), x)
        bwd.args = [*saved.values(), *ct_args]
        bwd = dce(bwd)
        # Forward values a rule read without listing them (a symbolic size in `x.shape`) are residuals too.
        for p in bwd.free_proxies():
            saved.setdefault(id(p), p)
        used = _read_names(bwd.bound_symbols)  # decompositions included, as free_proxies does
        used |= {p.name for p in tree_flatten(bwd.output) if isinstance(p, Proxy)}
        saved_used = [p for p in saved.values() if p.name in used]
        bwd.args = [*saved_used, *ct_args]
        bwd.pass_name = "split forward/backward"
        return bwd, saved_used

    def _accumulate(self, cotangents: dict[str, TensorProxy], x: TensorProxy, g: Any, bsym: BoundSymbol | None) -> None:
        if not isinstance(g, TensorProxy) or not rule_same_shape(g.shape, x.shape):
            what = bsym.sym.id if bsym is not None else "an output"
            got = g.type_string() if isinstance(g, TensorProxy) else type(g).__name__
            raise MinijitError(f"the VJP rule of {what} gave a gradient {got} for {x.name}: {x.type_string()}")
        if g.dtype != x.dtype:
            g = prims.convert_element_type(g, x.dtype)
        old = cotangents.get(x.name)
        cotangents[x.name] = g if old is None else prims.add(old, g)


def _intermediates(recorded: Sequence[BoundSymbol], outputs: Collection[str], requires: Collection[str]) -> set[str]:
    """The differentiable values of a VJP rule's `recorded` forward computed from values in `requires`, by calls
    that make none of the op's `outputs` (a layer norm's mean and rstd come with its output, and are left out:
    eager's own double backward treats such values as functions of the inputs, not as values with history)."""
    depends, found = set(requires), set()
    for b in recorded:
        if not any(a.name in depends for a in b.proxy_args()):
            continue
        made = list(b.proxy_outputs())
        depends.update(o.name for o in made)
        if not any(o.name in outputs for o in made):
            found.update(o.name for o in made if isinstance(o, TensorProxy) and is_differentiable(o))
    return found


def _read_names(bsyms: Sequence[BoundSymbol]) -> set[str]:
    """The names of the proxies that `bsyms` or their subsymbols read."""
    return {p.name for b in bsyms for p in b.proxy_args()} | {n for b in bsyms for n in _read_names(b.subsymbols)}


def requires_grad_inputs(trace: Trace) -> list[Proxy]:
    """The trace inputs that require grad (differentiable tensors with requires_grad)."""
    return [p for p in trace.args if is_differentiable(p) and p.requires_grad]


def split_forward_backward(trace: Trace, executors: Sequence[Any] = (), no_grad: Collection[str] = (),
                           inplace_originals: Mapping[str, str] | None = None,
                           written_with_grad: Collection[str] | None = None,
                           double_backward: bool = True) -> tuple[Trace, Trace, SplitResult]:
    """The forward trace (returns `(outputs, saved)`), the backward trace (takes `*saved, *cotangents`), and a `SplitResult`.

    The backward returns one gradient per input of `trace` (None for inputs that do
    not require grad or that no output depends on). Cotangents come in the order of
    the differentiable output leaves (`differentiable_outputs`), then one per input
    that requires grad and is written in place (`dirty_inputs`, positions among the
    inputs), for its new value. A saved input that the forward overwrites is returned as
    None and named in `overwritten_saved` (its backward raises, as eager's does), unless
    only in-place ops saved it, each the value it read from the tensor it wrote
    (`inplace_originals`, functionalize's: the value each in-place op wrote -> the one it
    read), which eager's in-place ops copy; those, and saved views of overwritten inputs,
    are cloned before the forward's copies. Where the first of `executors` that claims a
    call has a grad transform for it, that is its VJP rule. Symbols whose outputs are in
    `no_grad` (computed under `torch.no_grad()`) are constant for VJP. An input requiring
    grad that the code wrote only under `torch.no_grad()` (not in `written_with_grad`,
    functionalize's; default: every written input counts) keeps its autograd identity, as
    in eager: it is not dirty. Cheap residuals are recomputed in the backward (not saved) only where one
    of `executors` fuses regions. With `double_backward` (False where the runtime refuses one), the saved
    values computed from inputs requiring grad are named for the autograd node to return as hidden outputs,
    with the backward that differentiates them (`_second_backward`). `trace` is left as it is.
    """
    splitter = _Splitter(trace, executors, no_grad, written_with_grad)
    for bsym in trace.bound_symbols:
        splitter.forward(bsym)
    bwd, saved = splitter.backward()
    fwd = trace.derive(splitter.fwd, pass_name="split forward/backward")
    overwritten = {p.name for b in fwd.bound_symbols if b.sym.effects.copies for p in b.written()}
    fuses = any(getattr(ex, "fuses_regions", False) for ex in executors)
    if fuses:
        # Recomputation is free only where a fusion executor folds it into the backward's regions; with
        # torch calls alone each recomputed op is one more kernel than eager's autograd runs.
        bwd, saved = _recompute_cheap_residuals(fwd, bwd, saved, splitter.requires, overwritten)
    first_order_saved = len(saved)
    second = _second_backward(splitter, fwd, saved, overwritten, fuses) if double_backward else None
    if second is not None:
        saved = second.saved
    fwd = _bind_input_sizes(fwd, saved)
    fwd, kept = _keep_old_values(fwd, saved, overwritten, _copied_by_eager(splitter.tape, inplace_originals or {}),
                                 splitter.source)
    # An input the forward overwrites cannot serve the backward its old value: as eager
    # autograd does for a saved tensor modified in place, the backward raises (runtime/autograd.py).
    fwd.output = (trace.output, tuple(kept.get(p.name, None if p.name in overwritten else p) for p in saved))
    positions = {p.name: i for i, p in enumerate(trace.args)}
    return fwd, bwd, SplitResult(
        differentiable_outputs=differentiable_outputs(trace, splitter.requires),
        dirty_inputs=tuple(positions[p.name] for p, _ in splitter.dirty),
        overwritten_saved=tuple(p.name for p in saved if p.name in overwritten and p.name not in kept),
        saved_inputs_with_history=None if second is None else tuple(
            (i, positions[p.name]) for i, p in enumerate(saved) if p.name in splitter.requires and p.name in positions),
        first_order_saved=first_order_saved,
        hidden_saved=() if second is None else second.hidden,
        second_backward=None if second is None else second.trace,
        second_saved=() if second is None else second.reads,
    )


@dataclass(frozen=True)
class _SecondBackward:
    saved: list[Proxy]  # all the forward saves: the backward's own first
    hidden: tuple[int, ...]  # positions in `saved` of the hidden outputs, in the order of their cotangents
    trace: Trace | None  # the backward taking their cotangents (None: there are none)
    reads: tuple[int, ...]  # positions in `saved` of the values `trace` takes first


# Rounds of growing the hidden outputs until the backward differentiating them reads no other computed value.
_CLOSURE_ROUNDS = 8


def _second_backward(splitter: _Splitter, fwd: Trace, saved: list[Proxy], overwritten: Collection[str],
                     fuses: bool) -> _SecondBackward | None:
    """What a double backward reads, so that it needs no input the backward does not save (docs/design.md).

    The forward runs under no_grad inside the autograd node, so a saved value it computes from an input
    requiring grad (relu's result, read by a matmul's backward) reaches the backward without history. Such
    values become hidden outputs of the node: their history is then the node itself, and a second backward
    differentiates them, taking a cotangent for each. That backward may read more computed values, which
    become hidden too, until it reads none that is not (None when that takes more than a few rounds). Inputs
    carry their own history, and outputs theirs. Values outside the tape (a layer norm's mean and rstd, which
    eager's own double backward treats as constants) are not differentiated. None too where a backward reads a
    value a rule's forward computed on the way to its op's outputs (`_intermediates`): its history is on no tape.
    """
    inputs = {p.name for p in splitter.trace.args}
    outputs = {p.name for p in tree_flatten(splitter.trace.output) if isinstance(p, Proxy)}

    def computed(values: Sequence[Proxy]) -> list[TensorProxy]:
        return [p for p in values if isinstance(p, TensorProxy) and p.name in splitter.requires
                and p.name not in inputs and p.name not in outputs]

    def off_tape(values: Sequence[Proxy]) -> bool:
        # A rule's intermediate carries no history, and no backward differentiates it: only a recompute can.
        return any(p.name in splitter.intermediates for p in values)

    if off_tape(saved):
        return None
    hidden = {p.name: p for p in computed(saved)}
    if not hidden:
        return _SecondBackward(saved, (), None, ())
    for _ in range(_CLOSURE_ROUNDS):
        bwd, reads = splitter.backward(list(hidden.values()))
        if fuses:
            bwd, reads = _recompute_cheap_residuals(fwd, bwd, reads, splitter.requires, overwritten)
        if off_tape(reads):
            return None
        new = [p for p in computed(reads) if p.name not in hidden]
        if not new:
            break
        hidden.update((p.name, p) for p in new)
    else:
        return None
    everything = list(saved)
    position = {p.name: i for i, p in enumerate(everything)}
    for p in [*reads, *hidden.values()]:  # the first-order backward's values stay first, where it reads them
        if p.name not in position:
            position[p.name] = len(everything)
            everything.append(p)
    return _SecondBackward(everything, tuple(position[n] for n in hidden), bwd,
                           tuple(position[p.name] for p in reads))


def _copied_by_eager(tape: Sequence[_TapeEntry], inplace_originals: Mapping[str, str]) -> set[str]:
    """The saved values that only in-place ops saved, each the value it read from the tensor it wrote."""
    copied, by_reference = set(), set()
    for entry in tape:
        own = {inplace_originals.get(o.name) for o in entry.bsym.proxy_outputs()}
        for x in tree_flatten(entry.saved):
            if isinstance(x, Proxy):
                (copied if x.name in own else by_reference).add(x.name)
    return copied - by_reference


def _keep_old_values(fwd: Trace, saved: Sequence[Proxy], overwritten: Collection[str],
                     copied_by_eager: Collection[str], source: SourceLocation | None) -> tuple[Trace, dict[str, Proxy]]:
    """Clone, before the forward's copies into inputs, the saved old values of inputs they overwrite.

    Those are the inputs (and their views) an in-place op read before writing them (`x`
    of `x.mul_(k)`), of which eager's in-place op keeps a copy for its backward, and the
    other views of overwritten inputs (`kc[1]` read by a `mul`: at run time it shares
    the input's memory, which the copy at the end overwrites). An overwritten input saved
    for another op is left out: eager's backward raises there. Returns the forward with the
    clones (at `source`), and saved name -> the clone the forward returns in its place (the
    backward reads it under the saved value's name).
    """
    if not overwritten:
        return fwd, {}
    memory = memory_model(fwd)
    views = [p for p in saved if isinstance(p, TensorProxy) and memory.input_storages(p) & set(overwritten)
             and (p.name not in overwritten or p.name in copied_by_eager)]
    if not views:
        return fwd, {}
    first_copy = next(i for i, b in enumerate(fwd.bound_symbols) if b.sym.effects.copies)
    clones, recorded = record(fwd, lambda: {p.name: prims.clone(p) for p in views}, source=source)
    edits = Edits(fwd)
    edits.insert_before(first_copy, recorded)
    return edits.apply(pass_name=fwd.pass_name), clones


def _bind_input_sizes(fwd: Trace, saved: Sequence[Proxy]) -> Trace:
    """`fwd` binding the symbolic sizes it saves or reads but no longer binds: an input's at its top, a size only
    the trace knows (`nonzero`'s count, minijit/ops/unbacked.py) right after the op that made its tensor.

    dce drops a `prims.shape` or `prims.size` whose sizes nothing in the forward reads; a backward rule
    reading `x.shape` still needs them, and so does a VJP rule's forward computing with them (an opaque op's
    rule multiplies sizes).
    """
    defined = {p.name for p in fwd.args} | {p.name for b in fwd.bound_symbols for p in b.proxy_outputs()}
    missing = {p.name for p in [*saved, *fwd.free_proxies()] if isinstance(p, NumberProxy) and p.name not in defined}
    if not missing:
        return fwd
    edits = Edits(fwd)
    head = []
    for a in fwd.args:
        if isinstance(a, TensorProxy) and any(isinstance(d, NumberProxy) and d.name in missing for d in a.shape):
            head.append(prims.shape.bind(a, output=tuple(a.shape)))
            missing -= {d.name for d in a.shape if isinstance(d, NumberProxy)}
    edits.insert_before(0, head)
    for i, b in enumerate(fwd.bound_symbols):
        for t in b.proxy_outputs():
            for dim, d in enumerate(t.shape if isinstance(t, TensorProxy) else ()):
                if isinstance(d, NumberProxy) and d.name in missing:
                    edits.insert_after(i, [aten_prims.size.bind(t, dim, output=d)])
                    missing.discard(d.name)
    return edits.apply(pass_name=fwd.pass_name) if edits else fwd


def _is_cheap(bsym: BoundSymbol) -> bool:
    """True for pointwise and layout ops (or ops that decompose only into those); never random ones."""
    if bsym.is_random() or bsym.written():
        return False
    if bsym.sym.is_prim:
        # Prims that cost one pass over memory: recomputing them in the backward beats keeping their output.
        return Tag.CHEAP in bsym.sym.tags
    return bool(bsym.subsymbols) and all(_is_cheap(s) for s in bsym.subsymbols)


def _recompute_cheap_residuals(fwd: Trace, bwd: Trace, saved: list[Proxy], requires: Container[str],
                               overwritten: Container[str] = ()) -> tuple[Trace, list[Proxy]]:
    """Recompute in the backward each saved output of a cheap op whose inputs are available there anyway.

    Only differentiated ops are recomputed: constant ones stay in the forward alone
    (docs/design.md, invariant 4).
    "Available" means saved already, an input of the trace that the forward does not
    overwrite (the caller keeps it alive), or recomputed itself; so this never saves more and usually saves less (the output of
    `gelu` between two linears, say). A recomputed op is placed right before its first reader.
    """
    producer = {p.name: b for b in fwd.bound_symbols for p in b.proxy_outputs()}
    inputs = {p.name: p for p in fwd.args if p.name not in overwritten}
    available = {p.name for p in saved} | set(inputs)
    recompute: dict[str, BoundSymbol] = {}
    for p in saved:
        b = producer.get(p.name)
        if (b is not None and isinstance(p, TensorProxy) and p.name in requires and _is_cheap(b)
                and len(list(b.proxy_outputs())) == 1 and all(a.name in available for a in b.proxy_args())):
            recompute[p.name] = b
    if not recompute:
        return bwd, saved
    kept = [p for p in saved if p.name not in recompute]
    kept_names = {p.name for p in kept}
    for b in recompute.values():
        for a in b.proxy_args():
            if a.name not in kept_names and a.name not in recompute:
                kept.append(a)
                kept_names.add(a.name)
    edits = Edits(bwd)
    emitted: set[str] = set()

    def emit_producer_of(name: str, before: int) -> None:
        if name in recompute and name not in emitted:
            emitted.add(name)
            for a in recompute[name].proxy_args():
                emit_producer_of(a.name, before)
            edits.insert_before(before, [recompute[name]])

    for i, b in enumerate(bwd.bound_symbols):
        for a in b.proxy_args():
            emit_producer_of(a.name, i)
    for p in tree_flatten(bwd.output):
        if isinstance(p, Proxy):
            emit_producer_of(p.name, len(bwd.bound_symbols))
    cotangents = bwd.args[len(saved):]
    return edits.apply(pass_name=bwd.pass_name, args=[*kept, *cotangents]), kept


def differentiable_outputs(trace: Trace, requires: Container[str]) -> tuple[int, ...]:
    """Positions among the output leaves that get a cotangent in the backward."""
    return tuple(i for i, leaf in enumerate(tree_flatten(trace.output))
                 if is_differentiable(leaf) and leaf.name in requires)


# -- releasing dead values ---------------------------------------------------------------------

PYTHON_DEL = Symbol("python_del", None, namespace="", is_prim=True)


class DelBoundSymbol(BoundSymbol):
    """`del a, b`: drops the trace's references to values nothing reads any more."""

    def python_lines(self, constants: Constants, indent: str, comment_out: bool = False,
                     subsymbol_depth: int = 1) -> list[str]:
        names = ", ".join(p.name for p in self.args)
        return [f"{indent}{'# ' if comment_out else ''}del {names}"]


def release_dead_values(trace: Trace) -> Trace:
    """Insert a `del` after the last use of each value that is not an output (docs/design.md: memory).

    Run last, on the trace that gets compiled: a backward trace then frees each saved
    tensor and intermediate gradient as soon as nothing reads it.
    """
    keep = {p.name for p in tree_flatten(trace.output) if isinstance(p, Proxy)}
    last_use: dict[str, int] = {}
    for i, bsym in enumerate(trace.bound_symbols):
        for p in bsym.proxy_args():
            last_use[p.name] = i
    dead_after: dict[int, list[Proxy]] = {}
    seen: set[str] = set()
    for i, bsym in enumerate(trace.bound_symbols):
        for p in bsym.proxy_args():
            if p.name not in keep and p.name not in seen and last_use[p.name] == i:
                seen.add(p.name)
                dead_after.setdefault(i, []).append(p)
    edits = Edits(trace)
    for i, dead in dead_after.items():
        edits.insert_after(i, [DelBoundSymbol(PYTHON_DEL, tuple(dead), {}, None)])
    return edits.apply(pass_name="release dead values")
