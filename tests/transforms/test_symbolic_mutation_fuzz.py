"""Differential fuzzing of views, reshapes and in-place writes under cache="symbolic values" over changing sizes.

Each random program (views, reshapes of non-contiguous views, in-place writes into inputs, into
views of inputs and into intermediates, `out=`) is compiled once and called on inputs of several
sizes (3 then 5 then 4 ...; sizes 1 and 2 too), some non-contiguous, some sharing memory; each
call's outputs and every input's memory afterwards must match eager PyTorch. One program in three
runs with inputs requiring grad, and the gradients must match too. A refusal (a clear MinijitError)
is counted, never a mismatch. `MINIJIT_SYMBOLIC_FUZZ_PROGRAMS` sets how many programs run.
"""

from __future__ import annotations

import os
import random
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from tests.transforms.test_functionalize_fuzz import clone_inputs as clone_sharing
from tests.transforms.test_functionalize_fuzz import storage_of

PROGRAMS = int(os.environ.get("MINIJIT_SYMBOLIC_FUZZ_PROGRAMS", "60"))
SIZES = [[3, 5, 4, 3], [4, 6, 5, 4], [3, 1, 2, 5], [2, 4, 1, 3], [1, 3, 2, 1]]
Op = tuple[str, int, str, Callable[..., Any]]


def _setitem(a: torch.Tensor, key: Any, value: Any) -> torch.Tensor:
    a[key] = value
    return a


