"""Differential cases: generators, exceptions, with, classes, dataclasses, match statements."""

# ruff: noqa: F841, RUF005, UP028
from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
from collections import namedtuple

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


# -- classes ---------------------------------------------------------------------------------------
class _Shape:
    sides = 0
    registry = []

    def __init__(self, name):
        self.name = name
        _Shape.registry.append(name)

    def area(self):
        raise NotImplementedError

    def describe(self):
        return f"{self.name} with {self.sides} sides and area {self.area():.1f}"

    @classmethod
    def unit(cls):
        return cls(1)

    @staticmethod
    def kind():
        return "shape"


class _Square(_Shape):
    sides = 4

    def __init__(self, side):
        super().__init__("square")
        self.side = side

    def area(self):
        return self.side ** 2


class _Circle(_Shape):
    def __init__(self, r):
        super().__init__("circle")
        self.r = r

    def area(self):
        return 3.14159 * self.r ** 2

    def describe(self):
        return "round: " + super().describe()


@case(2)
def inheritance_and_super(n):
    shapes = [_Square(n), _Circle(n), _Square.unit()]
    return [s.describe() for s in shapes], _Circle.kind(), isinstance(shapes[0], _Shape)


@case()
def class_defined_inside():
    class Vec:
        __slots__ = ("x", "y")

        def __init__(self, x, y):
            self.x, self.y = x, y

        def __add__(self, o):
            return Vec(self.x + o.x, self.y + o.y)

        def __mul__(self, k):
            return Vec(self.x * k, self.y * k)

        __rmul__ = __mul__

        def __eq__(self, o):
            return isinstance(o, Vec) and (self.x, self.y) == (o.x, o.y)

        def __repr__(self):
            return f"Vec({self.x}, {self.y})"

        def __len__(self):
            return 2

        def __iter__(self):
            yield self.x
            yield self.y

        def __getitem__(self, i):
            return (self.x, self.y)[i]

        def __bool__(self):
            return bool(self.x or self.y)

        def __neg__(self):
            return Vec(-self.x, -self.y)

        def __lt__(self, o):
            return (self.x, self.y) < (o.x, o.y)

        def __hash__(self):
            return hash((self.x, self.y))

    a, b = Vec(1, 2), Vec(3, 4)
    x, y = a + b
    try:
        a.z = 1
    except AttributeError as e:
        slot_err = str(e)
    return (repr(a + b), repr(2 * a), repr(a * 3), a == Vec(1, 2), a != b, len(a), list(b), b[1], bool(Vec(0, 0)),
            repr(-a), sorted([b, a]), x, y, slot_err, f"{a}", str(b), max([a, b]), {a: 1}[Vec(1, 2)], 3 in b)


@case()
def properties_and_class_attributes():
    class Temp:
        unit = "C"
        count = 0

        def __init__(self, c):
            self._c = c
            Temp.count += 1

        @property
        def f(self):
            return self._c * 9 / 5 + 32

        @f.setter
        def f(self, value):
            self._c = (value - 32) * 5 / 9

        @property
        def label(self):
            return f"{self._c}{self.unit}"

    t = Temp(100)
    t2 = Temp(0)
    t2.f = 212
    try:
        t.label = "x"
    except AttributeError as e:
        err = type(e).__name__
    return t.f, t2._c, t.label, Temp.count, err


@case()
def dunder_getattr_and_call():
    class Proxyish:
        def __init__(self, target):
            self._target = target

        def __getattr__(self, name):
            return f"virtual {name}"

        def __call__(self, *a, **k):
            return ("called", a, sorted(k))

        def __contains__(self, item):
            return item == "yes"

    p = Proxyish([1])
    return p._target, p.anything, p(1, b=2), "yes" in p, "no" in p


@case()
def class_with_metaclass_and_init_subclass():
    registry = []

    class Base:
        def __init_subclass__(cls, tag=None, **kw):
            super().__init_subclass__(**kw)
            registry.append((cls.__name__, tag))

    class A(Base, tag="a"):
        pass

    class B(A):
        pass

    class Meta(type):
        def __new__(mcs, name, bases, ns):
            ns["made_by"] = "Meta"
            return super().__new__(mcs, name, bases, ns)

    class C(metaclass=Meta):
        x: int = 3

    return registry, C.made_by, C.__annotations__, C.__qualname__.split(".")[-1]


@case()
def multiple_inheritance_mro():
    class A:
        def who(self):
            return ["A"]

    class B(A):
        def who(self):
            return ["B"] + super().who()

    class C(A):
        def who(self):
            return ["C"] + super().who()

    class D(B, C):
        def who(self):
            return ["D"] + super().who()
    return D().who(), [k.__name__ for k in D.__mro__]


@case()
def reflected_and_inplace_dunders():
    class Money:
        def __init__(self, v):
            self.v = v

        def __add__(self, o):
            if isinstance(o, Money):
                return Money(self.v + o.v)
            if isinstance(o, int):
                return Money(self.v + o)
            return NotImplemented

        def __radd__(self, o):
            return self.__add__(o)

        def __iadd__(self, o):
            self.v += o.v if isinstance(o, Money) else o
            return self

    m = Money(5)
    total = sum([Money(1), Money(2)], Money(0))
    m += 3
    m2 = 10 + m
    try:
        m + "x"
    except TypeError as e:
        err = str(e)
    return total.v, m.v, m2.v, err


@case()
def dataclass_usage():
    @dataclasses.dataclass(order=True)
    class Point:
        x: int
        y: int = 0
        tags: list = dataclasses.field(default_factory=list)

        def norm1(self):
            return abs(self.x) + abs(self.y)

    p = Point(3, -4)
    q = dataclasses.replace(p, y=1)
    return repr(p), p.norm1(), p == Point(3, -4), sorted([p, q]), dataclasses.asdict(q), p < q


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: int
    b: str = "x"


@case()
def frozen_dataclass():
    f = _Frozen(1)
    try:
        f.a = 2
    except dataclasses.FrozenInstanceError as e:
        err = type(e).__name__
    return f, hash(f) == hash(_Frozen(1)), err


@case()
def namedtuple_and_enum():
    P = namedtuple("P", "x y")

    class Color(enum.Enum):
        RED = 1
        GREEN = 2

    p = P(1, y=2)
    return p, p._replace(x=5), p.x + p[1], Color.RED.name, Color(2), [c.value for c in Color]


# -- match statements ------------------------------------------------------------------------------
@dataclasses.dataclass
class _Pt:
    x: int
    y: int


@case(0, 5, "s", [1, 2], [1, 2, 3, 4], {"k": 1, "v": 2}, _Pt(0, 3), _Pt(1, 1), ((1, "x"),), None, 2.5, {"k": "z"})
def match_statement(v):
    match v:
        case 0:
            return "zero"
        case int(n) if n > 3:
            return f"big int {n}"
        case str() as s:
            return f"string {s}"
        case [a, b]:
            return ("pair", a, b)
        case [first, *rest] if len(rest) > 2:
            return ("long", first, rest)
        case {"k": 1, **others}:
            return ("mapping", others)
        case _Pt(x=0, y=yy):
            return ("on y axis", yy)
        case _Pt(xx, yy) if xx == yy:
            return ("diagonal", xx)
        case (1, "x") | (2, "y"):
            return "alternatives"
        case None:
            return "none"
        case float() | int():
            return "number"
        case {"k": str(s)}:
            return ("k is str", s)
        case _:
            return "other"


@case()
def match_class_errors():
    class NoArgs:
        pass
    try:
        match NoArgs():
            case NoArgs(1):
                return "matched"
    except TypeError as e:
        return str(e)
