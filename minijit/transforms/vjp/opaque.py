"""The VJP rule of every opaque torch op: torch's own derivative, run on the saved inputs.

The forward records the op and saves its arguments. The backward is one opaque
symbol, `opaque.<op>_vjp(cotangents, *args, **kwargs)`, which runs the op again on
those arguments with autograd on and returns `torch.autograd.grad` of its outputs,
for the given cotangents, with respect to each argument tensor that requires grad.
The gradients are therefore eager's (the op's own derivative formula), for the
price of running the op once more in the backward. For a random op the forward
also saves the state of the random generator just before the op
(`prims.get_rng_state`), and the backward runs the op again from that state, so it
draws the same random numbers (`F.rrelu`, `torch.svd_lowrank`).
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir import Symbol, TensorProxy, tree_flatten, tree_map
from minijit.ir.containers import sequence_leaves
from minijit.ir.context import current_trace
from minijit.ops import prims
from minijit.ops.opaque import OPAQUE, FunctionalForm, describe, unique_opaque_name
from minijit.transforms.vjp.registry import TAG_RULES, KeywordGrads, VjpRule


def _differentiable(x: Any) -> bool:
    return isinstance(x, TensorProxy) and x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)


def opaque_rule(sym: Symbol, eager: Any = None) -> VjpRule:
    """The rule of the opaque symbol `sym`: save the arguments; the backward differentiates the op with autograd.

    `eager`: the torch callable that runs `sym` on real tensors, where that is not `sym.fn` (an ltorch op
    on complex values, differentiated by torch's autograd: its conjugates are eager's, `eager_autograd_rule`).
    """

    def forward(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        # Read right before the op draws its random numbers (random symbols are never reordered).
        state = prims.get_rng_state(_generator_device(args, kwargs)) if sym.effects.random else None
        out = sym(*args, **kwargs)
        return out, (_saved_arguments(sym, args, kwargs), state)

    rule = VjpRule(sym, forward)

    @rule.backward
    def backward(saved: Any, *cotangents: Any) -> KeywordGrads:
        (args, kwargs), state = saved
        leaves = tree_flatten((args, kwargs))
        diff = tuple(i for i, x in enumerate(leaves) if _differentiable(x))
        replay = () if state is None else (state,)
        grads = vjp_symbol(sym, diff, state is not None, eager)(tuple(cotangents), *replay, *args, **kwargs) \
            if diff else ()
        by_leaf = dict(zip(diff, grads, strict=True))
        position = iter(range(len(leaves)))
        gargs, gkwargs = tree_map(lambda _: by_leaf.get(next(position)), (args, kwargs))
        return KeywordGrads(gargs, gkwargs)

    return rule


def _saved_arguments(sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The arguments the backward runs the op on again: as given, except the trace inputs the op writes.

    Those get their final values copied in at the end of the forward (docs/design.md, invariant 1),
    so the backward gets copies of their old values instead.
    """
    form = sym.fn if isinstance(sym.fn, FunctionalForm) else None
    trace = current_trace()
    if form is None or not form.written or trace is None:
        return args, kwargs
    inputs = {id(p) for p in trace.args}
    leaves = tree_flatten((args, kwargs))
    clones = {id(leaves[i]): prims.clone(leaves[i]) for i in form.written if id(leaves[i]) in inputs}
    if not clones:
        return args, kwargs
    return tree_map(lambda x: clones.get(id(x), x) if isinstance(x, TensorProxy) else x, (args, kwargs))


def _generator_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    """The device whose default generator a random op on these arguments draws from."""
    devices = [x.device for x in tree_flatten((args, kwargs)) if isinstance(x, TensorProxy)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))


