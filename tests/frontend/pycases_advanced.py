"""Differential cases: generators, exceptions, with statements."""

# ruff: noqa: F841, UP028
from __future__ import annotations

import contextlib
import itertools

from tests.frontend.cases import case


# -- generators ------------------------------------------------------------------------------------
def _countdown(n):
    while n > 0:
        yield n
        n -= 1
    return "done"


@case(4)
def generator_basic(n):
    return list(_countdown(n)), sum(_countdown(n)), list(zip(_countdown(n), "abcdef"))


@case(3)
def generator_send(n):
    def acc():
        total = 0
        while True:
            x = yield total
            if x is None:
                break
            total += x
        return total
    g = acc()
    out = [next(g)]
    for i in range(n):
        out.append(g.send(i * 10))
    try:
        g.send(None)
    except StopIteration as e:
        out.append(("stop", e.value))
    return out


@case(3)
def yield_from_return_value(n):
    def inner():
        yield 1
        yield 2
        return n * 100

    def outer():
        r = yield from inner()
        yield r
        yield from [7, 8]
        yield from range(n)
    return list(outer())


@case()
def yield_from_send_through():
    def inner():
        got = []
        while len(got) < 3:
            got.append((yield len(got)))
        return got

    def outer():
        result = yield from inner()
        yield ("inner returned", result)
    g = outer()
    out = [next(g), g.send("a"), g.send("b"), g.send("c")]
    return out


@case()
def generator_close_runs_finally():
    log = []

    def gen():
        try:
            yield 1
            yield 2
        finally:
            log.append("finally")
    g = gen()
    next(g)
    g.close()
    g.close()
    return log, list(g)


@case()
def generator_throw_caught():
    def gen():
        while True:
            try:
                yield "ready"
            except ValueError as e:
                yield f"caught {e}"
    g = gen()
    return next(g), g.throw(ValueError("boom")), next(g), g.throw(ValueError, ValueError("again"))


@case()
def generator_throw_uncaught():
    def gen():
        yield 1
    g = gen()
    next(g)
    try:
        g.throw(KeyError("k"))
    except KeyError as e:
        return "propagated", str(e), list(g)


@case()
def generator_throw_into_yield_from():
    log = []

    def inner():
        try:
            yield "in"
        except RuntimeError:
            log.append("inner caught")
            return "inner result"

    def outer():
        r = yield from inner()
        log.append(r)
        yield "after"
    g = outer()
    first = next(g)
    second = g.throw(RuntimeError)
    return first, second, log


@case()
def generator_ignores_exit():
    def gen():
        try:
            yield 1
        except GeneratorExit:
            yield 2
    g = gen()
    next(g)
    try:
        g.close()
    except RuntimeError as e:
        return str(e)


@case()
def generator_raises_stopiteration():
    def gen():
        yield 1
        raise StopIteration("bad")
    try:
        return list(gen())
    except RuntimeError as e:
        return str(e), type(e.__cause__).__name__


@case(5)
def generator_pipeline(n):
    def nums():
        yield from range(n * 2)

    def evens(xs):
        for x in xs:
            if x % 2 == 0:
                yield x

    def squares(xs):
        return (x * x for x in xs)
    return list(squares(evens(nums()))), list(itertools.islice(evens(itertools.count()), 3))


@case()
def generator_early_exit_zip():
    log = []

    def gen(tag):
        try:
            for i in range(10):
                yield f"{tag}{i}"
        finally:
            log.append(tag)
    pairs = list(zip(gen("a"), range(3)))
    return pairs


@case()
def generator_send_to_unstarted():
    def gen():
        yield 1
    try:
        gen().send(5)
    except TypeError as e:
        return str(e)


@case(4)
def generator_state(n):
    def gen():
        yield 1
    g = gen()
    a = g.gi_running
    vals = list(g)
    return a, vals, next(g, "default")


@case(3)
def generator_with_return_in_finally(n):
    def gen():
        try:
            for i in range(n):
                yield i
        finally:
            return
    return list(gen())


# -- exceptions ------------------------------------------------------------------------------------
@case(0, 1, 2)
def try_except_else_finally(k):
    log = []
    try:
        log.append("try")
        if k == 1:
            raise ValueError("one")
        if k == 2:
            raise KeyError("two")
    except ValueError as e:
        log.append(f"value {e}")
    except (KeyError, IndexError) as e:
        log.append(f"lookup {e!r}")
    else:
        log.append("else")
    finally:
        log.append("finally")
    return log


@case(3)
def finally_with_return_break_continue(n):
    log = []

    def f():
        try:
            return "try"
        finally:
            log.append("f-finally")

    def g():
        try:
            return "try"
        finally:
            return "finally wins"

    for i in range(n):
        try:
            if i == 0:
                continue
            if i == 2:
                break
            log.append(i)
        finally:
            log.append(f"loop-finally {i}")
    return f(), g(), log


