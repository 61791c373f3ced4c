"""Differential fuzzing of functionalization: random programs of pointwise ops, reductions, views and in-place ops.

Each program runs eagerly and under `minijit.jit` on clones of the same inputs;
outputs and the final value of every input must match, and the final trace must
keep invariant 1 (one copy per mutated input, every read of an old value before
its copy). Programs are built step by step while running eagerly, so every step
is one that eager PyTorch accepts. One program in three takes inputs that share
memory (`ALIASED_INPUTS`: overlapping slices, a tensor and its row, the same tensor
twice, an expanded view, ...); their clones share memory the same way, and the
whole shared storage must match after the call. `MINIJIT_FUZZ_PROGRAMS` sets how
many programs run (default 750, in chunks that test workers share; each Python's CI
lane runs its own seeds, `tests.lanes`); refusals (a clear MinijitError) are counted
and reported.
"""

from __future__ import annotations

import os
import random
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import TraceInvariantError
from minijit.ops.registry import ALL_LTORCH
from minijit.runtime import pipeline, trace_callable
from minijit.transforms import check_copies, functionalize
from minijit.transforms.verify import check_trace
from tests.lanes import lane_seeds
from tests.oputil import trace_call
from tests.transforms.mutation_util import assert_same, check_final_trace

PROGRAMS = int(os.environ.get("MINIJIT_FUZZ_PROGRAMS", "750"))
CHUNK = 250
MAX_REFUSED_SHARE = 0.05


@dataclass
class Step:
    """`env.append(fn(*env[i] for i in args))` (in-place steps append their result too)."""

    text: str
    args: tuple[int, ...]
    fn: Callable[..., Any]


@dataclass
class Program:
    n_inputs: int
    steps: list[Step] = field(default_factory=list)
    returns: tuple[int, ...] = ()
    inputs_text: str = ""  # how the inputs share memory, where they do

    def __call__(self, *inputs: Any) -> Any:
        env = list(inputs)
        for step in self.steps:
            out = step.fn(*(env[i] for i in step.args))
            env.extend(out if isinstance(out, tuple | list) else (out,))
        return tuple(env[i] for i in self.returns)

    def source(self) -> str:
        lines = [f"# inputs: {self.inputs_text}"] if self.inputs_text else []
        lines.append(f"def program({', '.join(f'v{i}' for i in range(self.n_inputs))}):")
        n = self.n_inputs
        for step in self.steps:
            lines.append(f"    v{n} = " + step.text.format(*(f"v{i}" for i in step.args)))
            n += 1
        lines.append(f"    return {', '.join(f'v{i}' for i in self.returns)}")
        return "\n".join(lines)


def _has(*names: str) -> bool:
    return all(n in ALL_LTORCH for n in names)


