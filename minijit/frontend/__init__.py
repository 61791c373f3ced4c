"""Capture: run the user's function through a bytecode interpreter on proxies and record a trace.

`interpret(fn, args, kwargs)` runs `fn` like CPython (3.11, 3.12 or 3.13: the running one) would,
one instruction at a time, so that every call can be inspected before it happens. The pieces:

- `code`: decodes a code object once into `Inst`s (handler, argument, successor, line,
  exception-table entry), and binds arguments through CPython itself (a "binder" copy of
  the function whose body returns its argument slots: exact errors for free).
- `frame`: the `Frame` (slots, value stack, position) and the per-interpretation `State` (`current_state()`, in a ContextVar)
  (frame stack, the exception being handled, the guards read so far).
- `interpreter`: the loop (`run_frame`), exception unwinding through the exception
  table, generators (`InterpretedGenerator`), and the `interpret` entry point.
- `opcodes/`: one handler per opcode, one module per family, and one table per CPython version
  mapping opcode names to handlers (`HANDLERS` is the running version's).
- `calls`: what a call does: ltorch symbol for a torch callable, lookaside, interpret
  Python code, or run natively after checking that no proxy goes where it cannot.
- `lookasides`: replacements for builtins that must see the interpreter's view
  (`super()`, `isinstance(proxy, torch.Tensor)`, ...; in `interpreted_lookasides`, those that run
  Python code through the interpreter: `map(f, ...)`, class bodies, ...);
  `nondeterminism`: torch's RNG state calls recorded into the trace, and Python's random,
  numpy.random, clocks and entropy refused (their values would be frozen at trace time);
  `scan`: `associative_scan` traced as the scan it computes.
- `guards`: `GuardEntry` (a value the trace read and where from) and `build_guard`, which
  compiles one function checking that they all still hold.

The trace's bound symbols get the innermost user line as their source (`trace.source`),
and `interpret(..., guards=entries)` appends the guard entries of the run to `entries`.

Example::

    trace, entries = Trace(), []
    with tracing(trace):
        x = trace.add_input(TensorProxy((2,), torch.float32, torch.device("cpu")), "x")
        trace.output = interpret(fn, (x,), {}, guards=entries)
    check = build_guard(entries)
"""

from minijit.frontend import (
    autograd_function,  # noqa: F401  (registers the Function.apply lookaside)
    backward,  # noqa: F401  (registers backward() and torch.autograd.grad)
    communication,  # noqa: F401  (refuses torch.distributed's calls without traced tensors)
    foreach,  # noqa: F401  (registers the torch._foreach_* lookasides)
    func_transforms,  # noqa: F401  (registers torch.func.grad, grad_and_value and vmap)
    interpreted_lookasides,  # noqa: F401  (registers map, len, getattr, class statements, checkpoint, ...)
    module_hooks,  # noqa: F401  (registers the BackwardHook lookaside: modules' full backward hooks)
    nondeterminism,  # noqa: F401  (registers the RNG, clock and entropy lookasides)
    scan,  # noqa: F401  (registers the associative_scan lookaside)
)

# Call dispatch and the opcode table import the interpreter, which therefore imports them
# lazily; loading them with the package keeps that import out of the first jitted call.
from minijit.frontend import calls as _calls  # noqa: F401
from minijit.frontend import opcodes as _opcodes  # noqa: F401
from minijit.frontend.guards import GuardEntry, build_guard
from minijit.frontend.interpreter import InterpretedGenerator, interpret

__all__ = ["GuardEntry", "InterpretedGenerator", "build_guard", "interpret"]
