"""The core of the bytecode interpreter: run a frame, unwind exceptions, run generators.

`interpret(fn, args, kwargs)` calls `fn` the way CPython would, except that Python
functions (the user's and those they call) are executed here, one instruction at a
time, by the handlers in `minijit.frontend.opcodes`. That lets every call go
through `minijit.frontend.calls.call`, which replaces torch callables by ltorch
symbols (recording them into the active trace), and lets the trace know the user's
source line of every bound symbol.
"""

from __future__ import annotations

import collections.abc
import functools
import sys
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from minijit.errors import UnsupportedSyntaxError, as_eager, reaches_user
from minijit.frontend.code import ASYNC_FLAGS, Inst, binder_for, code_info
from minijit.frontend.frame import GENERATOR, NULL, RETURN, YIELD, Frame, State, current_state, new_interpretation
from minijit.frontend.guards import GuardEntry, Source
from minijit.frontend.lookasides import add_dynamo_lookasides
from minijit.frontend.outside import Outside, OutsideView, check_no_proxy_left
from minijit.frontend.versions import GENERATOR_CONVERTS_STOPITERATION, RUNNING
from minijit.ir import Proxy, current_trace
from minijit.ir.containers import is_container
from minijit.ir.context import where_now
from minijit.ir.symbol import SourceLocation

_RECURSION_LIMIT = 1000  # interpreted frames; each one costs a few Python frames of the interpreter


