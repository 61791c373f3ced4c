"""Differential cases: corners of the data model, protocols and scoping."""

# ruff: noqa: F841
from __future__ import annotations

import dataclasses
import functools

from tests.frontend.cases import case


@case()
def sequence_protocol_by_getitem():
    class Seq:
        def __init__(self, n):
            self.n = n

        def __getitem__(self, i):
            if i >= self.n:
                raise IndexError(i)
            return i * i

    s = Seq(4)
    return list(s), [x for x in s], 9 in s, sorted(s, reverse=True), tuple(iter(s))


@case()
def getattribute_override():
    class Logged:
        def __init__(self):
            self.log = []
            self.value = 3

        def __getattribute__(self, name):
            if name not in ("log", "__dict__", "__class__"):
                object.__getattribute__(self, "log").append(name)
            return object.__getattribute__(self, name)

    o = Logged()
    v = o.value
    return v, o.log


@case()
def property_inheritance_and_super_property():
    class A:
        @property
        def name(self):
            return "A"

    class B(A):
        @property
        def name(self):
            return "B+" + super().name

    return B().name, A().name


@case()
def callable_instance_as_decorator():
    class CountCalls:
        def __init__(self, fn):
            functools.update_wrapper(self, fn)
            self.fn = fn
            self.calls = 0

        def __call__(self, *args, **kwargs):
            self.calls += 1
            return self.fn(*args, **kwargs)

    @CountCalls
    def add(a, b=1):
        return a + b

    return add(1), add(2, b=5), add.calls, add.__name__


@case(3)
def decorator_with_arguments(n):
    def repeat(times):
        def deco(fn):
            def wrapper(*a):
                return [fn(*a) for _ in range(times)]
            return wrapper
        return deco

    @repeat(n)
    def hello(x):
        return f"hi {x}"
    return hello("bob")


@case()
def dataclass_post_init_and_inheritance():
    @dataclasses.dataclass
    class Base:
        a: int

        def __post_init__(self):
            self.doubled = self.a * 2

    @dataclasses.dataclass
    class Child(Base):
        b: str = "x"

        def __post_init__(self):
            super().__post_init__()
            self.tag = f"{self.b}{self.doubled}"

    c = Child(4, "y")
    return c.tag, c.doubled, dataclasses.fields(c)[1].name


@case()
def class_getitem_and_classmethods():
    class Box:
        items = []

        def __class_getitem__(cls, item):
            return f"Box[{item.__name__}]"

        @classmethod
        def make(cls, *xs):
            b = cls()
            b.items = list(xs)
            return b

        @staticmethod
        def helper(x):
            return x + 1

    b = Box.make(1, 2)
    return Box[int], b.items, b.helper(1), Box.helper(2), type(b).__name__


@case()
def unhashable_when_eq_defined():
    class P:
        def __eq__(self, other):
            return True
    try:
        {P(): 1}
    except TypeError as e:
        return str(e), P() == 3


@case(4)
def iter_with_sentinel_and_next_default(n):
    state = [0]

    def tick():
        state[0] += 1
        return state[0]
    return list(iter(tick, n)), next(iter([]), "empty"), next(iter("ab")), max((x for x in []), default=-1)


@case([[1, 2, 3], [4, 5, 6]])
def zip_star_transpose(m):
    return [list(r) for r in zip(*m)], list(enumerate((x * 2 for x in m[0]), start=1))


@case()
def exception_var_unbound_after_except():
    try:
        raise ValueError("x")
    except ValueError as err:
        pass
    try:
        return err
    except NameError as e:
        return type(e).__name__, str(e)


@case()
def raise_from_class_cause():
    try:
        raise KeyError("a") from ValueError
    except KeyError as e:
        return type(e.__cause__).__name__, e.__suppress_context__


@case()
def continue_in_finally_and_break_in_except():
    log = []
    for i in range(4):
        try:
            if i == 1:
                raise ValueError
            log.append(("try", i))
        except ValueError:
            log.append("caught")
            continue
        finally:
            log.append(("finally", i))
        if i == 2:
            break
    return log