class OpaqueVjp:
    """At run time: the gradients of `fn(*args, **kwargs)` for `cotangents`, with respect to the leaves `diff`.

    With `replay`, the call's first argument after the cotangents is the state of the
    random generator the forward ran the op from; the op runs again from that state.
    """

    def __init__(self, fn: Any, diff: tuple[int, ...], replay: bool = False):
        self.fn = fn
        self.diff = diff
        self.replay = replay

    def __call__(self, cotangents: tuple[Any, ...], *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        if self.replay:
            state, *rest = args
            device = _generator_device_of(rest, kwargs)
            with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device], device_type=device.type):
                if device.type == "cpu":
                    torch.set_rng_state(state)
                else:
                    getattr(torch, device.type).set_rng_state(state, device)
                return self._grads(cotangents, tuple(rest), kwargs)
        return self._grads(cotangents, args, kwargs)

    def _grads(self, cotangents: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[torch.Tensor, ...]:
        wanted = set(self.diff)
        inputs: dict[int, torch.Tensor] = {}
        position = iter(range(1 << 62))
        # Grad mode on: a double backward runs this on saved values that carry their history
        # (runtime/double_backward.py); the gradients must carry it on, as eager's do.
        differentiable = torch.is_grad_enabled()

        def leaf(x: Any) -> Any:
            i = next(position)
            if i in wanted:
                # One input per occurrence: `f(x, x)` gives x a gradient from each, which the grad pass sums.
                # Under a double backward a view of x, which keeps x's history: a detached leaf would cut it.
                inputs[i] = x.view_as(x) if differentiable and x.requires_grad else x.detach().requires_grad_(True)
                return inputs[i]
            return x

        args, kwargs = tree_map(leaf, (args, kwargs))
        with torch.enable_grad():
            out = self.fn(*args, **kwargs)
        pairs = [(o, g) for o, g in zip(sequence_leaves(out), cotangents, strict=False)
                 if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        xs = [inputs[i] for i in self.diff]
        if not pairs:
            return tuple(torch.zeros_like(x) for x in xs)
        return tuple(torch.autograd.grad([o for o, _ in pairs], xs, [g for _, g in pairs], allow_unused=True,
                                         materialize_grads=True, create_graph=differentiable))

    def __repr__(self) -> str:
        return f"<vjp of {describe(self.fn)}>"


def _generator_device_of(args: Any, kwargs: dict[str, Any]) -> torch.device:
    devices = [x.device for x in tree_flatten((args, kwargs)) if isinstance(x, torch.Tensor)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))


_VJP_SYMBOLS: dict[tuple[Symbol, tuple[int, ...], bool], Symbol] = {}


def vjp_symbol(sym: Symbol, diff: tuple[int, ...], replay: bool = False, eager: Any = None) -> Symbol:
    """The backward symbol of the opaque `sym` for gradients with respect to the argument leaves `diff`.

    With `replay`, it takes the random generator's state before the op's arguments. `eager`: the callable
    the backward differentiates, where it is not `sym.fn`.
    """
    found = _VJP_SYMBOLS.get((sym, diff, replay))
    if found is None:
        fn = OpaqueVjp(sym.fn if eager is None else eager, diff, replay)

        def meta(cotangents: tuple[Any, ...], *args: Any, **kwargs: Any) -> tuple[TensorProxy, ...]:
            leaves = tree_flatten((args[1:] if replay else args, kwargs))
            return tuple(TensorProxy.like(leaves[i], requires_grad=False) for i in diff)

        name = unique_opaque_name(f"{sym.name.replace('.', '_')}_vjp", fn)
        found = _VJP_SYMBOLS[(sym, diff, replay)] = Symbol(name, meta, namespace="opaque", is_prim=True,
                                                           tags=frozenset({OPAQUE}), fn=fn)
    return found


TAG_RULES[OPAQUE] = opaque_rule

_EAGER_AUTOGRAD_RULES: dict[Symbol, VjpRule] = {}


def eager_autograd_rule(sym: Symbol, eager: Any) -> VjpRule:
    """The rule of an op on complex values: torch's autograd over `eager`, its torch callable, as for an opaque op.

    minijit's own rules are written for real values (they take no conjugates); torch's derivative formulas follow
    eager's convention for complex numbers (the conjugate Wirtinger derivative), and give a real input the real
    part of its gradient, as eager does.
    """
    rule = _EAGER_AUTOGRAD_RULES.get(sym)
    if rule is None:
        rule = _EAGER_AUTOGRAD_RULES[sym] = opaque_rule(sym, eager)
    return rule
