"""Differential fuzzing of automatic dynamic: Python numbers and sizes that change between calls.

Each seed draws a small program (source text, exec'd inside a function so that it has a closure cell) over a tensor
`x` and Python numbers read from many places: int, float and bool arguments, attributes of a plain object, a
module-level global the test changes between calls, a closure cell, list and dict items, attributes of an
`nn.Module`, and `x.shape[0]`. The program uses them in tensor arithmetic, branches, `range` loops, sizes, Python
arithmetic, tensor methods taking numbers, returns numbers it computed and writes numbers back. It is jitted
(cache="automatic" mostly, else "symbolic values") and called CALLS times with changing values: the same again,
another value, 0 and 1, negative, a float where an int was (and the reverse), True/False, large values, nan,
infinities, -0.0, and another size of `x`. Eager runs the same source (its own globals and cell) on equal, separate
inputs. Results (tensors: equal, or close where floats may round differently; numbers: equal and of the same
type, nan and the sign of zero included) and the final state of every object must match, and an exception in
one must be one in the other. Outcomes are counted (`minijit.cache_info`), and a hit for a set of values the
function was never called with before (only an entry traced with symbolic values can serve it) must be common,
so that the test fails where automatic dynamic is bypassed.
`MINIJIT_DYNAMIC_FUZZ_PROGRAMS` sets how many programs run (each CI lane its own seeds, `tests.lanes`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import textwrap
from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn

import minijit
from minijit.errors import MinijitError
from minijit.testing import tolerance
from tests.lanes import lane_seeds

PROGRAMS = int(os.environ.get("MINIJIT_DYNAMIC_FUZZ_PROGRAMS", "60"))
CALLS = 6  # calls per program, the values changing between them
# Of the calls after each program's first: hits for values the program reads never seen before (about 10% of them
# with automatic dynamic, in each lane; none with cache="constant values", which every such call misses). Most later
# calls miss: nan, infinities, type switches and the values `range`, `int()` or `math.floor` need are guarded.
MIN_SYMBOLIC_HIT_SHARE = 0.05
TOL = tolerance(torch.float32, reduction_length=16)

# Where the program reads numbers: int-like places, float-like places (each may hold any kind of value).
INTS = ["n", "o.k", "G", "c", "lst[0]", "d['a']", "m.k", "x.shape[0]"]
FLOATS = ["f", "o.s", "H", "lst[1]", "d['b']", "m.s"]
# The value each place holds (`x.shape[0]` is the size `S`).
SOURCES = {"n": "n", "o.k": "ok", "G": "G", "c": "c", "lst[0]": "l0", "d['a']": "da", "m.k": "mk",
           "x.shape[0]": "S", "f": "f", "o.s": "os", "H": "H", "lst[1]": "l1", "d['b']": "db", "m.s": "ms"}
INT_VALUES = [2, 3, 4, 5]
FLOAT_VALUES = [0.25, 0.75, 1.5, 2.5]

# Program steps over `x` (the tensor), `acc` (a tensor returned) and `r` (a number returned); {I} is an int-like
# place, {F} a float-like one.
STEPS = [
    "acc = acc * {F} + {I}",
    "acc = acc + {I} * {F}",
    "if {I} > 3:\n    acc = acc + 1\nelse:\n    acc = acc - 1",
    "if {F} < 0.5:\n    acc = acc * 2",
    "if {I} == 1:\n    r = r + 1",
    "if not {I}:\n    acc = acc + 5",
    "for _ in range(min({I}, 3)):\n    acc = acc + 1",
    "for i in range({I} % 4):\n    r = r + i",
    "acc = acc + x[:{I}].sum()",
    "acc = acc + x[:{I}].sum(0)",
    "acc = acc + x.view({I}, -1).sum()",
    "acc = acc + torch.full(({I} % 5,), {F}).sum()",
    "acc = acc + x.new_zeros({I} % 7).sum()",
    "acc = acc + x[:1].expand({I} % 4, 3).sum(0)",
    "acc = acc * (x.shape[0] + {I})",
    "r = r + {I} // 3 + {I} % 3",
    "r = r + {I} ** 2",
    "r = r - {I}",
    "r = -r + {F}",
    "r = r + abs({I}) + abs({F})",
    "r = r + min({I}, {F}) + max({I}, 2)",
    "r = r + round({F})",
    "r = r + round({F}, 1)",
    "r = r + int({F})",
    "r = r + float({I})",
    "r = r + math.floor({F}) + math.ceil({F})",
    "r = r + math.sqrt(abs({F}))",
    "r = r + {F} / 2",
    "r = r * {F}",
    "r = r + {F} // 1.5 + {F} % 1.5",
    "r = r + (1 if {F} == {I} else 0)",
    "r = r + b",
    "if b:\n    acc = acc + {I}",
    "acc = acc.clamp(min={F})",
    "acc = acc.clamp(max={I})",
    "acc = acc.pow({F})",
    "acc = acc.roll({I}, 0)",
    "acc = acc + x.narrow(0, 0, min({I}, x.shape[0])).sum()",
    "acc = acc + x.flatten().topk(min({I}, x.numel())).values.sum()",
    "acc = acc + r",
    "o.count += 1",
    "o.count = o.count + {I}",
    "lst.append({I})",
    "lst.append(r)",
    "d['c'] = {I} + 1",
    "m.k = m.k + 1",
    "o.s = {F} * 2",
    "r = r + len(lst)",
    "r = r + {I} / 2 + divmod({I}, 3)[1]",
    "r = r + ({I} << 1) + ({I} & 3)",
    "r = r + {F} ** 2 - {F}",
    "r = r + math.copysign(1.0, {F})",
    "r = r + (2 if {F} != {F} else 1) + math.isfinite({F})",
    "r = r + {F}.is_integer()",
    "r = r + bool({F}) + bool({I})",
    "r = r + ({I} if {I} > 0 else -{I})",
    "r = r + max({F}, 0.0) * {I}",
    "acc = acc + torch.arange({I} % 5).sum()",
    "acc = acc + x.new_full(({I} % 4,), {F}).sum()",
    "acc = acc + x.repeat({I} % 3 + 1, 1).sum(0)",
    "acc = acc + x.unsqueeze(0).expand({I} % 3, -1, -1).sum(0).sum(0)",
    "acc = acc + x.flatten()[:{I} * x.shape[0]].sum()",
    "acc = acc + torch.linspace(0, {F}, {I} % 4).sum()",
    "acc = acc * (x.sum() * {F} > {I})",
    "acc = torch.cat([acc, acc[:{I} % 3]])[:x.shape[0]]",
    "acc = acc + x.chunk(max({I} % 4, 1))[0].sum()",  # (chunks of an empty x: as many pieces as asked)
    "acc = acc + torch.nn.functional.pad(x, (0, {I} % 3)).sum(1, keepdim=True)",
    "G = G + {I}",
    "H = {F} / 4",
    "c = c + 1",
    "m.s = m.s * {F}",
    "d['a'] = d['a'] - {I}",
    "lst[0] = lst[0] + {F}",
]
# Each returns `acc`: an op whose result is unused is dropped from the trace, and with it an error eager raises there
# (not this fuzzer's subject).
RETURNS = ["acc, r", "acc, r, n + 1, f / 2", "acc, (r,)", "acc * 2, {I} + 1, {F} / 2", "acc, {I} - 1, r"]


class Obj:
    """A plain object argument holding numbers."""


class Mod(nn.Module):
    """A module whose plain attributes hold numbers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def random_program(rng: random.Random) -> str:
    """The source of `make()`, which returns (the program, a setter and a getter of its closure cell)."""
    def fill(template: str) -> str:
        return template.replace("{I}", rng.choice(INTS)).replace("{F}", rng.choice(FLOATS))

    steps = [fill(step) for step in rng.choices(STEPS, k=rng.randrange(2, 7))]
    body = ["global G, H", "nonlocal c", "acc = x * 1.0", f"r = {rng.choice(['0', '0.0'])}", *steps,
            f"return {fill(rng.choice(RETURNS))}"]
    program = "def program(x, n, f, b, o, lst, d, m):\n" + textwrap.indent("\n".join(body), "    ")
    return ("def make():\n    c = 0\n" + textwrap.indent(program, "    ")
            + "\n    def set_c(v):\n        nonlocal c\n        c = v\n    return program, set_c, lambda: c\n")