def _op_table(rng: random.Random) -> list[tuple[str, int, Callable[[], tuple[str, Callable[..., Any]]]]]:
    """(kind, arity, maker) where maker() draws parameters and returns (text, fn)."""
    def c(text: str, fn: Callable[..., Any]) -> Callable[[], tuple[str, Callable[..., Any]]]:
        return lambda: (text, fn)

    def scalar() -> float:
        return rng.choice([0.5, -1.5, 2.0, 0.25])

    ops: list[tuple[str, int, Callable[[], tuple[str, Callable[..., Any]]]]] = [
        ("pointwise", 2, c("{} + {}", lambda a, b: a + b)),
        ("pointwise", 2, c("{} * {}", lambda a, b: a * b)),
        ("pointwise", 2, c("{} - {}", lambda a, b: a - b)),
        ("pointwise", 1, lambda: (lambda s: (f"{{}} * {s}", lambda a: a * s))(scalar())),
        ("pointwise", 1, c("{}.tanh()", lambda a: a.tanh())),
        ("pointwise", 1, c("{}.sin()", lambda a: a.sin())),
        ("pointwise", 2, c("{}.maximum({})", lambda a, b: a.maximum(b))),
        ("pointwise", 2, c("{} / ({}.abs() + 1)", lambda a, b: a / (b.abs() + 1))),
        ("reduction", 1, lambda: (lambda d: (f"{{}}.sum({d}, keepdim=True)", lambda a: a.sum(d, keepdim=True)))(
            rng.choice([0, -1]))),
        ("reduction", 1, lambda: (lambda d: (f"{{}}.sum({d})", lambda a: a.sum(d)))(rng.choice([0, -1]))),
        ("view", 1, c("{}.t()", lambda a: a.t())),
        ("view", 1, c("{}.transpose(0, 1)", lambda a: a.transpose(0, 1))),
        ("inplace", 2, c("{}.add_({})", lambda a, b: a.add_(b))),
        ("inplace", 2, c("{}.mul_({})", lambda a, b: a.mul_(b))),
        ("inplace", 2, lambda: (lambda s: (f"{{}}.sub_({{}}, alpha={s})", lambda a, b: a.sub_(b, alpha=s)))(scalar())),
        ("inplace", 1, lambda: (lambda s: (f"{{}}.mul_({s})", lambda a: a.mul_(s)))(scalar())),
        ("inplace", 2, c("{}.copy_({})", lambda a, b: a.copy_(b))),
        ("inplace", 1, c("{}.zero_()", lambda a: a.zero_())),
        ("inplace", 1, lambda: (lambda s: (f"{{}}.fill_({s})", lambda a: a.fill_(s)))(scalar())),
        ("inplace", 1, c("{}.clamp_(-0.5, 0.75)", lambda a: a.clamp_(-0.5, 0.75))),
        ("inplace", 2, c("{}.lerp_({}, 0.3)", lambda a, b: a.lerp_(b, 0.3))),
        ("inplace", 3, c("{}.addcmul_({}, {}, value=0.5)", lambda a, b, d: a.addcmul_(b, d, value=0.5))),
        ("inplace", 2, c("{0}.addcdiv_({1}, {1}.abs() + 1)", lambda a, b: a.addcdiv_(b, b.abs() + 1))),
        ("inplace", 1, c("{}.neg_()", lambda a: a.neg_())),
    ]
    if _has("permute", "movedim"):  # permute runs through Tensor.permute since the shape ops landed
        ops.append(("view", 1, c("{}.permute(1, 0)", lambda a: a.permute(1, 0))))
    if _has("getitem"):
        ops += [
            ("view", 1, lambda: (lambda i: (f"{{}}[{i}]", lambda a: a[i]))(rng.choice([0, 1, -1]))),
            ("view", 1, c("{}[1:3]", lambda a: a[1:3])),
            ("view", 1, c("{}[::2]", lambda a: a[::2])),
            ("view", 1, c("{}[:, 1::2]", lambda a: a[:, 1::2])),
            ("view", 1, c("{}[None]", lambda a: a[None])),
            ("view", 1, c("{}[..., 0]", lambda a: a[..., 0])),
        ]
    if _has("setitem"):
        ops += [
            ("inplace", 2, c("{}.__setitem__(0, {}) or ...", lambda a, b: _setitem(a, 0, b))),
            ("inplace", 1, c("{}.__setitem__(slice(1, 3), 1.5) or ...", lambda a: _setitem(a, slice(1, 3), 1.5))),
            ("inplace", 2, c("{0}.__setitem__((..., slice(None, None, 2)), {1}[..., 1::2]) or ...",
                             lambda a, b: _setitem(a, (..., slice(None, None, 2)), b[..., 1::2]))),
            ("inplace", 2, c("{0}.__setitem__({1} > 0, 0.0) or ...", lambda a, b: _setitem(a, b > 0, 0.0))),
        ]
    if _has("view", "reshape", "unsqueeze", "squeeze"):
        ops += [
            ("view", 1, c("{}.view(-1)", lambda a: a.view(-1))),
            ("view", 1, c("{}.reshape(2, -1)", lambda a: a.reshape(2, -1))),
            ("view", 1, c("{}.unsqueeze(0)", lambda a: a.unsqueeze(0))),
            ("view", 1, c("{}.squeeze()", lambda a: a.squeeze())),
        ]
    if _has("select", "narrow", "expand", "unbind", "chunk"):
        ops += [
            ("view", 1, c("{}.select(0, 1)", lambda a: a.select(0, 1))),
            ("view", 1, c("{}.narrow(-1, 1, 2)", lambda a: a.narrow(-1, 1, 2))),
            ("view", 1, c("{0}.expand(2, *{0}.shape)", lambda a: a.expand(2, *a.shape))),
            ("view", 1, c("{}.unbind(0)[1]", lambda a: a.unbind(0)[1])),
            ("view", 1, c("{}.chunk(2, -1)[0]", lambda a: a.chunk(2, -1)[0])),
        ]
    return ops


