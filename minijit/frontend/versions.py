"""The CPython versions whose bytecode the interpreter runs, and which one is running.

What each version's opcodes mean lives in one table per version (`opcodes/table.py`);
the few facts about a version that are not an opcode's meaning live here, named.
docs/python-versions.md lists the changes version by version.
"""

from __future__ import annotations

import sys

# Oldest first.
VERSIONS = ("3.11", "3.12", "3.13")
RUNNING = f"{sys.version_info[0]}.{sys.version_info[1]}"

# Whether the generator object turns a StopIteration leaving the generator's frame into a RuntimeError
# (3.11). From 3.12 the generator's own bytecode does it (CALL_INTRINSIC_1 INTRINSIC_STOPITERATION_ERROR),
# so one thrown into a generator that has not started yet stays a StopIteration.
GENERATOR_CONVERTS_STOPITERATION = {"3.11": True, "3.12": False, "3.13": False}


def version_key(version: str) -> tuple[int, int]:
    """"3.12" -> (3, 12), for ordering versions."""
    major, minor = version.split(".")
    return int(major), int(minor)


__all__ = ["GENERATOR_CONVERTS_STOPITERATION", "RUNNING", "VERSIONS", "version_key"]
