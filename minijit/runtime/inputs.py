"""Trace inputs: which call arguments become inputs, their proxies, and flattening at call time.

In "constant values" mode the inputs are the tensors among the arguments; shapes and
Python numbers are constants of the trace. In "symbolic values" mode every dimension
other than 0 is an `IntegerProxy` (bound by a `prims.shape` call at the top of the
trace), and Python ints and floats among the arguments are inputs too.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import UnsupportedOpError, UnsupportedSyntaxError
from minijit.frontend.frame import current_state
from minijit.frontend.guards import Source
from minijit.ir import FloatProxy, IntegerProxy, Proxy, TensorProxy, Trace
from minijit.ir.containers import flatten, is_container, leaves
from minijit.ir.context import add_constraint, where_now
from minijit.ops import prims
from minijit.ops.strides import note_layout

Tensor = torch.Tensor


def parameter_names(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """A name per positional argument and keyword, from fn's signature where it has one."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(len(args))] + list(kwargs)
    names: list[str] = []
    for name, value in bound.arguments.items():
        param = bound.signature.parameters[name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}{i}" for i in range(len(value))]
        elif param.kind is not inspect.Parameter.VAR_KEYWORD:
            names.append(name)
    return names[: len(args)] + list(kwargs)


def is_symbolic_number(x: Any) -> bool:
    """Python ints and floats (not bools) become symbolic inputs in "symbolic values" mode."""
    return type(x) is int or type(x) is float