def compile_program(source: str) -> tuple[Any, Any, dict[str, Any]]:
    """The program, its cell's setter and getter and its globals, fresh."""
    namespace: dict[str, Any] = {"torch": torch, "math": math, "G": 0, "H": 0.0}
    exec(compile(source, "<dynamic values fuzz program>", "exec"), namespace)
    program, set_c, get_c = namespace["make"]()
    return program, set_c, get_c, namespace


def first_values(rng: random.Random) -> dict[str, Any]:
    values: dict[str, Any] = {SOURCES[p]: rng.choice(INT_VALUES) for p in INTS}
    values.update({SOURCES[p]: rng.choice(FLOAT_VALUES) for p in FLOATS})
    values["b"] = rng.random() < 0.5
    return values


def _changed(old: Any, kind: str, rng: random.Random) -> Any:
    """Another value for a place that holds `old`, of the kind drawn."""
    floaty = isinstance(old, float)
    return {"other": lambda: rng.choice(FLOAT_VALUES if floaty else INT_VALUES),
            "zero": lambda: 0.0 if floaty else 0, "one": lambda: 1.0 if floaty else 1,
            "negative": lambda: -rng.choice(FLOAT_VALUES if floaty else INT_VALUES),
            "type": lambda: (int(old) if math.isfinite(old) else 3) if floaty else float(old),
            "bool": lambda: rng.random() < 0.5, "large": lambda: 1e30 if floaty else 10**6,
            "nan": lambda: float("nan"), "inf": lambda: rng.choice([math.inf, -math.inf]), "-0.0": lambda: -0.0,
            }[kind]()


