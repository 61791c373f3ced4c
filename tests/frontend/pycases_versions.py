"""Differential cases for what CPython 3.12 and 3.13 compile differently from 3.11.

Each case runs on every supported version and is compared with the same Python running it
natively: inlined comprehensions (PEP 709), `super()` through LOAD_SUPER_ATTR, f-strings
(3.13's FORMAT_SIMPLE/FORMAT_WITH_SPEC/CONVERT_VALUE), slices (BINARY_SLICE/STORE_SLICE),
`yield from` with send/throw/close (END_SEND, CLEANUP_THROW), `except*`, `with`, `match`,
closures and function attributes (SET_FUNCTION_ATTRIBUTE), class bodies
(LOAD_FROM_DICT_OR_DEREF), calls with keywords (CALL_KW) and truth tests (TO_BOOL).
"""

from __future__ import annotations

import contextlib
import sys

from tests.frontend.cases import case


# -- comprehensions (inlined into the function from 3.12) --------------------------------------------
@case(3)
def comprehension_restores_outer_variable(n):
    x = "outer"
    squares = [x * x for x in range(n)]
    pairs = {x: y for x in range(n) for y in "ab"}
    return squares, pairs, x


@case(3)
def comprehension_variable_stays_unbound(n):
    out = [x + 1 for x in range(n)]
    try:
        return out, x
    except NameError as e:
        return out, type(e).__name__, str(e)