@case()
def generator_send_after_exhaustion_and_return_value():
    def g():
        x = yield 1
        return x * 2
    gen = g()
    next(gen)
    try:
        gen.send(21)
    except StopIteration as e:
        first = e.value
    try:
        gen.send(1)
    except StopIteration as e:
        second = e.value
    return first, second


@case()
def generator_expression_error_through_native_sum():
    try:
        return sum(1 / x for x in [1, 2, 0])
    except ZeroDivisionError as e:
        return str(e)


@case()
def tree_walk_recursive_generators():
    tree = ("a", [("b", [("d", [])]), ("c", [("e", []), ("f", [])])])

    def walk(node, depth=0):
        name, children = node
        yield depth, name
        for child in children:
            yield from walk(child, depth + 1)
    return list(walk(tree))


@case()
def nested_function_global_declaration():
    def setter():
        global _NESTED_GLOBAL
        _NESTED_GLOBAL = "set"

    def getter():
        return _NESTED_GLOBAL
    setter()
    value = getter()
    del globals()["_NESTED_GLOBAL"]
    return value, "_NESTED_GLOBAL" in globals()


@case()
def dir_and_vars_without_arguments():
    a = 1
    b = "two"
    return sorted(dir()), sorted(vars())


@case()
def int_dunders_called_directly():
    return int.__add__(1, 2), (5).__rsub__(7), "ab".__mul__(2), list.__len__([1, 2]), int.__add__(1, 2.0)


@case()
def set_operations():
    a, b = {1, 2, 3}, frozenset({2, 3, 4})
    return sorted(a | b), sorted(a & b), sorted(a - b), sorted(a ^ b), a <= {1, 2, 3, 9}, b.isdisjoint({9})


@case()
def multidimensional_subscripts():
    class Grid:
        def __getitem__(self, key):
            return key
    g = Grid()
    return g[1, 2], g[1:2, ...], g[::2], g[:, None]


@case()
def kwargs_into_class_with_python_init():
    class Config:
        def __init__(self, *, lr=0.1, **rest):
            self.lr = lr
            self.rest = rest
    opts = {"lr": 0.5, "momentum": 0.9}
    c = Config(**opts)
    try:
        Config(1)
    except TypeError as e:
        err = str(e)
    return c.lr, c.rest, err


@case()
def exception_in_exit_replaces_original():
    class Bad:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            raise RuntimeError("exit failed")
    try:
        with Bad():
            raise ValueError("body")
    except RuntimeError as e:
        return str(e), type(e.__context__).__name__


@case()
def lambda_closures_and_defaults():
    fs = {}
    for name, k in (("double", 2), ("triple", 3)):
        fs[name] = lambda x, k=k: x * k
    compose = lambda f, g: lambda x: f(g(x))
    return fs["double"](5), fs["triple"](5), compose(fs["double"], fs["triple"])(1)


@case()
def builtins_consume_python_iterables():
    class Countdown:
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            k = self.n
            while k:
                yield k
                k -= 1

    c = Countdown(4)
    xs = [3, 1, 2]
    xs.sort(key=lambda v: -v)
    return (sorted(c), min(c), max(c, key=lambda v: v % 3), list(map(str, c)), list(filter(None, c)),
            functools.reduce(lambda a, b: a * b, c), sum(c), list(zip(c, "ab")), xs, dict.fromkeys(c))


@case()
def getattr_fallbacks_after_property_and_getattribute():
    class Lazy:
        @property
        def missing(self):
            raise AttributeError("not yet")

        def __getattr__(self, name):
            return f"fallback {name}"

    class Both:
        def __getattribute__(self, name):
            if name == "boom":
                raise AttributeError(name)
            return f"ga {name}"

        def __getattr__(self, name):
            return f"getattr {name}"

    return Lazy().missing, Lazy().other, Both().x, Both().boom, getattr(Lazy(), "missing", "default")
