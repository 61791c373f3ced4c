"""Values a capture reads from its tensors: `if x.sum() > 0`, `int(n.item())`, `t.tolist()`, `float(t)`.

A trace cannot branch on a value it computes, so the capture asks for the real value: the
`ValueReader` runs the part of the trace recorded so far on the call's real inputs (functionalized,
so no input is written; the random generators' state saved and restored, so the real run draws
the same numbers; effects on outside state are logged by the capture, not run), and the capture
goes on with that value. It records `prims.check_value` where the value was read: on every later
call the compiled trace checks that the value is the one this trace was made for, and raises
`ValueGuardMiss` where it is not, before any write into an input (those come last) and before
the outside state is replayed (after the trace). The jitted function then runs the call again
with the entry made for the value seen, tracing one if there is none (minijit.runtime.jit).

The entries of one function that differ by such values are told apart by their *value path*:
the values their checks expect, in the order the code read them. Two entries agree up to the
first check whose value differs, since the code they traced ran the same way until then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import TraceInvariantError, UnsupportedSyntaxError, ValueGuardMiss
from minijit.ir import NumberProxy, Proxy, TensorProxy, Trace, tree_flatten, tree_map
from minijit.ir.containers import sequence_leaves
from minijit.ir.context import current_trace, outside_capture, where_now
from minijit.ops import prims
from minijit.ops.aten_prims import check_readable, check_value, is_value_check, observe
from minijit.ops.opaque import describe, shapes_seen_symbol, views_seen
from minijit.ops.unbacked import bind_unbacked_sizes, unbacked_shapes


@dataclass(frozen=True)
class ValueCheck:
    """One value the capture read: which proxy, how (`bool`, `>`, `tolist`, ...), the value seen, and where."""

    ordinal: int
    name: str
    how: str
    other: Any
    expected: Any
    where: str

    def describe(self, value: Any = None, *, now: bool = False) -> str:
        """`bool(t3) is True at f.py:3 (if x.sum() > 0:)`; with `now`, the value seen on this call in its place."""
        shown = value if now else self.expected
        if self.how in ("bool", "int", "float", "index"):
            read = f"{self.how}({self.name})"
        elif self.how in ("tolist", "shape"):
            read = f"{self.name}.tolist()" if self.how == "tolist" else f"{self.name}.shape"
        elif self.how == "value":
            read = self.name
        else:
            other = self.other.name if isinstance(self.other, Proxy) else repr(self.other)
            read = f"({self.name} {self.how} {other})"
        return f"{read} is {shown!r}{self.where}"


@contextmanager
def rng_preserved() -> Iterator[None]:
    """Run the block and put torch's random generators back as they were (CPU, and CUDA where initialized)."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class ValueReader:
    """The capture's reader of real values (installed with `minijit.ir.context.reading_values`).

    `inputs()` gives the real values of the trace's inputs so far (the call's, then the captured
    tensors); `evaluate(prefix, inputs, no_grad)` runs a trace whose output is the proxy to read (`no_grad`: the
    names the capture recorded or wrote under torch.no_grad()).
    """

    def __init__(self, trace: Trace, inputs: Callable[[], list[Any]],
                 evaluate: Callable[[Trace, list[Any], frozenset[str]], Any]):
        self.trace = trace
        self.inputs = inputs
        self.evaluate = evaluate
        self.checks: list[ValueCheck] = []

    def readable_here(self) -> bool:
        """Whether values can be read where the capture is: in its own trace, at the level of the user's code
        (not inside an op's decomposition, whose op is not recorded yet, nor in a traced autograd.Function)."""
        trace = current_trace()
        return trace is self.trace and trace.recording_user_call

    def __call__(self, x: Proxy, how: str, other: Any) -> Any:
        """The value of `x` read the way `how` names, with its check recorded; NotImplemented where
        the value cannot be read here.

        Inside an op's decomposition (`x[:n.item()]`, `torch.zeros(n.item())`) only a number the trace
        computed before the op can be read, and it is read whole: the op's shapes may hold it.
        """
        trace = current_trace()
        if trace is not self.trace:
            return NotImplemented
        nested = not trace.recording_user_call
        if nested:
            if not isinstance(x, NumberProxy) or not any(x is o for b in trace.bound_symbols for o in b.proxy_outputs()):
                return NotImplemented
            # A value not seen (`.item()`'s placeholder) is read whole: the op's shapes may hold it. A seen one (a
            # size the op made, a slice bound) reads only the outcome.
            if how != "value" and not x.seen:
                return observe(self(x, "value", None), how, other)
        check_readable(x, how)
        read = [x, other] if isinstance(other, NumberProxy) else [x]  # another size only the trace knows
        values = self._real_values(read)
        if values is None:
            return NotImplemented
        observed = observe(values[0], how, values[1] if len(values) > 1 else other)
        self._check(x, how, other, observed, nested)
        if isinstance(x, NumberProxy) and how == "value":
            x.value = observed
            x.read = True
        return observed

    def see(self, x: NumberProxy) -> bool:
        """Give `x`, a number the trace computed before the op being recorded (`n.item()` as a slice bound), its
        real value on the call traced, with no check: its comparisons then read only their outcome, as a size
        only the trace knows does (`NumberProxy.seen`). False where its value cannot be read here."""
        trace = current_trace()
        if trace is not self.trace or not any(x is o for b in trace.bound_symbols for o in b.proxy_outputs()):
            return False
        values = self._real_values([x])
        if values is None:
            return False
        x.value = x.python_type(values[0])
        x.seen = True
        return True

    def call_with_shapes_seen(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record `fn(*args, **kwargs)`, an op whose result's shape depends on the values (`nonzero`), with the
        shapes it gives on the real values, each checked right after it; NotImplemented where it cannot be."""
        leaves = tree_flatten((args, kwargs))
        if not self.readable_here() or "out" in kwargs or any(isinstance(x, NumberProxy) for x in leaves):
            return NotImplemented
        proxies = [x for x in leaves if isinstance(x, TensorProxy)]
        values = self._real_values(proxies)
        if values is None:
            return NotImplemented
        # The real values require grad as their proxies do, so that the outputs require grad as eager's would.
        by_id = {id(p): r.detach().requires_grad_(p.requires_grad and (r.is_floating_point() or r.is_complex()))
                 for p, r in zip(proxies, values, strict=True)}
        real_args, real_kwargs = tree_map(lambda x: by_id.get(id(x), x), (args, kwargs))
        with rng_preserved():
            real_out = fn(*real_args, **real_kwargs)
        real_tensors = [t for t in sequence_leaves(real_out) if isinstance(t, torch.Tensor)]
        views = views_seen(args, kwargs, (real_args, real_kwargs), real_out)
        unbacked = unbacked_shapes(fn, args, kwargs, describe(fn), real_tensors)
        if unbacked is not None:  # sizes only the trace knows, bound where the op made them: no check
            shapes, fresh = unbacked
            out = shapes_seen_symbol(fn, real_out, shapes, views)(*args, **kwargs)
            bind_unbacked_sizes(out, fresh)
            return out
        out = shapes_seen_symbol(fn, real_out, views=views)(*args, **kwargs)
        if isinstance(real_out, tuple) and hasattr(type(real_out), "n_fields"):
            real_out = tuple(real_out)  # torch.return_types, which the symbol gives as a named tuple
        for proxy, real in zip(tree_flatten(out), tree_flatten(real_out), strict=True):
            if isinstance(proxy, TensorProxy):
                self._check(proxy, "shape", None, tuple(real.shape))
        return out

    def _real_values(self, proxies: list[Proxy]) -> list[Any] | None:
        """The real values of `proxies`: the trace recorded so far, run on the call's real inputs (None where that
        part of the trace reads a value it does not compute: one made inside the op being recorded)."""
        trace = self.trace
        # Earlier checks hold on the inputs the capture runs on: they need not run again.
        bsyms = [b for b in trace.bound_symbols if not is_value_check(b)]
        if any(b.sym is prims.seed for b in bsyms):
            raise UnsupportedSyntaxError(
                f"the value of {proxies[0].name}{where_now()} is needed while tracing, after torch.seed() reseeded "
                "from a non-deterministic source: it is only known when the trace runs; seed with torch.manual_seed")
        prefix = trace.derive(bsyms, pass_name="value read", output=list(proxies))
        state = trace.capture
        # What was recorded or written under no_grad: constants for grad, free to write.
        no_grad = (frozenset(state.recorded_without_grad | state.written_without_grad) if state is not None
                   else frozenset())
        if prefix.free_proxies():
            return None
        with outside_capture(), rng_preserved(), torch.no_grad():
            return list(self.evaluate(prefix, self.inputs(), no_grad))

    def _check(self, x: Proxy, how: str, other: Any, observed: Any, nested: bool = False) -> None:
        """Record the check of the value read, at the top level of the trace (before the op being recorded)."""
        ordinal = len(self.checks)
        if nested:
            with self.trace.recording_at_top_level():
                check_value(x, how, other, observed, ordinal)
        else:
            check_value(x, how, other, observed, ordinal)
        self.checks.append(ValueCheck(ordinal, x.name, how, other, observed, where_now()))


def value_path(checks: list[ValueCheck]) -> tuple[Any, ...]:
    """The values an entry's checks expect, in the order the code read them."""
    return tuple(c.expected for c in checks)


