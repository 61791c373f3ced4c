"""Differential fuzzing of rebinding: random programs over random object graphs, called on fresh graphs.

A jitted function called with new objects of the kinds it was traced with reuses its entry, moved to the
new objects (`minijit.runtime.rebind`, `cache_info(j).rebound`). Each seed draws an object graph (plain
objects of two small classes, lists, tuples, dicts keyed by strings, ints, objects and tensors, closures,
functions, partials, bound methods, counters and weakrefs stored as attributes, objects shared at two places,
tensors) and a small program over it and a second argument, its own object or one of the graph's (source text:
reads of attributes and items, branches on Python values read, calls of the stored callables, writes of tensors
and Python values, appends, tensors as dict keys), jitted with cache="automatic" or "symbolic values".
The program is jitted and called on graph A, then on fresh graphs B, C, ... built by the same builder
with the same or a perturbed configuration (other tensor values, other Python values, one object shared
where there were two or the reverse, another callable, a missing key, an extra list item or attribute, another
kind of leaf, other keys' order, another tensor size);
now and then again on the graph of the call before. Eager runs on a second build of each graph (equal
objects, separate), and the results and the final state of every object must be equal: tensors by
`torch.equal`, Python values by `==`, and which places hold one object. A mismatch fails naming the seed
and the program's source; outcomes (hits, rebinds, misses, refusals) are counted and printed.
`MINIJIT_REBIND_FUZZ_PROGRAMS` sets how many programs run (each CI lane its own seeds, `tests.lanes`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import textwrap
import types
import weakref
from collections import Counter
from typing import Any

import torch

import minijit
from minijit.errors import MinijitError
from tests.lanes import lane_seeds

PROGRAMS = int(os.environ.get("MINIJIT_REBIND_FUZZ_PROGRAMS", "80"))
CALLS = 6  # calls per program: graph A, then fresh (or perturbed) graphs
MIN_REBOUND_SHARE = 0.2  # of the calls after each program's first


class Node:
    """The root of a graph: a plain object (all its state in `__dict__`)."""


class Leaf:
    """A plain object holding a tensor, a number and a callable."""

    def __init__(self, t: torch.Tensor, n: int, fn: Any) -> None:
        self.t, self.n, self.fn = t, n, fn

    def scaled(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.n


class SubLeaf(Leaf):
    """Another kind of leaf: a new graph with one in place of a `Leaf` is not the same kind of graph."""


def double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def plus_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1


def _closure(c: float) -> Any:
    return lambda t: t * c


def _with_default(k: int) -> Any:
    def f(t: torch.Tensor, k: int = k) -> torch.Tensor:
        return t + k
    return f


def _over_leaf(leaf: Leaf) -> Any:
    return lambda t: t + leaf.t * leaf.n


def _counter(start: int) -> Any:
    """A closure that counts its calls in its own cell."""
    def tick() -> int:
        nonlocal start
        start += 1
        return start
    return tick


def _two_over_one_cell(c: float) -> tuple[Any, Any]:
    """Two closures sharing one cell."""
    def get(t: torch.Tensor) -> torch.Tensor:
        return t * c

    def bump(t: torch.Tensor) -> torch.Tensor:
        nonlocal c
        c = c + 1
        return t + c
    return get, bump


def _writer(leaf: Leaf) -> Any:
    """A closure that writes into the leaf it closes over, then reads it."""
    def write(t: torch.Tensor) -> torch.Tensor:
        leaf.n = leaf.n + 1
        return t * leaf.n
    return write


CALLABLE_KINDS = ("closure", "default", "code", "partial", "leaf-closure", "method", "writer")


@dataclasses.dataclass(frozen=True)
class Config:
    """What a graph is built from: building it twice gives equal, separate graphs."""

    tensors: int  # seed of the tensors' values
    shape: tuple[int, ...]
    scale: float
    count: int
    flag: bool
    mode: str
    shared: bool  # g.a is g.b
    key_shared: bool  # the object key of g.by_obj is g.a
    tkey_shared: bool  # the tensor key of g.by_tensor is g.t
    fn: tuple[str, int]  # which callable g.fn is
    items: int  # tensors in g.items
    table: tuple[str, ...]  # keys of g.table
    note: bool  # g has an attribute `note`
    reversed_table: bool  # g.table's keys in the other order
    nums: tuple[int, ...]  # g.nums, a list of numbers
    sub: bool  # g.b is a SubLeaf
    ref_b: bool  # g.ref refers to g.b (else g.a)
    tick: int  # where g.tick starts counting
    one_cell: bool  # g.leaves[0].fn and g.leaves[1].fn share one cell
    h_is_a: bool  # the second argument is g.a (else a leaf of its own)


def random_config(rng: random.Random) -> Config:
    return Config(tensors=rng.randrange(1000), shape=rng.choice([(3,), (2, 3)]), scale=rng.choice([0.5, 2.0, 3.0]),
                  count=rng.randrange(3), flag=rng.random() < 0.5, mode=rng.choice(["add", "mul", "sub"]),
                  shared=rng.random() < 0.3, key_shared=rng.random() < 0.5, tkey_shared=rng.random() < 0.5,
                  fn=(rng.choice(CALLABLE_KINDS), rng.randrange(2)), items=rng.randrange(1, 4),
                  table=("w", "m") if rng.random() < 0.8 else ("w",), note=rng.random() < 0.3,
                  reversed_table=rng.random() < 0.2, nums=tuple(rng.randrange(1, 4) for _ in range(rng.randrange(3))),
                  sub=rng.random() < 0.2, ref_b=rng.random() < 0.3, tick=rng.randrange(3), one_cell=rng.random() < 0.5,
                  h_is_a=rng.random() < 0.5)


def perturb(cfg: Config, rng: random.Random) -> tuple[str, Config]:
    """A configuration for the next call: mostly the same but for the tensors' values, else one thing changed."""
    cfg = dataclasses.replace(cfg, tensors=rng.randrange(1000))
    kind = rng.choice(["same"] * 8 + ["value", "shared", "key", "tkey", "callable", "missing", "extra", "note",
                                      "order", "nums", "sub", "ref", "tick", "cell", "h", "shape"])
    changed = {
        "same": {},
        "value": rng.choice([{"scale": cfg.scale * 2}, {"count": cfg.count + 1}, {"flag": not cfg.flag},
                             {"mode": "sub" if cfg.mode != "sub" else "add"}]),
        "shared": {"shared": not cfg.shared},
        "key": {"key_shared": not cfg.key_shared},
        "tkey": {"tkey_shared": not cfg.tkey_shared},
        "callable": {"fn": rng.choice([(cfg.fn[0], 1 - cfg.fn[1]), (rng.choice(CALLABLE_KINDS), cfg.fn[1])])},
        "missing": {"table": cfg.table[:-1]},
        "extra": {"items": cfg.items + 1},
        "note": {"note": not cfg.note},
        "order": {"reversed_table": not cfg.reversed_table},
        "nums": {"nums": rng.choice([(*cfg.nums, 2), cfg.nums[1:], tuple(n + 1 for n in cfg.nums)])},
        "sub": {"sub": not cfg.sub},
        "ref": {"ref_b": not cfg.ref_b},
        "tick": {"tick": cfg.tick + 1},
        "cell": {"one_cell": not cfg.one_cell},
        "h": {"h_is_a": not cfg.h_is_a},
        "shape": {"shape": (*cfg.shape[:-1], cfg.shape[-1] + 1)},
    }[kind]
    return kind, dataclasses.replace(cfg, **changed)


