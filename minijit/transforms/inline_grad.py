"""Gradients taken inside the traced function (`loss.backward()`, `torch.autograd.grad`), as values of the trace.

While the user's code runs, `minijit.frontend.backward` records each such call as one bound symbol of
`GRAD_OF` (minijit/ops/grad_of.py): `(g0, g1, ...) = autograd.grad_of((loss,), (cotangent,), (p0, p1, ...))`,
whose outputs are fresh tensors shaped like the inputs differentiated. The rest of the code (an optimizer's
step) computes with those outputs as with any value. Functionalization then runs on the whole trace as usual.

`expand_inline_grads` replaces each `grad_of` by what it stands for, after functionalization (so that the
code's in-place ops are functional already) and before the executors claim anything: the bound symbols the
differentiated outputs depend on are differentiated as the grad transform differentiates a whole trace
(`minijit.transforms.grad`, the same VJP rules), with the `grad_of`'s inputs as the values requiring grad,
and the backward's bound symbols take the `grad_of`'s place. A trace with inline gradients is then one
computation, run without autograd (docs/design.md: "A whole training step in one trace").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from minijit.errors import InplaceError, MinijitError, UnsupportedSyntaxError, where
from minijit.ir import BoundSymbol, Proxy, Trace, tree_flatten
from minijit.ir.rewrite import Edits, ProxyMap, record
from minijit.ops import prims
from minijit.ops.grad_of import GRAD_OF
from minijit.transforms.functionalize import _recorded_without_grad, _stops_gradient
from minijit.transforms.grad import _Splitter, is_differentiable


def has_inline_grads(trace: Trace) -> bool:
    """Whether the user's code took gradients inside the traced function."""
    return any(b.sym is GRAD_OF for b in trace.bound_symbols)


def refuse_outputs_requiring_grad(trace: Trace, result: Any, no_grad: Collection[str]) -> None:
    """Refuse a captured trace with inline gradients whose `result` holds a tensor eager would return with a
    history it could still differentiate: one computed after the last gradient was taken, or any one computed
    with grad where the code kept the graph (`retain_graph=True`). The trace runs without autograd, so the
    other tensors computed with grad, whose graph the backward used up in eager, come back without history.
    `no_grad`: names of the values the capture recorded under `torch.no_grad()`."""
    markers = [i for i, b in enumerate(trace.bound_symbols) if b.sym is GRAD_OF]
    retained = any(trace.bound_symbols[i].kwargs.get("retain_graph") for i in markers)
    made_at = {id(p): i for i, b in enumerate(trace.bound_symbols) for p in b.proxy_outputs()}
    for p in tree_flatten(result):
        if not (is_differentiable(p) and p.requires_grad and id(p) in made_at) or p.name in no_grad:
            continue
        if retained or made_at[id(p)] > markers[-1]:
            b = trace.bound_symbols[made_at[id(p)]]
            raise UnsupportedSyntaxError(
                f"the jitted function takes gradients inside (backward() or torch.autograd.grad) and also returns "
                f"{p.name}, computed with grad{where(b.source)}"
                f"{' after the last gradient was taken' if not retained else ' while the graph is kept'}: minijit "
                "runs such a function without autograd, so its result would lose its history. Return it detached "
                "(`.detach()`, `.item()`), or compute it outside the jitted function")


def refuse_made_leaves(trace: Trace, output: Any, leaves: Sequence[Proxy], differentiated: bool,
                       no_grad: Collection[str] = ()) -> None:
    """Refuse a captured trace whose code made leaves requiring grad (`x.detach().requires_grad_()`) where the
    runtime would differ from eager: a leaf among its results or the values it stores outside the call (`output`,
    the trace's whole output), which eager gives back requiring grad, with its `.grad`; or a result requiring grad
    through such a leaf alone, when the call is not `differentiated` (no input requires grad, no gradient is taken
    inside): the trace then runs without autograd and eager's result would require grad. An in-place write into
    such a leaf, or a view of it, with grad on (outputs not in `no_grad`) raises eager's InplaceError."""
    if not leaves:
        return
    made_at = {id(p): b for b in trace.bound_symbols for p in b.proxy_outputs()}
    mine = {id(p) for p in leaves}
    _refuse_writes_into_made_leaves(trace, mine, no_grad)
    for p in tree_flatten(output):
        if id(p) in mine:
            b = made_at.get(id(p))
            raise UnsupportedSyntaxError(
                f"the jitted function returns or stores {p.name}, a leaf requiring grad it made itself"
                f"{where(b.source) if b is not None else ''}: minijit gives back such a tensor without its "
                "requires_grad flag and .grad. Return it detached and its .grad instead, or make the leaf outside "
                "the jitted function and pass it in")
        if not differentiated and isinstance(p, Proxy) and is_differentiable(p) and p.requires_grad:
            b = made_at.get(id(p))
            raise UnsupportedSyntaxError(
                f"the jitted function returns {p.name}{where(b.source) if b is not None else ''}, which requires "
                "grad only through a leaf the function made itself (requires_grad_() or requires_grad=True): minijit "
                "does not differentiate such a call, whose inputs do not require grad. Take the gradient inside "
                "(loss.backward()), or make the leaf outside the jitted function and pass it in")