def next_values(values: dict[str, Any], read: list[str], rng: random.Random) -> tuple[str, dict[str, Any]]:
    """The values of the next call: the same, or one to three places changed, mostly places in `read` (those the
    program reads)."""
    if rng.random() < 0.15:
        return "same", dict(values)
    values = dict(values)
    words = []
    places = read if read and rng.random() < 0.8 else sorted(values)
    for name in rng.sample(places, min(len(places), rng.choice([1, 1, 2, 3]))):
        if name == "S":
            values["S"] = rng.choice([0, 1, 2, 3, 4, 5, 7, 100])
        elif name == "b":
            values["b"] = not values["b"]
        else:
            kind = rng.choice(["other"] * 4 + ["zero", "one", "negative", "negative", "type", "type", "bool", "large",
                                                "nan", "inf", "-0.0"])
            values[name] = _changed(values[name], kind, rng)
        words.append(f"{name}={values[name]!r}")
    return " ".join(words), values


@dataclasses.dataclass
class Side:
    """One side's function and objects (jit or eager): separate, equal."""

    fn: Any
    set_c: Any
    get_c: Any
    namespace: dict[str, Any]
    o: Obj
    lst: list[Any]
    d: dict[str, Any]
    m: Mod

    def prepare(self, values: dict[str, Any]) -> None:
        """Put the call's values in their places (the objects are the same from call to call)."""
        self.o.__dict__.clear()
        self.o.k, self.o.s, self.o.count = values["ok"], values["os"], 0
        self.lst[:] = [values["l0"], values["l1"]]
        self.d.clear()
        self.d.update(a=values["da"], b=values["db"])
        self.m.k, self.m.s = values["mk"], values["ms"]
        self.namespace["G"], self.namespace["H"] = values["G"], values["H"]
        self.set_c(values["c"])

    def state(self) -> dict[str, Any]:
        return {"o": dict(vars(self.o)), "lst": list(self.lst), "d": dict(self.d), "m.k": self.m.k, "m.s": self.m.s,
                "G": self.namespace["G"], "H": self.namespace["H"], "c": self.get_c()}

    def run(self, x: torch.Tensor, values: dict[str, Any]) -> tuple[str, Any]:
        try:
            return "returned", self.fn(x, values["n"], values["f"], values["b"], self.o, self.lst, self.d, self.m)
        except MinijitError as e:
            return "refused", e
        except Exception as e:  # (eager raising is an outcome to compare)
            return "raised", e


def side(source: str, jit: str | None) -> Side:
    fn, set_c, get_c, namespace = compile_program(source)
    return Side(minijit.jit(fn, cache=jit) if jit else fn, set_c, get_c, namespace, Obj(), [], {}, Mod())


def difference(have: Any, want: Any, where: str) -> str | None:
    """How `have` (jit) differs from `want` (eager), or None: tensors equal or close (nan where eager has nan),
    numbers equal with the same type (nan equal to nan, -0.0 not equal to 0.0), containers item by item."""
    if isinstance(want, torch.Tensor):
        if not isinstance(have, torch.Tensor) or have.dtype != want.dtype or have.shape != want.shape:
            return f"{where}: {_short(have)} (jit) != {_short(want)} (eager)"
        if not torch.equal(have, want):
            try:
                torch.testing.assert_close(have, want, equal_nan=True, **TOL)
            except AssertionError as e:
                return f"{where}: {e}"
        return None
    if isinstance(want, list | tuple | dict):
        if type(have) is not type(want) or len(have) != len(want):
            return f"{where}: {_short(have)} (jit) != {_short(want)} (eager)"
        if isinstance(want, dict):
            if list(have) != list(want):
                return f"{where}: keys {list(have)} (jit) != {list(want)} (eager)"
            have, want = list(have.values()), list(want.values())
        return next((diff for i, (h, w) in enumerate(zip(have, want, strict=True))
                     if (diff := difference(h, w, f"{where}[{i}]")) is not None), None)
    if type(have) is not type(want) or not _same_number(have, want):
        return f"{where}: {have!r} ({type(have).__name__}, jit) != {want!r} ({type(want).__name__}, eager)"
    return None


