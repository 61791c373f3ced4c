"""Trace inputs besides the call's arguments (minijit.runtime.arguments has those): tensors met while tracing.

A tensor read from outside the call becomes an input after the call's own, a tensor made
while tracing a constant (`tensor_capturer`). Both kinds of tensor input share the refusal
of Tensor subclasses and, in "symbolic values" mode, sizes other than 0 as
`IntegerProxy`s (bound by a `prims.shape` call at the top of the trace).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from minijit.errors import UnsupportedOpError
from minijit.frontend.frame import current_state
from minijit.frontend.guards import Source
from minijit.ir import FloatProxy, IntegerProxy, Proxy, TensorProxy, Trace
from minijit.ir.context import where_now
from minijit.ops import prims
from minijit.ops.strides import note_layout
from minijit.runtime.arguments import make_sizes_symbolic, refuse_tensor_subclass
from minijit.runtime.dynamic import DynamicNumbers, StateSizes, slot_key

Tensor = torch.Tensor


def input_names(trace: Trace) -> list[str]:
    """The trace's input names, as the guard function's parameters."""
    return [p.name for p in trace.args if isinstance(p, Proxy)]


def tensor_capturer(trace: Trace, inputs: list[tuple[str, Source, Tensor]], constants: list[Tensor],
                    symbolic: bool = False, pinned: frozenset[int] = frozenset(),
                    symbolic_names: set[str] | None = None, noted: Mapping[str, StateSizes] | None = None,
                    state_sizes: dict[str, StateSizes] | None = None) -> Callable[[Tensor], Proxy]:
    """The `trace.capture_tensor` hook: the proxy of a real tensor met among an op's arguments, once per tensor.

    A tensor read from outside the call (minijit.frontend.outside knows its source) becomes
    an input of the trace, read again from that source on every call, and is appended to
    `inputs` as (input name, source, tensor); any other real tensor (made natively while
    tracing) becomes `prims.tensor_constant(tensor)` and is appended to `constants`.
    With `symbolic`, a captured tensor held as an attribute of a plain object (state such as a
    Hugging Face cache layer's `keys`, which grows from call to call) gets symbolic sizes, unless
    its input position is `pinned`; its name is added to `symbolic_names` (the guard then checks
    its rank, the constraints its sizes). Parameters, buffers, globals and items keep their sizes.
    `noted` (cache="automatic" once symbolic, minijit.runtime.dynamic): the sizes such a tensor of the same input
    name had in the trace made before under the call's key, a size kept constant as an int, a symbolic one as
    None; only the sizes that differ from those become symbolic (all stay constant where none were noted, or of
    another rank: symbolic once they change, as torch.compile's automatic dynamic does). Each such tensor's sizes
    as traced (constant: an int; symbolic: None) go into `state_sizes`, by input name.
    A tensor the interpretation sees as a proxy already (a jitted module's parameter: `Outside.seen`)
    is that proxy.
    """
    captured: dict[int, Proxy] = {}

    def capture(t: Tensor) -> Proxy:
        proxy = captured.get(id(t))
        if proxy is not None:
            return proxy
        outside = current_state().outside
        seen = outside.seen(t)
        if seen is not t:
            return seen
        source = outside.source_of(t)
        refuse_tensor_subclass(t, f"the tensor {source.label}" if source is not None else "a tensor")
        if source is not None:
            proxy = TensorProxy(tuple(t.shape), t.dtype, t.device, t.requires_grad)
            note_layout(trace, proxy, t)
            position = len(trace.args)
            trace.add_input(proxy, source.label)
            inputs.append((proxy.name, source, t))
            if trace.capture is not None:
                trace.capture.captured_from[proxy.name] = t
            if _is_state_tensor(t, source):
                if symbolic and position not in pinned:
                    make_sizes_symbolic(proxy, None if noted is None else kept_sizes(proxy.shape, noted.get(proxy.name)))
                    if symbolic_names is not None:
                        symbolic_names.add(proxy.name)
                if state_sizes is not None:
                    state_sizes[proxy.name] = tuple(d if isinstance(d, int) else None for d in proxy.shape)
        else:
            if t.requires_grad and torch.is_grad_enabled():
                raise UnsupportedOpError(
                    f"a tensor that requires grad reached the trace from outside the function's inputs"
                    f"{where_now()}; its gradient would be lost. Pass it as an argument (or register it "
                    "as a parameter of the jitted module)"
                )
            state = trace.capture
            assert state is not None
            state.capture_tensor = None  # the constant's own call must not capture again
            try:
                proxy = prims.tensor_constant(t)
                note_layout(trace, proxy, t)
            finally:
                state.capture_tensor = capture
            constants.append(t)
        captured[id(t)] = proxy
        return proxy

    return capture


def number_capturer(trace: Trace, inputs: list[tuple[str, Source, Any]], dynamic: DynamicNumbers
                    ) -> Callable[[str, Source, Any], Any]:
    """The `trace.capture.capture_number` hook: for a number read from outside at a dynamic source of `dynamic`, the
    proxy the trace takes as an input in its place, once per place (None for any other place).

    The number is appended to `inputs` as (input name, source, value), in the order of the trace's inputs, as
    captured tensors are: every call reads it again from its source. A tuple of numbers (Adam's `betas`) is a
    tuple of proxies, each read from its item.
    """
    captured: dict[tuple[Any, ...], Any] = {}

    def add(source: Source, value: int | float) -> Proxy:
        cls = IntegerProxy if type(value) is int else FloatProxy
        label = source.label.lstrip("_") or "n"
        p = trace.add_input(cls(value), label)
        p.expr = p.name
        inputs.append((p.name, source, value))
        return p

    def capture(kind: str, source: Source, value: Any) -> Any:
        key = slot_key(kind, source.holder, source.key)
        if key is None or not dynamic.covers(kind, source.holder, source.key):
            return None
        if key not in captured:
            captured[key] = (tuple(add(Source(source, "item", i, f"{source.label}_{i}"), v) for i, v in enumerate(value))
                             if type(value) is tuple else add(source, value))
        return captured[key]

    return capture


def kept_sizes(shape: tuple[int, ...], noted: StateSizes | None) -> StateSizes:
    """The sizes of a tensor read from an object that stay constants of the trace (the others None: symbolic): those
    equal to the `noted` ones of the trace before; all of them where none were noted, or of another rank."""
    if noted is None or len(noted) != len(shape):
        return tuple(shape)
    return tuple(d if d == k else None for d, k in zip(shape, noted, strict=True))


def _is_state_tensor(t: Tensor, source: Source) -> bool:
    """A tensor held in an instance attribute of a plain object (not a module, not a parameter)."""
    return (source.access == "attribute" and not isinstance(source.holder, Source | torch.nn.Module)
            and not isinstance(t, torch.nn.Parameter))
