"""Custom `torch.autograd.Function`s, traced: the forward into the trace, the backward as its VJP rule.

`Fn.apply(*args)` with a traced tensor among the arguments comes here (a lookaside):

1. `Fn.forward` runs through the interpreter, with a stand-in `ctx`, into a trace of
   its own, which is then functionalized. Replayed into the caller's trace, it becomes
   the subsymbols of one bound symbol, `autograd_function.Fn`, whose outputs are the
   forward's outputs followed by the forward values the backward reads (residuals).
2. When an argument requires grad, `Fn.backward` runs through the interpreter at once
   (so the globals it reads are guarded like any other traced code) into a trace whose
   inputs are those values and one cotangent per output tensor. Writes it makes into
   forward inputs (data only) become copies into them, as in eager.
3. The symbol, made for this one call, gets a VJP rule (in `minijit.transforms.vjp.VJP_RULES`) whose backward
   replays that trace on the grad pass's residuals and cotangents.

As in eager, the forward runs with grad disabled, so tensors it reads from elsewhere
(closures, globals) get no gradient. Outputs marked non-differentiable receive zeros.
Like eager with `set_materialize_grads(True)` (the default), the backward receives zeros
for outputs nobody differentiated; with materialization off it receives them as well,
which changes no gradient. `ctx.mark_dirty` (an in-place forward) is refused.

Dynamo's graphs hold a custom Function as `torch.ops.higher_order.autograd_function_apply(fwd_body, bwd_body,
*args)`: traced as a Function whose forward and backward call those bodies (`dynamo_function_apply`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch._functorch.autograd_function import autograd_function_apply

from minijit.errors import MinijitError, UnsupportedSyntaxError
from minijit.frontend.calls import call, should_interpret
from minijit.frontend.lookasides import lookaside
from minijit.ir import Proxy, Symbol, Tag, TensorProxy, Trace, tracing, tree_flatten, tree_map
from minijit.ir.context import current_trace, where_now
from minijit.ir.rewrite import replay
from minijit.ops import prims
from minijit.transforms.functionalize import functionalize
from minijit.transforms.vjp import VjpRule, add_rule

__all__ = ["TracedFunctionCtx"]


class TracedFunctionCtx:
    """The `ctx` that a traced custom Function's forward, setup_context and backward receive.

    User code may set any attribute on it, as on eager's ctx; tensors it stores that
    the backward reads become residuals of the forward.
    """

    def __init__(self, fn_name: str, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self._minijit_fn_name = fn_name
        self._minijit_saved: tuple[Any, ...] = ()
        self._minijit_non_differentiable: set[int] = set()

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep `tensors` for the backward (`ctx.saved_tensors`)."""
        for t in tensors:
            if t is not None and not isinstance(t, (TensorProxy, torch.Tensor)):
                raise TypeError(f"save_for_backward can only save variables, but argument is of type {type(t).__name__}")
        self._minijit_saved = tensors

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        """The tensors given to `save_for_backward`."""
        return self._minijit_saved

    saved_variables = saved_tensors

    def save_for_forward(self, *tensors: Any) -> None:
        """Forward-mode AD is not traced: accepted and ignored."""

    def mark_non_differentiable(self, *tensors: Any) -> None:
        """These outputs get no gradient (their cotangents in the backward are zeros)."""
        self._minijit_non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors: Any) -> None:
        """Refused: minijit traces custom Functions whose forward leaves its inputs alone."""
        raise UnsupportedSyntaxError(
            f"ctx.mark_dirty in {self._minijit_fn_name}.forward{where_now()}: a custom autograd.Function that "
            "modifies its inputs in place is not supported by minijit; return a new tensor instead")

    def set_materialize_grads(self, value: bool) -> None:
        """Recorded; the traced backward receives zeros for missing gradients either way."""
        self.materialize_grads = bool(value)


def _call(fn: Any, args: Sequence[Any]) -> Any:
    return call(fn, tuple(args), {})


def _is_differentiable(x: Any) -> bool:
    return isinstance(x, TensorProxy) and (x.dtype.is_floating_point or x.dtype.is_complex)


