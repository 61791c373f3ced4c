"""The torch executor's multi-tensor calls: independent calls of one pointwise op, one `torch._foreach_*` call.

minijit.transforms.grouping finds the calls that may run together; this module says which calls
form a group (`group_key`) and makes the call that runs them (`grouped`). A group runs exactly as
its members did, one after the other: on the CPU a `torch._foreach_*` op is a loop calling the
op of each member (the same kernel, the same result to the bit), without a Python call and a
dispatch per tensor. Only CPU tensors are grouped: on a GPU, foreach kernels may round otherwise
than the single op, and the fusion executors claim these ops there.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.extend import FOREACH_MUL_ROUNDS_NUMBER_FIRST, BoundSymbol, Effects, NumberProxy, Symbol, TensorProxy


@dataclass(frozen=True)
class _Form:
    """How a torch op's call maps onto its foreach op: what each positional argument may be, and the keywords."""

    foreach: str  # the name of the foreach op, without `torch.` and the trailing `_` of its in-place form
    arguments: str  # per positional argument: "T" a tensor, "TN" a tensor or a number (one per member, or one)
    keywords: dict[str, str]  # keyword -> "N" a number (one per member, or one; passed positionally, last),
    #                            "C" a number equal in every member (passed as the keyword)


_UNARY = ("abs", "neg", "sqrt", "rsqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan",
          "tanh", "sinh", "cosh", "asin", "acos", "atan", "sigmoid", "reciprocal", "sign", "ceil", "floor", "round",
          "trunc", "frac", "erf", "erfc", "lgamma")
_FORMS: dict[Any, _Form] = {
    **{getattr(torch, name): _Form(f"_foreach_{name}", "T", {}) for name in _UNARY},
    torch.add: _Form("_foreach_add", "T", {}),  # (its second argument: below, by its kind)
    torch.sub: _Form("_foreach_sub", "T", {}),
    torch.mul: _Form("_foreach_mul", "TN", {}),
    torch.div: _Form("_foreach_div", "TN", {}),
    torch.pow: _Form("_foreach_pow", "TN", {}),
    torch.lerp: _Form("_foreach_lerp", "TTN", {}),
    torch.addcmul: _Form("_foreach_addcmul", "TTT", {"value": "N"}),
    torch.addcdiv: _Form("_foreach_addcdiv", "TTT", {"value": "N"}),
}
# add and sub take `alpha` with a second list of tensors, a number (one per member, or one) without it.
_ADD_TENSORS = _Form("", "TT", {"alpha": "C"})
_ADD_NUMBERS = _Form("", "TN", {})


def _form(bsym: BoundSymbol) -> _Form | None:
    try:
        form = _FORMS.get(bsym.sym.fn)
    except TypeError:  # an unhashable implementation
        return None
    if form is None or not bsym.args:
        return None
    if form.foreach in ("_foreach_add", "_foreach_sub"):
        shape = _ADD_TENSORS if len(bsym.args) > 1 and isinstance(bsym.args[1], TensorProxy) else _ADD_NUMBERS
        return _Form(form.foreach, shape.arguments, shape.keywords)
    return form


def _is_number(x: Any) -> bool:
    return isinstance(x, NumberProxy) or type(x) in (int, float)


# How a member leaves its result: in a new tensor, or in its first argument's tensor (`out=` that tensor). A member
# writing into another tensor (`out=`, where the copy analysis or buffer reuse put it) joins no group: computing
# into new tensors and copying them in costs more than the dispatches it saves (0.83x eager against 0.94x for
# jit(opt.step), AdamW over 100 parameters of 64 and 64 x 64, in one process).
NEW, IN_PLACE = "new", "in place"


def group_key(bsym: BoundSymbol, writes_first_argument: bool) -> Hashable | None:
    """The kind of multi-tensor call `bsym` may join (equal keys: one call), or None.

    A member leaves its result in a new tensor or in its first argument's tensor; every tensor of it is
    a CPU tensor of the first argument's dtype.
    """
    form = _form(bsym)
    output = bsym.output
    if form is None or not isinstance(output, TensorProxy) or len(bsym.args) != len(form.arguments):
        return None
    keywords = {k: v for k, v in bsym.kwargs.items() if k != "out"}
    if not set(keywords) <= set(form.keywords):
        return None
    first, out = bsym.args[0], bsym.kwargs.get("out")
    if not isinstance(first, TensorProxy) or first.device.type != "cpu":
        return None
    if out is not None and not writes_first_argument:
        return None
    mode = NEW if out is None else IN_PLACE
    # The foreach op would round the number first where its members do not: such calls stay alone.
    if (form.foreach == "_foreach_mul" and mode is IN_PLACE and first.dtype in FOREACH_MUL_ROUNDS_NUMBER_FIRST
            and _is_number(bsym.args[1])):
        return None
    if any(isinstance(t, TensorProxy) and (t.device != first.device or t.dtype != first.dtype) for t in bsym.args):
        return None
    kinds: list[Hashable] = []
    for kind, x in zip(form.arguments, bsym.args, strict=True):
        if isinstance(x, TensorProxy) and "T" in kind:
            kinds.append("T")
        elif "N" in kind and _is_number(x):
            kinds.append(("N", x.python_type if isinstance(x, NumberProxy) else type(x)))
        else:
            return None
    for k, v in sorted(keywords.items()):
        if not _is_number(v) or (form.keywords[k] == "C" and isinstance(v, NumberProxy)):
            return None
        kinds.append((k, v) if form.keywords[k] == "C" else (k, "N"))
    return form.foreach, mode, first.dtype, tuple(kinds)


def _one_or_each(values: Sequence[Any]) -> Any:
    """One number where every member passes the same, else a tuple of each member's."""
    first = values[0]
    if all(v is first for v in values) or (
            not isinstance(first, NumberProxy)
            and all(type(v) is type(first) and v == first for v in values)):
        return first
    return tuple(values)


_SYMBOLS: dict[str, Symbol] = {}


def grouped(bsyms: Sequence[BoundSymbol], key: Hashable, namespace: str) -> BoundSymbol:
    """One call running `bsyms` (calls with the `group_key` `key`), in order; its output is the tuple of theirs."""
    mode = key[1]
    first = bsyms[0]
    form = _form(first)
    assert form is not None
    args: list[Any] = []
    for i in range(len(form.arguments)):
        values = [b.args[i] for b in bsyms]
        args.append(tuple(values) if isinstance(values[0], TensorProxy) else _one_or_each(values))
    keywords = {}
    for k, kind in form.keywords.items():
        if k in first.kwargs:
            if kind == "N":
                args.append(_one_or_each([b.kwargs[k] for b in bsyms]))
            else:
                keywords[k] = first.kwargs[k]
    name = form.foreach[1:] + ("_" if mode is IN_PLACE else "")
    sym = _SYMBOLS.get(name)
    if sym is None:
        sym = _SYMBOLS[name] = Symbol(name, None, namespace=namespace, is_prim=True,
                                      effects=Effects(writes=(0,)) if mode is IN_PLACE else Effects(),
                                      fn=_runner(form.foreach, mode))
    return sym.bind(*args, output=tuple(b.output for b in bsyms), source=first.source, **keywords)


def _runner(foreach: str, mode: str) -> Callable[..., Any]:
    op = getattr(torch, f"{foreach}_" if mode is IN_PLACE else foreach)

    def run(*args: Any, **kwargs: Any) -> Any:  # (torch takes the tuples of tensors and numbers as lists)
        result = op(*args, **kwargs)
        return args[0] if mode is IN_PLACE else result
    run.__name__ = op.__name__
    return run