def _partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    same_storage = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    identical = (a.shape, a.stride(), a.storage_offset()) == (b.shape, b.stride(), b.storage_offset())
    return same_storage and not identical


def _setitem(a: Any, key: Any, value: Any) -> Any:
    a[key] = value
    return a


WEIGHTS = {"pointwise": 3, "reduction": 1, "view": 3, "inplace": 4}

# Inputs that share memory, as views of one 4x4 tensor `t` (and `o`, a tensor of its own).
ALIASED_INPUTS: dict[str, Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]] = {
    "t[1:3], t[2:4], o": lambda t, o: [t[1:3], t[2:4], o],
    "t, t[1], o": lambda t, o: [t, t[1], o],
    "t.t(), t[0], o": lambda t, o: [t.t(), t[0], o],
    "t[:, ::2], t[:, 1::2], o": lambda t, o: [t[:, ::2], t[:, 1::2], o],
    "t, t, o": lambda t, o: [t, t, o],
    "t, t[0].expand(4, 4), o": lambda t, o: [t, t[0].expand(4, 4), o],
    "t[0:2], t[1:3], t[2:4]": lambda t, o: [t[0:2], t[1:3], t[2:4]],
    "t.view(-1)[2:10].view(2, 4), t[1:3].t(), o": lambda t, o: [t.view(-1)[2:10].view(2, 4), t[1:3].t(), o],
    "t, t[::2, 1:], t[1]": lambda t, o: [t, t[::2, 1:], t[1]],
    "t[0], t[:, 0], o.expand(4, 4)": lambda t, o: [t[0], t[:, 0], o.expand(4, 4)],
}


def is_aliased(seed: int) -> bool:
    """Whether the program of `seed` takes inputs that share memory (one in three)."""
    return seed % 3 == 2


