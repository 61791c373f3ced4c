"""An entry's epilogue: what a call runs around its compiled trace, generated as one Python function and printed.

As checks.py generates the prologue (what a call must pass), this module generates, once per entry, the function
the call then runs (`minijit.show(jf, "epilogue")` prints its source, exactly what was compiled). In order, it

1. reads the tensors the trace captured from outside (each from its `Source`; docs/design.md, "Tensors read from
   outside") and makes the synthetic base of each group of overlapping inputs (`InputAliasing.synthetic_bases`);
2. refuses, as eager does, a call outside `torch.inference_mode()` that would write into an inference tensor,
   before anything runs (the trace writes its inputs back at the end: no input is left half written);
3. runs the compiled trace (with grad mode off for a trace that took its gradients itself, with autocast off for
   an entry made under autocast, whose trace holds its own casts), then bumps the autograd version counter of each
   input it writes: a kernel writing memory directly (Triton) does not, and eager autograd must see the write;
4. replays the effects in order with the call's tensors (minijit.runtime.call_plan) and rebuilds the result.

Around it all, where the entry needs them, two `try` blocks: one puts torch's random generators back when a value
check fails after the trace drew (minijit.runtime.values: the call runs again with another entry), one runs the
call eagerly when an op inside a user's `try` raises at run time (minijit.runtime.fallback).

Where the trace is split for autograd, steps 2 and 3 are a second generated function, `forward`, which the
`torch.autograd.Function` (minijit.runtime.autograd) runs; `call` runs that Function in their place.
Every branch is decided when the entry is compiled: the source holds only the steps this entry needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import InplaceError, MinijitError, ValueGuardMiss
from minijit.runtime.call_plan import CallPlan, holder_reader, replay
from minijit.runtime.checks import compiled_code
from minijit.runtime.fallback import Fallback, rng_states, set_rng_states


@dataclass(frozen=True)
class Around:
    """What runs around the compiled trace itself (steps 2 and 3), decided from the final trace."""

    # The trace's inputs: the call's own, then the captured tensors, then the synthetic bases.
    names: tuple[str, ...]
    # (position among `names`, where the trace writes that input): the inputs an inference tensor may not be.
    inference_writes: tuple[tuple[int, str], ...] = ()
    # The positions of the inputs the trace writes, whose version counters are bumped after it.
    bumps: tuple[int, ...] = ()
    no_grad: bool = False  # the trace took its gradients itself (it runs without autograd)


def around(names: Sequence[str], mutated_inputs: Sequence[str], write_sites: Sequence[str],
           no_grad: bool = False) -> Around:
    """The `Around` of a trace whose inputs are `names`, which writes `mutated_inputs` at `write_sites`."""
    sites = dict(zip(mutated_inputs, write_sites, strict=True))
    return Around(tuple(names), tuple((i, sites[n]) for i, n in enumerate(names) if n in sites),
                  tuple(i for i, n in enumerate(names) if n in sites), no_grad)


def _refused_inference_write(name: str, site: str) -> InplaceError:
    return InplaceError(
        f"{site}: an in-place write into {name}, a tensor made under torch.inference_mode(), outside inference mode "
        "(eager raises: inplace update to inference tensor outside InferenceMode is not allowed); call under "
        "torch.inference_mode(), or pass a clone")


def _indented(lines: list[str]) -> list[str]:
    return [f"    {line}" for line in lines]


def _tuple(names: Iterable[str]) -> str:
    """The source of a tuple of `names`."""
    names = list(names)
    return f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"


class _Names:
    """Names for the generated source's helpers and locals that no input's name takes."""

    def __init__(self, taken: Sequence[str]):
        self.taken = set(taken)

    def __call__(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name


class Epilogue:
    """An entry's call, compiled from one source (`source`, exactly what was compiled): `function` takes the call's
    own inputs and returns the user's result.

    `trace` is the compiled trace (or its CUDA-graphed stand-in); with `grad`, the trace is the forward of a split,
    and `grad(forward)` is the autograd callable running the generated `forward` (minijit.runtime.autograd).
    `bases`: (the input it is made from, its length) per synthetic base; `autocast_off`: the entry was made under
    autocast; `restore_rng` and `fallback`: the two `try` blocks around the call (see the module's docstring).
    """

    def __init__(self, name: str, trace: Callable[..., Any], body: Around, plan: CallPlan,
                 bases: Sequence[tuple[int, int]] = (), autocast_off: bool = False,
                 grad: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None, restore_rng: bool = False,
                 fallback: Fallback | None = None):
        self.name, self.trace, self.body, self.plan = name, trace, body, plan
        self.bases, self.autocast_off, self.grad = tuple(bases), autocast_off, grad
        self.restore_rng, self.fallback = restore_rng, fallback
        own = len(plan.inputs)
        assert len(body.names) == own + len(plan.captured) + len(self.bases), (body.names, plan.inputs)
        self.autograd: Callable[..., Any] | None = None
        names = _Names(body.names)
        h = {k: names(k) for k in ("call", "forward", "_trace", "_grad", "_no_grad", "_no_autocast", "_inference_mode",
                                   "_refused", "_bump", "_as_strided", "_replay", "_effects", "_holders", "_result",
                                   "_rng_states", "_set_rng_states", "_ValueGuardMiss", "_MinijitError", "_fallback",
                                   "ran", "result", "values", "leaves", "rng", "states", "error")}
        self.env: dict[str, Any] = {
            h["_trace"]: trace, h["_no_grad"]: torch.no_grad, h["_no_autocast"]: torch._C._DisableAutocast,
            h["_inference_mode"]: torch.is_inference_mode_enabled, h["_refused"]: _refused_inference_write,
            h["_bump"]: torch.autograd.graph.increment_version, h["_as_strided"]: torch.as_strided,
            h["_rng_states"]: rng_states, h["_set_rng_states"]: set_rng_states, h["_ValueGuardMiss"]: ValueGuardMiss,
            h["_MinijitError"]: MinijitError, h["_fallback"]: fallback}
        if grad is None:
            source = self._call(h, self._body(h))
        else:
            source = (self._function(h["forward"], body.names, [*self._body(h), f"return {h['ran']}"]) + "\n\n"
                      + self._call(h, [f"{h['ran']} = {h['_grad']}({', '.join(body.names)})"]))
        if self._runs_trace_alone():
            # Nothing to run around the trace: a call runs it as it is, one frame less on the hit path.
            self.source = f"# Nothing runs around the compiled trace of {name}: a call runs it as it is.\n"
            self.function: Callable[..., Any] = trace
            return
        self.source = source
        exec(compiled_code(source, f"<minijit epilogue {name}>"), self.env)
        if grad is not None:  # the autograd.Function's callable, running the generated forward
            self.autograd = self.env[h["_grad"]] = grad(self.env[h["forward"]])
        self.function = self.env[h["call"]]
        self.function.__minijit_source__ = source  # type: ignore[attr-defined]

    def rebound(self, plan: CallPlan) -> Epilogue:
        """This epilogue around the same trace with another call plan (an entry moved to new objects: rebind.py)."""
        return Epilogue(self.name, self.trace, self.body, plan, self.bases, self.autocast_off, self.grad,
                        self.restore_rng, self.fallback)

    @staticmethod
    def _function(name: str, params: Sequence[str], lines: list[str]) -> str:
        return f"def {name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in lines)

    def _runs_trace_alone(self) -> bool:
        """Whether nothing runs around the trace: no step but calling it."""
        plan, body = self.plan, self.body
        return (self.grad is None and plan.is_trivial() and not self.bases and not self.autocast_off
                and not body.inference_writes and not body.bumps and not body.no_grad and not self.restore_rng
                and self.fallback is None)

    def _comment(self) -> str:
        return f"# The call of {self.name}'s entry around its compiled trace (minijit.runtime.epilogue)."

    def _body(self, h: dict[str, str]) -> list[str]:
        """Steps 2 and 3: the inference-write check, the trace under the modes it needs, the version bumps."""
        names, lines = self.body.names, []
        if self.body.inference_writes:
            lines.append(f"if not {h['_inference_mode']}():  # eager refuses in-place writes into inference tensors")
            for i, site in self.body.inference_writes:
                lines += [f"    if {names[i]}.is_inference():", f"        raise {h['_refused']}({names[i]!r}, {site!r})"]
        modes = [f"{h['_no_grad']}()"] * self.body.no_grad + [f"{h['_no_autocast']}()"] * self.autocast_off
        call = f"{h['ran']} = {h['_trace']}({', '.join(names)})"
        lines += [f"with {', '.join(modes)}:", f"    {call}"] if modes else [call]
        if self.body.bumps:
            lines.append(f"{h['_bump']}({_tuple(names[i] for i in self.body.bumps)})  # autograd sees the writes")
        return lines

    def _call(self, h: dict[str, str], run: list[str]) -> str:
        """`def call`: step 1, then `run` (the trace and what surrounds it), then step 4."""
        plan, all_names = self.plan, self.body.names
        own, n_captured = len(plan.inputs), len(plan.captured)
        lines = []
        for name, (source, _) in zip(all_names[own:own + n_captured], plan.captured, strict=True):
            lines.append(f"{name} = {source.expression(self.env)}  # captured from outside")
        for name, (lead, length) in zip(all_names[own + n_captured:], self.bases, strict=True):
            lines.append(f"{name} = {h['_as_strided']}({all_names[lead]}, ({length},), (1,), 0)  # synthetic base")
        lines += run
        split = plan.result is not None or bool(plan.effects)
        if not split:
            lines.append(f"return {h['ran']}")
            return self._function(h["call"], all_names[:own], [self._comment(), *self._guarded(h, lines)])
        lines.append(f"{h['result']}, {h['values']} = {h['ran']}")
        if plan.effects:
            self.env[h["_replay"]], self.env[h["_effects"]] = replay, plan.effects
            self.env[h["_holders"]] = [holder_reader(effect, plan.inputs) for effect, _ in plan.effects]
            values = h["values"]
            if plan.effect_passthrough:
                lines.append(f"{values} = list({values})")
                lines += [f"{values}[{p}] = {all_names[i]}  # an input, as itself" for p, i in plan.effect_passthrough]
            seen = _tuple(all_names[:own + n_captured])
            lines.append(f"{h['_replay']}({h['_effects']}, {h['_holders']}, {values}, {seen})")
        if plan.result is None:
            lines.append(f"return {h['result']}")
        else:
            self.env[h["_result"]] = plan.result
            lines.append(f"{h['leaves']} = list({h['result']})")
            lines += [f"{h['leaves']}[{p}] = {all_names[i]}  # an input, as itself" for p, i in plan.passthrough]
            lines.append(f"return {h['_result']}.rebuild({h['leaves']})")
        return self._function(h["call"], all_names[:own], [self._comment(), *self._guarded(h, lines)])

    def _guarded(self, h: dict[str, str], lines: list[str]) -> list[str]:
        """`lines` with the generators put back where a value check fails after the trace drew (the call runs again
        with another entry and must draw the same numbers), inside the eager fallback of ops in a user's `try`."""
        if self.restore_rng:
            lines = [f"{h['rng']} = {h['_rng_states']}()  # a failing value check puts the generators back",
                     "try:", *_indented(lines), f"except {h['_ValueGuardMiss']}:",
                     f"    {h['_set_rng_states']}({h['rng']})", "    raise"]
        if self.fallback is not None:
            lines = [f"{h['states']} = {h['_fallback']}.states()  # an error of an op in a user's try: run eagerly",
                     "try:", *_indented(lines), f"except ({h['_MinijitError']}, {h['_ValueGuardMiss']}):", "    raise",
                     f"except Exception as {h['error']}:",
                     f"    raise {h['_fallback']}.instead({h['error']}, {h['states']}) from {h['error']}"]
        return lines
