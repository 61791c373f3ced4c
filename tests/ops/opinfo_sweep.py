"""The whole OpInfo database through `minijit.jit`: each entry's forward against eager, and its gradients.

For every entry of `torch.testing._internal.common_methods_invocations.op_db`:

- forward: the entry's op, jitted, on its first CPU sample(s) in float32, bfloat16 and
  one integer dtype (those it supports), against eager on the same inputs (outputs
  and any input the op writes into);
- gradients, where it supports autograd in float64: the outputs and the gradients of
  every input that requires grad, for one random cotangent per output, against eager
  autograd.

A sample that eager itself rejects is not counted. A random op (eager gives different
values for different seeds) is run with the same seed in both: minijit runs an opaque
random op as eager does, so its values match; an op whose values are unspecified
(`empty`) is compared by shape and dtype only. Each entry ends as one `EntryResult`:
`equal`, `refused` (a MinijitError: its message says why), `wrong` (a value differs:
never acceptable), `error` (another exception: a bug) or `untested` (no sample eager
accepts, or no differentiable output).

By default each entry runs on its first two samples that eager accepts, per dtype (what
CI runs: every entry, forward and gradients, in about a minute of CPU time).
`MINIJIT_OPINFO_FULL=1` runs every sample; `MINIJIT_OPINFO_SAMPLES=N` the first N.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

import minijit
from minijit.errors import MinijitError, TraceInvariantError
from minijit.ops.opaque import OPAQUE
from tests.ops.opinfo_util import no_test_fn_lookup

FORWARD_DTYPES = (torch.float32, torch.bfloat16)
INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
GRAD_DTYPE = torch.float64
TOLERANCES = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-5, 1.3e-5), torch.bfloat16: (2e-2, 2e-2),
              torch.float16: (1e-2, 1e-2)}
GRAD_TOLERANCES = (1e-7, 1e-7)

# Ops whose result values are unspecified (uninitialized memory): compared by shape and dtype only.
UNSPECIFIED_VALUES = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
                      "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
                      "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
                      "rand_like", "randn_like", "bernoulli", "normal", "normal.number_mean", "randint",
                      "randint_like", "randn", "rand", "multinomial", "uniform"}


def samples_per_entry() -> int | None:
    """How many samples eager accepts to run per entry and dtype (None: all): MINIJIT_OPINFO_FULL, _SAMPLES."""
    if os.environ.get("MINIJIT_OPINFO_FULL", "") not in ("", "0"):
        return None
    value = os.environ.get("MINIJIT_OPINFO_SAMPLES", "2")
    return None if value == "all" else int(value)


@cache
def op_db() -> list[Any]:
    """PyTorch's OpInfo database."""
    from torch.testing._internal.common_methods_invocations import op_db as db

    return list(db)


def entry_name(info: Any) -> str:
    """`name` or `name.variant`, as the entry is reported."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


@dataclass
class Outcome:
    """One sample's result: a status, a detail (the error or the mismatch), and the opaque ops it recorded."""

    status: str
    detail: str = ""
    opaque: tuple[str, ...] = ()
    declined: tuple[str, ...] = ()


@dataclass
class EntryResult:
    """An entry's forward and grad results: the worst status over its samples, with its detail.

    `counts` holds how many samples ended in each status, per kind ("forward", "grad").
    """

    name: str
    forward: Outcome = field(default_factory=lambda: Outcome("untested"))
    grad: Outcome | None = None  # None: the entry does not support autograd in float64
    opaque: set[str] = field(default_factory=set)
    declined: set[str] = field(default_factory=set)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, kind: str, status: str) -> None:
        """Count one sample of `kind` that ended in `status`."""
        per_kind = self.counts.setdefault(kind, {})
        per_kind[status] = per_kind.get(status, 0) + 1

    def summary(self) -> dict[str, Any]:
        """A plain dict of the result (what the test records for the coverage summary)."""
        return {"name": self.name, "forward": self.forward.status, "forward_detail": self.forward.detail,
                "grad": self.grad.status if self.grad else None, "grad_detail": self.grad.detail if self.grad else "",
                "opaque": sorted(self.opaque), "declined": sorted(self.declined), "counts": self.counts}


