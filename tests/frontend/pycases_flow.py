"""Differential cases for control flow that CPython 3.12 and 3.13 compile differently from 3.11.

`yield from` with send/throw/close (END_SEND and CLEANUP_THROW from 3.12), `except*`
(CHECK_EG_MATCH, and PREP_RERAISE_STAR as an intrinsic from 3.12), `with`, `match`.
Each case is compared with the same Python running it natively.
"""

from __future__ import annotations

import contextlib
import sys

from tests.frontend.cases import case


# -- generators: yield from with send, throw, close (END_SEND, CLEANUP_THROW from 3.12) -----------------
class _Echo:
    """An iterator with send/throw/close written in Python: `yield from` must use them."""

    def __init__(self):
        self.log = []
        self.count = 0

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        self.log.append(("send", value))
        self.count += 1
        if self.count > 3:
            raise StopIteration(("echo done", self.count))
        return ("echo", value)

    def throw(self, exc):
        self.log.append(("throw", type(exc).__name__))
        if isinstance(exc, KeyError):
            raise StopIteration("stopped by throw")
        raise exc

    def close(self):
        self.log.append(("close",))


@case()
def yield_from_python_iterator_send_throw():
    echo = _Echo()

    def outer():
        result = yield from echo
        yield ("result", result)
        return "outer done"
    g = outer()
    out = [next(g), g.send("a"), g.send("b"), g.send("c")]
    try:
        next(g)
    except StopIteration as e:
        out.append(("stop", e.value))
    echo2 = _Echo()

    def outer2():
        r = yield from echo2
        yield ("after", r)
    g2 = outer2()
    out += [next(g2), g2.throw(KeyError("k"))]
    return out, echo.log, echo2.log


@case()
def yield_from_throw_not_caught_by_delegate():
    def inner():
        yield 1
        yield 2

    def outer():
        try:
            yield from inner()
        except ValueError as e:
            yield ("outer caught", str(e))
        yield "end"
    g = outer()
    return next(g), g.throw(ValueError("v")), next(g)


@case()
def yield_from_list_iterator_throw_and_close():
    def outer():
        try:
            yield from [1, 2, 3]
        except KeyError:
            yield "caught at outer yield"
    g = outer()
    first = next(g)
    second = g.throw(KeyError)
    g2 = outer()
    next(g2)
    g2.close()
    return first, second, g2.gi_running


@case()
def yield_from_close_closes_delegate():
    log = []

    def inner():
        try:
            yield "inner"
        finally:
            log.append("inner finally")

    def outer():
        try:
            yield from inner()
        finally:
            log.append("outer finally")
    g = outer()
    next(g)
    g.close()
    echo = _Echo()

    def over_echo():
        yield from echo
    g2 = over_echo()
    next(g2)
    g2.close()
    return log, echo.log


@case()
def yield_from_delegate_returns_during_throw_in_nested_try():
    def inner():
        try:
            yield "inner"
        except ArithmeticError:
            return "handled"

    def outer():
        results = []
        for _ in range(2):
            try:
                results.append((yield from inner()))
            finally:
                results.append("finally")
        yield results
    g = outer()
    return next(g), g.throw(ZeroDivisionError), g.throw(OverflowError)


@case()
def generator_throw_before_start_and_after_end():
    def gen():
        yield 1
    out = []
    for exc in (StopIteration, ValueError("fresh"), GeneratorExit):
        g = gen()
        try:
            g.throw(exc)
        except BaseException as e:
            out.append((type(e).__name__, str(e)))
    g = gen()
    list(g)
    try:
        g.throw(KeyError("after"))
    except KeyError as e:
        out.append(("after end", str(e)))
    return out


@case(4)
def generator_expressions_and_send_none(n):
    g = (i * i for i in range(n))
    first = g.send(None)
    rest = list(g)
    nested = list(x for row in ((i, -i) for i in range(n)) for x in row if x)
    return first, rest, nested, sum(i for i in range(n) if i % 2)

@case()
def stopiteration_thrown_into_yield_from_without_throw():
    def outer():
        value = yield from iter([1, 2])
        yield ("loop ended with", value)
    g = outer()
    first = next(g)
    try:
        return first, g.throw(StopIteration("from throw"))
    except RuntimeError as e:
        return first, str(e)



# -- except* -------------------------------------------------------------------------------------------
def _eg_summary(eg):
    if isinstance(eg, BaseExceptionGroup):
        return (type(eg).__name__, eg.message, [_eg_summary(e) for e in eg.exceptions])
    return (type(eg).__name__, str(eg))


