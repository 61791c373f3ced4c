"""Opcode handlers, one per CPython 3.11 opcode, grouped by family (one module each).

| module | family |
| --- | --- |
| `names` | loads and stores of locals, cells, globals, attributes; stack shuffling; imports |
| `calls` | calls, methods, function creation |
| `control` | jumps, iteration, return, yield and `yield from` |
| `exceptions` | raise, the exception table's handlers, `with` |
| `build` | tuples, lists, sets, dicts, slices, strings, unpacking |
| `operators` | unary, binary, comparison and subscript operators |
| `match` | the `match` statement |
"""

from minijit.frontend.opcodes import build, calls, control, exceptions, match, names, operators  # noqa: F401 - fill the table
from minijit.frontend.opcodes.table import HANDLERS

__all__ = ["HANDLERS"]