@case()
def nested_try_finally():
    log = []
    try:
        try:
            try:
                raise ValueError("inner")
            finally:
                log.append("f1")
        except TypeError:
            log.append("wrong")
        finally:
            log.append("f2")
    except ValueError as e:
        log.append(f"outer caught {e}")
    return log


@case()
def exception_chaining():
    try:
        try:
            {}["k"]
        except KeyError as e:
            raise ValueError("converted") from e
    except ValueError as v:
        a = (type(v.__cause__).__name__, v.__suppress_context__)
    try:
        try:
            1 / 0
        except ZeroDivisionError:
            raise TypeError("during handling")
    except TypeError as t:
        b = (type(t.__context__).__name__, t.__cause__, t.__suppress_context__)
    try:
        try:
            1 / 0
        except ZeroDivisionError:
            raise TypeError("suppressed") from None
    except TypeError as t:
        c = (type(t.__context__).__name__, t.__cause__, t.__suppress_context__)
    return a, b, c


@case()
def implicit_context_from_native_error():
    try:
        try:
            raise KeyError("first")
        except KeyError:
            int("not a number")
    except ValueError as e:
        return type(e.__context__).__name__, str(e)


@case()
def bare_reraise():
    log = []
    try:
        try:
            raise IndexError("idx")
        except IndexError:
            log.append("handling")
            raise
    except IndexError as e:
        log.append(str(e))
    return log


@case()
def reraise_outside_handler():
    raise


@case()
def exception_variable_cleared():
    try:
        raise ValueError
    except ValueError as e:
        pass
    return "e" in dir()


@case()
def custom_exception_class():
    class MyError(Exception):
        def __init__(self, code, msg):
            super().__init__(f"[{code}] {msg}")
            self.code = code

    class SubError(MyError):
        pass
    try:
        raise SubError(42, "bad thing")
    except MyError as e:
        return str(e), e.code, type(e).__name__, isinstance(e, Exception)


@case()
def raise_class_and_bad_raise():
    out = []
    try:
        raise ValueError
    except ValueError as e:
        out.append(repr(e))
    try:
        raise 5
    except TypeError as e:
        out.append(str(e))
    try:
        try:
            pass
        except 5:
            pass
        raise KeyError
    except KeyError:
        out.append("key")
    return out


@case()
def except_non_exception_class():
    try:
        raise ValueError
    except int:  # the type check happens only when matching
        pass


@case()
def handled_exception_visible_in_callee():
    import sys

    def who():
        return type(sys.exc_info()[1]).__name__
    try:
        raise LookupError
    except LookupError:
        inside = who()
    return inside, who()


@case()
def exception_in_generator_propagates():
    def gen():
        yield 1
        raise ValueError("from gen")
    out = []
    try:
        for x in gen():
            out.append(x)
    except ValueError as e:
        out.append(str(e))
    return out


@case(5)
def deep_recursion_error_type(n):
    def down(k):
        if k == 0:
            raise ArithmeticError(f"bottom at {n}")
        return down(k - 1)
    try:
        down(n)
    except ArithmeticError as e:
        return str(e)


# -- with statements -------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, log, name, swallow=False):
        self.log, self.name, self.swallow = log, name, swallow

    def __enter__(self):
        self.log.append(f"enter {self.name}")
        return self.name.upper()

    def __exit__(self, et, ev, tb):
        self.log.append(f"exit {self.name} {et.__name__ if et else None}")
        return self.swallow


@case()
def with_statement_paths():
    log = []
    with _Recorder(log, "a") as a, _Recorder(log, "b") as b:
        log.append(a + b)
    with _Recorder(log, "s", swallow=True):
        raise ValueError
    try:
        with _Recorder(log, "p"):
            raise KeyError
    except KeyError:
        log.append("propagated")

    def ret():
        with _Recorder(log, "r"):
            return "returned"
    log.append(ret())
    for i in range(3):
        with _Recorder(log, f"l{i}"):
            if i == 1:
                break
    return log


@case()
def contextmanager_generator():
    log = []

    @contextlib.contextmanager
    def managed(tag):
        log.append(f"setup {tag}")
        try:
            yield tag * 2
        except ZeroDivisionError:
            log.append("handled zde")
        finally:
            log.append(f"teardown {tag}")
    with managed("x") as v:
        log.append(v)
    with managed("y"):
        1 / 0
    with contextlib.suppress(KeyError):
        {}["k"]
    return log


@case()
def with_non_context_manager():
    with 5:
        pass


