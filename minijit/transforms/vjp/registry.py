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

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.errors import MinijitError, RegistrationError
from minijit.ir import Symbol, TensorProxy
from minijit.ir.proxies import rule_compare, rule_same_shape
from minijit.ops import prims
from minijit.ops.registry import ALL_LTORCH

# symbol -> its rule: the one table of VJP rules (minijit's own, executors' operators, traced
# custom autograd.Functions). Weak keys: a symbol made for one call takes its rule with it.
VJP_RULES: weakref.WeakKeyDictionary[Symbol, VjpRule] = weakref.WeakKeyDictionary()
# symbol tag -> a function making the rule of a symbol with that tag and no rule of its own
# (one rule for every opaque torch op: minijit/transforms/vjp/opaque.py)
TAG_RULES: dict[str, Callable[[Symbol], VjpRule]] = {}


class VjpRule:
    """The forward (outputs and residuals) and backward (residuals, cotangents -> grads) of one symbol."""

    def __init__(self, sym: Symbol, forward: Callable[..., Any], backward: Callable[..., Any] | None = None):
        self.sym = sym
        self.forward = forward
        self.bwd: Callable[..., Any] | None = backward

    def backward(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: set the backward of this rule."""
        self.bwd = fn
        return fn

    def __repr__(self) -> str:
        return f"<VjpRule {self.sym.id}>"


class KeywordGrads:
    """A backward's result for a call with tensor keyword arguments: positional gradients, and by keyword."""

    def __init__(self, positional: Sequence[Any], keywords: dict[str, Any]):
        self.positional = tuple(positional)
        self.keywords = keywords


def symbol_named(sym: Symbol | str) -> Symbol:
    """The symbol `sym` is, or is the id of ("prims.mul", "ltorch.softmax"); a RegistrationError for no symbol."""
    if isinstance(sym, Symbol):
        return sym
    namespace, _, name = sym.partition(".")
    table = {"prims": prims.ALL_PRIMS, "ltorch": ALL_LTORCH}.get(namespace, {})
    if name not in table:
        raise RegistrationError(f"a VJP rule is registered for {sym!r}, which is no symbol: name a prims or ltorch op")
    return table[name]


def check_rule_signature(rule: VjpRule, what: str = "the VJP rule") -> None:
    """Raise a RegistrationError unless `rule.forward` takes the arguments of its symbol's decomposition.

    The grad pass calls the forward with a composite symbol's arguments bound to the
    decomposition's signature, keywords by name; a rule spelling a parameter differently
    would never fit. A prim's arguments come positionally, and a forward taking `*args`
    fits every symbol.
    """
    fn, meta = rule.forward, rule.sym.meta
    if rule.sym.is_prim:
        return
    try:
        rule_params = list(inspect.signature(fn).parameters.values())
        sym_params = list(inspect.signature(meta).parameters.values()) if meta is not None else None
    except (TypeError, ValueError):
        return  # a builtin: nothing to compare
    if sym_params is None or any(p.kind is p.VAR_POSITIONAL for p in rule_params + sym_params):
        return
    names, expected = [p.name for p in rule_params], [p.name for p in sym_params]
    # The first parameter is the tensor the op acts on, whatever each side calls it.
    if names[1:] != expected[1:] or len(names) != len(expected):
        raise RegistrationError(
            f"{what} {getattr(fn, '__qualname__', fn)} for {rule.sym.id} takes ({', '.join(names)}), but "
            f"{rule.sym.id} takes ({', '.join(expected)}): give the rule's forward the symbol's parameter names"
        )


def add_rule(rule: VjpRule, what: str = "the VJP rule") -> VjpRule:
    """Make `rule` its symbol's VJP rule: checked against the symbol's signature, once per symbol."""
    check_rule_signature(rule, what)
    if rule.sym in VJP_RULES:
        raise RegistrationError(f"a VJP rule for {rule.sym.id} is registered twice ({VJP_RULES[rule.sym].forward} "
                                f"and {rule.forward})")
    VJP_RULES[rule.sym] = rule
    return rule


def vjp(sym: Symbol | str) -> Callable[[Callable[..., Any]], VjpRule]:
    """Decorator: register the decorated function as the forward of `sym`'s VJP rule.

    `sym` is a symbol or its id ("ltorch.softmax"). A name that is no symbol, or a
    forward whose parameters are not the symbol's, raises a RegistrationError here,
    when the rule's module is imported.
    """
    symbol = symbol_named(sym)

    def register(forward: Callable[..., Any]) -> VjpRule:
        return add_rule(VjpRule(symbol, forward))

    return register


def rule_for(sym: Symbol) -> VjpRule | None:
    """The VJP rule of `sym` (registered for it, else made by its tag's rule maker), or None."""
    rule = VJP_RULES.get(sym)
    if rule is None and sym.is_prim:
        make = next((TAG_RULES[tag] for tag in sym.tags if tag in TAG_RULES), None)
        if make is not None:
            rule = add_rule(make(sym))
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
    if rule_same_shape(g.shape, shape):
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead))
    dims += [lead + i for i, s in enumerate(shape) if rule_compare(s, "==", 1) and rule_compare(g.shape[lead + i], "!=", 1)]
    out = prims.sum(g, tuple(dims)) if dims else g
    return prims.reshape(out, shape) if not rule_same_shape(out.shape, shape) else out


def reshape_to(x: TensorProxy, shape: Sequence[Any]) -> TensorProxy:
    """`x` reshaped to `shape`, or `x` itself when it already has that shape."""
    shape = tuple(shape)
    # The ranks first: sizes of different ranks are not compared (one only the trace knows could not be)
    return x if len(x.shape) == len(shape) and rule_same_shape(x.shape, shape) else prims.reshape(x, shape)


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
