"""Running any trace, including ones before executors claimed it, from its printed source."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from minijit.extend import get_executor
from minijit.ir import Trace


def trace_callable(trace: Trace) -> Callable[..., Any]:
    """Compile `trace`'s printed source, binding `prims.*` and `ltorch.*` to the torch executor.

    Lets a user (or a test) run the trace after any pass, not only the final one.
    """
    ex = get_executor("torch")
    namespaces: dict[str, dict[str, Any]] = {"prims": {}, "ltorch": {}}
    for sym, impl in ex.implementations.items():
        # Bound by the names the printed source calls them through (`prims.add`).
        bound = namespaces.get(sym.namespace)
        if bound is not None:
            bound[sym.name] = impl.fn
    ctx = {ns: types.SimpleNamespace(**fns) for ns, fns in namespaces.items()}
    return trace.python_callable(ctx)