def _same_number(a: Any, b: Any) -> bool:
    if isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return bool(a == b)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 300 else text[:300] + "..."


def _outcome(before: minijit.CacheInfo, after: minijit.CacheInfo) -> str:
    for name in ("rebound", "misses", "eager_calls", "hits"):
        if getattr(after, name) > getattr(before, name):
            return name
    return "none"


def _read_values(values: dict[str, Any], source: str) -> tuple[Any, ...]:
    """The call's values at the places the program's source reads, with their types (1, 1.0 and True differ; nan
    is itself): a hit for a tuple of them never seen before is one only an entry with symbolic values can serve
    (`x.shape[0]` is read by every program: the size of `acc`)."""
    body = source[source.index("acc = x * 1.0"):source.index("def set_c")]
    read = [name for place, name in SOURCES.items() if place == "x.shape[0]" or (
        place in body if not place.isidentifier() else re.search(rf"(?<![.\w'\"]){place}(?![\w'\"])", body))]
    return tuple((name, type(values[name]).__name__, repr(values[name])) for name in sorted(read))


def run_one(seed: int, outcomes: Counter[str]) -> str | None:
    """Program `seed` over CALLS sets of values, under jit and eagerly, counting outcomes: None, or the first
    mismatch (naming the seed, the program, the values of each call and how the call was served)."""
    rng = random.Random(seed)
    source = random_program(rng)
    cache = "symbolic values" if rng.random() < 0.2 else "automatic"
    mine, theirs = side(source, cache), side(source, None)
    values, kind, history, seen = first_values(rng), "first", [], set()
    for call in range(CALLS):
        if call:
            kind, values = next_values(values, [name for name, _, _ in _read_values(values, source)], rng)
        history.append(f"# call {call}: {kind}: {values}")
        x = torch.randn(values["S"], 3, generator=torch.Generator().manual_seed(seed * 31 + call))
        mine.prepare(values)
        theirs.prepare(values)
        before = dataclasses.replace(minijit.cache_info(mine.fn))
        want = theirs.run(x.clone(), values)
        have = mine.run(x.clone(), values)
        outcome = _outcome(before, minijit.cache_info(mine.fn))
        where = (f"\nseed {seed}, call {call} ({outcome}, cache={cache!r}); again: "
                 f"`from tests.runtime.test_dynamic_values_fuzz import *; run_one({seed}, Counter())`\n{source}"
                 + "\n".join(history))
        read = _read_values(values, source)
        new_values = read not in seen
        seen.add(read)
        if have[0] == "refused":
            outcomes["refused"] += 1
            continue
        if (want[0] == "raised") != (have[0] == "raised"):
            return f"eager {want[0]} {_short(want[1])}, jit {have[0]} {_short(have[1])}{where}"
        # (where both raised, eager's writes before the raise need not have landed: any exception is fine)
        diff = None if want[0] == "raised" else (difference(have[1], want[1], "result")
                                                 or difference(mine.state(), theirs.state(), "state"))
        if diff is not None:
            outcomes[f"mismatch ({outcome})"] += 1
            return f"result or state differs from eager's at {diff}{where}"
        outcomes["eager raised" if want[0] == "raised" else outcome] += 1
        if call and outcome == "hits" and new_values:
            outcomes["symbolic hits"] += 1
    return None


# A call whose trace raised where eager does not runs eagerly, with this warning (a number proxy lacking `divmod`,
# `<<` or `float.is_integer`): an outcome like another here, its result compared with eager's all the same.
@pytest.mark.filterwarnings("ignore::minijit.runtime.fallback.TracingRaisedWarning")
def test_random_programs_over_changing_numbers_match_eager() -> None:
    outcomes: Counter[str] = Counter()
    mismatches = [m for seed in lane_seeds(PROGRAMS) if (m := run_one(seed, outcomes)) is not None]
    later = sum(v for k, v in outcomes.items() if k != "symbolic hits") - PROGRAMS
    print(f"\n{PROGRAMS} programs: {dict(outcomes)}")
    assert not mismatches, "\n\n".join(mismatches)
    assert outcomes["symbolic hits"] >= MIN_SYMBOLIC_HIT_SHARE * later, dict(outcomes)
