"""Capture: run the user's function through a bytecode interpreter on proxies and record a trace.

`interpret(fn, args, kwargs)` is the entry point; `guards.build_guard` turns the
guard entries it leaves in `trace.info["guards"]` into one checking function.
"""

from minijit.frontend.guards import GuardEntry, build_guard
from minijit.frontend.interpreter import InterpretedGenerator, interpret

__all__ = ["GuardEntry", "InterpretedGenerator", "build_guard", "interpret"]