def _overrides(cls: type, name: str) -> bool:
    """Whether `cls` defines `name` itself rather than inheriting torch's default."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch."):
            return False
        if name in vars(klass):
            return True
    return False


def _user_function(cls: type, name: str) -> Any:
    """`cls.name`, unwrapped from torch wrappers that would run it natively (`once_differentiable`).

    Wrappers the interpreter runs (`torch.amp.custom_fwd`, which casts the inputs and turns
    autocast off) are kept.
    """
    fn = getattr(cls, name)
    while (hasattr(fn, "__wrapped__") and getattr(fn, "__globals__", {}).get("__name__", "").startswith("torch.")
           and not should_interpret(fn)):
        fn = fn.__wrapped__
    return fn


def _no_grad(sub: Trace) -> set[str]:
    """The names a sub-trace recorded or wrote under torch.no_grad()."""
    assert sub.capture is not None
    return sub.capture.recorded_without_grad | sub.capture.written_without_grad


def _produced(trace: Trace) -> dict[int, Proxy]:
    return {id(p): p for b in trace.bound_symbols for p in b.proxy_outputs()}


@lookaside(torch.autograd.Function.apply.__func__)
def function_apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    """`Fn.apply(*args)`: natively without traced tensors, else traced (see the module docstring)."""
    if not any(isinstance(x, Proxy) for x in tree_flatten((args, kwargs))):
        return torch.autograd.Function.apply.__func__(cls, *args, **kwargs)
    if kwargs:
        raise UnsupportedSyntaxError(f"{cls.__name__}.apply with keyword arguments{where_now()} is not supported "
                                     "by minijit; pass them positionally")
    return _CustomFunctionCall(cls, args).run()


@lookaside(autograd_function_apply)
def dynamo_function_apply(fwd: Any, bwd: Any, *args: Any, **kwargs: Any) -> Any:
    """Dynamo's form of `Fn.apply(*args)` in the graphs it hands the backend (`torch.compile(backend="minijit")`):
    `autograd_function_apply(fwd_body, bwd_body, *args, non_differentiable_idx=..., saved_for_backward_idx=...)`,
    `fwd_body(*args)` giving the outputs and the values `bwd_body(*grads, *values)` reads. Traced as the custom
    Function it stands for."""
    non_differentiable = set(kwargs.get("non_differentiable_idx", ()))
    if kwargs.get("dirty_idx"):
        raise UnsupportedSyntaxError(f"autograd_function_apply with dirty_idx{where_now()} (ctx.mark_dirty, an in-place "
                                     "custom Function forward) is not supported by minijit")

    # These two run natively, as minijit's own code does; the graphs' code they call is interpreted.
    def forward(ctx: Any, *inputs: Any) -> Any:
        output, ctx.saved_values = _call(fwd.forward, inputs)
        several = isinstance(output, tuple | list)
        ctx.mark_non_differentiable(*(x for i, x in enumerate(output if several else (output,))
                                      if i in non_differentiable))
        return output

    def backward(ctx: Any, *grads: Any) -> Any:
        return _call(bwd.forward, (*grads, *ctx.saved_values))

    cls = type("DynamoAutogradFunction", (torch.autograd.Function,),
               {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    return function_apply(cls, *args)


class _CustomFunctionCall:
    """Tracing one `Fn.apply(*args)` call."""

    def __init__(self, cls: type, args: tuple[Any, ...]):
        self.cls = cls
        self.name = cls.__name__
        self.args = args
        self.outer = current_trace()
        grad_on = torch.is_grad_enabled()
        self.needs = tuple(grad_on and _is_differentiable(a) and a.requires_grad for a in args)
        self.ctx = TracedFunctionCtx(self.name, self.needs)

    def run(self) -> Any:
        fwd, out_leaves = self.capture_forward()
        bwd = residuals = None
        if any(self.needs):
            bwd, residuals = self.capture_backward(fwd, out_leaves)
        produced = [x for x in out_leaves if isinstance(x, Proxy)]
        outputs = (*produced, *(residuals or ()))
        sym = Symbol(_identifier(self.name), functools.partial(_replay_outputs, fwd, outputs),
                     namespace="autograd_function", tags=frozenset({Tag.CUSTOM_FUNCTION}))
        if bwd is not None:
            _custom_rule(sym, fwd, bwd, len(produced), residuals, self._cotangent_kinds(produced))
        results = iter(sym(*fwd.args))
        return tree_map(lambda x: next(results) if isinstance(x, Proxy) else x, fwd.output)

    # -- forward -------------------------------------------------------------------------
    def capture_forward(self) -> tuple[Trace, list[Any]]:
        raw = self.outer.nested(f"{self.name}_forward")
        raw.args = list({id(a): a for a in self.args if isinstance(a, Proxy)}.values())
        forward = _user_function(self.cls, "forward")
        with tracing(raw), torch.no_grad():
            if _overrides(self.cls, "setup_context"):
                out = _call(forward, self.args)
                _call(_user_function(self.cls, "setup_context"), (self.ctx, self.args, out))
            else:
                out = _call(forward, (self.ctx, *self.args))
        raw.output = out
        inputs = {id(a) for a in raw.args}
        for leaf in tree_flatten(out):
            if isinstance(leaf, Proxy) and id(leaf) in inputs:
                raise UnsupportedSyntaxError(
                    f"{self.name}.forward returns its input {leaf.name} unchanged{where_now()}; minijit supports "
                    "custom Functions that return new tensors (return x.clone() or a view of it)")
        # Tensors read from outside (closures, tensors in list arguments) are inputs too;
        # as in eager they get no gradient.
        raw.args += raw.free_proxies()
        self.raw_produced = _produced(raw)
        fwd, functionalized = functionalize(raw, grad_enabled=False, no_grad=_no_grad(raw))
        if functionalized.mutated_inputs:
            raise UnsupportedSyntaxError(
                f"{self.name}.forward modifies its input(s) {', '.join(functionalized.mutated_inputs)} in place"
                f"{where_now()}; minijit supports custom Functions whose forward leaves its inputs alone")
        self.non_differentiable = {id(x) for x in tree_flatten(out)
                                   if id(x) in self.ctx._minijit_non_differentiable}
        return fwd, tree_flatten(fwd.output)

    # -- backward ------------------------------------------------------------------------
    def capture_backward(self, fwd: Trace, out_leaves: list[Any]) -> tuple[Trace, list[Proxy]]:
        raw = self.outer.nested(f"{self.name}_backward")
        cotangents = [TensorProxy.like(x, requires_grad=False) if isinstance(x, TensorProxy) else None
                      for x in out_leaves]
        backward = _user_function(self.cls, "backward")
        # Eager runs the backward later, in the autocast state of the backward pass: off in the AMP
        # loop (`torch.amp.custom_bwd` turns on the forward's state again, traced like any code).
        with tracing(raw), torch.no_grad(), torch._C._DisableAutocast():
            grads = _call(backward, (self.ctx, *cotangents))
        grads = self._check_grads(grads)
        # One gradient per input of the forward trace (summed where a tensor was passed twice).
        per_input: dict[int, Any] = {}
        with tracing(raw):
            for a, g in zip(self.args, grads):
                if g is None or not isinstance(a, Proxy):
                    continue
                per_input[id(a)] = g if id(a) not in per_input else prims.add(per_input[id(a)], g)
        raw.output = tuple(per_input.get(id(a)) for a in fwd.args)
        ct_proxies = [c for c in cotangents if c is not None]
        raw.args = ct_proxies
        free = raw.free_proxies()
        fwd_values = _produced(fwd)
        inputs = {id(a) for a in fwd.args}
        residuals: list[Proxy] = []
        for p in free:
            if id(p) in inputs:
                continue
            if id(p) in fwd_values:
                residuals.append(p)
            elif id(p) in self.raw_produced:
                raise UnsupportedSyntaxError(
                    f"{self.name}.backward reads {p.name}, a tensor its forward modified in place after computing it"
                    f"{where_now()}; eager autograd would raise on it too")
            else:
                raise UnsupportedSyntaxError(
                    f"{self.name}.backward reads the tensor {p.name}, which its forward neither received nor "
                    f"computed{where_now()}; save it with ctx.save_for_backward")
        raw.args = [*fwd.args, *residuals, *ct_proxies]
        bwd, _ = functionalize(raw, grad_enabled=False, no_grad=_no_grad(raw))
        return bwd, residuals

    def _check_grads(self, grads: Any) -> tuple[Any, ...]:
        grads = grads if isinstance(grads, tuple) else (grads,)
        n = len(self.args)
        if len(grads) > n and all(g is None for g in grads[n:]):
            grads = grads[:n]
        if len(grads) != n:
            raise MinijitError(f"{self.name}.backward returned {len(grads)} gradients, expected {n} (one per "
                               f"argument of {self.name}.apply){where_now()}")
        for i, (a, g) in enumerate(zip(self.args, grads)):
            if g is None:
                continue
            if not isinstance(g, TensorProxy):
                raise MinijitError(f"{self.name}.backward returned a {type(g).__name__} as gradient {i}; expected a "
                                   f"tensor or None{where_now()}")
            if not isinstance(a, TensorProxy):
                raise MinijitError(f"{self.name}.backward returned a gradient at position {i}, but that argument of "
                                   f"{self.name}.apply is not a tensor{where_now()}")
            if tuple(g.shape) != tuple(a.shape):
                raise MinijitError(f"{self.name}.backward returned a gradient of shape {tuple(g.shape)} for argument "
                                   f"{i} of shape {tuple(a.shape)}{where_now()}")
        return grads

    def _cotangent_kinds(self, outputs: list[Proxy]) -> list[str]:
        """Per output proxy: "tensor" (gets its cotangent), "zeros" (non-differentiable), or "none" (a number)."""
        kinds = []
        for x in outputs:
            if not isinstance(x, TensorProxy):
                kinds.append("none")
            elif _is_differentiable(x) and id(x) not in self.non_differentiable:
                kinds.append("tensor")
            else:
                kinds.append("zeros")
        return kinds


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "Function"


def _replay_outputs(fwd: Trace, outputs: tuple[Proxy, ...], *inputs: Any) -> tuple[Any, ...]:
    """The decomposition of a traced custom Function: its forward, returning outputs and residuals."""
    return replay(fwd, inputs, outputs)


def _custom_rule(sym: Symbol, fwd: Trace, bwd: Trace, n_outputs: int, residuals: Sequence[Proxy],
                 kinds: Sequence[str]) -> Any:
    def forward(*inputs: Any) -> Any:
        out = sym(*inputs)
        return out, (inputs, out)

    rule = VjpRule(sym, forward)

    @rule.backward
    def backward(saved: Any, *cotangents: Any) -> Any:
        inputs, out = saved
        cts = []
        for kind, value, g in zip(kinds, out[:n_outputs], cotangents[:n_outputs], strict=True):
            if kind == "none":
                continue
            if kind == "zeros" or g is None:
                g = prims.full(value.shape, 0, dtype=value.dtype, device=value.device)
            cts.append(g)
        return replay(bwd, (*inputs, *out[n_outputs:], *cts))

    return add_rule(rule)

