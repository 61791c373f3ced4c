"""Differential cases: standard-library code written in Python, run through the interpreter."""

from __future__ import annotations

import colorsys
import contextlib
import copy
import difflib
import fractions
import importlib.util
import json
import shlex
import statistics
import string
import sys
import textwrap

from tests.frontend.cases import case


def _pure_module(name: str, accelerator: str):
    """A fresh copy of the stdlib module `name` loaded without its C accelerator (pure Python)."""
    saved = sys.modules.get(accelerator)
    sys.modules[accelerator] = None  # makes `from _accel import *` fail, so the Python code stays
    try:
        spec = importlib.util.find_spec(name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules[accelerator]
        else:
            sys.modules[accelerator] = saved
    return module


pure_bisect = _pure_module("bisect", "_bisect")
pure_heapq = _pure_module("heapq", "_heapq")

_TEXT = ("The interpreter runs every instruction of the user's function on proxies, so that each tensor "
         "operation is recorded in the trace, and the printed trace names the line it came from.")


@case(20, 35)
def textwrap_wrap(width):
    return textwrap.wrap(_TEXT, width=width), textwrap.fill(_TEXT[:60], width=width, initial_indent="> ")


@case()
def textwrap_dedent_indent():
    block = """
        def f(x):
            return x + 1
    """
    return textwrap.dedent(block), textwrap.indent("a\nb\n", "  "), textwrap.shorten(_TEXT, 40)


@case()
def fraction_arithmetic():
    F = fractions.Fraction
    a, b = F(3, 4), F(5, 6)
    return (a + b, a - b, a * b, a / b, a ** 2, -a, a < b, a + 1, 2 * b, F("1.25"), F(0.5), abs(F(-1, 3)),
            round(F(7, 3)), str(F(10, 4)), float(a), sum([F(1, n) for n in range(1, 6)]), F(1, 3) == 1 / 3)


@case()
def fraction_errors():
    try:
        fractions.Fraction(1, 0)
    except ZeroDivisionError as e:
        return str(e)


@case([3, 1, 4, 1, 5, 9, 2, 6], [1.5, 2.5], [7])
def statistics_functions(xs):
    return (statistics.mean(xs), statistics.median(xs), statistics.median_low(xs), statistics.mode(xs),
            statistics.fmean(xs), statistics.median_high(xs))


@case()
def statistics_fractions_and_errors():
    F = fractions.Fraction
    out = [statistics.mean([F(1, 2), F(1, 3)]), statistics.variance([1, 2, 3, 4]), statistics.pstdev([2, 4, 4, 4])]
    try:
        statistics.mean([])
    except statistics.StatisticsError as e:
        out.append(str(e))
    return out


@case(([1, 3, 3, 5, 8], 3), ([], 1), ([2, 4], 5))
def pure_bisect_functions(xs, x):
    xs = list(xs)
    left, right = pure_bisect.bisect_left(xs, x), pure_bisect.bisect_right(xs, x)
    pure_bisect.insort(xs, x)
    keyed = pure_bisect.bisect_left([("a", 1), ("b", 5)], 4, key=lambda p: p[1])
    return left, right, xs, keyed


@case([5, 1, 8, 3, 2, 9, 4])
def pure_heapq_functions(xs):
    h = []
    for x in xs:
        pure_heapq.heappush(h, x)
    popped = [pure_heapq.heappop(h) for _ in range(3)]
    h2 = list(xs)
    pure_heapq.heapify(h2)
    return (popped, h, h2, pure_heapq.nlargest(3, xs), pure_heapq.nsmallest(2, xs, key=lambda v: -v),
            list(pure_heapq.merge([1, 4, 7], [2, 5], [3])), pure_heapq.heappushpop(h2, 0))


@case()
def json_dumps_pure_python_path():
    data = {"name": "minijit", "ops": [1, 2.5, None, True], "nested": {"a": [], "b": {}, "c": ["x", {"d": -1}]}}
    # indent= makes json take its pure-Python encoder (generators all the way down).
    return json.dumps(data, indent=2, sort_keys=True), json.dumps([1, [2, [3]]], indent=1, separators=(",", ": "))


@case()
def json_dumps_error():
    return json.dumps({"a": {1, 2}}, indent=2)


@case((0.2, 0.4, 0.4), (1.0, 0.0, 0.5))
def colorsys_roundtrips(r, g, b):
    h, s, v = colorsys.rgb_to_hsv(r, g, b)
    hl = colorsys.rgb_to_hls(r, g, b)
    return (round(h, 6), round(s, 6), round(v, 6)), [round(c, 6) for c in colorsys.hsv_to_rgb(h, s, v)], \
        [round(c, 6) for c in colorsys.hls_to_rgb(*hl)], [round(c, 6) for c in colorsys.rgb_to_yiq(r, g, b)]


@case()
def copy_deepcopy():
    inner = [1, {"a": (2, 3)}]
    data = {"x": inner, "y": inner, "s": {4, 5}}
    dup = copy.deepcopy(data)
    return dup, dup["x"] is dup["y"], dup["x"] is inner, copy.copy(inner) is inner


@case('echo "hello world" --flag=\'a b\' plain')
def shlex_split(s):
    return shlex.split(s), shlex.quote("it's")


@case(("kitten", "sitting"), ("abcd", "abcd"))
def difflib_matching(a, b):
    m = difflib.SequenceMatcher(None, a, b)
    return round(m.ratio(), 6), m.get_opcodes(), difflib.get_close_matches(a, ["mitten", "bitten", "sitting"], n=2)


@case()
def string_template():
    t = string.Template("$who likes ${what}")
    return t.substitute(who="tim", what="kung pao"), t.safe_substitute(who="x"), string.capwords(" a  b c ")


@case()
def argparse_parsing():
    import argparse

    p = argparse.ArgumentParser(prog="tool")
    p.add_argument("--n", type=int, default=3)
    p.add_argument("files", nargs="*")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("run").add_argument("-v", action="store_true")
    return vars(p.parse_args(["--n", "5", "a", "b", "run", "-v"])), p.format_usage()


@case()
def pprint_nested():
    import pprint

    return pprint.pformat({"a": list(range(30)), "b": {"c": ("x" * 50, [1, {2: 3}])}}, width=40)


@case()
def urllib_parse_functions():
    import urllib.parse as up

    u = up.urlparse("http://u:p@host:80/a/b?x=1&y=2#f")
    return u, up.parse_qs(u.query), up.quote("a b/c"), up.urljoin("http://a/b/c", "../d"), u.port


@case()
def ipaddress_networks():
    import ipaddress

    n = ipaddress.ip_network("10.0.0.0/29")
    return [str(h) for h in n.hosts()], ipaddress.ip_address("::1").is_loopback, str(n.supernet())


@case()
def tomllib_loads():
    import tomllib

    return tomllib.loads('a = 1\n[t]\nb = "x"\nc = [1, 2, {d = 3}]\n[[arr]]\ne=1\n[[arr]]\ne=2\n')


@case()
def configparser_interpolation():
    import configparser

    c = configparser.ConfigParser(interpolation=configparser.ExtendedInterpolation())
    c.read_string("[a]\nx = 1\ny = ${x}2\n[b]\nz=${a:y}3\n")
    return {s: dict(c[s]) for s in c.sections()}


@case()
def pathlib_pure_paths():
    import pathlib

    p = pathlib.PurePosixPath("/a/b/c.tar.gz")
    return p.parent, p.suffixes, p.stem, p.with_name("d"), p.relative_to("/a"), list(p.parts), p.match("*.gz")


@case()
def exitstack_callbacks():
    out = []
    with contextlib.ExitStack() as stack:
        stack.callback(out.append, "first registered")
        stack.enter_context(contextlib.nullcontext())
        stack.callback(out.append, "last registered")
    return out


@case(5)
def random_with_seed(seed):
    import random

    r = random.Random(seed)
    xs = list(range(10))
    r.shuffle(xs)
    return xs, r.choice("abc"), r.sample(range(100), 3), r.randint(1, 6), round(r.gauss(0, 1), 9)


@case()
def abstract_base_classes():
    import abc

    class Base(abc.ABC):
        @abc.abstractmethod
        def f(self): ...

    class Impl(Base):
        def f(self):
            return "impl"
    try:
        Base()
    except TypeError as e:
        err = str(e)
    return Impl().f(), err, isinstance(Impl(), Base)