def _out(f: Callable[..., torch.Tensor], o: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
    if f(*args).shape != o.shape:
        raise ValueError("out= would resize")  # deprecated in eager: not generated
    return f(*args, out=o)


OPS: list[Op] = [
    ("pointwise", 2, "{} + {}", lambda a, b: a + b),
    ("pointwise", 2, "{} * {}", lambda a, b: a * b),
    ("pointwise", 1, "{}.sin()", lambda a: a.sin()),
    ("pointwise", 1, "{}.sum(0)", lambda a: a.sum(0)),
    ("view", 1, "{}.t()", lambda a: a.t()),
    ("view", 1, "{}[1:]", lambda a: a[1:]),
    ("view", 1, "{}[::2]", lambda a: a[::2]),
    ("view", 1, "{}[:, 1:3]", lambda a: a[:, 1:3]),
    ("view", 1, "{}[0]", lambda a: a[0]),
    ("view", 1, "{}[..., 1]", lambda a: a[..., 1]),
    ("view", 1, "{}.unsqueeze(0)", lambda a: a.unsqueeze(0)),
    ("view", 1, "{}.flatten()", lambda a: a.flatten()),
    ("view", 1, "{}.view(-1)", lambda a: a.view(-1)),
    ("view", 1, "{}.reshape(-1)", lambda a: a.reshape(-1)),
    ("view", 1, "{}.reshape(-1, 2)", lambda a: a.reshape(-1, 2)),
    ("view", 1, "{}.reshape(2, -1)", lambda a: a.reshape(2, -1)),
    ("view", 1, "{0}.view({0}.shape[0], 2, -1)", lambda a: a.view(a.shape[0], 2, -1)),
    ("view", 1, "{0}.expand(2, *{0}.shape)", lambda a: a.expand(2, *a.shape)),
    ("view", 1, "{}.t().reshape(-1)", lambda a: a.t().reshape(-1)),
    ("view", 1, "{}[:, ::2].reshape(-1)", lambda a: a[:, ::2].reshape(-1)),
    ("view", 1, "{0}.t().reshape({0}.shape[0], -1)", lambda a: a.t().reshape(a.shape[0], -1)),
    ("inplace", 2, "{}.add_({})", lambda a, b: a.add_(b)),
    ("inplace", 2, "{}.mul_({})", lambda a, b: a.mul_(b)),
    ("inplace", 1, "{}.add_(1.0)", lambda a: a.add_(1.0)),
    ("inplace", 2, "{}.copy_({})", lambda a, b: a.copy_(b)),
    ("inplace", 1, "{}.zero_()", lambda a: a.zero_()),
    ("inplace", 2, "_setitem({}, 0, {})", lambda a, b: _setitem(a, 0, b)),
    ("inplace", 1, "_setitem({}, slice(1, None), 0.5)", lambda a: _setitem(a, slice(1, None), 0.5)),
    ("inplace", 2, "{}.index_copy_(0, torch.tensor([1, 0]), {}[:2])",
     lambda a, b: a.index_copy_(0, torch.tensor([1, 0]), b[:2])),
    ("inplace", 3, "torch.add({1}, {2}, out={0})", lambda o, a, b: _out(torch.add, o, a, b)),
]
KIND_WEIGHTS = {"pointwise": 1, "view": 4, "inplace": 4}
INPUTS: dict[str, Callable[[Callable[..., torch.Tensor], int], list[torch.Tensor]]] = {
    "plain": lambda r, n: [r(n, 4), r(n, 4), r(4)],
    "non-contiguous": lambda r, n: [r(4, n).t(), r(n, 8)[:, ::2], r(4)],
    "columns": lambda r, n: [r(4, n).t(), r(n, 1).expand(n, 4), r(1, n).t()],
    "overlapping rows": lambda r, n: (lambda t: [t[:n], t[1:], r(4)])(r(n + 1, 4)),
    "the same tensor twice": lambda r, n: (lambda t: [t, t, r(4)])(r(n, 4)),
}


def make_inputs(kind: str, n: int, seed: int) -> list[torch.Tensor]:
    """The inputs of `kind` for size `n` (the same values for the same seed and size)."""
    g = torch.Generator().manual_seed(seed * 31 + n)
    return INPUTS[kind](lambda *s: torch.randn(*s, generator=g), n)


def clone_inputs(inputs: list[torch.Tensor], grad: bool = False) -> list[torch.Tensor]:
    """Clones sharing memory as `inputs` do (with `grad`: independent leaves, the first two requiring grad)."""
    if grad:
        return [x.detach().clone().requires_grad_(i < 2) for i, x in enumerate(inputs)]
    return clone_sharing(inputs)


class Program:
    """`env.append(fn(*env[i] for i in args))` per step; returns some of env."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, tuple[int, ...], Callable[..., Any]]] = []
        self.returns: tuple[int, ...] = ()

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env = list(inputs)
        for _, args, fn in self.steps:
            env.append(fn(*(env[i] for i in args)))
        return tuple(env[i] for i in self.returns)

    def source(self) -> str:
        lines = ["def program(v0, v1, v2):"]
        for n, (text, args, _) in enumerate(self.steps, start=3):
            lines.append(f"    v{n} = " + text.format(*(f"v{i}" for i in args)))
        return "\n".join([*lines, f"    return {', '.join(f'v{i}' for i in self.returns)}"])


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def make_program(seed: int, kind: str, n: int, grad: bool) -> Program | None:
    """A random program eager runs on inputs of `kind` and size `n` (None: none found with grad)."""
    rng = random.Random(seed)
    env = clone_inputs(make_inputs(kind, n, seed), grad)
    program = Program()
    want, tries = rng.randint(2, 9), 0
    while len(program.steps) < want and tries < 80:
        tries += 1
        op_kind = rng.choices(list(KIND_WEIGHTS), list(KIND_WEIGHTS.values()))[0]
        _, arity, text, fn = rng.choice([op for op in OPS if op[0] == op_kind])
        args = tuple(rng.randrange(len(env)) for _ in range(arity))
        if op_kind == "inplace":
            target = env[args[0]]
            if 0 in target.stride() or any(_same_storage(target, env[i]) for i in args[1:]):
                continue  # eager reads such an operand while writing it: not a functional program
        saved = [storage_of(x).detach().clone() for x in env]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                out = fn(*(env[i] for i in args))
        except (RuntimeError, IndexError, ValueError, UserWarning):
            if grad:
                return None  # an autograd error may leave a write behind that a restore cannot undo
            for x, old in zip(env, saved, strict=True):
                storage_of(x).copy_(old)
            continue
        env.append(out)
        program.steps.append((text, args, fn))
    program.returns = tuple(sorted({len(env) - 1} | {rng.randrange(len(env)) for _ in range(2)}))
    return program


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape, (got.shape, expected.shape)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


def check_call(program: Program, jf: Any, kind: str, n: int, seed: int, grad: bool) -> str:
    """'ok', 'eager-error' or 'refused: ...' for one call at size `n`; raises AssertionError on a mismatch."""
    base = make_inputs(kind, n, seed)
    eager_in, jit_in = clone_inputs(base, grad), clone_inputs(base, grad)
    try:
        expected = program(*eager_in)
    except (RuntimeError, IndexError, ValueError):
        return "eager-error"  # a step eager accepted at the first size and refuses at this one
    try:
        got = jf(*jit_in)
    except minijit.MinijitError as e:
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        _close(g, e)
    if not grad:
        for j, e in zip(jit_in, eager_in, strict=True):
            _close(storage_of(j), storage_of(e))
        return "ok"
    weights = [torch.randn(e.shape, generator=torch.Generator().manual_seed(n)) for e in expected]
    losses = [sum(((o * w).sum() for o, w in zip(outs, weights, strict=True) if o.requires_grad),
                  torch.zeros((), requires_grad=True)) for outs in (expected, got)]
    try:
        losses[0].backward()
    except RuntimeError:
        return "eager-error"  # e.g. a saved tensor written in place later: eager's backward refuses
    losses[1].backward()
    for j, e in zip(jit_in, eager_in, strict=True):
        _close(j.grad if j.grad is not None else torch.zeros_like(j), e.grad if e.grad is not None else torch.zeros_like(e))
    return "ok"


def run_seed(seed: int) -> list[str]:
    """The outcomes of one random program's calls at its sizes."""
    rng = random.Random(seed ^ 0x5EED)
    grad = seed % 3 == 0
    kind = rng.choice(["plain", "non-contiguous"] if grad else sorted(INPUTS))
    sizes = rng.choice(SIZES)
    mode = torch.enable_grad if grad else rng.choice([torch.no_grad, torch.inference_mode, torch.enable_grad])
    program = make_program(seed, kind, sizes[0], grad)
    if program is None:
        return []
    jf = minijit.jit(program, cache="symbolic values")
    outcomes = []
    for n in sizes:
        try:
            with mode():
                outcomes.append(check_call(program, jf, kind, n, seed, grad))
        except AssertionError as err:
            raise AssertionError(f"{err}\nseed {seed}, inputs {kind!r}, sizes {sizes} at {n}, {mode.__name__}, "
                                 f"grad {grad}:\n{program.source()}") from None
    return outcomes


def test_random_view_and_write_programs_match_eager_over_changing_sizes():
    outcomes: Counter[str] = Counter()
    for seed in range(PROGRAMS):
        outcomes.update(run_seed(seed))
    refused = sum(v for k, v in outcomes.items() if k.startswith("refused"))
    print(f"\n{sum(outcomes.values())} calls: {outcomes['ok']} matched eager, {refused} refused, "
          f"{outcomes['eager-error']} skipped (eager refuses)")
    assert outcomes["ok"] >= 2 * PROGRAMS, outcomes  # most calls run and compare


def test_reshape_of_an_out_written_input_replayed_by_functionalization():
    # functionalize re-records `v0.reshape(-1).reshape(2, -1)` on add's result (sizes of v1, spelt
    # otherwise than v0's): the capture's check of the -1 stands; it was refused ("invalid for input of size 20").
    def f(v0, v1):
        torch.add(v1, v1, out=v0)
        flat = v0.reshape(-1)
        halves = flat.reshape(2, -1)
        halves[0] += 1
        return halves, flat.reshape(v0.shape[0], -1)

    jf = minijit.jit(f, cache="symbolic values")
    for n in (5, 3, 6, 4):
        inputs = [torch.randn(n, 4), torch.randn(n, 4)]
        eager_in, jit_in = [x.clone() for x in inputs], [x.clone() for x in inputs]
        for g, e in zip(jf(*jit_in), f(*eager_in), strict=True):
            _close(g, e)
        for j, e in zip(jit_in, eager_in, strict=True):
            _close(j, e)


def _expand_an_out_written_input(v0, v1):
    torch.sin(v0, out=v1)
    flat = v1.reshape(-1, 2)
    return flat.expand(2, *flat.shape)


def _broadcast_a_row_against_an_out_written_input(v0, v1):
    rows = v0[::2]  # one row at sizes 1 and 2: broadcasts; two rows at 3 and 4: eager refuses
    torch.sin(v1, out=v0)
    return v1.mul_(rows)


@pytest.mark.parametrize("fn, sizes", [(_expand_an_out_written_input, [5, 3, 6]),
                                       (_broadcast_a_row_against_an_out_written_input, [2, 1, 2, 4])])
def test_size_checks_replayed_by_functionalization_match_eager(fn, sizes):
    # functionalize re-records expand / the broadcast of mul_ on values whose sizes are spelt otherwise
    # than the capture's: they were refused ("the size 10 of dim 0 must match 10", "cannot be broadcast").
    jf = minijit.jit(fn, cache="symbolic values")
    for n in sizes:
        inputs = [torch.randn(n, 4), torch.randn(n, 4)]
        eager_in, jit_in = [x.clone() for x in inputs], [x.clone() for x in inputs]
        try:
            expected = fn(*eager_in)
        except RuntimeError:
            with pytest.raises((RuntimeError, minijit.MinijitError)):
                jf(*jit_in)
            continue
        _close(jf(*jit_in), expected)
        for j, e in zip(jit_in, eager_in, strict=True):
            _close(j, e)


def _squeeze_a_view_of_a_copied_into_input(v0, v1):
    v1.copy_(v0)
    row = v1[::2].squeeze(0)  # one row at sizes 1 and 2: squeezed to (4,)
    torch.sin(v1, out=v0)
    return row


def test_a_replayed_squeeze_decides_as_the_capture_did():
    # functionalize re-records `v1[::2].squeeze(0)` on v0's value (v1.copy_(v0)), whose size is spelt
    # `(v0.shape[0] + 1) // 2`: squeeze kept the dim the capture squeezed, a (1, 4) result for eager's (4,).
    fn = _squeeze_a_view_of_a_copied_into_input
    jf = minijit.jit(fn, cache="symbolic values")
    for n in (2, 3, 4, 1, 2):
        inputs = [torch.randn(n, 4), torch.randn(n, 4)]
        eager_in, jit_in = [x.clone() for x in inputs], [x.clone() for x in inputs]
        _close(jf(*jit_in), fn(*eager_in))
        for j, e in zip(jit_in, eager_in, strict=True):
            _close(j, e)
