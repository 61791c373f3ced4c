"""The one way to register a VJP rule, and helpers the rules share.

A rule pairs a forward and a backward for one symbol::

    @vjp(prims.mul)
    def mul_fwd(a, b):
        return prims.mul(a, b), (a, b)          # (outputs, saved residuals)

    @mul_fwd.backward
    def mul_bwd(saved, g):
        a, b = saved
        return prims.mul(g, b), prims.mul(g, a)  # one gradient per positional argument

The forward runs while the forward trace records, so it should call the symbol
itself (the grad pass gives the recorded outputs the original names). The
backward runs while the backward trace records: it takes the residuals and one
cotangent per output leaf (None for an output nobody differentiated) and returns
one entry per positional argument of the symbol, after binding its arguments
to the decomposition's signature with defaults applied: a gradient, None, or,
for a sequence argument (`cat`'s tensors), a sequence of them. A rule for calls
that pass tensors by keyword returns `KeywordGrads` instead. A forward may
return `NotImplemented` to decline a call (an unusual argument); the grad pass
then differentiates the symbol's decomposition instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.errors import MinijitError
from minijit.ir import Symbol, TensorProxy
from minijit.ops import prims

# symbol id ("prims.mul", "ltorch.linear") -> its rule
VJP_RULES: dict[str, VjpRule] = {}
# symbol tag -> a function making the rule of a symbol with that tag and no rule of its own
# (one rule for every opaque torch op: minijit/transforms/vjp/opaque.py)
TAG_RULES: dict[str, Callable[[Symbol], VjpRule]] = {}


class VjpRule:
    """The forward (outputs and residuals) and backward (residuals, cotangents -> grads) of one symbol."""

    def __init__(self, sym_id: str, forward: Callable[..., Any]):
        self.sym_id = sym_id
        self.forward = forward
        self.bwd: Callable[..., Any] | None = None

    def backward(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: set the backward of this rule."""
        self.bwd = fn
        return fn

    def __repr__(self) -> str:
        return f"<VjpRule {self.sym_id}>"


class KeywordGrads:
    """A backward's result for a call with tensor keyword arguments: positional gradients, and by keyword."""

    def __init__(self, positional: Sequence[Any], keywords: dict[str, Any]):
        self.positional = tuple(positional)
        self.keywords = keywords


def vjp(sym: Symbol | str) -> Callable[[Callable[..., Any]], VjpRule]:
    """Decorator: register the decorated function as the forward of `sym`'s VJP rule.

    `sym` is a symbol or a symbol id ("ltorch.softmax"); a rule for an id that no op
    has yet simply waits for the op to be declared.
    """
    sym_id = sym if isinstance(sym, str) else sym.id

    def register(forward: Callable[..., Any]) -> VjpRule:
        if sym_id in VJP_RULES:
            raise ValueError(f"a VJP rule for {sym_id} is registered twice")
        rule = VjpRule(sym_id, forward)
        VJP_RULES[sym_id] = rule
        return rule

    return register


def rule_for(sym: Symbol) -> VjpRule | None:
    """The VJP rule of `sym` (its own, else the one registered for its id, else its tag's), or None."""
    rule = sym.vjp if sym.vjp is not None else VJP_RULES.get(sym.id)
    if rule is None and sym.is_prim:
        make = next((TAG_RULES[tag] for tag in sym.tags if tag in TAG_RULES), None)
        if make is not None:
            rule = sym.vjp = make(sym)
    if rule is not None and rule.bwd is None:
        raise MinijitError(f"the VJP rule for {sym.id} has no backward")
    return rule


# -- helpers for rules ------------------------------------------------------------------

def is_tensor(x: Any) -> bool:
    """True for tensor proxies (arguments that can receive a gradient)."""
    return isinstance(x, TensorProxy)


def zeros_like(x: TensorProxy) -> TensorProxy:
    """A tensor of zeros with `x`'s shape, dtype and device."""
    return prims.full(x.shape, 0, dtype=x.dtype, device=x.device)


def sum_to_shape(g: TensorProxy, shape: Sequence[Any]) -> TensorProxy:
    """Sum `g` over the dims broadcasting added to a tensor of `shape` (the VJP of broadcasting)."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead))
    dims += [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    out = prims.sum(g, tuple(dims)) if dims else g
    return prims.reshape(out, shape) if tuple(out.shape) != shape else out


def reshape_to(x: TensorProxy, shape: Sequence[Any]) -> TensorProxy:
    """`x` reshaped to `shape`, or `x` itself when it already has that shape."""
    shape = tuple(shape)
    return x if tuple(x.shape) == shape else prims.reshape(x, shape)


def cast_like(g: TensorProxy, x: TensorProxy) -> TensorProxy:
    """`g` in `x`'s dtype (a no-op when they already agree)."""
    return g if g.dtype == x.dtype else prims.convert_element_type(g, x.dtype)


def matrix_transpose(x: TensorProxy) -> TensorProxy:
    """`x` with its last two dims swapped."""
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return prims.transpose(x, tuple(perm))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types (as torch's kernels compute), else `dtype`."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