def clone_inputs(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Clones of `inputs` that share memory as they do: each storage copied once, each input viewed again in it."""
    copies: dict[int, torch.Tensor] = {}
    if len({x.untyped_storage().data_ptr() for x in inputs}) == len(inputs) and not any(x._is_view() for x in inputs):
        return [x.clone() for x in inputs]
    out = []
    for x in inputs:
        key = x.untyped_storage().data_ptr()
        if key not in copies:
            copies[key] = storage_of(x).clone()
        out.append(copies[key].as_strided(x.shape, x.stride(), x.storage_offset()))
    return out


def storage_of(x: torch.Tensor) -> torch.Tensor:
    """The whole storage under `x`, as a 1-D tensor."""
    return x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)


def make_program(seed: int) -> tuple[Program, list[torch.Tensor]]:
    """A random program that eager PyTorch runs, and its inputs."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    shapes = [(4, 4), (4, 4), rng.choice([(4,), (4, 4), (1, 4)])]
    inputs = [torch.randn(s) for s in shapes]
    inputs_text = ""
    if is_aliased(seed):
        inputs_text = rng.choice(sorted(ALIASED_INPUTS))
        inputs = ALIASED_INPUTS[inputs_text](inputs[0], inputs[2])
    table = _op_table(rng)
    by_kind: dict[str, list[Any]] = {}
    for op in table:
        by_kind.setdefault(op[0], []).append(op)
    kinds = list(by_kind)
    weights = [WEIGHTS[k] for k in kinds]
    program = Program(len(inputs), inputs_text=inputs_text)
    env = clone_inputs(inputs)
    storages = list({x.untyped_storage().data_ptr(): storage_of(x) for x in env if x._is_view()}.values())
    n_steps = rng.randint(2, 10)
    tries = 0
    while len(program.steps) < n_steps and tries < 60:
        tries += 1
        kind = rng.choices(kinds, weights)[0]
        _, arity, maker = rng.choice(by_kind[kind])
        args = tuple(rng.randrange(len(env)) for _ in range(arity))
        text, fn = maker()
        if kind == "inplace" and any(_partial_overlap(env[args[0]], env[i]) for i in args[1:]):
            # Eager reads such an operand while writing it, in memory order: not a functional program.
            continue
        snapshot = [x.clone() for x in env]
        saved = [x.clone() for x in storages]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. index_put_ on an expanded tensor: deprecated, skip it
                out = fn(*(env[i] for i in args))
        except (RuntimeError, IndexError, ValueError, TypeError, UserWarning):
            for x, old in zip(env, snapshot, strict=True):  # an eager error may leave a partial write
                if not x._is_view():
                    x.copy_(old)
            for x, old in zip(storages, saved, strict=True):
                x.copy_(old)
            continue
        if not isinstance(out, torch.Tensor) or (out.ndim == 0 and kind == "view"):
            continue
        env.append(out)
        program.steps.append(Step(text, args, fn))
    count = len(env) - len(inputs)
    picks = {len(env) - 1} if count else set()
    picks |= {rng.randrange(len(env)) for _ in range(2)}
    program.returns = tuple(sorted(picks))
    return program, inputs


def run_one(seed: int, cache: str = "constant values") -> str | None:
    """'ok', or a refusal reason; raises AssertionError on any mismatch."""
    program, inputs = make_program(seed)
    eager_in = clone_inputs(inputs)
    try:
        expected = program(*eager_in)
    except RuntimeError:  # a step's validity changed with the program's history; not a jit question
        return "eager-error"
    jit_in = clone_inputs(inputs)
    jf = minijit.jit(program, cache=cache)
    try:
        got = jf(*jit_in)
    except minijit.MinijitError as e:
        if isinstance(e, TraceInvariantError):
            raise  # a bug in a pass, never a refusal
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    where = f"\nseed {seed} ({cache}):\n{program.source()}"
    try:
        assert_same(got, expected)
        for e, j in zip(eager_in, jit_in, strict=True):
            torch.testing.assert_close(j, e, rtol=1e-5, atol=1e-5, equal_nan=True)
            torch.testing.assert_close(storage_of(j), storage_of(e), rtol=1e-5, atol=1e-5, equal_nan=True)
        check_final_trace(jf)
    except AssertionError as err:
        raise AssertionError(f"{err}{where}\n{minijit.last_traces(jf)[-1]}") from None
    return "ok"


@pytest.mark.parametrize("chunk", range((PROGRAMS + CHUNK - 1) // CHUNK))
def test_random_programs_match_eager(chunk):
    outcomes, aliased = Counter(), Counter()
    seeds = lane_seeds(PROGRAMS)[chunk * CHUNK:(chunk + 1) * CHUNK]
    for seed in seeds:
        outcome = run_one(seed)
        outcomes[outcome] += 1
        if is_aliased(seed):
            aliased[outcome.split(":")[0]] += 1
    ran = len(seeds) - outcomes["eager-error"]
    refused = {k: v for k, v in outcomes.items() if k.startswith("refused")}
    share = sum(refused.values()) / max(ran, 1)
    print(f"\nprograms {seeds.start}-{seeds.stop - 1}: {outcomes['ok']} matched eager, {sum(refused.values())} refused "
          f"({share:.1%}), {outcomes['eager-error']} skipped; with inputs sharing memory: {aliased['ok']} matched, "
          f"{aliased['refused']} refused")
    for reason, n in sorted(refused.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {reason}")
    assert share <= MAX_REFUSED_SHARE, refused


SYMBOLIC_PROGRAMS = max(PROGRAMS // 10, 30)


def test_random_programs_on_inputs_sharing_memory_with_symbolic_sizes():
    """The shared-memory programs again under cache="symbolic values" (written overlapping inputs keep their sizes)."""
    outcomes = Counter()
    for seed in lane_seeds(SYMBOLIC_PROGRAMS, start=2, step=3):
        assert is_aliased(seed)
        outcomes[run_one(seed, cache="symbolic values")] += 1
    ran = sum(outcomes.values()) - outcomes["eager-error"]
    refused = {k: v for k, v in outcomes.items() if k.startswith("refused")}
    print(f"\nsymbolic sizes, {ran} programs on inputs sharing memory: {outcomes['ok']} matched eager, "
          f"{sum(refused.values())} refused")
    for reason, n in sorted(refused.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {reason}")
    assert sum(refused.values()) / max(ran, 1) <= MAX_REFUSED_SHARE, refused


def test_random_programs_reading_a_value_after_writes_into_inputs_sharing_memory(monkeypatch):
    """The shared-memory programs under cache="symbolic values", ending in a branch on the value of an input
    (`v * (1.5 if v.sum() > 0 else -0.5)`): read inside capture after the program's writes, where written inputs
    that share memory have symbolic sizes the value comes from the recorded prefix run on copies of their memory
    (`_run_on_copies`); results, inputs and storages equal eager's."""
    used = []
    run_on_copies = pipeline._run_on_copies
    monkeypatch.setattr(pipeline, "_run_on_copies", lambda *a: (used.append(1), run_on_copies(*a))[1])
    make = make_program

    def with_value_read(seed: int) -> tuple[Program, list[torch.Tensor]]:
        program, inputs = make(seed)
        j = random.Random(seed).randrange(len(inputs))
        program.steps.append(Step("{0} * (1.5 if {0}.sum() > 0 else -0.5)", (j,),
                                  lambda a: a * (1.5 if a.sum() > 0 else -0.5)))
        program.returns = (*program.returns, len(inputs) + len(program.steps) - 1)
        return program, inputs

    monkeypatch.setitem(globals(), "make_program", with_value_read)
    outcomes = Counter(run_one(seed, cache="symbolic values") for seed in lane_seeds(SYMBOLIC_PROGRAMS, start=2, step=3))
    ran = sum(outcomes.values()) - outcomes["eager-error"]
    refused = {k: v for k, v in outcomes.items() if k.startswith("refused")}
    assert sum(refused.values()) / max(ran, 1) <= MAX_REFUSED_SHARE, refused
    assert len(used) > SYMBOLIC_PROGRAMS // 3, (len(used), outcomes)


def test_random_programs_on_aliased_inputs():
    """The same tensor passed as the first two inputs: functionalize told so gives eager's result."""
    for seed in range(max(min(PROGRAMS, 300) // 5, 20)):
        program, inputs = make_program(10_000 + seed)
        shared = inputs[0]
        eager_shared = shared.clone()
        try:
            expected = program(eager_shared, eager_shared, inputs[2].clone())
        except RuntimeError:
            continue
        jit_shared = shared.clone()
        trace = trace_call(program, jit_shared, jit_shared, inputs[2].clone())
        try:
            functional, _ = functionalize(trace, input_aliases=[(0, 1)])
        except minijit.MinijitError:
            continue
        check_copies(functional)
        check_trace(functional)
        got = trace_callable(functional)(jit_shared, jit_shared, inputs[2].clone())
        try:
            assert_same(got, expected)
            torch.testing.assert_close(jit_shared, eager_shared, rtol=1e-5, atol=1e-5, equal_nan=True)
        except AssertionError as err:
            raise AssertionError(f"{err}\nseed {10_000 + seed}:\n{program.source()}\n{functional}") from None