def value_miss_reason(entry: Any, miss: ValueGuardMiss, fresh: bool = False) -> str:
    """Why a call left `entry` (a CompiledEntry whose check `miss.ordinal` failed), in words."""
    check = entry.capture.value_checks[miss.ordinal]
    if fresh:
        return (f"value guard: {check.describe(miss.observed, now=True)} when the compiled trace runs, but it was "
                f"{check.expected!r} when the capture read it on the same inputs; the executors compute it "
                "differently from eager torch (rounding), or it is not deterministic. Compare with a tolerance, or "
                "compute with tensors (torch.where) instead of reading the value")
    return (f"value guard: {check.describe(miss.observed, now=True)} (the trace was made for {check.expected!r}); "
            f"the trace ran up to that check in vain")


def check_writes_after_checks(trace: Trace) -> None:
    """Raise TraceInvariantError where a final trace writes into an input before one of its value checks.

    A check that fails must leave the call's inputs as they were: the call runs again with another entry.
    """
    last_check = max((i for i, b in enumerate(trace.bound_symbols) if is_value_check(b)), default=-1)
    if last_check < 0:
        return
    inputs = {p.name for p in trace.args}
    for bsym in trace.bound_symbols[:last_check]:
        written = [p.name for p in bsym.written() if p.name in inputs]
        if written:
            raise TraceInvariantError(
                f"{trace.pass_name}: {bsym.sym.id} writes input {written[0]} before the value check "
                f"prims.check_value at line {last_check} of the trace: a failing check would leave it written")
