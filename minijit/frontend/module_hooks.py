"""Modules' full backward hooks inside a trace (`register_full_backward_hook`, `register_full_backward_pre_hook`).

Eager's `Module._call_impl` hands a hooked module's positional tensor arguments, and then its results, to
`torch.utils.hooks.BackwardHook`, which passes each group through an identity autograd node whose backward
calls the user's hooks. The capture does the same (a lookaside for `BackwardHook`), with one identity op per
group: `module_hooks.inputs(site, *xs)` and `module_hooks.outputs(site, *ys)`, each output a view of its
argument. `site` (a `HookSite`) is the module call: the module, its hooks, and which arguments are tensors.

Their VJPs are one external call each in the backward trace, at the module's boundary, as eager's nodes are:

- the outputs' runs the backward pre-hooks on grad_output (a returned tuple replaces it) and keeps it on the
  site; where no argument required grad it also runs the full hooks, with a grad_input of Nones;
- the inputs' runs the full hooks with grad_input and the kept grad_output; a returned tuple replaces
  grad_input, which is then the gradient of the module's arguments.

The backward of one call runs on one thread: the site keeps grad_output per thread.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.hooks

from minijit.errors import MinijitError, UnsupportedOpError
from minijit.frontend.lookasides import lookaside
from minijit.ir import Effects, Symbol, Tag, TensorProxy
from minijit.ir.context import where_now
from minijit.ops import prims
from minijit.ops.opaque import OPAQUE
from minijit.transforms.vjp import VjpRule, add_rule

__all__ = ["HookSite", "TracedBackwardHook"]


class HookError(MinijitError, RuntimeError):
    """A backward hook returned gradients eager's autograd would refuse (a RuntimeError there too)."""


