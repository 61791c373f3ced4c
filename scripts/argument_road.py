"""Follow a call's arguments through minijit while a call compiles: which modules hand them to which.

A module is on the road when one of its functions is called with an argument (a tensor or container
the call was given, the tuple of them, or a list or tuple holding them); the body of the traced
function (the interpreter and the ops it records) is left out. A hand-off is a distinct (caller
module -> callee module) pair of such calls; a climb is a hand-off from a lower layer back up to a
higher one (tests/test_layering.py: a callback, such as a flattener's leaf test defined upstairs).

Run: PYTHONPATH=. python scripts/argument_road.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import minijit
from tests.test_layering import layer_of


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def f(x, xs, n, pair, y):
    y.add_(1)
    return x * n + xs[0] + xs[1] + pair.a * pair.b + y


def road(symbolic: bool) -> tuple[list[tuple[str, str]], set[tuple[str, str]]]:
    """(module, function) of each call on the road, and the (caller, callee) module pairs, for one compiling call."""
    base = torch.randn(8)
    args = (torch.randn(4), [torch.randn(4), torch.randn(4)], 3.5, Pair(torch.randn(4), torch.randn(4)), base[:4])
    tracked = {id(args), *(id(a) for a in args if not isinstance(a, float)), *(id(t) for t in args[1]),
               id(args[3].a), id(args[3].b)}
    calls: list[tuple[str, str]] = []
    edges: set[tuple[str, str]] = set()
    inside = [0]

    def holds(v: Any, depth: int = 0) -> bool:
        if id(v) in tracked:
            return True
        if depth < 2 and type(v) in (list, tuple):
            return any(holds(w, depth + 1) for w in v)
        if depth < 2 and type(v) is dict:
            return any(holds(w, depth + 1) for w in v.values())
        return False

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if code.co_name in ("interpret", "_interpret") and module.startswith("minijit.frontend"):
            inside[0] += 1 if event == "call" else -1 if event == "return" else 0
            return
        if event != "call" or inside[0] or not module.startswith("minijit"):
            return
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
        if any(holds(frame.f_locals.get(n)) for n in code.co_varnames[:count]):
            calls.append((module, code.co_name))
            caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
            if caller.startswith("minijit") and caller != module:
                edges.add((caller, module))

    jf = minijit.jit(f, cache="symbolic values" if symbolic else "constant values")
    sys.setprofile(profile)
    try:
        jf(*args)
    finally:
        sys.setprofile(None)
    return calls, edges


def main() -> None:
    for symbolic in (False, True):
        calls, edges = road(symbolic)
        modules = sorted({m for m, _ in calls})
        up = {e for e in edges if layer_of(e[1])[1] > layer_of(e[0])[1]}
        print(f"{'symbolic' if symbolic else 'constant'} values: {len(modules)} modules, {len(edges)} hand-offs, "
              f"{len(up)} climbs back up a layer")
        functions: dict[str, set[str]] = {}
        for m, fn in calls:
            functions.setdefault(m, set()).add(fn)
        for m in modules:
            print(f"  {m}: {', '.join(sorted(functions[m]))}")
        for caller, callee in sorted(edges):
            print(f"    {'UP ' if (caller, callee) in up else '   '}{caller} -> {callee}")


if __name__ == "__main__":
    main()
