"""The opcode tables: the running version's table names only its opcodes and covers every one ordinary code can meet."""

from __future__ import annotations

import dis

import pytest

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.opcodes import HANDLERS, TABLES, VERSIONS, running_table, table
from minijit.frontend.versions import RUNNING

# The opcodes the interpreter does not handle, and why; every other opcode of the running version has a handler.
NOT_HANDLED = {
    "async code: calling a coroutine or async generator function is refused first": {
        "BEFORE_ASYNC_WITH", "END_ASYNC_FOR", "GET_AITER", "GET_ANEXT", "GET_AWAITABLE", "ASYNC_GEN_WRAP"},
    "module level or the REPL only, which the interpreter never runs": {"IMPORT_STAR", "PRINT_EXPR"},
    "never in compiled code (placeholders, the specializing interpreter's own)": {
        "CACHE", "RESERVED", "INTERPRETER_EXIT", "ENTER_EXECUTOR", "EXIT_INIT_CHECK"},
}


def _real_opcodes() -> set[str]:
    """The running version's opcodes, without pseudo-instructions (numbered from 256) and instrumented twins."""
    return {name for name, op in dis.opmap.items() if op < 256 and not name.startswith("INSTRUMENTED_")}


def test_there_is_a_table_for_the_running_version():
    assert RUNNING in VERSIONS and set(TABLES) == set(VERSIONS)
    assert running_table() is HANDLERS


def test_table_names_only_opcodes_of_the_running_version():
    assert set(HANDLERS) <= _real_opcodes()


def test_table_covers_every_opcode_of_the_running_version():
    refused = set().union(*NOT_HANDLED.values())
    assert _real_opcodes() - set(HANDLERS) == _real_opcodes() & refused


def test_an_unknown_version_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(table, "RUNNING", "3.99")
    with pytest.raises(UnsupportedSyntaxError) as info:
        running_table()
    assert "3.99" in str(info.value) and all(v in str(info.value) for v in VERSIONS)


def test_one_handler_per_opcode_and_version():
    with pytest.raises(ValueError, match="two handlers"):
        table.handles("NOP", since=RUNNING, until=RUNNING)(lambda frame, inst: None)
    assert HANDLERS["NOP"].__name__ == "nop"