@case(4)
def comprehension_error_restores_outer(n):
    x = "outer"
    try:
        [1 // (x - 2) for x in range(n)]
    except ZeroDivisionError as e:
        return x, str(e)


@case(3)
def comprehension_lambdas_capture_each_variable(n):
    fns = [lambda: i * 10 for i in range(n)]
    bound = [lambda i=i: i for i in range(n)]
    return [f() for f in fns], [f() for f in bound]


@case(3)
def comprehension_over_cell_variable(n):
    total = 0

    def add(k):
        nonlocal total
        total += k
        return total
    return [add(k) for k in range(n)], total


@case(2)
def nested_comprehensions_shadowing(n):
    i = "keep"
    grid = [[i * j for j in range(n + 1)] for i in range(n)]
    flat = [i for row in grid for i in row if i]
    return grid, flat, i


@case(3)
def comprehension_sees_locals(n):
    base = 10
    names = [sorted(k for k in locals() if not k.startswith(".")) for _ in range(1)]
    return [base + k for k in range(n)], names


@case()
def comprehension_in_class_body():
    class C:
        xs = [1, 2, 3]
        doubled = [x * 2 for x in xs]
        try:
            bad = [y for y in range(2) if xs]
        except NameError as e:
            error = str(e)
    return C.doubled, getattr(C, "error", None), getattr(C, "bad", None)


# -- super() (LOAD_SUPER_ATTR from 3.12) ---------------------------------------------------------------
class _Base:
    tag = "base"

    def __init__(self, n):
        self.n = n

    def describe(self, suffix=""):
        return f"base {self.n}{suffix}"

    @classmethod
    def make(cls, n):
        return cls(n)

    @property
    def doubled(self):
        return self.n * 2


class _Child(_Base):
    tag = "child"

    def __init__(self, n, extra):
        super().__init__(n)
        self.extra = extra

    def describe(self, suffix=""):
        return "child/" + super().describe(suffix=suffix)

    @classmethod
    def make(cls, n):
        obj = super().make(n + 1)
        return type(obj).__name__, obj.n

    @property
    def doubled(self):
        return super().doubled + 1

    def parts(self):
        s = super()
        return super().tag, s.tag, super(_Child, self).describe("!"), s.describe  # noqa: UP008 - the two-argument form

    def in_nested(self):
        def inner():
            return super(_Child, self).describe("?")
        return inner()


@case(3)
def super_forms(n):
    c = _Child(n, "x")
    parts = c.parts()
    return c.describe("."), _Child.make(n), c.doubled, parts[:3], parts[3](), c.in_nested()


@case()
def super_without_arguments_in_plain_function():
    def not_a_method():
        return super().x
    try:
        return not_a_method()
    except RuntimeError as e:
        return str(e)


# -- f-strings (FORMAT_SIMPLE, FORMAT_WITH_SPEC, CONVERT_VALUE in 3.13) --------------------------------
class _Money:
    def __init__(self, cents):
        self.cents = cents

    def __format__(self, spec):
        return f"${self.cents / 100:{spec or '.2f'}}"

    def __str__(self):
        return f"{self.cents}c"

    def __repr__(self):
        return f"_Money({self.cents})"


@case(3.14159, 42)
def fstring_conversions_and_nested_specs(x):
    m = _Money(1234)
    width, prec = 10, 3
    return [f"{x}", f"{x!r}", f"{x!s:>8}", f"{x!a}", f"{'é'!a}", f"{x:{width}.{prec}}", f"{m}", f"{m:.1f}",
            f"{m!s}", f"{m!r:>14}", f"{x=:.2f}", f"{m=}", f"{f'{x:.1f}':>6}", f"{'yes' if x else 'no'}", f"{{}}{x}"]


@case()
def fstring_format_errors():
    out = []
    for spec in ("d", "x", "q"):
        try:
            out.append(f"{1.5:{spec}}")
        except ValueError as e:
            out.append(str(e))
    return out


# -- slices (BINARY_SLICE, STORE_SLICE from 3.12) ---------------------------------------------------
class _Recorder:
    def __init__(self):
        self.log = []

    def __getitem__(self, key):
        self.log.append(("get", key))
        return key

    def __setitem__(self, key, value):
        self.log.append(("set", key, value))

    def __delitem__(self, key):
        self.log.append(("del", key))


@case([0, 1, 2, 3, 4, 5], "abcdefg")
def slices_read_write_delete(xs, s):
    xs = list(xs)
    a, b = 1, -1
    reads = (xs[1:3], xs[a:b], xs[:a], xs[b:], xs[::2], xs[::-1], xs[a:b:2], s[1:4], s[::-2], tuple(xs)[2:], range(10)[3:7])
    xs[1:3] = ["x", "y", "z"]
    xs[a:a] = [None]
    xs[::2] = [0] * len(xs[::2])
    xs[2:4] += ["plus"]
    del xs[:1]
    del xs[::3]
    return reads, xs


@case()
def slices_on_python_class():
    r = _Recorder()
    lo, hi = 2, 5
    r[lo:hi]
    r[::3]
    r[lo:hi] = "v"
    del r[lo:]
    return r.log


@case()
def slice_errors():
    out = []
    half = 1.5
    for bad in (lambda: [1][half:2], lambda: (1, 2).__setitem__(slice(0, 1), 3), lambda: "ab"[::0]):
        try:
            bad()
        except (TypeError, ValueError) as e:
            out.append((type(e).__name__, str(e)))
    t = (1, 2, 3)
    try:
        t[0:1] = (9,)
    except TypeError as e:
        out.append(str(e))
    return out


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


# -- closures and function attributes (SET_FUNCTION_ATTRIBUTE in 3.13) ---------------------------------
@case(2)
def function_attributes(n):
    def make(k, *, scale=n):
        def inner(a: int = k, *, b: str = "b") -> tuple:
            return a, b, k, scale
        return inner
    f = make(5)
    return (f(), f(1, b="x"), f.__defaults__, f.__kwdefaults__, f.__annotations__, f.__qualname__,
            [c.cell_contents for c in f.__closure__], f.__code__.co_freevars)


@case(3)
def closures_nonlocal_and_delete(n):
    def counter():
        count = 0

        def step(by=1):
            nonlocal count
            count += by
            return count
        return step
    c = counter()
    values = [c(), c(n), c()]
    x = 1

    def reads_x():
        return x  # noqa: F821 - deleted below, on purpose
    del x
    try:
        reads_x()
    except NameError as e:
        values.append(str(e))
    return values


# -- class bodies (LOAD_LOCALS, LOAD_FROM_DICT_OR_DEREF from 3.12) -------------------------------------
@case(4)
def class_body_scopes(n):
    shadowed = "function"
    only_outer = n

    class C:
        first = shadowed
        shadowed = "class"
        second = shadowed
        from_outer = only_outer * 2
        annotated: int = 3

        def method(self):
            return shadowed, __class__.__name__
    return C.first, C.second, C.from_outer, C.__annotations__, C().method()


@case()
def class_hooks():
    log = []

    class Named:
        def __set_name__(self, owner, name):
            log.append(("set_name", owner.__name__, name))

    class Base:
        def __init_subclass__(cls, tag=None, **kw):
            super().__init_subclass__(**kw)
            log.append(("init_subclass", cls.__name__, tag))

    class Child(Base, tag="t"):
        field = Named()
    return log


# -- calls with keywords (CALL_KW in 3.13), methods, unpacking -----------------------------------------
class _Calls:
    def __init__(self, base):
        self.base = base
        self.fn = lambda x, y=0: (x, y)

    def method(self, a, b=1, *args, c=2, **kw):
        return self.base, a, b, args, c, kw

    @staticmethod
    def static(a, *, k):
        return ("static", a, k)

    @classmethod
    def klass(cls, a, **kw):
        return (cls.__name__, a, kw)


@case(3)
def calls_with_keywords(n):
    o = _Calls(n)
    args, kwargs = (1, 2, 3), {"c": 4, "d": 5}
    return (o.method(1, c=3), o.method(1, 2, 3, c=4, e=5), o.method(*args, **kwargs), o.static(1, k=2),
            _Calls.klass(1, x=2), o.klass(2), o.fn(1, y=2), dict(a=1, **{"b": 2}), max([3, 1, 2], key=lambda v: -v),
            sorted("bca", reverse=True), print.__name__, str.join(",", ["a", "b"]))


@case()
def call_keyword_errors():
    o = _Calls(0)
    out = []
    for bad in (lambda: o.method(), lambda: o.method(1, a=2), lambda: o.static(1), lambda: o.method(1, **{"c": 1}, c=2)):
        try:
            bad()
        except TypeError as e:
            out.append(str(e))
    return out


# -- truth tests (TO_BOOL, COMPARE_OP's bool bit in 3.13) ---------------------------------------------
class _Weird:
    def __init__(self, v):
        self.v = v

    def __lt__(self, other):
        return [self.v] if self.v < other.v else []

    def __bool__(self):
        return self.v != 0

    def __len__(self):
        raise AssertionError("__bool__ comes first")


class _Sized:
    def __len__(self):
        return 0


@case()
def truth_of_comparisons_and_objects():
    a, b = _Weird(1), _Weird(2)
    raw = a < b
    out = [raw, b < a]
    out.append("lt" if a < b else "not lt")
    out.append("lt" if b < a else "not lt")
    out.append(not _Weird(0))
    out.append(bool(_Sized()) or "empty")
    out.append([x for x in (0, 1, "", "s", [], [0], None, _Weird(3)) if x].__len__())
    out.append(1 if a and not _Weird(0) else 2)
    while _Weird(0):
        out.append("never")
    return out


@case(2)
def unary_plus_and_tuple_unpacking(n):
    class P:
        def __pos__(self):
            return "positive"
    a, b = [1, 2], (3, n)
    return +P(), +n, (*a, *b), [*b, *a], {*a}, {**{"k": n}}


# -- unbound locals (LOAD_FAST_CHECK from 3.12) --------------------------------------------------------
@case(0, 1)
def maybe_unbound_local(flag):
    if flag:
        value = "bound"
    try:
        return value
    except UnboundLocalError as e:
        return str(e)


@case()
def deleted_local_then_read():
    v = 1
    del v
    try:
        return v  # noqa: F821 - deleted above, on purpose
    except UnboundLocalError as e:
        return str(e)


# -- PEP 695 (3.12 syntax; CALL_INTRINSIC_1/2 type-parameter intrinsics) -------------------------------
if sys.version_info >= (3, 12):
    _PEP695_SOURCE = '''
def generic_functions_and_aliases():
    def first[T](xs: list[T]) -> T:
        return xs[0]

    class Box[T]:
        def __init__(self, item: T):
            self.item = item

    class Methods:
        limit = 3

        def clip[T](self, x: T, *, bound: int = limit) -> list[T]:
            return [x] * min(bound, 2)

    type Pair[K] = tuple[K, K]
    params = first.__type_params__
    return (first([3, 4]), Box(5).item, [p.__name__ for p in params], Box.__type_params__[0].__name__,
            Pair.__name__, Pair.__value__, Pair.__type_params__[0].__name__, Methods().clip("a"),
            sorted(Methods.clip.__annotations__), Methods.clip.__annotations__["bound"])
'''
    _namespace: dict = {}
    exec(compile(_PEP695_SOURCE, "<PEP 695 cases>", "exec", dont_inherit=True), _namespace)
    case()(_namespace["generic_functions_and_aliases"])


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


@case()
def global_assign_and_delete():
    global _deleted_global
    _deleted_global = "set"
    before = _deleted_global
    del _deleted_global
    try:
        return before, _deleted_global
    except NameError as e:
        return before, str(e)