def proxify_arguments(trace: Trace, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                      symbolic: bool, pinned: frozenset[int] = frozenset()) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace the arguments that are trace inputs by proxies named after their parameters.

    Must be called while `trace` records: in symbolic mode it records the `prims.shape` calls.
    The tensors at the flat input positions `pinned` keep constant sizes in symbolic mode,
    checked by the guard (as a module's parameters do).
    """
    values = list(args) + list(kwargs.values())
    proxied = []
    position = itertools.count()  # the flat input position of each leaf, in order
    # A module's forward names its parameters after their paths (`fc1_weight`).
    leaf_names: list[str] | None = getattr(fn, "param_names", None)
    for name, value in zip(parameter_names(fn, args, kwargs), values, strict=True):
        count = [0]
        is_module_params = name == "params" and leaf_names is not None

        def wanted_name(name: str = name, count: list[int] = count) -> str:
            count[0] += 1
            if name == "params" and leaf_names is not None:
                return leaf_names[count[0] - 1]
            return name if count[0] == 1 else f"{name}_{count[0] - 1}"

        def to_proxy(x: Any, is_module_params: bool = is_module_params, name: str = name) -> Any:
            at = next(position)
            if isinstance(x, Tensor):
                refuse_tensor_subclass(x, f"the argument {name}")
                p = trace.add_input(TensorProxy(tuple(x.shape), x.dtype, x.device, x.requires_grad), wanted_name())
                note_layout(p, x)
                if symbolic and (is_module_params or at in pinned):
                    # A module's parameters keep their sizes (and so do overlapping inputs rebuilt from a
                    # synthetic base): specialise on them, checked by the guard.
                    for i, d in enumerate(p.shape):
                        add_constraint(f"{p.name}.shape[{i}] == {d}")
                elif symbolic:
                    _make_sizes_symbolic(p)
                return p
            if symbolic and is_symbolic_number(x):
                cls = IntegerProxy if type(x) is int else FloatProxy
                p = trace.add_input(cls(x), wanted_name())
                p.expr = p.name
                return p
            return x

        if type(value) is set:  # a copy, as for lists: a change the code makes is replayed, never made twice
            proxied.append(set(value))
            continue
        spec, leaves = flatten(value, _input_leaf(symbolic))
        proxied.append(spec.rebuild([to_proxy(x) for x in leaves]))
    return tuple(proxied[: len(args)]), dict(zip(kwargs, proxied[len(args):], strict=True))


def refuse_tensor_subclass(t: Tensor, what: str) -> None:
    """Refuse a Tensor subclass whose `__torch_function__` eager would call: the trace sees plain tensors.

    Subclasses that disable it (`nn.Parameter`, DTensor) behave as plain tensors and pass.
    """
    cls = type(t)
    if cls is Tensor or cls.__torch_function__ is torch._C._disabled_torch_function_impl:
        return
    raise UnsupportedOpError(
        f"{what} is a {cls.__qualname__}, a Tensor subclass with __torch_function__, which eager calls on every "
        f"torch function{where_now()}; minijit traces plain tensors. Pass t.as_subclass(torch.Tensor) (and wrap "
        "it inside the function), or set __torch_function__ = torch._C._disabled_torch_function_impl")


def _input_leaf(symbolic: bool) -> Callable[[Any], bool]:
    """Which values among the arguments are trace inputs: tensors, and Python numbers in symbolic mode."""
    if symbolic:
        return lambda x: isinstance(x, Tensor) or is_symbolic_number(x)
    return lambda x: isinstance(x, Tensor)


def _make_sizes_symbolic(p: TensorProxy) -> None:
    """Sizes 0 stay constants; the others become IntegerProxy, sizes of 1 included.

    The guard checks the kind of size: `x.shape[0] == 0`, `x.shape[1] > 1`, or `x.shape[2] >= 1`
    for a size traced at 1. A trace made for a size of 1 serves larger ones where nothing
    depended on the 1: whatever did (a broadcast against another size, `squeeze`, a branch)
    compared the size and so recorded `x.shape[2] == 1`. A trace made for a larger size does not
    serve a size of 1 (ops may have assumed a size that does not broadcast).
    """
    shape: list[Any] = []
    for i, d in enumerate(p.shape):
        expr = f"{p.name}.shape[{i}]"
        if d == 0:
            add_constraint(f"{expr} == {d}")
            shape.append(d)
        elif d == 1:
            add_constraint(f"{expr} >= 1")
            shape.append(IntegerProxy(d, expr=expr))
        else:
            add_constraint(f"{expr} > 1")
            shape.append(IntegerProxy(d, expr=expr))
    p.shape = tuple(shape)
    if any(isinstance(d, IntegerProxy) for d in shape):
        prims.shape(p)


def flat_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], symbolic: bool) -> list[Any]:
    """The values that a compiled trace takes, in the order of its inputs (containers of any kind looked into)."""
    return leaves((args, kwargs), _input_leaf(symbolic))


def input_names(trace: Trace) -> list[str]:
    """The trace's input names, as the guard function's parameters."""
    return [p.name for p in trace.args if isinstance(p, Proxy)]


def tensor_capturer(trace: Trace, inputs: list[tuple[str, Source, Tensor]], constants: list[Tensor],
                    symbolic: bool = False, pinned: frozenset[int] = frozenset(),
                    symbolic_names: set[str] | None = None) -> Callable[[Tensor], Proxy]:
    """The `trace.capture_tensor` hook: the proxy of a real tensor met among an op's arguments, once per tensor.

    A tensor read from outside the call (minijit.frontend.outside knows its source) becomes
    an input of the trace, read again from that source on every call, and is appended to
    `inputs` as (input name, source, tensor); any other real tensor (made natively while
    tracing) becomes `prims.tensor_constant(tensor)` and is appended to `constants`.
    With `symbolic`, a captured tensor held as an attribute of a plain object (state such as a
    Hugging Face cache layer's `keys`, which grows from call to call) gets symbolic sizes, unless
    its input position is `pinned`; its name is added to `symbolic_names` (the guard then checks
    its rank, the constraints its sizes). Parameters, buffers, globals and items keep their sizes.
    """
    captured: dict[int, Proxy] = {}

    def capture(t: Tensor) -> Proxy:
        proxy = captured.get(id(t))
        if proxy is not None:
            return proxy
        source = current_state().outside.source_of(t)
        refuse_tensor_subclass(t, f"the tensor {source.label}" if source is not None else "a tensor")
        if source is not None:
            proxy = TensorProxy(tuple(t.shape), t.dtype, t.device, t.requires_grad)
            note_layout(proxy, t)
            position = len(trace.args)
            trace.add_input(proxy, source.label)
            inputs.append((proxy.name, source, t))
            if symbolic and position not in pinned and _is_state_tensor(t, source):
                _make_sizes_symbolic(proxy)
                if symbolic_names is not None:
                    symbolic_names.add(proxy.name)
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
                note_layout(proxy, t)
            finally:
                state.capture_tensor = capture
            constants.append(t)
        captured[id(t)] = proxy
        return proxy

    return capture


def _is_state_tensor(t: Tensor, source: Source) -> bool:
    """A tensor held in an instance attribute of a plain object (not a module, not a parameter)."""
    return (source.access == "attribute" and not isinstance(source.holder, Source | torch.nn.Module)
            and not isinstance(t, torch.nn.Parameter))


def snapshot_containers(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The containers among the (proxied) arguments — lists, dicts, sets, dataclasses, ... — with a copy of their state.

    The traced function receives rebuilt copies of them: a change it made is either replayed into the
    caller's container on every call (`changed_argument_lists`) or refused (`check_containers_unchanged`).
    Each is (label, path, container, state): `path` is the argument's position, then the keys down to it.
    """
    found: list[Any] = []

    def walk(label: str, path: tuple[Any, ...], x: Any) -> None:
        if type(x) is set:
            found.append((label, path, x, _container_state(x)))
            return
        if not is_container(x) or type(x) is slice:
            return
        if isinstance(x, tuple):  # immutable: only what it holds may change
            for i, v in enumerate(x):
                walk(label, (*path, i), v)
            return
        state = _container_state(x)
        found.append((label, path, x, state))
        if isinstance(x, dict | list):
            for k, v in state[0]:
                walk(label, (*path, k), v)
        else:  # reached for the refusal only: no path leads back to it
            for v in [v for part in state for _, v in part]:
                walk(label, (*path, None), v)

    for i, (name, value) in enumerate(zip(parameter_names(fn, args, kwargs), (*args, *kwargs.values()), strict=True)):
        walk(name, (i,), value)
    return found


def _container_state(x: Any) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    """(items, attributes) of a container argument, as (key, value) pairs."""
    if isinstance(x, dict):
        items = list(x.items())
    elif isinstance(x, list | set | tuple):
        items = list(enumerate(x))
    else:
        items = []
    own = getattr(x, "__dict__", None)
    return items, list(own.items()) if isinstance(own, dict) else []


def _unchanged(container: Any, before: Any) -> bool:
    now = _container_state(container)
    return all(len(a) == len(b) and all(ka == kb and va is vb for (ka, va), (kb, vb) in zip(a, b))
               for a, b in zip(now, before))


def changed_argument_lists(snapshot: list[Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    """(label, path, container) of each plain list, dict or set argument the traced code changed (appended to,
    assigned an item, popped, updated) that the caller's call replays: every path to it is keys of
    lists, dicts and tuples, and it holds none of the other argument containers (whose identity a
    rebuilt copy would lose)."""
    containers = {id(c) for _, _, c, _ in snapshot}
    changed = []
    for label, path, container, before in snapshot:
        if _unchanged(container, before) or type(container) not in (list, dict, set) or None in path[1:]:
            continue
        values = container.values() if isinstance(container, dict) else container
        if isinstance(container, set) and len(path) > 1:
            continue  # a set inside another argument was not copied for the trace: refused
        if any(id(v) in containers for v in values):
            continue
        changed.append((label, path, container))
    return changed


def check_containers_unchanged(snapshot: list[Any], replayed: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    """Refuse a traced function that changed a container it was given that is not replayed (ids in `replayed`)."""
    for label, _, container, before in snapshot:
        if id(container) not in replayed and not _unchanged(container, before):
            raise UnsupportedSyntaxError(
                f"the jitted function modified the {type(container).__name__} passed as argument '{label}' in place; "
                "minijit would not repeat that on later calls. Return the new values instead"
            )


def _storage_key(t: Tensor) -> int:
    ptr = t.untyped_storage().data_ptr()
    return ptr if ptr else id(t)  # empty storages share address 0 without sharing memory


def alias_pattern(*values: Any) -> tuple[int, ...]:
    """Which inputs share storage: the position of the first input with the same storage, per input.

    Part of the guard of traces that write into their inputs (docs/design.md, invariant 1): a trace
    functionalized for distinct inputs is wrong for aliased ones, and the other way round.
    """
    first: dict[int, int] = {}
    return tuple(first.setdefault(_storage_key(v), i) if isinstance(v, Tensor) else i for i, v in enumerate(values))


def alias_groups(values: list[Any]) -> tuple[list[list[int]], list[list[int]]]:
    """Groups of input positions sharing storage: (identical views, other overlaps)."""
    by_storage: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, Tensor):
            by_storage.setdefault(_storage_key(v), []).append(i)
    identical, partial = [], []
    for group in by_storage.values():
        if len(group) < 2:
            continue
        lead = values[group[0]]
        same = all((values[i].data_ptr(), values[i].shape, values[i].stride(), values[i].dtype)
                   == (lead.data_ptr(), lead.shape, lead.stride(), lead.dtype) for i in group)
        (identical if same else partial).append(group)
    return identical, partial


def alias_layout(*values: Any, also: tuple[int, ...] = ()) -> tuple[tuple[Any, ...], ...]:
    """Where each input that shares storage with another sits in it: (position, storage offset, strides, dtype).

    Checked by the guard of entries compiled for aliased inputs only (their pattern already
    says which inputs share storage): `t[0:2], t[1:3]` must not reuse a trace made for `t, t`.
    The inputs at positions `also` (written inputs that repeat elements) are described too.
    """
    pattern = alias_pattern(*values)
    shared = {p for i, p in enumerate(pattern) if p != i}.union(also)
    return tuple((i, v.storage_offset(), v.stride(), v.dtype) for i, v in enumerate(values) if pattern[i] in shared)


def synthetic_base_layout(values: list[Any], group: list[int]) -> tuple[int, tuple[tuple[Any, ...], ...]]:
    """(length, (size, stride, storage offset) per member) of the storage prefix the inputs at `group` view.

    The synthetic base is the 1-D view of elements 0 to `length` of their common storage:
    each member is `as_strided(base, size, stride, offset)` of it.
    """
    layouts = tuple((tuple(values[i].shape), tuple(values[i].stride()), values[i].storage_offset()) for i in group)
    length = max((off + sum((s - 1) * st for s, st in zip(size, stride, strict=True)) + 1
                  if all(s > 0 for s in size) else 0) for size, stride, off in layouts)
    return length, layouts


@dataclass(frozen=True)
class InputAliasing:
    """How the inputs of the call a trace was functionalized for share memory, for a trace that writes into inputs.

    The entry's guard checks `pattern` (which inputs share storage) and, for entries made for
    inputs that share it, `layout` (where each sits in it, `alias_layout(..., also=layout_also)`).
    `synthetic_bases` are (position of the group's first input, length) of each synthetic base
    the trace takes after the call's inputs.
    """

    pattern: tuple[int, ...]
    layout: tuple[tuple[Any, ...], ...] = ()
    layout_also: tuple[int, ...] = ()
    synthetic_bases: tuple[tuple[int, int], ...] = ()
