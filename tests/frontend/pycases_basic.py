"""Differential cases: strings, numbers, loops, recursion, closures, comprehensions, calls."""

# ruff: noqa: F841, RUF013, RUF021, UP028, UP032, UP033, UP037, E742
from __future__ import annotations

import functools
import itertools
import math
import operator

from tests.frontend.cases import case

COUNTER = 0
SCALE = 3


# -- strings ----------------------------------------------------------------------------------------
@case("hello world", "", "a-b_c d")
def title_words(s):
    return " ".join(w[:1].upper() + w[1:] for w in s.split())


@case("racecar", "abca", "")
def is_palindrome(s):
    i, j = 0, len(s) - 1
    while i < j:
        if s[i] != s[j]:
            return False
        i += 1
        j -= 1
    return True


@case("the quick brown fox jumps over the lazy dog the end")
def word_counts(text):
    counts = {}
    for w in text.split():
        counts[w] = counts.get(w, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


@case(("abc", 3), ("", 2), ("xy", 0))
def string_ops(s, n):
    return [s * n, s[::-1], s.center(9, "*"), s.replace("b", "BB"), f"{s!r:>10}", s.encode().hex(), n * "ab" + s]


@case(3.14159, 1234567.891, -0.5)
def fstring_specs(x):
    w = 12
    return [f"{x:.2f}", f"{x:>{w}.3e}", f"{x:+,.1f}", f"{x!s:^20}", f"{int(x):08b}", f"{x=}", f"{'nested ' + str(w)}"]


@case("a1b22c333")
def split_digits(s):
    out, cur = [], ""
    for ch in s:
        if ch.isdigit():
            cur += ch
        elif cur:
            out.append(int(cur))
            cur = ""
    if cur:
        out.append(int(cur))
    return out


@case("Hello, World")
def caesar(s, k=3):
    def shift(c):
        if c.isalpha():
            base = ord("A") if c.isupper() else ord("a")
            return chr((ord(c) - base + k) % 26 + base)
        return c
    return "".join(map(shift, s))


@case("((a)[b]{c})", "(]", "((")
def balanced(s):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for c in s:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


@case("x=1;y=22;z=333")
def parse_kv(s):
    return {k: int(v) for k, v in (item.split("=") for item in s.split(";"))}


@case("abc")
def string_index_error(s):
    return s[10]


@case(("%s-%d-%.2f", ("a", 3, 2.5)))
def percent_format(fmt, args):
    return fmt % args, "{0}{1}{0}".format("x", "y"), "{a}/{b}".format(a=1, b=[2])


# -- numbers ----------------------------------------------------------------------------------------
@case(10, 0, 1)
def fib_iter(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@case(15)
def fib_rec(n):
    return n if n < 2 else fib_rec(n - 1) + fib_rec(n - 2)


@case(100)
def primes(n):
    sieve = [True] * (n + 1)
    sieve[0:2] = [False, False]
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = [False] * len(sieve[i * i::i])
    return [i for i, p in enumerate(sieve) if p]


@case((48, 18), (17, 5), (0, 3))
def gcd_rec(a, b):
    return a if b == 0 else gcd_rec(b, a % b)


@case((7, 2), (-7, 2), (7, -2), (2, 0))
def int_ops(a, b):
    return a // b, a % b, divmod(a, b), a ** 2, -a, ~a, a << 2, a >> 1, a & b, a | b, a ^ b, a / b


@case((1.5, 2.25))
def float_ops(a, b):
    return round(a * b, 3), math.floor(a), math.sqrt(b), abs(-a), math.isclose(a + b, 3.75), float("inf") > a, hash(a)


@case(12)
def collatz_len(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


@case(5)
def factorial_reduce(n):
    return functools.reduce(operator.mul, range(1, n + 1), 1)


@case((3, 4))
def complex_numbers(a, b):
    z = complex(a, b)
    return abs(z), z.conjugate(), z * 1j, (z ** 2).real


@case(2, 10)
def chained_compare(x):
    return 1 < x < 5, 0 <= x <= 10 != x, x == 2 or x > 9 and x < 11


# -- loops and control flow -----------------------------------------------------------------------
@case(20)
def loop_break_continue_else(n):
    out = []
    for i in range(n):
        if i % 3 == 0:
            continue
        if i > 14:
            break
        out.append(i)
    else:
        out.append("no break")
    for j in range(3):
        pass
    else:
        out.append("else ran")
    return out


@case(5)
def nested_loops_break(n):
    found = None
    for i in range(n):
        for j in range(n):
            if i * j == 6:
                found = (i, j)
                break
        if found:
            break
    return found


@case(10)
def while_else(n):
    i = 0
    while i < n:
        i += 3
    else:
        i = -i
    return i


@case([3, 1, 2])
def for_over_enumerate_zip(xs):
    return [(i, a, b) for i, (a, b) in enumerate(zip(xs, reversed(xs)))]


@case([5, 3, 8, 1])
def bubble_sort(xs):
    xs = list(xs)
    for i in range(len(xs)):
        for j in range(len(xs) - 1 - i):
            if xs[j] > xs[j + 1]:
                xs[j], xs[j + 1] = xs[j + 1], xs[j]
    return xs


@case(([1, 2, 3, 4, 5, 6, 7], 5), ([1, 3], 2))
def binary_search(xs, target):
    lo, hi = 0, len(xs) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if xs[mid] == target:
            return mid
        if xs[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


@case(4)
def walrus(n):
    data = list(range(n * 3))
    out = [y for x in data if (y := x * x) % 2 == 0]
    if (m := len(out)) > 2:
        return m, out
    return None


@case(6)
def conditional_expressions(n):
    return ["fizz" * (i % 3 == 0) + "buzz" * (i % 5 == 0) or str(i) for i in range(1, n * 3)]


@case(3)
def del_statements(n):
    a = list(range(n * 2))
    del a[0]
    del a[-2:]
    d = {"x": 1, "y": 2}
    del d["x"]
    b = 5
    del b
    return a, d, "b" in locals()


@case()
def unbound_local():
    if False:
        x = 1
    return x


@case([[1, 2], [3, 4], [5]])
def flatten(xss):
    return [x for xs in xss for x in xs]


# -- closures and scopes --------------------------------------------------------------------------------
@case(5)
def counter_closure(n):
    def make():
        count = 0

        def inc(by=1):
            nonlocal count
            count += by
            return count
        return inc
    c = make()
    return [c() for _ in range(n)] + [c(10)]


@case(3)
def closures_in_loop(n):
    fns = [lambda i=i: i * 10 for i in range(n)]
    late = [lambda: i for i in range(n)]
    return [f() for f in fns], [f() for f in late]


@case(4)
def nested_nonlocal(n):
    x = 0

    def outer():
        def inner():
            nonlocal x
            x += n
        inner()
        inner()
    outer()
    return x


@case(2)
def global_read_write(k):
    global COUNTER
    COUNTER += k
    value = COUNTER
    COUNTER -= k
    return value, SCALE * k


@case()
def free_var_unbound():
    def inner():
        return y

    r = None
    try:
        r = inner()
    except NameError as e:
        r = str(e)
    y = 1
    return r, inner()


@case(3)
def cell_is_argument(n):
    def get():
        return n * 2
    n += 1
    return get()


@case()
def closure_over_class_scope():
    class K:
        a = 5
        try:
            b = [a * i for i in range(3)]  # the class scope is invisible here
        except NameError as e:
            b = str(e)
        c = a + 1
    return K.a, K.b, K.c


# -- calls: defaults, keyword-only, *args/**kwargs --------------------------------------------------
def _target(a, b=2, *args, c, d=4, **kw):
    return a, b, args, c, d, sorted(kw.items())


@case()
def call_forwarding():
    args = (1, 2, 3)
    kw = {"c": 5, "z": 6}
    return [
        _target(1, c=3),
        _target(*args, **kw),
        _target(0, *args[1:], c=1, **{"y": 0}),
        _target(*[9], *(8, 7), c=0, **{"d": 1}, **{"e": 2}),
    ]


@case()
def call_errors():
    out = []
    for call in (lambda: _target(), lambda: _target(1), lambda: _target(1, c=1, a=2),
                 lambda: _target(1, c=2, **{"c": 3}), lambda: (lambda x, /: x)(x=1),
                 lambda: _target(*5, c=1), lambda: _target(1, c=1, **[1])):
        try:
            call()
        except TypeError as e:
            out.append(str(e))
    return out


@case((1, 2))
def positional_only_and_kwonly(a, b):
    def f(x, y, /, z=3, *, w=4):
        return x, y, z, w
    return f(a, b), f(a, b, 5, w=6), f(a, b, z=7)


@case()
def mutable_default():
    def append(x, acc=[]):
        acc.append(x)
        return list(acc)
    return append(1), append(2), append(3, [])


@case(4)
def lambda_and_sorting(n):
    people = [("bob", 30), ("al", 25), ("cy", 30), ("di", 22)][:n]
    return (sorted(people, key=lambda p: (-p[1], p[0])), min(people, key=lambda p: p[1]),
            max(people, key=operator.itemgetter(1)), sorted(people, key=len, reverse=True))


@case([4, 1, 3])
def list_sort_key(xs):
    xs = list(xs)
    xs.sort(key=lambda v: -v)
    return xs


@case(3)
def functools_partial(n):
    def power(base, exp):
        return base ** exp
    square = functools.partial(power, exp=2)
    cube = functools.partial(power, exp=3)
    return [square(i) + cube(i) for i in range(n)], square.func is power


@functools.lru_cache(maxsize=None)
def _cached_fib(n):
    return n if n < 2 else _cached_fib(n - 1) + _cached_fib(n - 2)


@case(30)
def lru_cached_call(n):
    return _cached_fib(n)


@case(3)
def decorators(n):
    def twice(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*fn(*a, **k), **k)
        return wrapper

    @twice
    def step(x, y, scale=1):
        return x + y * scale, y

    return step(n, 1), step(n, 2, scale=3), step.__name__


@case()
def recursion_mutual():
    def even(n):
        return True if n == 0 else odd(n - 1)

    def odd(n):
        return False if n == 0 else even(n - 1)
    return even(10), odd(7)


@case(10)
def map_filter(n):
    return list(map(lambda x: x * 2, filter(lambda x: x % 3, range(n)))), list(map(operator.add, [1, 2], [3, 4]))


# -- comprehensions -------------------------------------------------------------------------------------
@case(4)
def nested_comprehensions(n):
    return [[i * j for j in range(i) if j % 2 == 0] for i in range(n)]


@case("mississippi")
def dict_set_comprehensions(s):
    return {c: s.count(c) for c in set(s)}, {c for c in s if c > "m"}, sorted({len(w) for w in s.split("s")})


@case(5)
def generator_expressions(n):
    g = (i * i for i in range(n))
    first = next(g)
    return first, sum(g), any(x > 3 for x in range(n)), all(x < n for x in range(n)), max(x % 3 for x in range(n))


@case(3)
def comprehension_scope(n):
    x = "outer"
    ys = [x for x in range(n)]
    return x, ys, [[x] * 2 for x in "ab"]


# -- itertools and builtins ------------------------------------------------------------------------------
@case(4)
def itertools_mix(n):
    return (list(itertools.product("ab", repeat=2)), list(itertools.permutations(range(3), 2))[:n],
            list(itertools.accumulate(range(n))), list(itertools.chain.from_iterable([[1], [2, 3]])),
            [(k, list(g)) for k, g in itertools.groupby("aabbbc")], list(itertools.islice(itertools.count(5), n)),
            list(itertools.zip_longest("ab", "xyz", fillvalue="-")), list(itertools.combinations("abcd", n - 1)))


@case([3, 1, 2])
def builtins_mix(xs):
    return (len(xs), sum(xs), min(xs), max(xs), sorted(xs), list(reversed(xs)), any(xs), all(xs),
            dict(zip("abc", xs)), list(enumerate(xs, 1)), isinstance(xs, list), callable(len),
            getattr(xs, "count")(1), hasattr(xs, "nope"), divmod(7, 3), pow(2, 10, 1000), repr(xs), bool([]))


@case()
def slicing():
    s = list(range(10))
    s[2:5] = ["a"]
    t = s[::-2]
    s[::3] = [0] * len(s[::3])
    return s, t, "hello"[1:-1], (1, 2, 3)[slice(None, None, -1)]


@case(([1, 2, 3, 4],))
def star_unpacking(xs):
    a, *b, c = xs
    (d, e), f = (1, 2), 3
    *g, = xs
    h, i, *j = "hi"
    return a, b, c, d, e, f, g, h, i, j, [*xs, *"ab"], {**{"a": 1}, "b": 2}, {*xs, 9}


@case()
def unpack_errors():
    out = []
    for value in ([1, 2, 3], [1], 5, iter([1])):
        try:
            a, b = value
        except (ValueError, TypeError) as e:
            out.append((type(e).__name__, str(e)))
    try:
        a, *b, c = [1]
    except ValueError as e:
        out.append(str(e))
    return out


@case(3)
def assert_statement(n):
    assert n > 0, "positive"
    try:
        assert n < 0, f"{n} is not negative"
    except AssertionError as e:
        return str(e)


@case()
def import_inside_function():
    import json
    from collections import Counter, OrderedDict
    from os import path as p
    return json.dumps({"a": [1, 2]}), Counter("abca").most_common(1), list(OrderedDict(a=1)), p.join("a", "b")


@case()
def name_error():
    return undefined_name_xyz  # noqa: F821


@case()
def attribute_error():
    return (1).nope


@case()
def zero_division():
    return [1 / x for x in (1, 2, 0)]


@case()
def key_error():
    return {"a": 1}["b"]


@case()
def type_error_operands():
    return [1] + (2,)


@case()
def globals_and_locals():
    x = 1
    y = [2]
    return sorted(k for k in locals()), "SCALE" in globals(), eval("x + 1", {"x": 41})


@case(7)
def bool_short_circuit(n):
    calls = []

    def t(v):
        calls.append(v)
        return v
    r = (t(0) or t(n) and t(None)) or t("x")
    return r, calls, not n, n and [] or "d"


@case(3)
def augmented_assignments(n):
    x = [1]
    x += [2]
    y = x
    y *= n
    s = "a"
    s += "b"
    d = {"k": 1}
    d["k"] += 5
    class O:
        v = 1
    o = O()
    o.v += 2
    t = (1,)
    t += (2,)
    return x, y is x, s, d, o.v, t


@case(3)
def string_join_generators(n):
    return ",".join(str(i) for i in range(n)), "-".join(sorted({"b", "a"}))


@case(300)
def deep_recursion(n):
    def sum_to(k):
        return 0 if k == 0 else k + sum_to(k - 1)
    return sum_to(n)


@case(2)
def class_body_reads_enclosing_function_variable(n):
    def make():
        x = n

        class C:
            y = x * 10  # LOAD_CLASSDEREF: x is a cell of make()
            x = "class-level"
            z = x
        return C
    C = make()
    return C.y, C.z, C.x


@case()
def annotations_on_inner_function():
    def g(x: int, *, y: "list[str]" = None) -> str:
        return str(x)
    return g.__annotations__, g(5), g.__kwdefaults__


@case(3)
def yield_inside_with(n):
    log = []

    class Ctx:
        def __enter__(self):
            log.append("enter")

        def __exit__(self, *a):
            log.append(f"exit {a[0].__name__ if a[0] else None}")

    def gen():
        with Ctx():
            for i in range(n):
                yield i
    g = gen()
    first = next(g)
    g.close()
    return first, log, list(gen())


@case("The Quick Brown Fox")
def string_methods(s):
    return (s.lower(), s.swapcase(), s.partition(" "), s.rsplit(" ", 1), s.startswith(("The", "A")), s.find("Q"),
            s.zfill(25), s.expandtabs(), s.casefold(), s.title(), s.isidentifier(), s.strip("Tx"), list(s)[:3],
            s.translate(str.maketrans("aeiou", "AEIOU")), sorted(s.split(), key=str.lower))


@case(6)
def comprehension_with_walrus_and_filter(n):
    total = 0
    pairs = {(k := i % 3): [j for j in range(i) if j % 2] for i in range(n)}
    evens = {v for i in range(n) if (v := i * 2) > 3}
    total = sum(len(v) for v in pairs.values())
    return pairs, evens, k, total