class _RecursionLimit:
    """The recursion limit, raised for the interpreter's frames while any interpretation runs.

    The limit is the process's, and threads may interpret at once (compiles of different functions):
    the first to start raises it, the last to finish puts it back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._before = 0

    def enter(self) -> None:
        with self._lock:
            if self._running == 0:
                self._before = sys.getrecursionlimit()
                sys.setrecursionlimit(max(self._before, 12 * _RECURSION_LIMIT))
            self._running += 1

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                sys.setrecursionlimit(self._before)


_DEEP_RECURSION = _RecursionLimit()


def run_frame(frame: Frame, throw: BaseException | None = None) -> str:
    """Execute `frame` until it returns, yields or creates a generator; returns which of the three.

    With `throw`, first raise that exception at the instruction the frame is suspended at
    (how `generator.throw` enters a generator).
    """
    insts = frame.insts
    trace = current_trace() if frame.info.is_user else None
    if trace is not None and frame.info.sourceless and trace.source is not None:
        trace = None
    if throw is not None:
        assert frame.suspended_at is not None
        current_state().passthrough = throw  # gen.throw() raises the exception as given, without a new context
        _unwind(frame, frame.suspended_at, throw)
    while True:
        inst = insts[frame.ip]
        if inst.line != frame.line:
            frame.line = inst.line
            if trace is not None:
                trace.source = frame.info.location(inst.line)
        frame.ip = inst.next
        try:
            signal = inst.handler(frame, inst)
        except BaseException as exc:  # user code may catch any exception, so the loop must see all
            _unwind(frame, inst, _as_eager_raised(exc))
            continue
        if signal is not None:
            return signal


def _as_eager_raised(exc: BaseException) -> BaseException:
    """A MetaError for a check torch itself made (an opaque op's meta run, a view) as eager's type too."""
    raised = getattr(exc, "eager_raised", None)
    if raised is None or not reaches_user(exc):
        return exc
    typed = as_eager(exc, raised)  # type: ignore[arg-type]
    if typed is not exc:
        typed.__traceback__, typed.__context__ = exc.__traceback__, exc.__context__
    return typed


def _unwind(frame: Frame, inst: Inst, exc: BaseException) -> None:
    """Jump to the handler of the exception table entry covering `inst`, or re-raise `exc`."""
    state = current_state()
    if exc is state.passthrough:
        state.passthrough = None
    else:
        set_context(exc, state.handled)
    entry = inst.except_entry
    if entry is None:
        if current_trace() is not None or frame.info.is_user:
            passed = state.escapes.setdefault(exc, [])
            location = frame.info.location(inst.line)
            if not passed or passed[-1] != location:  # a comprehension's frame shares its line
                passed.append(location)
        state.passthrough = exc
        raise exc
    target, depth, push_lasti = entry
    del frame.stack[depth:]
    if push_lasti:
        frame.stack.append(inst.offset)
    frame.stack.append(exc)
    frame.ip = target
    if reaches_user(exc):
        # A MinijitError means no trace can be built: `finally` blocks and `__exit__` still run (so
        # e.g. grad mode is restored), but no user `except` may swallow it. Typed `except` clauses
        # never match it (CHECK_EXC_MATCH); a bare `except:` is skipped here, straight to its cleanup.
        handler = frame.insts[target]
        after = frame.insts[handler.next]
        if handler.opname == "PUSH_EXC_INFO" and after.opname == "POP_TOP":
            handler.handler(frame, handler)
            _unwind(frame, after, exc)


def set_context(exc: BaseException, handled: BaseException | None) -> None:
    """Chain `exc` to the exception being handled, as CPython does when an exception is raised."""
    if handled is None or handled is exc:
        return
    # Break a cycle the new link would create (CPython does the same).
    o = handled
    while (ctx := o.__context__) is not None:
        if ctx is exc:
            o.__context__ = None
            break
        o = ctx
    exc.__context__ = handled


def raise_passthrough(exc: BaseException) -> None:
    """Raise `exc` without giving it a new `__context__` (a re-raise)."""
    current_state().passthrough = exc
    raise exc


def new_frame(fn: types.FunctionType, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Frame:
    """A frame for calling the Python function `fn` with its arguments bound."""
    info = code_info(fn.__code__)
    bound = binder_for(fn, info)(*args, **kwargs)
    if (fn.__defaults__ or fn.__kwdefaults__) and id(fn) not in current_state().internal_cells:
        _defaults_are_outside(fn)
    localsplus = list(bound)
    localsplus += [NULL] * (info.n_localsplus - len(localsplus))
    builtins = fn.__builtins__
    if not isinstance(builtins, dict):
        builtins = builtins.__dict__
    return Frame(info, fn, localsplus, fn.__globals__, builtins)


def _defaults_are_outside(fn: types.FunctionType) -> None:
    """Default argument values of a function defined outside the call are objects from outside it."""
    outside = current_state().outside
    code = fn.__code__
    names = code.co_varnames[code.co_argcount - len(fn.__defaults__ or ()):code.co_argcount]
    for name, value in [*zip(names, fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).items()]:
        if isinstance(value, Tensor):
            outside.note_value(value, Source(fn.__defaults__ if name in names else fn.__kwdefaults__, "item",
                                             names.index(name) if name in names else name, name))
        else:
            outside.add_root(value, name)


def run_function(fn: types.FunctionType, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> Any:
    """Interpret a call of the Python function `fn` and return its result (a generator for generator functions)."""
    frame = new_frame(fn, args, kwargs)
    return run_new_frame(frame)


def run_new_frame(frame: Frame) -> Any:
    """Run a fresh frame to its return (or to the creation of its generator)."""
    state = current_state()
    if len(state.frames) >= _RECURSION_LIMIT:
        raise RecursionError("maximum recursion depth exceeded (in the minijit interpreter)")
    trace = current_trace()
    saved_source = trace.source if trace is not None else None
    state.frames.append(frame)
    try:
        signal = run_frame(frame)
    finally:
        state.frames.pop()
        if trace is not None:
            trace.source = saved_source
    if signal is RETURN:
        return frame.retval
    if signal is GENERATOR:
        if frame.code.co_flags & ASYNC_FLAGS:
            raise UnsupportedSyntaxError(
                f"coroutines and async generators ({frame.code.co_qualname}, opcode RETURN_GENERATOR in an "
                f"async def){where_now()} are not supported by the minijit interpreter")
        return InterpretedGenerator(frame)
    raise UnsupportedSyntaxError(f"a yield outside a generator in {frame.code.co_qualname}{where_now()}")


class InterpretedGenerator:
    """A generator whose frame is run by the interpreter; behaves like a native generator.

    Native code (list(), zip(), next()) drives it through `__next__`/`send`, which
    resume the interpreter, so the generator's body is always interpreted.
    """

    __slots__ = ("__weakref__", "exc_value", "finished", "frame", "running", "started")

    def __init__(self, frame: Frame):
        self.frame = frame
        self.running = False
        self.started = False
        self.finished = False
        # The exception being handled inside the generator while it is suspended (its own exc_info).
        self.exc_value: BaseException | None = None

    def __repr__(self) -> str:
        return f"<interpreted generator object {self.frame.code.co_qualname} at {id(self):#x}>"

    @property
    def __name__(self) -> str:
        """The generator function's name."""
        return self.frame.code.co_name

    @property
    def gi_running(self) -> bool:
        """True while the generator's body runs."""
        return self.running

    @property
    def gi_code(self) -> types.CodeType:
        """The generator function's code."""
        return self.frame.code

    def __iter__(self) -> InterpretedGenerator:
        return self

    def __next__(self) -> Any:
        return self._resume(None, None)

    def send(self, value: Any) -> Any:
        """Resume the generator with `value` as the result of its `yield`."""
        if not self.started and value is not None and not self.finished:
            raise TypeError("can't send non-None value to a just-started generator")
        return self._resume(value, None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Raise an exception at the generator's `yield` (delegating to a `yield from` target first)."""
        exc = _make_exception(typ, val)
        if tb is not None:
            exc = exc.with_traceback(tb)
        if self.finished:
            raise exc
        delegate = self._delegate()
        if delegate is not None:
            if isinstance(exc, GeneratorExit):
                _close_iter(delegate)
            else:
                throw = getattr(delegate, "throw", None)
                if throw is not None:
                    try:
                        return self._call_running(throw, exc)
                    except StopIteration as stop:
                        return self._delegate_returned(stop.value)
                    except BaseException as raised:  # the delegate's exception enters this generator
                        return self._resume(None, raised)
        return self._resume(None, exc)

    def close(self) -> None:
        """Raise GeneratorExit inside the generator; it must not yield again."""
        if self.finished:
            return
        if not self.started:
            self.finished = True
            return
        try:
            self.throw(GeneratorExit)
        except (GeneratorExit, StopIteration):
            return
        raise RuntimeError("generator ignored GeneratorExit")

    def __del__(self) -> None:
        # CPython closes an unfinished generator when it is collected (running its finally blocks).
        if self.started and not self.finished and not self.running:
            try:
                self.close()
            except Exception:
                pass

    def _delegate(self) -> Any:
        """The iterator a suspended `yield from` delegates to, if any."""
        frame = self.frame
        at = frame.suspended_at
        if at is None or at.opname != "YIELD_VALUE":
            return None
        nxt = frame.insts[at.next]
        # RESUME's low two bits say where it is: 2 after a `yield from` (3.13 adds an except-depth bit).
        if nxt is not None and nxt.opname == "RESUME" and (nxt.arg & 3) >= 2 and frame.stack:
            return frame.stack[-1]
        return None

    def _delegate_returned(self, value: Any) -> Any:
        """The `yield from` delegate returned `value` while a throw went through it: go on as the loop's
        SEND does when its receiver returns (each version leaves the loop its own way)."""
        frame = self.frame
        # Every version lays out the loop as SEND; YIELD_VALUE; RESUME; JUMP_BACKWARD_NO_INTERRUPT (to SEND).
        jump = frame.insts[frame.insts[frame.suspended_at.next].next]
        frame.stack[-1] = _Returned(value)
        frame.ip = jump.argval // 2
        return self._resume(None, None)

    def _call_running(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.running:
            raise ValueError("generator already executing")
        self.running = True
        try:
            return fn(*args)
        finally:
            self.running = False

    def _resume(self, value: Any, exc: BaseException | None) -> Any:
        if self.running:
            raise ValueError("generator already executing")
        if self.finished:
            if exc is not None:
                raise exc
            raise StopIteration
        frame = self.frame
        state = current_state()
        trace = current_trace()
        saved_source = trace.source if trace is not None else None
        outer_handled = state.handled
        if self.exc_value is not None:
            state.handled = self.exc_value
        self.running = True
        self.started = True
        state.frames.append(frame)
        try:
            # The sent value is pushed even for a throw (as CPython does): the handler's depth may include it.
            frame.stack.append(value)
            frame.line = None  # the consumer's line is current now: set the generator's again
            signal = run_frame(frame, exc)
        except StopIteration as stop:
            self.finished = True
            if not GENERATOR_CONVERTS_STOPITERATION[RUNNING]:
                raise
            err = RuntimeError("generator raised StopIteration")
            err.__cause__ = err.__context__ = stop
            raise_passthrough(err)
        except BaseException:
            self.finished = True
            raise
        finally:
            self.running = False
            state.frames.pop()
            if trace is not None:
                trace.source = saved_source
            self.exc_value = state.handled if state.handled is not outer_handled else None
            state.handled = outer_handled
        if signal is YIELD:
            return frame.retval
        self.finished = True
        result = frame.retval
        raise_passthrough(StopIteration() if result is None else StopIteration(result))


collections.abc.Generator.register(InterpretedGenerator)


class _Returned:
    """Stands for a `yield from` delegate that has returned `value`: SEND's next() on it raises StopIteration(value)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __iter__(self) -> _Returned:
        return self

    def __next__(self) -> Any:
        raise StopIteration(self.value)


def _close_iter(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _make_exception(typ: Any, val: Any) -> BaseException:
    if isinstance(typ, BaseException):
        if val is not None:
            raise TypeError("instance exception may not have a separate value")
        return typ
    if isinstance(typ, type) and issubclass(typ, BaseException):
        if isinstance(val, typ):
            return val
        if val is None:
            return typ()
        return typ(*val) if isinstance(val, tuple) else typ(val)
    raise TypeError(f"exceptions must be classes or instances deriving from BaseException, not {type(typ).__name__}")


@dataclass(frozen=True)
class Escaped:
    """An exception the interpreted code raised that escaped it, the user's line it was raised at, and whether the
    code had written into objects from outside the call (or printed: effects, `minijit.frontend.outside`) by then.

    The code's own: a `raise`, an error of an op or of the Python code it ran (one standing for eager's
    error, `minijit.errors.as_eager`, included). Not a `MinijitError` refusing the code, nor an exception
    raised after the code returned, nor a KeyboardInterrupt no `raise` statement of the code made (Ctrl-C
    interrupting minijit, at whatever point it reached).
    """

    error: BaseException
    where: SourceLocation | None
    wrote_outside: bool


def _escaped(state: State, exc: BaseException) -> Escaped | None:
    """`exc` as an `Escaped`, where it is one (see there)."""
    locations = state.escapes.get(exc)
    if not locations or reaches_user(exc):
        return None
    if isinstance(exc, KeyboardInterrupt) and not any(e is exc for e in state.raised):
        return None
    return Escaped(exc, locations[0], bool(state.outside.effects))


def interpret(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              guard_roots: Iterable[Any] = (), finish: Callable[[Any, Outside], Any] | None = None,
              view: OutsideView | None = None, guards: list[GuardEntry] | None = None,
              escaped: list[Escaped] | None = None) -> Any:
    """Run `fn(*args, **kwargs)` through the interpreter, recording tensor ops into the current trace.

    Works outside tracing too (then it only runs the function). The guards for the
    values the code read from outside the call are appended to `guards`. The
    arguments and `guard_roots` (e.g. every module of a jitted nn.Module) are roots
    (minijit.frontend.outside): reads from them are guarded, writes into them logged.
    `finish(result, outside)`, if given, runs before the writes are undone and returns
    what `interpret` returns. `view` is what the caller has traced code see in place of
    what objects from outside hold (a jitted module's parameters: their proxies), and the
    reads its cache key covers (minijit.frontend.outside.OutsideView). Where the code raises
    an exception of its own (`Escaped`), it is appended to `escaped` before it propagates.

    Example::

        guards: list[GuardEntry] = []
        with tracing(trace):
            out = interpret(f, (x_proxy,), {}, guards=guards)
    """
    add_dynamo_lookasides()
    with new_interpretation(handled=sys.exc_info()[1]) as state:
        return _interpret(state, fn, args, kwargs, guard_roots, finish, view, guards, escaped)


def _interpret(state: State, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               guard_roots: Iterable[Any], finish: Callable[[Any, Outside], Any] | None,
               view: OutsideView | None, guards: list[GuardEntry] | None, escaped: list[Escaped] | None) -> Any:
    from minijit.frontend.calls import call

    outside = state.outside
    for root in guard_roots:
        outside.add_root(root, "self")
    for name, bound in _bound_values(fn):
        outside.add_root(bound, name)
    if view is not None:
        outside.take_view(view)
    # Arguments that are objects are the caller's own; containers (dataclasses included) were
    # rebuilt around proxies for this call (minijit.runtime.arguments), so they are not.
    for name, value in [*zip(_argument_names(fn, len(args)), args), *kwargs.items()]:
        if hasattr(value, "__dict__") and not isinstance(value, Proxy) and not is_container(value):
            outside.add_root(value, name)
        outside.note_iterator(value, name)
    trace = current_trace()
    _DEEP_RECURSION.enter()
    try:
        result = call(fn, args, kwargs)
        if finish is not None:
            result = finish(result, outside)
    except BaseException as exc:
        # The traceback shows the interpreter's frames; the note shows the user's.
        locations = state.escapes.get(exc)
        if locations:
            lines = "\n".join(f"  {loc.filename}:{loc.lineno}  {loc.text}" for loc in reversed(locations))
            exc.add_note(f"raised in code traced by minijit (most recent call last):\n{lines}")
        own = _escaped(state, exc) if escaped is not None else None
        if own is not None:
            escaped.append(own)
        raise
    finally:
        _DEEP_RECURSION.leave()
        outside.restore()
        if guards is not None:
            guards.extend(state.guards.values())
    if trace is not None:
        check_no_proxy_left(outside)
    return result


def _bound_values(fn: Any) -> list[tuple[str, Any]]:
    """What a bound method or a functools.partial carries from outside: its `self`, its bound arguments."""
    if isinstance(fn, types.MethodType):
        return [("self", fn.__self__), *_bound_values(fn.__func__)]
    if isinstance(fn, functools.partial):
        found = [(f"arg{i}", a) for i, a in enumerate(fn.args)] + list(fn.keywords.items())
        return [(n, v) for n, v in found if not isinstance(v, Proxy)] + _bound_values(fn.func)
    return []


def _argument_names(fn: Any, n: int) -> list[str]:
    code = getattr(fn, "__code__", None)
    names = list(code.co_varnames[:code.co_argcount]) if code is not None else []
    return names + [f"arg{i}" for i in range(len(names), n)]


__all__ = ["Escaped", "InterpretedGenerator", "interpret", "raise_passthrough", "run_frame", "run_function", "set_context"]
