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

Where the trace is split for autograd, the source also holds the entry's own `torch.autograd.Function`
(minijit.runtime.autograd), `_JitFunction`: its `forward` runs steps 2 and 3 and keeps what the backward needs,
its `backward` runs the compiled backward trace with autocast off, or, under grad mode (`create_graph=True`), the
double backward the entry allows (minijit.runtime.double_backward); `call` applies it in their place and rebuilds
the output around the tensors autograd returned. Every branch is decided when the entry is compiled: the source
holds only the steps this entry needs.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import InplaceError, MinijitError, ValueGuardMiss
from minijit.ir import tree_flatten
from minijit.runtime import autograd
from minijit.runtime.autocast import no_autocast
from minijit.runtime.autograd import CompiledGrad
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


# From this many inputs an inference tensor may not be, the epilogue asks about them all at once first.
ASKED_AT_ONCE = 4


def any_inference(tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether any of `tensors` was made under `torch.inference_mode()`, asked in one C call per tensor."""
    return any(map(torch.Tensor.is_inference, tensors))


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


class _Names(dict[str, str]):
    """Names for the generated source's helpers and locals that no input's name takes: `names[base]` is `base`, or
    `base_1`, ... where an input (or another helper) has it, the same each time it is asked."""

    def __init__(self, taken: Sequence[str]):
        super().__init__()
        self.taken = set(taken)

    def __missing__(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        self[base] = name
        return name


def _grad_helpers(h: _Names, grad: CompiledGrad) -> dict[str, Any]:
    """The names the source of a split entry's autograd.Function reads, besides the epilogue's own."""
    return {h["_Function"]: torch.autograd.Function, h["_autograd"]: autograd, h["_flatten"]: tree_flatten,
            h["_grad_enabled"]: torch.is_grad_enabled, h["_backward"]: grad.backward, h["_recompute"]: grad.recompute,
            h["_saved_backward"]: grad.saved_backward}


class Epilogue:
    """An entry's call, compiled from one source (`source`, exactly what was compiled): `function` takes the call's
    own inputs and returns the user's result.

    `trace` is the compiled trace (or its CUDA-graphed stand-in); with `grad`, the trace is the forward of a split,
    and the source holds the autograd.Function joining it to `grad.backward` (see the module's docstring).
    `bases`: (the input it is made from, its length) per synthetic base; `autocast_off`: the entry was made under
    autocast; `restore_rng` and `fallback`: the two `try` blocks around the call (see the module's docstring).
    """

    def __init__(self, name: str, trace: Callable[..., Any], body: Around, plan: CallPlan,
                 bases: Sequence[tuple[int, int]] = (), autocast_off: bool = False, grad: CompiledGrad | None = None,
                 restore_rng: bool = False, fallback: Fallback | None = None):
        self.name, self.trace, self.body, self.plan = name, trace, body, plan
        self.bases, self.autocast_off, self.grad = tuple(bases), autocast_off, grad
        self.restore_rng, self.fallback = restore_rng, fallback
        own = len(plan.inputs)
        assert len(body.names) == own + len(plan.captured) + len(self.bases), (body.names, plan.inputs)
        if self._runs_trace_alone():
            # Nothing to run around the trace: a call runs it as it is, one frame less on the hit path.
            self.source = f"# Nothing runs around the compiled trace of {name}: a call runs it as it is.\n"
            self.function: Callable[..., Any] = trace
            return
        self.helpers = h = _Names(body.names)
        self.env: dict[str, Any] = {
            h["_trace"]: trace, h["_no_grad"]: torch.no_grad, h["_no_autocast"]: no_autocast,
            h["_inference_mode"]: torch.is_inference_mode_enabled, h["_refused"]: _refused_inference_write,
            h["_bump"]: torch.autograd.graph.increment_version, h["_as_strided"]: torch.as_strided,
            h["_any_inference"]: any_inference,
            h["_rng_states"]: rng_states, h["_set_rng_states"]: set_rng_states, h["_ValueGuardMiss"]: ValueGuardMiss,
            h["_MinijitError"]: MinijitError, h["_fallback"]: fallback}
        if grad is None:
            source = self._call(h, self._body(h))
        elif not (grad.differentiable_outputs or grad.dirty_inputs):  # all constant for VJP: made under no_grad
            source = self._call(h, [*self._body(h, no_grad=True),
                                    f"{h['ran']} = {h['ran']}[0]  # the outputs: nothing to differentiate, no node"])
        else:
            self.env.update(_grad_helpers(h, grad))
            source = self._function_class(h, grad) + "\n\n" + self._call(h, self._apply(h, grad))
        self.source = source
        exec(compiled_code(source, f"<minijit epilogue {name}>"), self.env)
        if h["_JitFunction"] in self.env:  # its backward runs wherever backward() was called: Dynamo must not trace it
            autograd.hidden_from_dynamo(self.env[h["_JitFunction"]].backward)
        self.function = self.env[h["call"]]
        self.function.__minijit_source__ = source  # type: ignore[attr-defined]

    def rebound(self, plan: CallPlan, partner: dict[int, Any]) -> Epilogue:
        """This epilogue around the same trace for an entry moved to new objects (rebind.py), whose call plan is
        `plan`, this one's with each object `o` of the old ones replaced by `partner[id(o)]`: the same source, over
        this environment with each such object replaced under its name (its words name objects, not where they
        were found); nothing is generated again."""
        if not hasattr(self, "env"):  # (nothing runs around the trace)
            return Epilogue(self.name, self.trace, self.body, plan, self.bases, self.autocast_off, self.grad,
                            self.restore_rng, self.fallback)
        copy = object.__new__(Epilogue)
        copy.__dict__.update(self.__dict__)
        h = self.helpers
        copy.plan = plan
        copy.env = env = {name: partner.get(id(value), value) for name, value in self.env.items()}
        if plan.effects:
            env[h["_effects"]] = plan.effects
            env[h["_holders"]] = [holder_reader(effect, plan.inputs) for effect, _ in plan.effects]
        if plan.result is not None:
            env[h["_result"]] = plan.result
        exec(compiled_code(self.source, f"<minijit epilogue {self.name}>"), env)
        if h["_JitFunction"] in env:
            autograd.hidden_from_dynamo(env[h["_JitFunction"]].backward)
        copy.function = env[h["call"]]
        copy.function.__minijit_source__ = self.source  # type: ignore[attr-defined]
        return copy

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

    def _body(self, h: _Names, no_grad: bool = False, into: str | None = None) -> list[str]:
        """Steps 2 and 3: the inference-write check, the trace under the modes it needs (grad mode off too with
        `no_grad`), its result assigned to `into` (else to `ran`), the version bumps."""
        names, lines = self.body.names, []
        if self.body.inference_writes:
            test = f"not {h['_inference_mode']}()"
            if len(self.body.inference_writes) >= ASKED_AT_ONCE:  # (one C call per tensor; which one, only if any)
                test += f" and {h['_any_inference']}({_tuple(names[i] for i, _ in self.body.inference_writes)})"
            lines.append(f"if {test}:  # eager refuses in-place writes into inference tensors")
            for i, site in self.body.inference_writes:
                lines += [f"    if {names[i]}.is_inference():", f"        raise {h['_refused']}({names[i]!r}, {site!r})"]
        modes = [f"{h['_no_grad']}()"] * (self.body.no_grad or no_grad) + [f"{h['_no_autocast']}()"] * self.autocast_off
        call = f"{into or h['ran']} = {h['_trace']}({', '.join(names)})"
        lines += [f"with {', '.join(modes)}:", f"    {call}"] if modes else [call]
        if self.body.bumps:
            lines.append(f"{h['_bump']}({_tuple(names[i] for i in self.body.bumps)})  # autograd sees the writes")
        return lines

    def _function_class(self, h: _Names, grad: CompiledGrad) -> str:
        """`class _JitFunction`: the entry's autograd.Function, one node of autograd's graph per call."""
        ctx = h["ctx"]
        methods = (self._function("forward", [ctx, h["box"], *self.body.names], self._forward(h, grad)),
                   self._function("backward", [ctx, f"*{h['cotangents']}"], self._backward(h, grad)))
        return (f"class {h['_JitFunction']}({h['_Function']}):\n    # {self.name}'s compiled forward and backward as one "
                "autograd.Function (minijit.runtime.autograd).\n"
                + "".join(f"\n    @staticmethod\n{textwrap.indent(method, '    ')}" for method in methods))

    def _forward(self, h: _Names, grad: CompiledGrad) -> list[str]:
        """The Function's forward: steps 2 and 3, then what the backward and a double backward need kept."""
        names, ctx, saved, flat = self.body.names, h["ctx"], h["saved"], h["flat"]
        # It returns the outputs to differentiate, then the inputs it marks dirty.
        returned = [f"{flat}[{p}]" for p in grad.differentiable_outputs] + [names[i] for i in grad.dirty_inputs]
        inputs = _tuple(names)
        recompute = grad.recompute.refusal is None
        from_saved, random = grad.saved_backward, recompute and grad.recompute.random
        lines = [f"{h['rng']} = {h['_recompute']}.rng_state({inputs})  # where a recompute's draws start"] * random
        lines += [*self._body(h, into=f"{h['outputs']}, {saved}"), f"{flat} = {h['_flatten']}({h['outputs']})",
                  f"{h['box']}.append(({h['outputs']}, {flat}))  # for the call: the outputs autograd does not return",
                  f"{h['_autograd']}.save({ctx}, {saved})  # autograd checks their versions at backward"]
        if from_saved is not None:
            lines.append(f"{ctx}.from_saved = {h['_saved_backward']}.holds({saved}, {inputs}, {_tuple(returned)})"
                         "  # a double backward can run from the saved values")
        if recompute:
            kept = f"() if {ctx}.from_saved else {inputs}" if from_saved is not None else inputs
            lines += [f"{ctx}.inputs = {kept}  # a double backward recomputes the call from them",
                      f"{ctx}.input_versions = {h['_autograd']}.versions({ctx}.inputs)"]
            if random:
                lines.append(f"{ctx}.rng = None if {ctx}.from_saved else {h['rng']}" if from_saved is not None
                             else f"{ctx}.rng = {h['rng']}")
        if grad.backward_mutated_inputs:
            pairs = _tuple(f"({names[i]!r}, {names[i]})" for i in grad.backward_mutated_inputs)
            lines.append(f"{ctx}.writes_requiring_grad = [n for n, t in {pairs} if t.requires_grad]"
                         "  # the backward writes them")
        if grad.dirty_inputs:
            lines.append(f"{ctx}.mark_dirty({', '.join(names[i] for i in grad.dirty_inputs)})"
                         "  # autograd rebases their history onto this node")
        if from_saved is not None and from_saved.hidden:
            lines += [f"if {ctx}.from_saved:  # the saved values computed here are returned too: their history is this node",
                      f"    {ctx}.set_materialize_grads(False)  # a backward without a double one gets None for them",
                      f"    {ctx}.output_layouts = [(t.shape, t.dtype, t.device) for t in {_tuple(returned)}]",
                      f"    return {_tuple(returned + [f'{saved}[{i}]' for i in from_saved.hidden])}"]
        return [*lines, f"return {_tuple(returned)}"]

    def _backward(self, h: _Names, grad: CompiledGrad) -> list[str]:
        """The Function's backward: the compiled backward trace, or under grad mode the double backward the entry
        allows (minijit.runtime.double_backward), or the error eager's backward would raise."""
        ctx, cot, recompute = h["ctx"], h["cotangents"], grad.recompute
        if grad.overwritten_saved:
            return [f"raise {h['_autograd']}.overwritten({self.name!r}, {grad.overwritten_saved!r})  # as eager's backward does"]
        first = "" if grad.first_order_saved is None else f"[:{grad.first_order_saved}]"
        n, lines, double = len(grad.differentiable_outputs), [], []
        if grad.saved_backward is not None and grad.saved_backward.hidden:
            count = n + len(grad.dirty_inputs)
            lines = [f"if {ctx}.from_saved:  # the hidden outputs' cotangents come last",
                     f"    if any(c is not None for c in {cot}[{count}:]):  # a double backward reached a hidden output",
                     f"        return None, *{h['_autograd']}.hidden_gradients({ctx}, {h['_saved_backward']}, {h['_backward']}, "
                     f"{grad.first_order_saved}, {cot}[:{count}], {cot}[{count}:])",
                     f"    {cot} = {h['_autograd']}.materialized({ctx}, {cot}[:{count}])"]
        if grad.backward_mutated_inputs:
            double += [f"if {ctx}.writes_requiring_grad:",
                       f"    raise {h['_autograd']}.backward_write({self.name!r}, {ctx}.writes_requiring_grad)"]
        if grad.saved_backward is not None:
            double += [f"if {ctx}.from_saved:",
                       f"    return None, *{h['_saved_backward']}.gradients({h['_autograd']}.saved_values({ctx}), {cot})"]
        if recompute.refusal is None:
            double.append(f"return None, *{h['_recompute']}.gradients({ctx}.inputs, {ctx}.input_versions, "
                          f"{grad.differentiable_outputs!r}, {cot}[:{n}], {f'{ctx}.rng' if recompute.random else None})")
        else:
            double.append(f"raise {h['_recompute']}.refused()  # {' '.join(recompute.refusal.split())}")
        return [*lines, f"if {h['_grad_enabled']}():  # create_graph=True: a differentiable backward",
                *_indented(double), f"with {h['_no_autocast']}():  # the backward trace holds its own casts",
                f"    {h['grads']} = {h['_backward']}(*{h['_autograd']}.saved_values({ctx}){first}, *{cot})",
                f"return None, *{h['grads']}"]

    def _apply(self, h: _Names, grad: CompiledGrad) -> list[str]:
        """What `call` runs in place of steps 2 and 3: the Function, and the output rebuilt around what it returned."""
        names, flat, ran, returned = self.body.names, h["flat"], h["ran"], h["returned"]
        lines = []
        for i in grad.dirty_inputs:
            lines += [f"if {names[i]}.is_leaf and {names[i]}.requires_grad:  # eager refuses writes into such leaves",
                      f"    raise {h['_autograd']}.leaf_write({names[i]!r}, {self.name!r})"]
        lines += [f"{h['box']} = []",
                  f"{returned} = {h['_JitFunction']}.apply({h['box']}, {', '.join(names)})  # one autograd node",
                  f"{ran}, {flat} = {h['box']}[0]"]
        lines += [f"{flat}[{p}] = {returned}[{k}]" for k, p in enumerate(grad.differentiable_outputs)]
        return [*lines, f"{ran} = {h['_autograd']}.rebuilt({ran}, {flat})"]

    def _call(self, h: _Names, run: list[str]) -> str:
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

    def _guarded(self, h: _Names, lines: list[str]) -> list[str]:
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
