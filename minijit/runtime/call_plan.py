"""What a compiled call does around its trace: read captured tensors, replay effects, rebuild the result.

At the end of the capture (`finish_capture`), the user's result and the values the
traced code wrote into objects from outside the call are flattened
(minijit.ir.containers): their tensors become the trace's outputs, and a `CallPlan`
remembers how to put them back. On every call, the entry's epilogue (minijit.runtime.epilogue,
generated from the plan) reads the tensors the trace captured from outside (each from its
`Source`), runs the trace, replays the effects in order (docs/design.md, invariant 8) with the
call's tensors in place of the traced ones and containers the trace created rebuilt afresh,
and rebuilds the result (a dataclass, a `ModelOutput`, ...) around the call's tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.frame import current_state
from minijit.frontend.guards import Source, TensorSeen
from minijit.frontend.outside import Effect, Outside
from minijit.ir import Proxy, Trace
from minijit.ir.containers import Constant, Mapping, Registered, Sequence, Spec, contains_proxy, flatten
from minijit.ir.context import where_now
from minijit.runtime.arguments import CALL_ARGUMENTS, ArgumentPath
from minijit.runtime.checks import compiled_code

Tensor = torch.Tensor

@dataclass
class CallPlan:
    """How one compiled trace meets the outside world on each call."""

    # Tensors read from outside: (source, the tensor seen while tracing), in the order of the trace's inputs;
    # of the tensor, only its metadata once the entry is compiled (`forget_tensors`).
    captured: list[tuple[Source, Tensor | TensorSeen]] = field(default_factory=list)
    # Rebuilds the user's result from the trace's first output; None when the trace returns it as is.
    result: Spec | None = None
    # Each effect with the spec of its value, whose leaves are the trace's second output, in order.
    effects: list[tuple[Effect, Spec]] = field(default_factory=list)
    # (position among the result's leaves, trace input index): an input returned as it is. Eager returns
    # that very tensor object (a Parameter stays a leaf), so the call does too.
    passthrough: list[tuple[int, int]] = field(default_factory=list)
    # The same for the effects' values (`lst.append(x)` appends the caller's `x` itself).
    effect_passthrough: list[tuple[int, int]] = field(default_factory=list)
    # True when an effect writes into a list or dict argument (the call's arguments are needed).
    writes_arguments: bool = False
    # The names of the trace's inputs the call's arguments give, in order: what a `Source` of an input reads (an
    # argument's `.grad`, fetched as an input; the argument a backward sets `.grad` on).
    inputs: list[str] = field(default_factory=list)

    def forget_tensors(self) -> None:
        """Keep only the metadata of the tensors read from outside (each call reads them from their sources)."""
        self.captured = [(source, TensorSeen.of(t) if isinstance(t, Tensor) else t) for source, t in self.captured]

    def is_trivial(self) -> bool:
        """True when the compiled trace can be called directly."""
        return not self.captured and self.result is None and not self.effects


def _parameters(inputs: list[str]) -> str:
    """The parameter list of a generated function of the call's inputs (`inputs` named, the rest taken as `*_`)."""
    return ", ".join([*inputs, "*_"])


def holder_reader(effect: Effect, inputs: list[str]) -> Callable[[tuple[Any, ...]], Any]:
    """What reads the object an effect writes into on each call, given the call's inputs: itself, or its source
    (which may read an input), compiled once."""
    holder = effect.holder
    if isinstance(holder, ArgumentPath):
        return lambda _: holder.resolve(CALL_ARGUMENTS.get())
    if not isinstance(holder, Source):
        return lambda _: holder
    env: dict[str, Any] = {}
    # our own generated read
    code = f"def read({_parameters(inputs)}):\n    return {holder.expression(env)}\n"
    exec(compiled_code(code, "<minijit effect holder>"), env)  # (the same words for an entry moved: rebind.py)
    read = env["read"]
    return lambda values: read(*values)


