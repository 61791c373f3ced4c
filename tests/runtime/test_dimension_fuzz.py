"""Differential fuzzing of cache="automatic" over sizes that change dim by dim, across several tensor arguments.

The automatic mode makes symbolic only the dims that changed between calls (minijit.runtime.dynamic): a call that
differs from a traced one in some sizes traces again with those dims symbolic and the others constant, and a later
change of another dim widens again. Each seed draws a small program (source text, exec'd) over 2-3 tensor arguments
`a`, `b`, `c` of rank 1-4 whose dims are named by letters (`a` of dims B, N, K; `b` of a's last dims, or a matmul's
(K, M); `c` of a's last dim), and a sequence of calls in which the letters' sizes change one at a time: a dim
changes, then another, then back; a dim goes to 1 and back; a dim of `b` alone goes to 1 (broadcasting); two
letters become equal then differ (`a @ a.mT` square, `a + b` where b's dim equals a's); a size of 0; and an argument
passed as a transposed, sliced or expanded view or channels-last in place of a contiguous tensor. Programs use
broadcasting arithmetic, matmul/bmm/einsum, reductions, views and reshapes, permutes, expand/repeat, cat/stack/split/
chunk/unbind, slicing by sizes, shape-driven branches and loops, `new_zeros`, `arange`, softmax/layer_norm, in-place
writes into the arguments and views of them, and arguments that require grad (`.backward()` inside, or
`torch.autograd.grad` on the results outside). Eager runs the same source on equal, separate inputs (built twice
from one seed, layouts included). Results (equal, or close where floats reorder), Python values, the arguments (and
the buffers they view) after the call, gradients, each returned tensor's strides on dims longer than 1, and whether
it aliases an input (and which) must match; an exception in one must be one in the other. Outcomes are counted
(`minijit.cache_info`); a hit for argument sizes the function was never called with (only an entry with symbolic
dims can serve it) must be common, so the test fails where automatic dynamic is bypassed.
`MINIJIT_DIMENSION_FUZZ_PROGRAMS` sets how many programs run (each CI lane its own seeds, `tests.lanes`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import textwrap
from collections import Counter
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import MinijitError
from tests.lanes import lane_seeds
from tests.runtime.test_dynamic_values_fuzz import _outcome, _short

PROGRAMS = int(os.environ.get("MINIJIT_DIMENSION_FUZZ_PROGRAMS", "40"))
CALLS = 6
# Hits for argument sizes the function was never called with, per program (one in five to one in three programs
# has one, by lane; none with cache="constant values", whose guards check every size).
MIN_SYMBOLIC_HITS_PER_PROGRAM = 1 / 8
TOL = {"rtol": 1e-4, "atol": 1e-4}
LETTERS = "BNMK"
# A `torch.Size` returned comes back as a tuple (not chased here: it is so with constant sizes too).
SIZE_AS_TUPLE = True
SIZES = [2, 3, 4, 5]


@dataclasses.dataclass
class Structure:
    """What a program is drawn for: each argument's dims, named by letters (`b` None where it has none)."""

    a: list[str]
    b: list[str]
    c: list[str] | None
    family: str  # "broadcast" (b is a's last dims) or "matmul" (b is (..., K, M))
    grad: str  # "", "inside" (.backward() in the program) or "outside" (autograd.grad on the results)
    # The int argument `n`: a letter's size plus this offset (at least 0), as a size passed along with the tensors
    n: tuple[str, int]