_RANK = {"untested": 0, "equal": 1, "refused": 2, "error": 3, "wrong": 4}


def _worse(a: Outcome, b: Outcome) -> Outcome:
    return b if _RANK[b.status] > _RANK[a.status] else a


def integer_dtype(info: Any) -> torch.dtype | None:
    """The integer dtype an entry is tested in: the first of INTEGER_DTYPES it supports."""
    supported = info.supported_dtypes("cpu")
    return next((d for d in INTEGER_DTYPES if d in supported), None)


def forward_dtypes(info: Any) -> list[torch.dtype]:
    """float32, bfloat16 and an integer dtype, those the entry supports on CPU (else the first dtype it does: bool)."""
    supported = info.supported_dtypes("cpu")
    dtypes = [d for d in FORWARD_DTYPES if d in supported]
    integer = integer_dtype(info)
    dtypes += [integer] if integer is not None else []
    return dtypes or sorted(supported, key=str)[:1]


def reseed(seed: int) -> None:
    """Seed the CPU generator (torch.manual_seed also records a stack trace per lazy device: slow under pytest)."""
    torch.default_generator.manual_seed(seed)


def entry_samples(info: Any, dtype: torch.dtype, requires_grad: bool) -> Iterator[Any]:
    """The entry's CPU samples, drawn from their own random stream seeded with 0 (the generator may raise).

    The stream is swapped in only while a sample is made: a `fork_rng` held across the
    yields would restore its saved state whenever this generator is closed, in the middle
    of a later run.
    """
    outer = torch.get_rng_state()
    reseed(0)
    try:
        with no_test_fn_lookup():
            made = iter(info.sample_inputs("cpu", dtype, requires_grad=requires_grad, set_seed=False))
    finally:
        stream = torch.get_rng_state()
        torch.set_rng_state(outer)
    while True:
        outer = torch.get_rng_state()
        torch.set_rng_state(stream)
        try:
            sample = next(made, None)
        finally:
            stream = torch.get_rng_state()
            torch.set_rng_state(outer)
        if sample is None:
            return
        yield sample


def clone_arguments(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
        return type(x)(clone_arguments(v) for v in x)
    if isinstance(x, dict):
        return {k: clone_arguments(v) for k, v in x.items()}
    return x


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, list | tuple):
        return [leaf for v in x for leaf in _leaves(v)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    return [x]


def _call(op: Callable[..., Any], sample: Any) -> Any:
    return as_user_code(op)(sample.input, *sample.args, **sample.kwargs)


def as_arguments(sample: Any) -> tuple[Any, ...]:
    return (sample.input, sample.args, sample.kwargs)


def _call_unseeded(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


@cache
def as_user_code(fn: Any) -> Any:
    """OpInfo's own lambdas (`lambda x: x.cumprod(0)`) as user code, which minijit interprets, not as torch's.

    The same code and globals, in a function whose module is not `torch.testing`. OpInfo's
    `wrapper_set_seed` (a `torch.manual_seed(42)` before a random op) is left out: the sweep
    seeds eager and minijit alike before each run.
    """
    if not isinstance(fn, types.FunctionType) or not fn.__module__.startswith("torch.testing"):
        return fn
    namespace = dict(fn.__globals__, __name__="opinfo_entry", wrapper_set_seed=_call_unseeded)
    return types.FunctionType(fn.__code__.replace(), namespace, fn.__name__, fn.__defaults__, fn.__closure__)


def jitted(info: Any) -> Callable[..., Any]:
    """The entry's op under minijit.jit, called as `jf(input, args, kwargs)`."""
    op = as_user_code(info.op)

    def call_op(input: Any, args: Any, kwargs: Any) -> Any:
        return op(input, *args, **kwargs)

    return minijit.jit(call_op)


def compare(actual: Any, expected: Any, dtype: torch.dtype, values: bool, what: str) -> str | None:
    """None if equal, else a description of the first difference."""
    a, e = _leaves(actual), _leaves(expected)
    if len(a) != len(e):
        return f"{what}: {len(a)} results, eager gives {len(e)}"
    for i, (x, y) in enumerate(zip(a, e)):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor):
                return f"{what}[{i}]: got {type(x).__name__}, eager gives a tensor"
            if (x.shape, x.dtype) != (y.shape, y.dtype):
                return f"{what}[{i}]: got {x.dtype}{list(x.shape)}, eager gives {y.dtype}{list(y.shape)}"
            if not values:
                continue
            atol, rtol = TOLERANCES.get(dtype, (0.0, 0.0))
            rt = TOLERANCES.get(y.dtype, (0.0, 0.0))
            atol, rtol = max(atol, rt[0]), max(rtol, rt[1])
            try:
                torch.testing.assert_close(x.detach(), y.detach(), atol=atol, rtol=rtol, equal_nan=True)
            except AssertionError as err:
                return f"{what}[{i}]: " + " ".join(str(err).split())[:300]
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and x != x and y != y):
            return f"{what}[{i}]: got {x!r}, eager gives {y!r}"
    return None


