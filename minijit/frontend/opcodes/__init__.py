"""Opcode handlers for CPython 3.11, 3.12 and 3.13, grouped by family (one module each).

| module | family |
| --- | --- |
| `names` | loads and stores of locals, cells, globals, attributes; stack shuffling; imports |
| `calls` | calls, method loads (`LOAD_ATTR`'s method bit, `LOAD_SUPER_ATTR`), function creation |
| `control` | jumps, iteration, return, yield and `yield from` |
| `exceptions` | raise, the exception table's handlers, `with`, `except*` |
| `build` | tuples, lists, sets, dicts, slices, strings, unpacking |
| `operators` | unary, binary (and slice), comparison and subscript operators, truth |
| `match` | the `match` statement |
| `intrinsics` | `CALL_INTRINSIC_1`/`CALL_INTRINSIC_2` (3.12+) |

`table.TABLES` holds one table per version; `HANDLERS` is the running version's.
"""

from minijit.frontend.opcodes import (  # noqa: F401 - fill the tables
    build,
    calls,
    control,
    exceptions,
    intrinsics,
    match,
    names,
    operators,
)
from minijit.frontend.opcodes.table import TABLES, running_table
from minijit.frontend.versions import RUNNING, VERSIONS

HANDLERS = TABLES.get(RUNNING, {})

__all__ = ["HANDLERS", "TABLES", "VERSIONS", "running_table"]