def build(cfg: Config) -> Node:
    """A fresh graph for `cfg`."""
    gen = torch.Generator().manual_seed(cfg.tensors)

    def tensor() -> torch.Tensor:
        return torch.randn(cfg.shape, generator=gen)

    g = Node()
    g.t, g.scale, g.count, g.flag, g.mode = tensor(), cfg.scale, cfg.count, cfg.flag, cfg.mode
    a = Leaf(tensor(), cfg.count + 1, double)
    b = a if cfg.shared else (SubLeaf if cfg.sub else Leaf)(tensor(), cfg.count + 2, plus_one)
    g.a, g.b = a, b
    g.pair = (a, tensor(), cfg.scale + 1)
    g.items = [tensor() for _ in range(cfg.items)]
    g.leaves = [Leaf(tensor(), i + 1, _closure(i + 0.5)) for i in range(2)]
    if cfg.one_cell:
        g.leaves[0].fn, g.leaves[1].fn = _two_over_one_cell(cfg.scale)
    g.nums = list(cfg.nums)
    g.ref = weakref.ref(b if cfg.ref_b else a)
    g.tick = _counter(cfg.tick)
    g.table = {k: (tensor() if k == "w" else cfg.scale * 3)
               for k in (reversed(cfg.table) if cfg.reversed_table else cfg.table)}
    g.by_id = {0: tensor(), 1: tensor()}
    g.keyobj = a if cfg.key_shared else Leaf(tensor(), 5, double)
    g.by_obj = {g.keyobj: tensor()}
    g.tkey = g.t if cfg.tkey_shared else tensor()
    g.by_tensor = {g.tkey: tensor()}
    g.cfg = {"scale": cfg.scale, "nested": {"k": cfg.count}}
    kind, k = cfg.fn
    g.fn = {"closure": lambda: _closure(k + 1.5), "default": lambda: _with_default(k + 1),
            "code": lambda: [double, plus_one][k], "partial": lambda: functools.partial(torch.add, other=k + 1),
            "leaf-closure": lambda: _over_leaf([a, g.leaves[0]][k]), "method": lambda: [a, b][k].scaled,
            "writer": lambda: _writer([b, g.leaves[1]][k])}[kind]()
    g.h = a if cfg.h_is_a else Leaf(tensor(), 7, double)  # (passed as the second argument too)
    if cfg.note:
        g.note = tensor()
    return g