class HookSite:
    """One call of a hooked module in a trace: what its boundary ops need in the backward.

    Holds the hooks as the call saw them (eager's `BackwardHook` holds them until the backward runs too).
    """

    def __init__(self, module: torch.nn.Module, user_hooks: Sequence[Callable[..., Any]],
                 user_pre_hooks: Sequence[Callable[..., Any]]):
        self.module = module
        self.user_hooks = list(user_hooks)
        self.user_pre_hooks = list(user_pre_hooks)
        self.n_inputs = -1
        self.input_index: list[int] | None = None  # positions of the tensor arguments; None: none needs grad
        self.n_outputs = -1
        self.output_index: list[int] | None = None
        self._pending = threading.local()  # grad_output of the backward running on this thread

    def __repr__(self) -> str:
        return f"HookSite({type(self.module).__name__})"

    def output_grads(self, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """The backward at the module's results: pre-hooks on grad_output, kept for the full hooks."""
        grad_outputs = self._through(self.user_pre_hooks, _pack(self.output_index or [], grads, self.n_outputs), (),
                                     "Backward pre hook", "grad_output")
        if self.input_index is None:
            self._without_input_grads(grad_outputs)
        else:
            self._pending.grad_outputs = grad_outputs
        return _checked(_unpack(self.output_index or [], grad_outputs), grads, "grad_output", self.module)

    def _through(self, hooks: Sequence[Callable[..., Any]], grads: tuple[Any, ...], more: tuple[Any, ...],
                 kind: str, what: str) -> tuple[Any, ...]:
        """`grads` passed through each of `hooks` in turn (called with the module, `grads` and `more`): a hook's
        returned tuple replaces them, and must be as long, as eager checks."""
        for hook in hooks:
            result = hook(self.module, grads, *more)
            if result is None:
                continue
            if len(result) != len(grads):
                raise HookError(f"{kind} returned an invalid number of {what}, got {len(result)}, but expected "
                                f"{len(grads)} ({_name(hook)} on {type(self.module).__name__})")
            grads = tuple(result)
        return grads

    def input_grads(self, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """The backward at the module's arguments: the full hooks on grad_input and the kept grad_output."""
        grad_outputs = getattr(self._pending, "grad_outputs", None)
        if grad_outputs is None:  # eager: the gradient reached the arguments without passing the results
            return grads
        self._pending.grad_outputs = None
        grad_inputs = self._through(self.user_hooks, _pack(self.input_index or [], grads, self.n_inputs),
                                    (grad_outputs,), "Backward hook", "grad_input")
        return _checked(_unpack(self.input_index or [], grad_inputs), grads, "grad_input", self.module)

    def _without_input_grads(self, grad_outputs: tuple[Any, ...]) -> None:
        warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs "
                      "since no inputs require gradients. See https://docs.pytorch.org/docs/main/generated/"
                      "torch.nn.Module.html#torch.nn.Module.register_full_backward_hook for more details.",
                      stacklevel=5)
        grad_inputs = (None,) * self.n_inputs
        for hook in self.user_hooks:
            result = hook(self.module, grad_inputs, grad_outputs)
            if result is not None and not (isinstance(result, tuple) and all(r is None for r in result)):
                raise HookError("Backward hook for Modules where no input requires gradient should always return "
                                f"None or None for all gradients ({_name(hook)} on {type(self.module).__name__})")


def _name(hook: Any) -> str:
    return getattr(hook, "__qualname__", repr(hook))


def _pack(indices: Sequence[int], values: Sequence[Any], size: int) -> tuple[Any, ...]:
    packed: list[Any] = [None] * size
    for i, value in zip(indices, values, strict=True):
        packed[i] = value
    return tuple(packed)


def _unpack(indices: Sequence[int], values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(values[i] for i in indices)


def _checked(new: tuple[Any, ...], old: Sequence[Any], what: str, module: torch.nn.Module) -> tuple[Any, ...]:
    """`new`, the gradients a hook left, where they fit the ones the trace computed (eager's autograd checks too)."""
    for i, (n, o) in enumerate(zip(new, old, strict=True)):
        if (n is None) != (o is None) or (n is not None and (n.shape != o.shape or n.dtype != o.dtype)):
            got = "None" if n is None else f"{n.dtype} {tuple(n.shape)}"
            want = "None" if o is None else f"{o.dtype} {tuple(o.shape)}"
            raise HookError(f"a backward hook of {type(module).__name__} replaced {what}[{i}] ({want}) by {got}, "
                            "which minijit cannot pass on: return a tensor of the same shape and dtype")
    return new


# -- the trace's ops ---------------------------------------------------------------------------------------

_BOUNDARY: dict[tuple[str, int], Symbol] = {}
_GRADS: dict[str, Symbol] = {}


def _identity(site: HookSite, *xs: Any) -> tuple[Any, ...]:
    return xs


def _boundary_meta(site: HookSite, *xs: TensorProxy) -> tuple[TensorProxy, ...]:
    return tuple(TensorProxy.like(x) for x in xs)


def _grads_meta(site: HookSite, *grads: TensorProxy | None) -> tuple[TensorProxy | None, ...]:
    return tuple(None if g is None else TensorProxy.like(g) for g in grads)


def boundary_symbol(kind: str, n: int) -> Symbol:
    """`module_hooks.<kind>(site, *n tensors)`: the tensors as they are, each output a view of its argument.

    `kind` is "inputs" or "outputs"; its VJP calls the site's hooks (`_boundary_rule`).
    """
    sym = _BOUNDARY.get((kind, n))
    if sym is None:
        sym = Symbol(kind, _boundary_meta, namespace="module_hooks", is_prim=True,
                     tags=frozenset({OPAQUE, Tag.FUNCTION_VIEW}), fn=_identity,
                     effects=Effects(views=tuple(range(1, n + 1))))
        _BOUNDARY[(kind, n)] = sym
        _boundary_rule(sym, kind)
    return sym


def _grads_symbol(kind: str) -> Symbol:
    """`module_hooks.<kind>_grads(site, *grads)`: the site's hooks run on the gradients at that boundary."""
    sym = _GRADS.get(kind)
    if sym is None:
        method = HookSite.output_grads if kind == "outputs" else HookSite.input_grads
        sym = Symbol(f"{kind}_grads", _grads_meta, namespace="module_hooks", is_prim=True,
                     tags=frozenset({OPAQUE}), fn=method, effects=Effects(external=True))
        _GRADS[kind] = sym
    return sym


def _boundary_rule(sym: Symbol, kind: str) -> None:
    def forward(site: HookSite, *xs: Any) -> Any:
        return sym(site, *xs), (site, xs)

    rule = VjpRule(sym, forward)

    @rule.backward
    def backward(saved: Any, *cotangents: Any) -> Any:
        site, xs = saved
        # A tensor that needs no grad is non-differentiable through eager's identity node: no gradient.
        grads = [g if x.requires_grad else None for x, g in zip(xs, cotangents, strict=True)]
        if kind == "inputs":
            # Eager's hook sees what its identity node returns, with grads materialised: zeros for an argument
            # nothing differentiated (at the results it sees the incoming grads, None included).
            grads = [g if g is not None else prims.full(x.shape, 0, dtype=x.dtype, device=x.device)
                     for x, g in zip(xs, grads, strict=True)]
        return (None, *_grads_symbol(kind)(site, *grads))

    add_rule(rule)


# -- the capture's BackwardHook ------------------------------------------------------------------------------

class TracedBackwardHook:
    """What `torch.utils.hooks.BackwardHook(module, hooks, pre_hooks)` is in traced code: its two setup methods
    record the boundary ops where eager applies its identity nodes."""

    def __init__(self, module: torch.nn.Module, user_hooks: Sequence[Any], user_pre_hooks: Sequence[Any]):
        self.site = HookSite(module, user_hooks, user_pre_hooks)

    def setup_input_hook(self, args: Any) -> Any:
        """`args` with their tensors passed through `module_hooks.inputs`, where one needs grad."""
        out, index = self._apply(args, "inputs")
        self.site.n_inputs, self.site.input_index = len(args), index
        return out

    def setup_output_hook(self, result: Any) -> Any:
        """The module's result with its tensors passed through `module_hooks.outputs`, where one needs grad."""
        is_tuple = isinstance(result, tuple)
        args = result if is_tuple else (result,)
        out, index = self._apply(args, "outputs")
        self.site.n_outputs, self.site.output_index = len(args), index
        return out if is_tuple else out[0]

    def _apply(self, args: Any, kind: str) -> tuple[Any, list[int] | None]:
        index = [i for i, a in enumerate(args) if isinstance(a, TensorProxy | torch.Tensor)]
        tensors = [args[i] for i in index]
        real = [t for t in tensors if not isinstance(t, TensorProxy)]
        if real:
            raise UnsupportedOpError(
                f"a full backward hook of {type(self.site.module).__name__}: its {kind} include a tensor minijit "
                f"does not trace (made natively){where_now()}; pass it to the jitted function")
        if not (any(t.requires_grad for t in tensors) and torch.is_grad_enabled()):
            return args, None
        new = boundary_symbol(kind, len(tensors))(self.site, *tensors)
        listed = list(args)
        for i, value in zip(index, new, strict=True):
            listed[i] = value
        return (tuple(listed) if type(args) is tuple else type(args)(*listed)), index


@lookaside(torch.utils.hooks.BackwardHook)
def _backward_hook(module: torch.nn.Module, user_hooks: Sequence[Any], user_pre_hooks: Sequence[Any]
                   ) -> TracedBackwardHook:
    return TracedBackwardHook(module, user_hooks, user_pre_hooks)


lookaside(TracedBackwardHook.setup_input_hook)(TracedBackwardHook.setup_input_hook)
lookaside(TracedBackwardHook.setup_output_hook)(TracedBackwardHook.setup_output_hook)
