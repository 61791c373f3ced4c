"""Looking at traces: print one (highlighted in a terminal), or what a pass changed."""

from __future__ import annotations

import difflib
import sys
from typing import IO, Any

from minijit.ir import Trace


def _find_trace(traces: list[Trace], name: str | int) -> Trace:
    if isinstance(name, int):
        return traces[name]
    matches = [t for t in traces if t.pass_name == name]
    if not matches:
        raise KeyError(f"no trace after a pass named {name!r}; passes: {[t.pass_name for t in traces]}")
    return matches[-1]


def trace_text(jfn: Any, which: str | int = "forward") -> str:
    """The text `show` prints: 'forward', 'backward', 'prologue', 'epilogue' (what a call runs around the trace),
    or the trace after a named pass."""
    if which == "prologue":
        return jfn.last_prologue()
    if which == "epilogue":
        return jfn.last_epilogue()
    if which == "forward":
        return str(jfn.last_traces()[-1])
    if which == "backward":
        backward = getattr(jfn, "last_backward_traces", None)
        traces = backward() if backward is not None else []
        if not traces:
            raise RuntimeError("the last call has no backward trace (no input required grad)")
        return str(traces[-1])
    return str(_find_trace(jfn.last_traces(), which))


def _emit(text: str, lexer: str, file: IO[str] | None) -> None:
    out = file if file is not None else sys.stdout
    if out.isatty():
        try:
            from rich.console import Console
            from rich.syntax import Syntax
        except ImportError:
            pass
        else:
            Console(file=out).print(Syntax(text, lexer, theme="ansi_dark", word_wrap=True))
            return
    out.write(text if text.endswith("\n") else text + "\n")


def show(jfn: Any, which: str | int = "forward", *, file: IO[str] | None = None) -> None:
    """Print a trace of the last call: highlighted with rich in a terminal, plain text elsewhere."""
    _emit(trace_text(jfn, which), "python", file)


def diff_text(jfn: Any, pass_a: str | int, pass_b: str | int) -> str:
    """A unified diff between the traces after two passes of the last call."""
    traces = jfn.last_traces()
    a, b = _find_trace(traces, pass_a), _find_trace(traces, pass_b)
    lines = difflib.unified_diff(a.python().splitlines(), b.python().splitlines(),
                                 fromfile=f"after {a.pass_name}", tofile=f"after {b.pass_name}", lineterm="")
    return "\n".join(lines) + "\n"


def show_diff(jfn: Any, pass_a: str | int, pass_b: str | int, *, file: IO[str] | None = None) -> None:
    """Print what changed in the trace between two passes (names or positions in last_traces)."""
    _emit(diff_text(jfn, pass_a, pass_b), "diff", file)