def _refuse_writes_into_made_leaves(trace: Trace, leaves: set[int], no_grad: Collection[str]) -> None:
    """Eager's InplaceError for an op that writes with grad on into a leaf requiring grad made by the traced code, or
    into a view of one (a write through a detached alias, `z.detach().zero_()`, is none)."""
    parent: dict[int, Proxy] = {}  # id(view) -> the leaf it views, for views of made leaves
    for b in trace.bound_symbols:
        if b.is_view() and not _stops_gradient(b):
            viewed = b.viewed_tensor()
            leaf = viewed if viewed is not None and id(viewed) in leaves else parent.get(id(viewed))
            if leaf is not None:
                parent.update((id(p), leaf) for p in b.proxy_outputs())
        if not b.written() or _recorded_without_grad(b, no_grad):
            continue
        for w in b.written():
            if id(w) in leaves or id(w) in parent:
                what = "a leaf Variable" if id(w) in leaves else "a view of a leaf Variable"
                raise InplaceError(f"{b.sym.id}{where(b.source)}: {what} that requires grad is being used in an "
                                   f"in-place operation ({w.name}, made a leaf by the traced code, as in eager); use "
                                   "torch.no_grad() or write into a clone")


def expand_inline_grads(trace: Trace, executors: Sequence[Any], no_grad: Collection[str]) -> Trace:
    """`trace` with each `grad_of` replaced by the forward's rules and the backward it stands for, in order.

    `no_grad`: names of the values recorded under `torch.no_grad()` (constant for VJP).
    """
    while True:
        position = next((i for i, b in enumerate(trace.bound_symbols) if b.sym is GRAD_OF), None)
        if position is None:
            return trace
        trace = _expand_one(trace, position, executors, no_grad)


def _cone(bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy], stop: Collection[int]) -> list[int]:
    """Positions of the bound symbols among `bsyms` whose outputs `outputs` depend on, not looking past the
    proxies whose ids are in `stop` (the values differentiated: their own history is not differentiated)."""
    needed = {id(p) for p in outputs if id(p) not in stop}
    cone = []
    for i in reversed(range(len(bsyms))):
        b = bsyms[i]
        if any(id(p) in needed for p in b.proxy_outputs()):
            cone.append(i)
            needed.update(id(p) for p in b.proxy_args() if id(p) not in stop)
    return cone[::-1]


def _expand_one(trace: Trace, position: int, executors: Sequence[Any], no_grad: Collection[str]) -> Trace:
    marker = trace.bound_symbols[position]
    outputs, cotangents, inputs = marker.args
    stop = {id(p) for p in inputs}
    cone = _cone(trace.bound_symbols[:position], outputs, stop)

    region = Trace(trace.fn_name, _names=trace.names, _layouts=trace.layouts)
    region.args = list({id(p): p for p in inputs}.values())
    region.output = tuple(outputs)
    splitter = _Splitter(region, executors, no_grad)
    # The values differentiated are the grad_of's inputs, whatever their flags (a parameter the code updated
    # under no_grad before this backward is one of them too).
    splitter.requires = {p.name for p in region.args if is_differentiable(p)}
    splitter.inputs_requiring = set(splitter.requires)

    edits = Edits(trace)
    for i in cone:
        start = len(splitter.fwd)
        splitter.forward(trace.bound_symbols[i])
        edits.replace(i, *splitter.fwd[start:])
    if splitter.dirty:
        raise UnsupportedSyntaxError(
            f"a gradient taken inside the traced function{where(marker.source)} differentiates through a write into "
            f"{splitter.dirty[0][0].name}, an input requiring grad; write it under torch.no_grad(), or take the "
            "gradient outside the jitted function")
    bwd, _ = splitter.backward(list(outputs))
    # The backward takes the saved values (the forward's own proxies) and one cotangent per output: the grad_of's.
    env = ProxyMap()
    env.bind(list(bwd.args[len(bwd.args) - len(outputs):]), list(cotangents))
    body = [env.bsym(b) for b in bwd.bound_symbols]
    by_input = dict(zip((p.name for p in region.args), (env.value(g) for g in bwd.output)))
    produced = {id(p) for b in body for p in b.proxy_outputs()}
    renamed = ProxyMap()  # each gradient the backward made -> the grad_of output standing for it (one pass below)
    for x, result in zip(inputs, marker.output):
        g = by_input.get(x.name)
        if g is None:
            raise MinijitError(
                f"autograd.grad_of{where(marker.source)}: no gradient reached {x.name}, which the traced code saw "
                "depending on the differentiated outputs; take the gradient outside the jitted function")
        if id(g) in produced and g not in renamed:
            renamed[g] = result
        else:  # an input or cotangent passed through, or one value serving two inputs: a tensor of its own
            copy, recorded = record(trace, prims.clone, (g,), source=marker.source)
            renamed[copy] = result
            body += recorded
    edits.replace(position, *map(renamed.bsym, body))
    return edits.apply(pass_name="expand inline gradients")


__all__ = ["GRAD_OF", "expand_inline_grads", "has_inline_grads", "refuse_made_leaves", "refuse_outputs_requiring_grad"]
