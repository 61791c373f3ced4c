"""Explaining cache misses in words: what a call's arguments look like, and how they differ."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.runtime.autocast import describe_autocast


def _describe_value(label: str, x: Any, out: dict[str, tuple[str, Any]], symbolic: bool) -> None:
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
            _describe_value(f"{label}[{i}]", v, out, symbolic)
    elif type(x) is dict:
        out[f"{label} keys"] = (label, ("keys", tuple(x)))
        for k, v in x.items():
            _describe_value(f"{label}[{k!r}]", v, out, symbolic)
    elif x is None or type(x) in (int, float, bool, str, complex):
        out[label] = (label, ("value", (type(x).__name__, x)))
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
    # A module's forward takes its parameters and training flags first: name them by path.
    module_names = {"params": getattr(fn, "slots", None), "flags": getattr(fn, "module_paths", None)}
    for name, value in items:
        paths = module_names.get(name)
        if paths is None:
            _describe_value(name, value, out, symbolic)
            continue
        for path, v in zip(paths, value, strict=True):
            if isinstance(path, tuple):  # a parameter or buffer slot: (path, owner, kind, name)
                label = f"self.{path[0]}"
            else:
                label = ".".join(filter(None, ("self", path, "training")))
            _describe_value(label, v, out, symbolic)
    return out


def _format(aspect: str, value: Any) -> str:
    if aspect == "value":
        type_name, v = value
        return f"{v!r} ({type_name})"
    if aspect == "dtype":
        return str(value).removeprefix("torch.")
    return str(value)


def _argument(label: str) -> str:
    if label.startswith(("torch.", "self.")):
        return label
    return f"arg '{label}'"


def explain_difference(new: dict[str, tuple[str, Any]], old: dict[str, tuple[str, Any]]) -> list[str]:
    """Each way `new` differs from `old`, as `arg 'x': shape (8, 16) != (4, 16)`."""
    reasons = []
    for key, (expr, (aspect, value)) in new.items():
        label = _argument(expr)
        if key not in old:
            reasons.append(f"{label}: not present before")
        elif old[key][1] != (aspect, value):
            old_aspect, old_value = old[key][1]
            if old_aspect != aspect:
                reasons.append(f"{label}: {aspect} {_format(aspect, value)} was {old_aspect} {_format(old_aspect, old_value)}")
            else:
                reasons.append(f"{label}: {aspect} {_format(aspect, value)} != {_format(aspect, old_value)}")
    reasons += [f"{_argument(old[key][0])}: no longer present" for key in old if key not in new]
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
        elif aspect == "object":
            lines.append(f"  assert {expr} is <the {value}>")
        elif aspect == "rank":
            lines.append(f"  assert {expr}.ndim == {value}")
        elif aspect == "type":
            lines.append(f"  assert type({expr}) is {value}")
        else:
            lines.append(f"  assert len({expr}) == {value!r}")
    lines += [f"  assert {c}" for c in constraints]
    lines += [f"  assert unchanged({v})" for v in values]
    return "\n".join(lines) + "\n"
