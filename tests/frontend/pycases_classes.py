"""Differential cases: classes, dataclasses, match statements."""

# ruff: noqa: RUF005
from __future__ import annotations

import dataclasses
import enum
from collections import namedtuple

from tests.frontend.cases import case


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