@case()
def except_star_splits_a_group():
    seen = []
    try:
        inner = ExceptionGroup("inner", [ValueError("v2"), KeyError("k")])
        raise ExceptionGroup("many", [ValueError("v1"), TypeError("t"), inner])
    except* ValueError as eg:
        seen.append(("value", _eg_summary(eg), _eg_summary(sys.exception())))
    except* (TypeError, KeyError) as eg:
        seen.append(("type or key", _eg_summary(eg)))
    return seen


@case()
def except_star_unhandled_rest_propagates():
    try:
        try:
            raise ExceptionGroup("g", [ValueError("v"), OSError("o")])
        except* ValueError:
            pass
    except ExceptionGroup as rest:
        return _eg_summary(rest)


@case()
def except_star_naked_exception_is_wrapped():
    out = []
    try:
        raise ValueError("naked")
    except* ValueError as eg:
        out.append(_eg_summary(eg))
    try:
        try:
            raise KeyError("naked key")
        except* ValueError:
            out.append("wrong clause")
    except KeyError as e:
        out.append(("plain re-raise", str(e)))
    return out


@case()
def except_star_raise_and_reraise_inside_clauses():
    try:
        try:
            raise ExceptionGroup("g", [ValueError("v"), TypeError("t"), KeyError("k")])
        except* ValueError:
            raise
        except* TypeError:
            raise RuntimeError("new in clause")
    except BaseExceptionGroup as eg:
        return _eg_summary(eg)


@case()
def except_star_bad_match_types():
    out = []
    for bad in (ExceptionGroup, (ValueError, ExceptionGroup), int):
        try:
            try:
                raise ExceptionGroup("g", [ValueError()])
            except* bad:
                pass
        except TypeError as e:
            out.append(str(e))
    return out


@case()
def except_star_with_finally_and_else():
    log = []
    for fail in (False, True):
        try:
            if fail:
                raise ExceptionGroup("g", [ValueError("x")])
            log.append("body ok")
        except* ValueError:
            log.append("handled")
        else:
            log.append("else")
        finally:
            log.append("finally")
    return log


@case()
def exception_group_notes_and_subgroup():
    eg = ExceptionGroup("top", [ValueError(1), TypeError(2)])
    eg.add_note("a note")
    sub = eg.subgroup(ValueError)
    match, rest = eg.split(lambda e: isinstance(e, TypeError))
    return sub.__notes__, _eg_summary(sub), _eg_summary(match), _eg_summary(rest)


# -- with ----------------------------------------------------------------------------------------------
class _Manager:
    def __init__(self, name, log, suppress=False):
        self.name, self.log, self.suppress = name, log, suppress

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self.name

    def __exit__(self, typ, exc, tb):
        self.log.append(("exit", self.name, typ.__name__ if typ else None))
        return self.suppress


@case(3)
def with_statements_nested_and_suppressing(n):
    log = []
    with _Manager("a", log) as a, _Manager("b", log) as b:
        log.append(("body", a, b))
    with _Manager("s", log, suppress=True):
        raise ValueError("suppressed")
    for i in range(n):
        with _Manager(f"loop{i}", log):
            if i == 0:
                continue
            if i == 1:
                break
    try:
        with _Manager("outer", log), _Manager("inner", log):
            1 / 0
    except ZeroDivisionError:
        log.append("propagated")
    with contextlib.suppress(KeyError):
        {}["missing"]
    return log


@case()
def with_return_value_from_inside():
    log = []

    def f():
        with _Manager("r", log):
            return "from with"
    return f(), log


# -- match ---------------------------------------------------------------------------------------------
class _Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


@case([1, 2, 3], {"kind": "circle", "r": 2, "extra": 1}, _Point(0, 5), _Point(3, 3), (1, (2, 3)), "text", 7.5, True)
def match_patterns(v):
    match v:
        case [1, *rest] if len(rest) == 2:
            return ("list starting with 1", rest)
        case {"kind": "circle", "r": r, **others}:
            return ("circle", r, others)
        case _Point(0, y):
            return ("on y axis", y)
        case _Point(x=a, y=b) if a == b:
            return ("diagonal", a)
        case (1, (2, _) as inner):
            return ("nested", inner)
        case str() | bytes() as text:
            return ("text", text)
        case True:
            return "true"
        case float(f):
            return ("float", f)
        case _:
            return "other"
