"""The tables from opcode names to handlers, one per supported CPython version, filled in by the family modules.

Each CPython version's bytecode is its own instruction set: `TABLES["3.12"]` says what
every 3.12 opcode does. A handler registers for the versions whose opcode it implements
(`since`/`until`, default every version). Where an opcode's meaning changed (3.12's
LOAD_ATTR gained a method bit, 3.13's CALL takes `self` after the callable), the new
meaning is a second handler registered for the new versions, next to the old one, so each
change reads as one function; no handler asks `sys.version_info`. docs/python-versions.md
lists the changes version by version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.versions import RUNNING, VERSIONS, version_key

# version -> opname -> handler(frame, inst) returning None to go on, or a signal (RETURN, YIELD, GENERATOR) to stop.
TABLES: dict[str, dict[str, Callable[..., Any]]] = {v: {} for v in VERSIONS}


Handler = Callable[..., Any]


def handles(*opnames: str, since: str = VERSIONS[0], until: str = VERSIONS[-1]) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of `opnames` in the tables of versions `since`..`until`."""
    versions = [v for v in VERSIONS if version_key(since) <= version_key(v) <= version_key(until)]
    if not versions:
        raise ValueError(f"no supported version between {since} and {until}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for version in versions:
            table = TABLES[version]
            for name in opnames:
                if name in table:
                    raise ValueError(f"opcode {name} has two handlers on Python {version}")
                table[name] = fn
        return fn

    return register


def running_table() -> dict[str, Callable[..., Any]]:
    """The table of the Python running now; a clear error on a version the interpreter does not know."""
    table = TABLES.get(RUNNING)
    if table is None:
        raise UnsupportedSyntaxError(
            f"the minijit interpreter runs the bytecode of CPython {', '.join(VERSIONS)}, not of Python {RUNNING}; "
            f"run minijit on one of those versions")
    return table


__all__ = ["TABLES", "handles", "running_table"]
