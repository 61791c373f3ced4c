"""Explaining cache misses in words: what a call's arguments look like, and how they differ."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.runtime.autocast import describe_autocast


def describe_value(label: str, x: Any, out: dict[str, tuple[str, Any]], symbolic: bool) -> None:
    """Add to `out` what a call specialises on about the value `x`, item by item, labelled `label`."""
    if isinstance(x, torch.Tensor) and symbolic:
        out[f"{label} rank"] = (label, ("rank", x.ndim))
        out[f"{label} dtype"] = (label, ("dtype", x.dtype))
        out[f"{label} device"] = (label, ("device", x.device))
        out[f"{label} requires_grad"] = (label, ("requires_grad", x.requires_grad))
    elif symbolic and type(x) in (int, float):
        out[label] = (label, ("type", type(x).__name__))
    elif isinstance(x, torch.Tensor):
        out[f"{label} shape"] = (label, ("shape", tuple(x.shape)))
        out[f"{label} dtype"] = (label, ("dtype", x.dtype))
        out[f"{label} device"] = (label, ("device", x.device))
        out[f"{label} requires_grad"] = (label, ("requires_grad", x.requires_grad))
    elif type(x) in (tuple, list):
        out[f"{label} length"] = (label, (f"{type(x).__name__} length", len(x)))
        for i, v in enumerate(x):
            describe_value(f"{label}[{i}]", v, out, symbolic)
    elif type(x) is dict:
        out[f"{label} keys"] = (label, ("keys", tuple(x)))
        for k, v in x.items():
            describe_value(f"{label}[{k!r}]", v, out, symbolic)
    elif x is None or type(x) in (int, float, bool, str, complex):
        out[label] = (label, ("value", (type(x).__name__, x)))
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        out[f"{label} type"] = (label, ("type", type(x).__name__))
        for f in dataclasses.fields(x):
            describe_value(f"{label}.{f.name}", getattr(x, f.name, None), out, symbolic)
    elif isinstance(x, dict):
        out[f"{label} keys"] = (label, (f"{type(x).__name__} keys", tuple(x)))
        for k, v in x.items():
            describe_value(f"{label}[{k!r}]", v, out, symbolic)
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        out[f"{label} type"] = (label, ("type", type(x).__name__))
        for name, v in zip(x._fields, x):
            describe_value(f"{label}.{name}", v, out, symbolic)
    else:
        out[label] = (label, ("object", f"{type(x).__name__} at {id(x):#x}"))


def describe_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  symbolic: bool = False) -> dict[str, tuple[str, Any]]:
    """What a call specialises on, item by item: key -> (argument label, (aspect, value))."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        items = list(bound.arguments.items())
    except (TypeError, ValueError):
        items = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    out: dict[str, tuple[str, Any]] = {"grad mode": ("torch.is_grad_enabled()", ("value", ("bool", torch.is_grad_enabled())))}
    out.update(describe_autocast())
    # A module's forward takes its parameters and its tree's state first: it names them by path.
    describe_state = getattr(fn, "describe_state", None)
    for name, value in items:
        described = describe_state(name, value, symbolic) if describe_state is not None else None
        if described is None:
            describe_value(name, value, out, symbolic)
        else:
            out.update(described)
    return out


def _format(aspect: str, value: Any) -> str:
    if aspect == "value":
        type_name, v = value
        return f"{v!r} ({type_name})"
    if aspect == "dtype":
        return str(value).removeprefix("torch.")
    return str(value)


def _argument(label: str) -> str:
    if label == "self" or label.startswith(("torch.", "self.")):
        return label
    return f"arg '{label}'"


def _hooks_changed(label: str, aspect: str, ids: tuple[int, ...], old_ids: tuple[int, ...]) -> str:
    """`self.fc1: forward hook added`, for a module's hooks (aspect `forward hooks`, value: handle ids)."""
    kind = aspect.removesuffix("s")
    changes = []
    for count, what in ((sum(i not in old_ids for i in ids), "added"), (sum(i not in ids for i in old_ids), "removed")):
        if count:
            changes.append(f"{kind} {what}" if count == 1 else f"{count} {kind}s {what}")
    return f"{label}: {', '.join(changes) or aspect + ' reordered'}"


def explain_difference(new: dict[str, tuple[str, Any]], old: dict[str, tuple[str, Any]]) -> list[str]:
    """Each way `new` differs from `old`, as `arg 'x': shape (8, 16) != (4, 16)`."""
    reasons = []
    for key, (expr, (aspect, value)) in new.items():
        label = _argument(expr)
        if aspect.endswith("hooks"):
            old_ids = old[key][1][1] if key in old else ()
            if value != old_ids:
                reasons.append(_hooks_changed(label, aspect, value, old_ids))
        elif key not in old:
            reasons.append(f"{label}: not present before")
        elif old[key][1] != (aspect, value):
            old_aspect, old_value = old[key][1]
            if old_aspect != aspect:
                reasons.append(f"{label}: {aspect} {_format(aspect, value)} was {old_aspect} {_format(old_aspect, old_value)}")
            else:
                reasons.append(f"{label}: {aspect} {_format(aspect, value)} != {_format(aspect, old_value)}")
    for key, (expr, (aspect, value)) in old.items():
        if key not in new:
            label = _argument(expr)
            gone = _hooks_changed(label, aspect, (), value) if aspect.endswith("hooks") else f"{label}: no longer present"
            reasons.append(gone)
    return reasons


def explain_miss(new: dict[str, tuple[str, Any]], previous: list[dict[str, tuple[str, Any]]]) -> str:
    """Why a call missed the cache: its differences from the closest existing entry."""
    if not previous:
        return "first call"
    closest = min((explain_difference(new, old) for old in previous), key=len)
    if not closest:
        return "a guard on a value the trace read (not an argument) failed"
    return "; ".join(closest)


def prologue_source(description: dict[str, tuple[str, Any]], constraints: Sequence[str] = (),
                    values: Sequence[Any] = ()) -> str:
    """The checks a call must pass to reuse a cache entry, written as Python asserts."""
    params = dict.fromkeys(re.split(r"[.\[]", expr)[0] for expr, _ in description.values() if not expr.startswith("torch."))
    lines = [f"def prologue({', '.join(params)}):"]
    for expr, (aspect, value) in description.values():
        if aspect == "value":
            type_name, v = value
            if expr.startswith("torch."):
                lines.append(f"  assert {expr} == {v!r}")
            else:
                lines.append(f"  assert type({expr}) is {type_name} and {expr} == {v!r}")
        elif aspect in ("shape", "dtype", "device", "requires_grad"):
            shown = {"dtype": str(value), "device": f"torch.device({str(value)!r})"}.get(aspect, repr(value))
            lines.append(f"  assert {expr}.{aspect} == {shown}")
        elif aspect == "keys":
            lines.append(f"  assert tuple({expr}) == {value!r}")
        elif aspect in ("object", "module"):
            lines.append(f"  assert {expr} is <the {value}>")
        elif aspect.endswith("hooks"):
            lines.append(f"  assert tuple({expr}._{aspect.replace(' ', '_').replace('-', '_')}) == {value!r}")
        elif aspect == "rank":
            lines.append(f"  assert {expr}.ndim == {value}")
        elif aspect == "type":
            lines.append(f"  assert type({expr}) is {value}")
        else:
            lines.append(f"  assert len({expr}) == {value!r}")
    lines += [f"  assert {c}" for c in constraints]
    lines += [f"  assert unchanged({v})" for v in values]
    return "\n".join(lines) + "\n"
