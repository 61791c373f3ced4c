"""minijit's environment variables, each read and checked in one place.

| variable | value | what it does |
| --- | --- | --- |
| `MINIJIT_WARN_RETRACES` | an int N >= 0 | warn (`RetraceWarning`) on every trace after the first N of a jitted function |
| `MINIJIT_DUMP_TRACES` | a directory | append each compile's final traces to a file per pytest test there |
| `MINIJIT_CHECK_TRACES` | `0`, `1`, or unset | `0`: no trace checks; `1`: verify the trace after every pass |

A value that means nothing is an `EnvironmentVariableError` naming the variable and what it takes: at
`import minijit`, and again where the variable is read (a program may set it after the import).
"""

from __future__ import annotations

import os

from minijit.errors import EnvironmentVariableError


def _value(name: str) -> str:
    return os.environ.get(name, "")


def warn_retraces() -> int | None:
    """`MINIJIT_WARN_RETRACES`: after how many traces a jitted function warns on each new one; None where unset."""
    value = _value("MINIJIT_WARN_RETRACES").strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise EnvironmentVariableError(f"MINIJIT_WARN_RETRACES={value!r}: expected a whole number of traces (0 or "
                                       "more) after which a jitted function warns on each new trace")
    return n


def dump_traces_folder() -> str | None:
    """`MINIJIT_DUMP_TRACES`: the directory the final traces are appended into; None where unset."""
    folder = _value("MINIJIT_DUMP_TRACES")
    if not folder:
        return None
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise EnvironmentVariableError(f"MINIJIT_DUMP_TRACES={folder!r}: expected a directory to write traces into, "
                                       "but that path is a file")
    return folder


CHECK_LEVELS = ("", "0", "1")


def check_traces() -> str:
    """`MINIJIT_CHECK_TRACES`: "" (unset: the default checks), "0" (none) or "1" (the verifier after every pass)."""
    value = _value("MINIJIT_CHECK_TRACES").strip()
    if value not in CHECK_LEVELS:
        raise EnvironmentVariableError(f"MINIJIT_CHECK_TRACES={value!r}: expected 0 (no trace checks) or 1 (verify "
                                       "the trace after every pass), or leave it unset")
    return value


def check_all() -> None:
    """Read every variable, raising on the first that means nothing (at `import minijit`)."""
    warn_retraces()
    dump_traces_folder()
    check_traces()