# Program steps: statements over `g` (the graph), `x` (a tensor) and `acc` (the tensor returned).
STEPS = [
    "acc = acc + g.t * g.scale",
    "if g.flag:\n    acc = acc * 2\nelse:\n    acc = acc - 1",
    "if g.mode == 'add':\n    acc = acc + g.a.t\nelif g.mode == 'mul':\n    acc = acc * g.a.t\nelse:\n    acc = acc - g.b.t",
    "acc = g.fn(acc)",
    "acc = g.a.fn(acc) + g.b.fn(x)",
    "g.a.t = acc * 0.5",
    "acc = acc + g.b.t",
    "g.a.n = g.a.n + 1",
    "acc = acc * g.b.n",
    "g.items.append(acc * 3)",
    "acc = acc + g.items[-1]",
    "if len(g.items) > 2:\n    acc = acc + 1",
    "g.table['k'] = acc * 2",
    "acc = acc + g.table['w']",
    "if 'm' in g.table:\n    acc = acc * g.table['m']",
    "for k, v in g.by_id.items():\n    acc = acc + v * k",
    "acc = acc + g.by_obj[g.keyobj]",
    "for k in g.by_obj:\n    acc = acc + k.t * k.n",
    "g.by_obj[g.b] = acc + 1",
    "g.by_tensor[g.t] = acc * 2",
    "acc = acc + g.by_tensor[g.tkey]",
    "for k, v in g.by_tensor.items():\n    acc = acc + k * v",
    "g.a.t.add_(x)",
    "g.a, g.b = g.b, g.a",
    "g.count = g.count + 1",
    "acc = acc + g.count",
    "g.flag = not g.flag",
    "g.pair[0].t = acc - 1",
    "acc = acc + g.pair[1] * g.pair[2]",
    "g.cfg['scale'] = g.cfg['scale'] * 2",
    "acc = acc * g.cfg['scale'] + g.cfg['nested']['k']",
    "g.leaves[0].fn = g.fn",
    "acc = g.leaves[0].fn(acc) + g.leaves[1].fn(x)",
    "for leaf in g.leaves:\n    acc = acc + leaf.t * leaf.n",
    "g.items = g.items + [acc]",
    "if hasattr(g, 'note'):\n    acc = acc + g.note",
    "g.note = acc * 4",
    "g.table.pop('w', None)",
    "if g.a is g.b:\n    acc = acc + 10",
    "if g.keyobj is g.a:\n    acc = acc - 10",
    "if len(g.items) > 1:\n    g.items.pop()",
    "g.items.insert(0, acc)",
    "g.table.update({'u': acc})",
    "g.new = Leaf(acc, g.count, g.fn)",
    "for n in g.nums:\n    acc = acc * n",
    "acc = acc + sum(g.nums)",
    "g.nums.append(g.count)",
    "acc = acc + g.ref().t * g.ref().n",
    "if g.pair[0] is g.a:\n    acc = acc + 3",
    "for k in g.by_obj:\n    acc = k.fn(acc)",
    "g.t.mul_(2)",
    "acc = acc + g.tkey",
    "g.b.fn = lambda t: t * g.scale",
    "g.by_id[len(g.items)] = acc",
    "acc = acc + g.by_id.get(2, x)",
    "if isinstance(g.b, SubLeaf):\n    acc = acc * 3",
    "acc = acc * g.tick()",
    "acc = g.leaves[1].fn(acc)",
    "for k, v in g.table.items():\n    acc = acc + v",
    "h.t = acc * 3",
    "acc = acc + h.t * h.n",
    "h.n = h.n + 1",
    "acc = h.fn(acc)",
    "if h is g.a:\n    acc = acc * 0.5",
]
RETURNS = ["acc", "acc, g.count", "acc, g.items", "acc, g.a", "acc, g.flag, len(g.table)"]