def draw_structure(rng: random.Random) -> Structure:
    """The arguments' ranks and dims (letters may repeat: a square `a` stays square as its letter changes)."""
    a = [rng.choice(LETTERS) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.5:
        b = a[len(a) - rng.randint(1, len(a)):]
        b = [rng.choice(LETTERS) if rng.random() < 0.15 else x for x in b]  # sometimes equal only by chance
        family = "broadcast"
    else:
        batch = a[: max(len(a) - 2, 0)]
        b = [*batch[len(batch) - rng.randint(0, len(batch)):], a[-1], rng.choice(LETTERS)]
        family = "matmul"
    c = rng.choice([None, [a[-1]], list(a)])
    grad = rng.choice(["", "", "", "inside", "outside"])
    return Structure(a, b, c, family, grad, (rng.choice(a), rng.choice([0, 0, -1, 1])))


# Steps: (the ranks a step needs, as a predicate on the structure; its text). `t` is the working tensor, of a's
# rank, `outs` the list returned. {d} is a dim of a, {d2} another, {k} True or False.
def _steps(s: Structure) -> list[str]:
    ra, rb = len(s.a), len(s.b)
    steps = [
        "t = t * 2 - a", "t = t + a.sum({d}, keepdim=True)", "outs.append(t.sum({d}, keepdim={k}))",
        "outs.append(t.amax({d}))", "outs.append(t.mean(({d}, {d2}), keepdim={k}))", "t = t.softmax(-1)",
        "t = torch.nn.functional.layer_norm(t, t.shape[-1:])", "outs.append(t.reshape(-1))",
        "outs.append(t.flatten({d}))", "outs.append(t.view(t.shape[0], -1))",
        "outs.append(t.unflatten(-1, (1, t.shape[-1])))", "outs.append(t[..., :1].expand_as(t))",
        "outs.append(t.unsqueeze(0).expand(2, *t.shape))", "outs.append(t.repeat(*([1] * (t.dim() - 1)), 2))",
        "outs.append(torch.cat([t, a], {d}))", "outs.append(torch.stack([t, a * 2]))",
        "outs.extend(t.split(2, {d}))", "outs.extend(t.chunk(2, -1))", "outs.extend(t.unbind({d}))",
        "outs.append(t[..., -1])", "outs.append(t[1:])", "outs.append(a[..., ::2])", "outs.append(a[0])",
        "outs.append(a.reshape(-1))", "outs.append(a.view(-1))", "outs.append(a.squeeze())",
        "outs.append(a.unsqueeze(1))", "outs.append(a.flatten())", "outs.append(a.contiguous())",
        "outs.append(a.expand(2, *a.shape))", "outs.append(a.narrow({d}, 0, 1))",
        "if t.shape[-1] > 3:\n    t = t * 2\nelse:\n    t = t - 1",
        "for i in range(min(t.shape[0], 3)):\n    t = t + i",
        "if t.shape[0] == 1:\n    outs.append(t.squeeze(0))",
        "if a.shape[{d}] == 0:\n    outs.append(a.sum())\nelse:\n    outs.append(t.select({d}, -1))",
        "outs.append(t.new_zeros(t.shape[1:]) + t[0])", "t = t + torch.arange(t.shape[-1])",
        "outs.append(torch.arange(a.shape[-1]) * a.shape[0])", "outs.append(t.shape)",
        "outs.append(a.shape[-1] * 2 + b.shape[0])", "outs.append(t.numel())", "outs.append(len(a))",
        "outs.append(a.size({d}) - b.size(-1))", "t = t.add_(a)", "t[..., 0] = 5",
        "outs.append(t.permute(*reversed(range(t.dim()))))", "outs.append(t.transpose(0, {d}))",
        "outs.append(a.mul_(2))", "a[0] += 1", "a[..., :1].fill_(3)", "b.add_(1)", "a.clamp_(max=1)",
        "outs.append(b.copy_(b * 2))",
        # the int argument n, a size passed with the tensors
        "outs.append(t[..., :n])", "outs.append(t.narrow(-1, 0, min(n, t.shape[-1])))",
        "outs.append(torch.arange(n) + t.shape[0])", "outs.append(t.new_zeros(n, t.shape[-1]))",
        "for i in range(min(n, 3)):\n    t = t + i", "if n == t.shape[-1]:\n    t = t * 3",
        "outs.append(a.reshape(-1, n))", "outs.append(n * a.shape[-1])", "outs.append(t.flatten()[:n])",
        "outs.append(torch.full((n,), float(a.shape[0])))", "outs.append(t.unsqueeze(0).expand(n, *t.shape))",
        # sizes of different arguments compared (one may be a constant of the trace, the other symbolic)
        "if a.shape[0] == b.shape[-1]:\n    outs.append(a.sum(0))\nelse:\n    outs.append(b.sum(-1))",
        "outs.append(torch.zeros(a.shape[0], b.shape[-1]) + t.mean())", "outs.append(a.new_ones(b.shape) * 2)",
        "outs.append(t.reshape(b.shape[0], -1))", "outs.append(t[: max(a.shape[0], b.shape[0]) - 1])",
        "outs.append(t.flatten()[: min(a.shape[-1], b.shape[-1])])",
    ]
    if ra >= 2:
        steps += ["outs.append(t @ t.mT)", "outs.append(t.mT @ t)", "a[:, 0] += 1", "outs.append(a.mT.add_(1))",
                  "outs.append(t[:, : b.shape[-1]])", "outs.append(a.mT)",
                  "if a.shape[-1] == a.shape[-2]:\n    outs.append(a @ a)\nelse:\n    outs.append(a @ a.mT)"]
    if ra <= 2:
        steps += ["a.t().add_(1)", "outs.append(a.t())"]
    if ra == 4:
        steps += ["outs.append(t.contiguous(memory_format=torch.channels_last))",
                  "outs.append(torch.nn.functional.avg_pool2d(t, 1))"]
    if s.family == "broadcast":
        steps += ["t = t + b", "t = t * b - a", "outs.append(a + b)", "outs.append(torch.where(a > 0, a, b))",
                  "outs.append(b.expand_as(a))", "t.mul_(b)", "outs.append((a - b).abs().sum(-1))",
                  "outs.append(b[..., : a.shape[-1]])", "outs.append(torch.maximum(t, b))"]
    else:
        steps += ["outs.append(a @ b)", "outs.append(torch.matmul(t, b))", "t = t + (a @ b).sum(-1, keepdim=True)",
                  "outs.append(b.mT.matmul(t.mT))"]
        if ra == 2 and rb == 2:
            steps += ["outs.append(torch.einsum('ik,kj->ij', a, b))", "outs.append(torch.mm(t, b))"]
        if ra == 3 and rb == 3:
            steps += ["outs.append(torch.bmm(a, b))", "outs.append(torch.einsum('bik,bkj->bij', t, b))"]
    if s.c is not None and len(s.c) == 1:
        steps += ["t = torch.nn.functional.layer_norm(t, t.shape[-1:], c, c)", "t = t * c", "c.zero_()",
                  "outs.append(c[: a.shape[-1]])", "outs.append(torch.outer(c, c))"]
    elif s.c is not None:
        steps += ["t = t + c", "c.mul_(a)", "outs.append(torch.stack([a, c], -1))", "outs.append(c.masked_fill(a > 0, 1))"]
    return steps


def random_program(rng: random.Random, s: Structure) -> str:
    """The source of `program(a, b, c, n)`."""
    ra = len(s.a)

    def fill(step: str) -> str:
        d = rng.randrange(-ra, ra)
        d2 = rng.choice([x for x in range(ra) if x != d % ra] or [d])
        return step.replace("{d}", str(d)).replace("{d2}", str(d2)).replace("{k}", str(rng.random() < 0.5))

    steps = [fill(step) for step in rng.choices(_steps(s), k=rng.randint(2, 6))]
    if s.grad:  # in-place writes into a leaf that requires grad: eager raises at the first, so does the program
        steps = [x for x in steps if not any(w in x for w in ("_(", "+= ", "] = "))] or ["t = t * 2"]
    body = ["outs = []", rng.choice(["t = a * 1.0", "t = a.clone()", "t = a + 0"]), *steps]
    if s.grad == "inside":  # (what was computed with grad comes back detached: minijit refuses it otherwise)
        body += ["outs = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]",
                 rng.choice(["(t * t).sum().backward()", "t.sum().backward(retain_graph=True)",
                             "outs.append(torch.autograd.grad(t.sum(), [a], allow_unused=True))"]), "t = t.detach()"]
    body.append(rng.choice(["return t, outs", "return outs", "return outs, t.shape"]))
    return "def program(a, b, c, n):\n" + textwrap.indent("\n".join(body), "    ")


@dataclasses.dataclass
class Call:
    """One call's sizes and layouts: the letters' sizes, a dim of an argument set apart (to 1), a layout each, a's
    dtype, whether `c` is passed by keyword, and whether the call is made under torch.no_grad()."""

    sizes: dict[str, int]
    overrides: dict[tuple[str, int], int]
    layouts: dict[str, str]
    dtype: torch.dtype = torch.float32
    keyword: bool = False
    no_grad: bool = False

    def shape(self, arg: str, letters: list[str]) -> tuple[int, ...]:
        return tuple(self.overrides.get((arg, i), self.sizes[x]) for i, x in enumerate(letters))


def first_call(rng: random.Random) -> Call:
    return Call({x: rng.choice(SIZES) for x in LETTERS}, {}, {"a": "contiguous", "b": "contiguous", "c": "contiguous"})


def next_call(rng: random.Random, s: Structure, calls: list[Call]) -> tuple[str, Call]:
    """The next call: one kind of change from the last (or back to an earlier call's sizes)."""
    last = calls[-1]
    new = Call(dict(last.sizes), dict(last.overrides), dict(last.layouts), last.dtype, last.keyword, last.no_grad)
    used = sorted(set(s.a + s.b + (s.c or [])))
    letter = rng.choice(used)
    kind = rng.choice(["dim", "dim", "dim", "back", "back", "one", "zero", "equal", "broadcast", "layout", "same",
                       "two dims", "dim and layout", "dtype", "keyword", "no_grad"])
    if kind in ("two dims", "dim and layout"):
        words, new = next_call(rng, s, [*calls, dataclasses.replace(last, sizes={
            **last.sizes, letter: rng.choice([n for n in [*SIZES, 6, 7] if n != last.sizes[letter]])})])
        return f"{kind} {letter}={new.sizes[letter]}, {words}", new
    if kind == "dtype":
        new.dtype = torch.float64 if last.dtype == torch.float32 else torch.float32
    elif kind == "keyword":
        new.keyword = not last.keyword
    elif kind == "no_grad":
        new.no_grad = not last.no_grad
    elif kind == "dim":
        new.sizes[letter] = rng.choice([n for n in [*SIZES, 6, 7] if n != last.sizes[letter]])
    elif kind == "back":
        new = dataclasses.replace(rng.choice(calls[:-1] or calls))
    elif kind == "one":
        new.sizes[letter] = 1
    elif kind == "zero":
        new.sizes[letter] = 0
    elif kind == "equal" and len(used) > 1:
        other = rng.choice([x for x in used if x != letter])
        new.sizes[letter] = new.sizes[other] if last.sizes[letter] != last.sizes[other] else new.sizes[other] + 1
    elif kind == "broadcast":
        arg = rng.choice(["b", "a"] if s.family == "broadcast" else ["b"])
        dim = rng.randrange(len(s.a if arg == "a" else s.b))
        if (arg, dim) in new.overrides:
            del new.overrides[(arg, dim)]
        else:
            new.overrides[(arg, dim)] = 1
    elif kind == "layout":
        arg = rng.choice(["a", "b", "c"] if s.c else ["a", "b"])
        new.layouts[arg] = rng.choice(["contiguous", "transposed", "sliced", "expanded", "channels_last", "offset"]
                                      + ["alias"] * (arg == "c"))
    words = {"dim": f"{letter}={new.sizes[letter]}", "one": f"{letter}=1", "zero": f"{letter}=0"}
    return f"{kind} {words.get(kind, '')}".strip(), new


def make_tensor(shape: tuple[int, ...], layout: str, gen: torch.Generator,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(a tensor of `shape` laid out as `layout` says, the buffer it views): built alike from equal generators."""
    x, base = _laid_out(shape, layout, gen)
    if dtype != torch.float32:
        base = base.to(dtype)
        x = base.as_strided(x.shape, x.stride(), x.storage_offset())
    return x, base


def _laid_out(shape: tuple[int, ...], layout: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(shape)
    if layout == "transposed" and n >= 2:
        base = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=gen)
        return base.transpose(-1, -2), base
    if layout == "sliced":
        base = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen)
        return base[..., ::2], base
    if layout == "offset":
        base = torch.randn(shape[0] + 1, *shape[1:], generator=gen)
        return base[1:], base
    if layout == "expanded":
        base = torch.randn(1, *shape[1:], generator=gen)
        return base.expand(shape), base
    if layout == "channels_last" and n == 4:
        base = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
        return base, base
    base = torch.randn(shape, generator=gen)
    return base, base


def make_inputs(s: Structure, call: Call, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """([a, b, c], the buffers they view): each call's inputs, built from `seed`; leaves that require grad where
    the program differentiates (a's and b's buffers)."""
    gen = torch.Generator().manual_seed(seed)
    args, bases = [], []
    for name, letters in (("a", s.a), ("b", s.b), ("c", s.c)):
        if letters is None:
            args.append(None)
            bases.append(None)
            continue
        base_layout = call.layouts[name]
        dtype = call.dtype if name != "b" else torch.float32  # (b promotes; a norm's weight c must be a's dtype)
        if base_layout == "alias" and (letters == s.a or 0 not in args[0].shape[:-1]):
            # c shares a's memory: a itself, or a's first row (where a has one; else c is a tensor of its own)
            x = args[0] if letters == s.a else args[0][(0,) * (len(s.a) - 1)]
            args.append(x)
            bases.append(bases[0])
            continue
        x, base = make_tensor(call.shape(name, letters), base_layout, gen, dtype)
        if s.grad and name in "ab":
            base.requires_grad_(True)
            x = base if x is base else _same_view(x, base)
        args.append(x)
        bases.append(base)
    return args, bases


def _same_view(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The view `view` made again of `base` (now a leaf that requires grad), so that grads flow to the leaf."""
    return base.as_strided(view.shape, view.stride(), view.storage_offset())


def _aliased(t: torch.Tensor, inputs: list[Any]) -> int | None:
    """Which input's storage the tensor `t` shares (None: none)."""
    ptr = t.untyped_storage().data_ptr()
    return next((i for i, x in enumerate(inputs) if x is not None and x.untyped_storage().data_ptr() == ptr
                 and t.numel() and x.numel()), None)


def difference(have: Any, want: Any, where: str, ours: list[Any], theirs: list[Any], grad: bool = True,
               strided: bool = False) -> str | None:
    """How `have` (jit) differs from `want` (eager), or None: tensors equal or close, of the same dtype, shape,
    requires_grad (unless not `grad`), aliasing the same input (if any), and with the same strides on dims longer
    than 1 where they alias one (or where `strided`); other values equal (a torch.Size as a tuple: SIZE_AS_TUPLE)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(have, torch.Tensor) or (have.dtype, have.shape) != (want.dtype, want.shape):
            return f"{where}: {_short(have)} (jit) != {_short(want)} (eager)"
        if grad and have.requires_grad != want.requires_grad:
            return f"{where}: requires_grad {have.requires_grad} (jit) != {want.requires_grad} (eager)"
        viewed = _aliased(want, theirs)
        if viewed is not None and theirs[viewed]._version != 0:
            # A result that views an input the call wrote is a copy (docs/design.md, "materialized like the results
            # that alias a written input"): its value is compared, not its memory.
            viewed = None
        elif _aliased(have, ours) != viewed:
            return f"{where}: aliases input {_aliased(have, ours)} (jit), input {viewed} (eager)"
        strides = [(h, w) for h, w, n in zip(have.stride(), want.stride(), want.shape, strict=True) if n > 1]
        if (viewed is not None or strided) and want.numel() and any(h != w for h, w in strides):
            return f"{where}: strides {have.stride()} (jit) != {want.stride()} (eager), shape {tuple(want.shape)}"
        if not torch.equal(have.detach(), want.detach()):
            try:
                torch.testing.assert_close(have.detach(), want.detach(), equal_nan=True, **TOL)
            except AssertionError as e:
                return f"{where}: {e}"
        return None
    if isinstance(want, list | tuple):
        if type(have) is not type(want) and not (SIZE_AS_TUPLE and type(want) is torch.Size and type(have) is tuple):
            return f"{where}: {_short(have)} (jit) != {_short(want)} (eager)"
        if len(have) != len(want):
            return f"{where}: {_short(have)} (jit) != {_short(want)} (eager)"
        return next((diff for i, (h, w) in enumerate(zip(have, want, strict=True))
                     if (diff := difference(h, w, f"{where}[{i}]", ours, theirs, grad, strided)) is not None), None)
    if type(have) is not type(want) or have != want:
        return f"{where}: {have!r} (jit) != {want!r} (eager)"
    return None


def _grads(result: Any, bases: list[Any], s: Structure) -> list[Any]:
    """The grads of the leaves: theirs after the call (`.grad`, from a backward inside), or those of the sum of the
    results that require grad (outside)."""
    leaves = [x for x in bases[:2] if x is not None and x.requires_grad]
    if s.grad == "inside":
        return [x.grad for x in leaves]
    found = [t for t in _tensors(result) if t.requires_grad and t.is_floating_point()]
    if not found:
        return []
    loss = sum((t * (i + 1)).sum() for i, t in enumerate(found))
    return list(torch.autograd.grad(loss, leaves, allow_unused=True))


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for v in x for t in _tensors(v)]
    return []


def run_side(fn: Any, s: Structure, call: Call, seed: int) -> tuple[str, Any, list[Any], list[Any]]:
    """(outcome, the result or exception, [a, b, c] and their buffers after the call, grads)."""
    args, bases = make_inputs(s, call, seed)
    letter, offset = s.n
    n = max(call.sizes[letter] + offset, 0)
    try:
        with torch.set_grad_enabled(not call.no_grad):
            result = fn(*args[:2], c=args[2], n=n) if call.keyword else fn(*args, n)
    except MinijitError as e:
        return "refused", e, args + bases, []
    except Exception as e:  # (eager raising is an outcome to compare)
        return "raised", e, args + bases, []
    try:
        # (not after a call under no_grad: a view the program returns as it came in is the argument itself there,
        # which autograd then reaches; eager's view does not: test_automatic_dynamic.py, an xfail)
        grads = _grads(result, bases, s) if s.grad and not call.no_grad else []
    except Exception as e:
        return "raised", e, args + bases, []
    return "returned", result, args + bases, grads


def run_one(seed: int, outcomes: Counter[str], jit_each_call: bool = False) -> str | None:
    """Program `seed` over CALLS calls, under jit and eagerly, counting outcomes: None, or the first mismatch
    (naming the seed, the program, each call's sizes and how the call was served). `jit_each_call`: a new jitted
    function for each call (constant sizes: whether a mismatch is automatic dynamic's)."""
    rng = random.Random(seed)
    s = draw_structure(rng)
    source = random_program(rng, s)
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, "<dimension fuzz program>", "exec"), namespace)
    eager = namespace["program"]
    jf = minijit.jit(eager)
    calls = [first_call(rng)]
    history, seen = [f"# {s}"], set()
    for i in range(CALLS):
        kind = "first"
        if i:
            kind, call = next_call(rng, s, calls)
            calls.append(call)
        call = calls[-1]
        history.append(f"# call {i}: {kind}: {call}")
        if jit_each_call:
            jf = minijit.jit(eager)
        before = dataclasses.replace(minijit.cache_info(jf))
        want = run_side(eager, s, call, seed * 101 + i)
        have = run_side(jf, s, call, seed * 101 + i)
        outcome = _outcome(before, minijit.cache_info(jf))
        where = (f"\nseed {seed}, call {i} ({outcome}); again: "
                 f"`from tests.runtime.test_dimension_fuzz import *; run_one({seed}, Counter())`\n{source}\n"
                 + "\n".join(history))
        shapes = tuple(tuple(x.shape) for x in have[2][:3] if x is not None)  # (strides: not all guarded)
        new_shapes = shapes not in seen
        seen.add(shapes)
        if have[0] == "refused":
            outcomes["refused" if want[0] == "raised" else "refused where eager returned"] += 1
            continue
        if (want[0] == "raised") != (have[0] == "raised"):
            return f"eager {want[0]} {_short(want[1])}, jit {have[0]} {_short(have[1])}{where}"
        diff = None
        if want[0] != "raised":
            diff = (difference(have[1], want[1], "result", have[2], want[2], s.grad != "inside")
                    or difference([x.detach() if x is not None else x for x in have[2]],
                                  [x.detach() if x is not None else x for x in want[2]], "arguments", [], [])
                    # (a .grad is laid out as its tensor; autograd.grad's results as the backward made them)
                    or difference(have[3], want[3], "grads", [], [], strided=s.grad == "inside"))
        if diff is not None:
            outcomes[f"mismatch ({outcome})"] += 1
            return f"result, arguments or grads differ from eager's at {diff}{where}"
        outcomes["eager raised" if want[0] == "raised" else outcome] += 1
        if i and outcome == "hits" and new_shapes and want[0] != "raised":
            outcomes["symbolic hits"] += 1
    return None


@pytest.mark.filterwarnings("ignore::minijit.runtime.fallback.TracingRaisedWarning")
def test_random_programs_over_sizes_changing_dim_by_dim_match_eager() -> None:
    outcomes: Counter[str] = Counter()
    mismatches = [m for seed in lane_seeds(PROGRAMS) if (m := run_one(seed, outcomes)) is not None]
    print(f"\n{PROGRAMS} programs: {dict(outcomes)}")
    assert not mismatches, "\n\n".join(mismatches)
    assert outcomes["symbolic hits"] >= max(1, int(MIN_SYMBOLIC_HITS_PER_PROGRAM * PROGRAMS)), dict(outcomes)