def replay(effects: list[tuple[Effect, Spec]], holders: list[Callable[[tuple[Any, ...]], Any]], values: list[Any],
           inputs: tuple[Any, ...] = ()) -> None:
    """Apply each effect, in order, to the object `holders` read (from the call's `inputs` where a holder is one of
    them), with the call's `values` for the traced tensors."""
    it = iter(values)
    for (effect, spec), read_holder in zip(effects, holders, strict=True):
        value = spec._build(it)
        holder = read_holder(inputs)
        op = effect.op
        if op == "setattr":
            setattr(holder, effect.key, value)
        elif op == "accumulate grad":
            holder.grad = value if _obeys_layout_contract(value, holder) else torch.empty_like(holder).copy_(value)
        elif op == "object setattr":
            object.__setattr__(holder, effect.key, value)
        elif op == "delattr":
            delattr(holder, effect.key)
        elif op == "object delattr":
            object.__delattr__(holder, effect.key)
        elif op == "setitem":
            holder[effect.key] = value
        elif op == "delitem":
            del holder[effect.key]
        elif op == "cell":
            holder.cell_contents = value
        elif op == "function":
            holder(*value[0], **value[1])
        elif op == "replace":  # a list or dict argument: its new contents, in place
            if isinstance(holder, list):
                holder[:] = value
            else:
                holder.clear()
                holder.update(value)
        else:  # a container method, with the effect's arguments and keywords as its value
            getattr(holder, effect.key)(*value[0], **value[1])


def finish_capture(trace: Trace, where: str, result: Any, outside: Outside) -> tuple[Any, CallPlan]:
    """The trace's output for `result` and the effects, and the `CallPlan` saying how to use it.

    Runs at the end of the capture, before the writes into outside objects are undone:
    tensors among the values are captured (a tensor read from outside becomes an input),
    objects the traced code created are rebuilt around each call's tensors (a Hugging Face
    `DynamicCache`), and no proxy may hide in an object that cannot be rebuilt (docs/design.md,
    invariant 8).
    `where` names the traced function for messages.
    """
    capture = trace.capture_tensor
    outside.history_checks()

    def is_leaf(x: Any) -> bool:
        return isinstance(x, Proxy | Tensor)

    def proxies(leaves: list[Any]) -> list[Any]:
        return [capture(x) if isinstance(x, Tensor) and not isinstance(x, Proxy) and capture is not None else x
                for x in leaves]

    plan = CallPlan()
    _guard_outside_containers(result, outside)
    for effect in outside.effects:
        _guard_outside_containers(effect.value, outside)
    result_spec, result_leaves = flatten(result, is_leaf, outside.is_created)
    _check_no_hidden_proxy(result_spec, f"the result of {where}", outside)
    result_leaves = proxies(result_leaves)
    effect_leaves: list[Any] = []
    notes: list[str] = []
    for effect in _without_overwritten(outside.effects):
        spec, leaves = flatten(effect.value, is_leaf, outside.is_created)
        _check_no_hidden_proxy(spec, f"a value stored outside the call by {where} ({effect.describe()})", outside)
        plan.effects.append((effect, spec))
        leaves = proxies(leaves)
        effect_leaves += leaves
        notes.append(f"then {effect.describe()}: {spec.describe([_name(x) for x in leaves])}")
    inputs = {id(p): i for i, p in enumerate(trace.args)}
    plan.passthrough = [(i, inputs[id(x)]) for i, x in enumerate(result_leaves) if id(x) in inputs]
    plan.effect_passthrough = [(i, inputs[id(x)]) for i, x in enumerate(effect_leaves) if id(x) in inputs]
    plan.writes_arguments = any(isinstance(effect.holder, ArgumentPath) for effect, _ in plan.effects)
    # An object from outside in the result is put back by the plan, not held by the trace: an entry moved
    # to new objects (minijit.runtime.rebind) returns the new one.
    rebuild = result_spec.needs_rebuild() or bool(plan.passthrough) or bool(outside.returned)
    if plan.effects or rebuild:
        plan.result = result_spec if rebuild else None
        output: Any = (tuple(result_leaves) if plan.result is not None else result_spec.rebuild(result_leaves),
                       tuple(effect_leaves))
        if plan.result is not None:
            notes.insert(0, f"returns {result_spec.describe([_name(x) for x in result_leaves])}")
        trace.output_note = " ".join("; ".join(notes).split())
    else:
        output = result_spec.rebuild(result_leaves)
    return output, plan