def random_program(rng: random.Random) -> str:
    body = ["acc = x * 1.0", *rng.choices(STEPS, k=rng.randrange(2, 8)), f"return {rng.choice(RETURNS)}"]
    return "def program(g, h, x):\n" + textwrap.indent("\n".join(body), "    ") + "\n"


def compile_program(source: str) -> Any:
    namespace: dict[str, Any] = {}
    namespace.update(Leaf=Leaf, SubLeaf=SubLeaf)
    exec(compile(source, "<rebind fuzz program>", "exec"), namespace)
    return namespace["program"]


def snapshot(graph: Node, result: Any) -> Any:
    """The graph's state and the call's result as plain data: each object and tensor once, at the first place the
    walk meets it, and as a reference to that place elsewhere, so that equal snapshots mean equal values and the
    same places sharing objects. A list, tuple or dict in the result is walked by value: results in containers
    are rebuilt (docs/design.md, invariant 8), while the objects and tensors in them are the very ones."""
    seen: dict[int, str] = {}
    alive: list[Any] = []

    def walk(x: Any, path: str, rebuilt: bool = False) -> Any:
        if x is None or type(x) in (bool, int, float, str):
            return (type(x).__name__, x)
        if rebuilt and isinstance(x, list | tuple | dict):
            return contents(x, path, rebuilt)
        if id(x) in seen:
            return ("same as", seen[id(x)])
        seen[id(x)] = path
        alive.append(x)
        return contents(x, path, False)

    def contents(x: Any, path: str, rebuilt: bool) -> Any:
        if isinstance(x, torch.Tensor):
            return ("tensor", x.detach().clone())
        if isinstance(x, list | tuple):
            return (type(x).__name__, [walk(v, f"{path}[{i}]", rebuilt) for i, v in enumerate(x)])
        if isinstance(x, dict):
            return ("dict", [(walk(k, f"{path}.key{i}"), walk(v, f"{path}[{i}]", rebuilt))
                             for i, (k, v) in enumerate(x.items())])
        if isinstance(x, types.FunctionType):
            cells = [c.cell_contents for c in x.__closure__ or ()]
            return ("function", x.__code__, walk(x.__defaults__, f"{path}.defaults"), walk(cells, f"{path}.cells"))
        if isinstance(x, functools.partial):
            return ("partial", x.func, walk(x.args, f"{path}.args"), walk(x.keywords, f"{path}.keywords"))
        if isinstance(x, types.MethodType):
            return ("method", x.__func__, walk(x.__self__, f"{path}.self"))
        if isinstance(x, weakref.ref):
            return ("weakref", walk(x(), f"{path}()"))
        if isinstance(x, Node | Leaf):
            return (type(x).__name__, [(k, walk(v, f"{path}.{k}")) for k, v in sorted(vars(x).items())])
        raise AssertionError(f"the fuzzer meets an unexpected {type(x)} at {path}")

    return [walk(graph, "g"), walk(result, "result", rebuilt=True)]


