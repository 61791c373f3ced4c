"""Cache-entry guards: one compiled function per entry that says whether its trace still holds.

The cache key already fixes tensor metadata and Python values among the arguments; the
guard checks the rest: the constraints a "symbolic values" trace relied on, and the
globals and closure values the interpreter saw (`minijit.frontend.guards`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.frontend import GuardEntry, build_guard
from minijit.frontend.guards import Source
from minijit.ir import Trace
from minijit.runtime.inputs import alias_layout, alias_pattern, input_names

# A symbolic input size (> 1) compared with 0 or 1: implied by the `x.shape[i] > 1` constraint
# every symbolic size starts with, so the guard need not check it again.
_IMPLIED = re.compile(r"^(0|1) (==|!=|<=|>=|<|>) \w+\.shape\[\d+\]$|^\w+\.shape\[\d+\] (==|!=|<=|>=|<|>) (0|1)$")


def drop_implied(constraints: list[str]) -> list[str]:
    """The constraints without those that the per-size constraints already imply."""
    return [c for c in constraints if not _IMPLIED.match(c) or c.endswith(("== 0", "== 1", "> 1"))]


def compile_guard(trace: Trace, constraints: list[str], values: list[GuardEntry],
                  aliases: tuple[int, ...] | None = None,
                  captured: Sequence[tuple[Source, torch.Tensor]] = (),
                  layout: tuple[Any, ...] = (), layout_also: tuple[int, ...] = ()) -> Callable[..., bool] | None:
    """One function of the call's inputs, True while every constraint and read value still holds.

    `aliases` is the storage-sharing pattern of the inputs the trace was functionalized
    for, when it writes into inputs: a call whose inputs alias differently misses.
    `captured` are the tensors the trace read from outside the call: each must still be
    there, a tensor like the one traced (shape, dtype, device, requires_grad). `layout` is
    where the inputs sharing storage (and those at `layout_also`) sit in it (`alias_layout`),
    checked only when there are any.
    """
    value_guard = build_guard(values)
    if not constraints and value_guard is None and aliases is None and not captured:
        return None
    names = input_names(trace)
    own = names[: len(names) - len(captured)]
    env: dict[str, Any] = {"_values_unchanged": value_guard, "_alias_pattern": alias_pattern,
                           "_expected_aliases": aliases, "_Tensor": torch.Tensor,
                           "_alias_layout": functools.partial(alias_layout, also=layout_also),
                           "_expected_layout": layout}
    terms = list(constraints) + (["_values_unchanged()"] if value_guard is not None else [])
    fetch = ""
    if captured:
        reads = [source.expression(env) for source, _ in captured]
        fetch = f"    ({', '.join(names[len(own):])},) = ({', '.join(reads)},)\n"
        for name, (_, t) in zip(names[len(own):], captured):
            env[f"_meta_{name}"] = (t.shape, t.dtype, t.device, t.requires_grad)
            terms.append(f"type({name}) in _TENSOR_TYPES and ({name}.shape, {name}.dtype, {name}.device, "
                         f"{name}.requires_grad) == _meta_{name}")
        env["_TENSOR_TYPES"] = tuple({type(t) for _, t in captured})
    if aliases is not None:
        terms.append(f"_alias_pattern({', '.join(names)}) == _expected_aliases")
        if layout:
            terms.append(f"_alias_layout({', '.join(names)}) == _expected_layout")
    body = " and ".join(terms)
    # Read each input's shape once: `x.shape` costs more than indexing the tuple it gives.
    shaped = [n for n in own if f"{n}.shape[" in body]
    for n in shaped:
        body = body.replace(f"{n}.shape[", f"{n}_shape[")
    reads = "".join(f"    {n}_shape = {n}.shape\n" for n in shaped)
    if fetch:
        source = (f"def guard({', '.join(own)}):\n{reads}    try:\n    {fetch}    except Exception:\n"
                  f"        return False\n    return {body}\n")
    else:
        source = f"def guard({', '.join(own)}):\n{reads}    return {body}\n"
    exec(compile(source, f"<minijit guard {trace.fn_name}>", "exec"), env)
    guard = env["guard"]
    guard.__minijit_source__ = source
    return guard


def explain_guard_failure(entry: Any, flat: list[Any]) -> str:
    """Which constraints or read values of `entry` no longer hold for these inputs, in words."""
    names = input_names(entry.traces[0])
    params = ", ".join(names[: len(flat)])
    # The constraints are our own generated source over the input names.
    broken = [c for c in entry.constraints if not eval(f"lambda {params}: {c}")(*flat)]
    failed = ["constraint failed: " + "; ".join(broken)] if broken else []
    expected = entry.traces[-1].info.get("alias_pattern")
    if expected is not None and alias_pattern(*flat) != expected:
        failed.append(f"inputs share memory differently: {alias_pattern(*flat)} != {expected}")
    elif expected is not None:
        info = entry.traces[-1].info
        layout = alias_layout(*flat, also=info.get("alias_layout_also", ()))
        if layout != info.get("alias_layout", ()):
            failed.append("inputs that share memory sit differently in it (offsets or strides changed): "
                          f"{layout} != {info.get('alias_layout', ())}")
    for value in entry.value_guards:
        check = build_guard([value])
        if check is not None and not check():
            failed.append(f"{value} changed")
    for name, source, t in entry.traces[0].info.get("captured_inputs", ()):
        env: dict[str, Any] = {}
        try:
            now = eval(source.expression(env), env)  # our own generated read of the tensor's source
        except Exception:
            failed.append(f"the tensor {name} read from outside the call is gone")
            continue
        if not isinstance(now, torch.Tensor):
            failed.append(f"{name}, read from outside the call, is no longer a tensor (a {type(now).__name__})")
        elif (now.shape, now.dtype, now.device, now.requires_grad) != (t.shape, t.dtype, t.device, t.requires_grad):
            failed.append(f"the tensor {name} read from outside the call changed: shape {tuple(now.shape)}, {now.dtype}, "
                          f"requires_grad={now.requires_grad} (was {tuple(t.shape)}, {t.dtype}, "
                          f"requires_grad={t.requires_grad})")
    return "; ".join(failed) if failed else "a guard failed"