def _guard_outside_containers(value: Any, outside: Outside) -> None:
    """Guard the contents of each list, tuple or dict from outside the call found in `value` (a result, a value
    stored outside): the plan rebuilds them from what they hold now (their length, their keys, their items), which
    must then be what they hold on every call the entry serves (else returning `obj.items` after an item was
    appended returned the old items)."""
    guards = current_state().guards
    todo, seen = [value], set()
    while todo:
        x = todo.pop()
        if not isinstance(x, list | tuple | dict) or id(x) in seen:
            continue
        seen.add(id(x))
        if outside.is_root(x):
            if isinstance(x, dict):
                outside.observe_values(guards, x)
            else:
                outside.observe(guards, x, "iterate")
        todo += list(x.values()) if isinstance(x, dict) else list(x)


_SETS = ("setattr", "accumulate grad")


def _obeys_layout_contract(grad: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether eager's AccumulateGrad keeps `grad` as the new `t.grad` as it is: laid out like `t` where `t` is
    dense (strides equal wherever a size is not 1), else contiguous. Otherwise it copies it into that layout.
    A sparse gradient (an `Embedding(sparse=True)`'s) it keeps as it is."""
    if grad.layout != torch.strided:
        return True
    order = sorted(range(t.ndim), key=lambda d: -t.stride(d))
    expected, dense = 1, True
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride(d) != expected:
            dense = False
        expected *= t.shape[d]
    if not dense or t.is_contiguous():
        return grad.is_contiguous()
    return all(a == b for a, b, n in zip(grad.stride(), t.stride(), t.shape) if n != 1)


def _without_overwritten(effects: list[Effect]) -> list[Effect]:
    """`effects` less each attribute set on a tensor that a later effect sets again (a `.grad` that a backward made
    and `zero_grad()` then set to None): nothing outside the call could see it, and its value need not be an output."""
    kept = []
    for i, effect in enumerate(effects):
        if effect.op in _SETS and isinstance(effect.holder, Source) and any(
                later.holder is effect.holder and later.key == effect.key and later.op in (*_SETS, "delattr")
                for later in effects[i + 1:]):
            continue
        kept.append(effect)
    return kept


def _name(x: Any) -> str:
    return x.name if isinstance(x, Proxy) else repr(x)


def _check_no_hidden_proxy(spec: Spec, what: str, outside: Outside) -> None:
    """Refuse a proxy inside an object minijit cannot rebuild (it would reach the user, or a later call).

    An object from outside the call (a Hugging Face cache passed in, written and returned) is
    returned as itself: the proxies in it now are the trace's writes into it, logged as effects
    and replayed with each call's tensors; one still in it once those writes are undone is
    refused when the capture ends (`check_no_proxy_left`).
    """
    for constant in _constants(spec):
        if outside.is_root(constant.value):
            outside.returned.append(constant.value)
            continue
        if contains_proxy(constant.value):
            raise UnsupportedSyntaxError(
                f"{what}{where_now()} holds a traced tensor inside a {type(constant.value).__name__}, which minijit "
                "cannot rebuild for each call. Return tensors in tuples, lists, dicts, dataclasses, named tuples, "
                "types registered with torch.utils._pytree or objects of plain Python classes the function creates")


def _constants(spec: Spec) -> list[Constant]:
    if isinstance(spec, Constant):
        return [spec]
    children: list[Spec] = []
    if isinstance(spec, Sequence | Registered):
        children = spec.children
    elif isinstance(spec, Mapping):
        children = spec.children + spec.attributes
    return [c for child in children for c in _constants(child)]


__all__ = ["CALL_ARGUMENTS", "ArgumentPath", "CallPlan", "finish_capture", "replay"]