def difference(have: Any, want: Any, where: str = "") -> str | None:
    """Where snapshots `have` and `want` first differ, and how; None where they are equal."""
    if isinstance(want, torch.Tensor):
        if not (isinstance(have, torch.Tensor) and have.dtype == want.dtype and have.shape == want.shape
                and torch.equal(have, want)):
            return f"{where}: {have} (jit) != {want} (eager)"
        return None
    if isinstance(want, list | tuple):
        if type(have) is not type(want) or len(have) != len(want):
            return f"{where}: {_short(have)} (jit) != {_short(want)} (eager)"
        if len(want) == 2 and isinstance(want[0], str) and isinstance(want[1], list):  # (kind, parts)
            where = f"{where} {want[0]}"
        return next((d for i, (h, w) in enumerate(zip(have, want, strict=True))
                     if (d := difference(h, w, f"{where}/{i}")) is not None), None)
    return None if type(have) is type(want) and have == want else f"{where}: {have!r} (jit) != {want!r} (eager)"


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 300 else text[:300] + "..."


def _run(fn: Any, g: Node, x: torch.Tensor) -> tuple[str, Any]:
    try:
        return "returned", fn(g, g.h, x)
    except MinijitError as e:
        return "refused", e
    except Exception as e:  # (eager raising is an outcome to compare)
        return "raised", e


def _outcome(before: minijit.CacheInfo, after: minijit.CacheInfo) -> str:
    for name in ("rebound", "misses", "eager_calls", "hits"):
        if getattr(after, name) > getattr(before, name):
            return name
    return "none"


def run_one(seed: int, outcomes: Counter[str]) -> str | None:
    """Program `seed` on CALLS graphs under jit and eagerly, counting outcomes: None, or the first mismatch (naming
    the seed, the program, the graphs' configurations and how the call was served)."""
    rng = random.Random(seed)
    source = random_program(rng)
    program = compile_program(source)
    cache = "symbolic values" if rng.random() < 0.3 else "automatic"
    jitted = minijit.jit(program, cache=cache)
    cfg = random_config(rng)
    kind, history = "first", []
    mine = theirs = None
    for call in range(CALLS):
        if mine is not None and rng.random() < 0.2:
            kind = "again"  # the graph of the call before, as that call left it
        else:
            if call:
                kind, cfg = perturb(cfg, rng)
            mine, theirs = build(cfg), build(cfg)
        history.append(f"# call {call}: {kind} {cfg}")
        x = torch.randn(cfg.shape, generator=torch.Generator().manual_seed(seed * 31 + call))
        before = dataclasses.replace(minijit.cache_info(jitted))
        want = _run(program, theirs, x.clone())
        have = _run(jitted, mine, x.clone())
        outcome = _outcome(before, minijit.cache_info(jitted))
        where = (f"\nseed {seed}, call {call} ({outcome}, cache={cache!r}); again: "
                 f"`from tests.semantics.test_rebind_fuzz import *; run_one({seed}, Counter())`\n{source}"
                 + "\n".join(history))
        if have[0] == "refused":
            outcomes["refused"] += 1
            mine = None  # (its state need not be eager's: not called again)
            continue
        if want[0] == "raised":
            outcomes["eager raised"] += 1
            mine = None
            if have[0] != "raised" or type(have[1]) is not type(want[1]):
                return f"eager raised {want[1]!r}, jit {have[0]} {have[1]!r}{where}"
            continue
        if have[0] == "raised":
            return f"jit raised {have[1]!r}{where}"
        diff = difference(snapshot(mine, have[1]), snapshot(theirs, want[1]), "[graph, result]")
        if diff is not None:
            outcomes[f"mismatch ({outcome})"] += 1
            return f"result or state differs from eager's at {diff}{where}"
        outcomes[outcome] += 1
    return None


def test_random_programs_on_fresh_graphs_match_eager() -> None:
    outcomes: Counter[str] = Counter()
    mismatches = [m for seed in lane_seeds(PROGRAMS) if (m := run_one(seed, outcomes)) is not None]
    later = sum(outcomes.values()) - PROGRAMS
    print(f"\n{PROGRAMS} programs, {sum(outcomes.values())} calls: {dict(outcomes)}")
    assert not mismatches, "\n\n".join(mismatches)
    assert outcomes["rebound"] >= MIN_REBOUND_SHARE * later, dict(outcomes)