def _ops_of(jf: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        traces = minijit.last_traces(jf)
    except RuntimeError:  # refused while capturing: no trace
        return (), ()
    if not traces:
        return (), ()
    capture = traces[0]
    names = tuple(dict.fromkeys(b.sym.id for b in capture.bound_symbols if OPAQUE in b.sym.tags))
    declined = tuple(dict.fromkeys(sym for sym, _ in jf.last_entry().capture.declined))
    return names, declined


def is_random(info: Any, sample: Any) -> bool:
    """Whether eager gives different values for different seeds (or values are unspecified)."""
    if entry_name(info) in UNSPECIFIED_VALUES:
        return True
    results = []
    for seed in (0, 1):
        reseed(seed)
        args = clone_arguments(as_arguments(sample))  # a fresh copy each time: an in-place op writes into it
        results.append(as_user_code(info.op)(args[0], *args[1], **args[2]))
    return compare(results[0], results[1], torch.float64, True, "") is not None


def run_forward_sample(info: Any, sample: Any, dtype: torch.dtype) -> Outcome:
    """The entry's op on one sample under minijit against eager."""
    random = False
    try:
        random = is_random(info, sample)
        reseed(0)
        eager_args = clone_arguments(as_arguments(sample))
        expected = as_user_code(info.op)(eager_args[0], *eager_args[1], **eager_args[2])
    except Exception:
        return Outcome("untested", "eager rejects the sample")
    jf = jitted(info)
    jit_args = clone_arguments(as_arguments(sample))
    try:
        reseed(0)
        actual = jf(*jit_args)
    except MinijitError as e:
        # A trace the verifier rejects is a bug in a pass, never a refusal.
        status = "error" if isinstance(e, TraceInvariantError) else "refused"
        return Outcome(status, _first_line(e), *_ops_of(jf))
    except Exception as e:
        return Outcome("error", f"{type(e).__name__}: {_first_line(e)}", *_ops_of(jf))
    values = entry_name(info) not in UNSPECIFIED_VALUES
    diff = compare(actual, expected, dtype, values, "output") or compare(jit_args, eager_args, dtype, True, "input")
    if diff is not None and random and values:
        diff = compare(actual, expected, dtype, False, "output")  # random: shapes and dtypes only
    return Outcome("wrong" if diff else "equal", diff or "", *_ops_of(jf))


def run_grad_sample(info: Any, sample: Any) -> Outcome:
    """Outputs and input gradients of the entry's op on one float64 sample under minijit, against eager autograd."""
    leaves = [x for x in _leaves(as_arguments(sample)) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not leaves:
        return Outcome("untested", "no input requires grad")
    try:
        random = is_random(info, sample)
        reseed(0)
        expected = [t for t in _leaves(_call(info.op, sample)) if isinstance(t, torch.Tensor)]
    except Exception:
        return Outcome("untested", "eager rejects the sample")
    diff_out = [i for i, t in enumerate(expected) if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)]
    if not diff_out:
        return Outcome("untested", "no differentiable output")
    try:
        reseed(0)
        cotangents = [torch.randn_like(expected[i]) for i in diff_out]
        want = torch.autograd.grad([expected[i] for i in diff_out], leaves, cotangents, allow_unused=True)
    except Exception:
        return Outcome("untested", "eager autograd rejects the sample")
    jf = jitted(info)
    try:
        reseed(0)  # the same random numbers as eager's, where minijit runs the op as eager does
        actual = [t for t in _leaves(jf(*as_arguments(sample))) if isinstance(t, torch.Tensor)]
        diff = compare(actual, expected, GRAD_DTYPE, True, "output")
        if diff is not None and random:
            return Outcome("untested", "random: minijit draws other random numbers than eager")
        if diff is not None:
            return Outcome("wrong", diff, *_ops_of(jf))
        pairs = [(actual[i], ct) for i, ct in zip(diff_out, cotangents) if actual[i].requires_grad]
        have = torch.autograd.grad([o for o, _ in pairs], leaves, [ct for _, ct in pairs], allow_unused=True) \
            if pairs else [None] * len(leaves)
    except MinijitError as e:
        # A trace the verifier rejects is a bug in a pass, never a refusal.
        status = "error" if isinstance(e, TraceInvariantError) else "refused"
        return Outcome(status, _first_line(e), *_ops_of(jf))
    except Exception as e:
        return Outcome("error", f"{type(e).__name__}: {_first_line(e)}", *_ops_of(jf))
    # An output minijit computes from constants only needs no grad where eager's gradient is zero anyway
    # (`x.clone().zero_()`): the comparison of the gradients below covers it.
    have = [torch.zeros_like(x) if g is None else g for g, x in zip(have, leaves)]
    want = [torch.zeros_like(x) if g is None else g for g, x in zip(want, leaves)]
    diff = compare(have, want, GRAD_DTYPE, True, "grad")
    return Outcome("wrong" if diff else "equal", diff or "", *_ops_of(jf))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _run_samples(info: Any, dtype: torch.dtype, grad: bool, result: EntryResult) -> Outcome:
    """The worst outcome over the first `samples_per_entry()` samples eager accepts (all, in the full sweep)."""
    limit = samples_per_entry()
    worst, tested = Outcome("untested"), 0
    samples = entry_samples(info, dtype, requires_grad=grad)
    while limit is None or tested < limit:
        try:
            sample = next(samples)
        except StopIteration:
            break
        except Exception as e:  # OpInfo's sample generator itself failed: nothing to compare
            worst = _worse(worst, Outcome("untested", f"OpInfo's samples raise {type(e).__name__}"))
            break
        outcome = run_grad_sample(info, sample) if grad else run_forward_sample(info, sample, dtype)
        result.count("grad" if grad else "forward", outcome.status)
        tested += outcome.status != "untested"
        worst = _worse(worst, outcome)
        result.opaque.update(outcome.opaque)
        result.declined.update(outcome.declined)
    return worst


def run_entry(info: Any, grad: bool = True) -> EntryResult:
    """Forward (every tested dtype) and, where supported, gradients of one OpInfo entry."""
    result = EntryResult(entry_name(info))
    for dtype in forward_dtypes(info):
        result.forward = _worse(result.forward, _run_samples(info, dtype, False, result))
    if grad and supports_grad(info):
        result.grad = _run_samples(info, GRAD_DTYPE, True, result)
    return result


def supports_grad(info: Any) -> bool:
    """Whether the entry's gradients are compared: it supports autograd, in float64 on CPU."""
    return bool(info.supports_autograd) and GRAD_DTYPE in info.supported_dtypes("cpu")
