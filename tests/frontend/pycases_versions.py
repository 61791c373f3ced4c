"""Differential cases for what CPython 3.12 and 3.13 compile differently from 3.11.

Each case runs on every supported version and is compared with the same Python running it
natively: inlined comprehensions (PEP 709), `super()` through LOAD_SUPER_ATTR, f-strings
(3.13's FORMAT_SIMPLE/FORMAT_WITH_SPEC/CONVERT_VALUE), slices (BINARY_SLICE/STORE_SLICE),
closures and function attributes (SET_FUNCTION_ATTRIBUTE), class bodies
(LOAD_FROM_DICT_OR_DEREF), calls with keywords (CALL_KW), truth tests (TO_BOOL), PEP 695.
Control flow (`yield from`, `except*`, `with`, `match`) is in pycases_flow.py.
"""

from __future__ import annotations

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
def global_assign_and_delete():
    global _deleted_global
    _deleted_global = "set"
    before = _deleted_global
    del _deleted_global
    try:
        return before, _deleted_global
    except NameError as e:
        return before, str(e)
