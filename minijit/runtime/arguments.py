"""A call's arguments: how they become the trace's inputs, the entry's checks, and what each call hands the trace.

The one module that reads a call's arguments for a compile (docs/design.md, the runtime).
`read_arguments` goes over them once: it names each argument after its parameter, makes
the checks a call must pass to reuse the entry (`Check`s, minijit.runtime.checks), and
splits each argument into its structure and its input leaves (tensors, and Python
numbers in "symbolic values" mode) with `minijit.ir.containers.flatten`, the flattener
of call arguments. The `CallArguments` it returns then serves every later step of the
compile, none of which flattens the arguments again:

- `proxify`: the arguments rebuilt around proxies, the trace's inputs (while it records);
- `snapshot_containers`: the containers the traced code was given, to replay or refuse its changes;
- `functionalize`: the trace functionalized for how this call's inputs share memory
  (alias groups, synthetic bases: docs/design.md, invariant 1), with the `InputAliasing`
  whose checks (`InputAliasing.checks`) the entry's guard makes.

On each call the compiled trace takes `flat_inputs(args, kwargs)` (the leaves, in the
order of the trace's inputs), then the tensors captured from outside the call, then the
synthetic bases made from the call's inputs (`InputAliasing.synthetic_bases`): both read
by the entry's epilogue (minijit.runtime.epilogue). That is the per-call fetch plan.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import AliasError, TraceInvariantError, UnsupportedOpError, UnsupportedSyntaxError
from minijit.frontend.outside import Effect
from minijit.ir import FloatProxy, IntegerProxy, TensorProxy, Trace
from minijit.ir.containers import Spec, flatten, is_container, is_tensor, is_tensor_or_number, leaves
from minijit.ir.context import add_constraint, outside_capture, where_now
from minijit.ops import prims
from minijit.ops.strides import note_layout
from minijit.runtime.autocast import any_autocast_enabled, autocast_state
from minijit.runtime.checks import AUTOCAST, GRAD_MODE, Check, argument_label, safe_name, walk
from minijit.runtime.iterators import ArgumentIterator, consumed
from minijit.transforms import functionalize as functionalize_trace
from minijit.transforms.functionalize import FunctionalizeResult, SyntheticBase
from minijit.transforms.memory import inputs_written, layout_read
from minijit.transforms.view_updates import view_shares_memory

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


def input_leaf(symbolic: bool) -> Callable[[Any], bool]:
    """Which values among the arguments are trace inputs: tensors, and Python numbers in symbolic mode."""
    return is_tensor_or_number if symbolic else is_tensor


def flat_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], symbolic: bool) -> list[Any]:
    """The values that a compiled trace takes, in the order of its inputs (containers of any kind looked into).

    The per-call path: the leaves `read_arguments` finds, without building their structure.
    """
    return leaves((args, kwargs), input_leaf(symbolic))


# --- the arguments of the call being compiled, read once ----------------------------------------------------


@dataclass
class CallArguments:
    """The arguments of the call a trace is compiled for, read once by `read_arguments`."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    symbolic: bool
    # A name per positional argument and keyword (`parameter_names`).
    names: list[str]
    # The parameters of the prologue's `check_call` and its checks (`call_checks`).
    params: list[str]
    checks: list[Check]
    # Per argument: its structure and its input leaves; None for a set (copied whole for the trace).
    parts: list[tuple[Spec, list[Any]] | None]
    # The input leaves of all arguments, in order: the trace's first inputs.
    flat: list[Any]

    def proxify(self, trace: Trace, pinned: frozenset[int] = frozenset(),
                constant_sizes: Sequence[tuple[int | None, ...]] | None = None
                ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments with their input leaves replaced by proxies named after their parameters.

        Must be called while `trace` records: in symbolic mode it records the `prims.shape` calls.
        The tensors at the flat input positions `pinned` keep constant sizes in symbolic mode,
        checked by the guard (as a module's parameters do); so do the sizes `constant_sizes` gives as
        ints, per tensor argument in order (cache="automatic": those that did not change).
        """
        symbolic = self.symbolic
        proxied: list[Any] = []
        position = itertools.count()  # the flat input position of each leaf, in order
        tensor_index = itertools.count()  # the position of each tensor among the arguments' tensors
        # A module's forward names its parameters after their paths (`fc1_weight`).
        leaf_names: list[str] | None = getattr(self.fn, "param_names", None)
        for index, (name, value, part) in enumerate(zip(self.names, (*self.args, *self.kwargs.values()), self.parts,
                                                        strict=True)):
            count = [0]
            # A module's parameters are its forward's first argument.
            is_module_params = index == 0 and leaf_names is not None

            def wanted_name(name: str = name, count: list[int] = count, is_module_params: bool = is_module_params
                            ) -> str:
                count[0] += 1
                if is_module_params:
                    return leaf_names[count[0] - 1]
                return name if count[0] == 1 else f"{name}_{count[0] - 1}"

            def to_proxy(x: Any, is_module_params: bool = is_module_params, name: str = name) -> Any:
                at = next(position)
                if isinstance(x, Tensor):
                    refuse_tensor_subclass(x, f"the argument {name}")
                    p = trace.add_input(TensorProxy(tuple(x.shape), x.dtype, x.device, x.requires_grad), wanted_name())
                    note_layout(trace, p, x)
                    k = next(tensor_index)
                    if symbolic and (is_module_params or at in pinned):
                        # A module's parameters keep their sizes (and so do overlapping inputs rebuilt from a
                        # synthetic base): specialise on them, checked by the guard.
                        for i, d in enumerate(p.shape):
                            add_constraint(f"{p.name}.shape[{i}] == {d}")
                    elif symbolic:
                        make_sizes_symbolic(p, constant_sizes[k] if constant_sizes is not None else None)
                    return p
                if symbolic and is_symbolic_number(x):
                    cls = IntegerProxy if type(x) is int else FloatProxy
                    p = trace.add_input(cls(x), wanted_name())
                    p.expr = p.name
                    return p
                return x

            if part is None:  # a set: a copy, as for lists: a change the code makes is replayed, never made twice
                proxied.append(set(value))
                continue
            spec, found = part
            proxied.append(spec.rebuild([to_proxy(x) for x in found]))
        return tuple(proxied[: len(self.args)]), dict(zip(self.kwargs, proxied[len(self.args):], strict=True))

    def snapshot_containers(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ArgumentContainers:
        """The containers among the (proxied) arguments `args` and `kwargs` the traced function is given, with
        a copy of their state (`ArgumentContainers`)."""
        found: list[Any] = []

        def walk_containers(label: str, path: tuple[Any, ...], x: Any) -> None:
            if type(x) is set:
                found.append((label, path, x, _container_state(x)))
                return
            if not is_container(x) or type(x) is slice:
                return
            if isinstance(x, tuple):  # immutable: only what it holds may change
                for i, v in enumerate(x):
                    walk_containers(label, (*path, i), v)
                return
            state = _container_state(x)
            found.append((label, path, x, state))
            if isinstance(x, dict | list):
                for k, v in state[0]:
                    walk_containers(label, (*path, k), v)
            else:  # reached for the refusal only: no path leads back to it
                for v in [v for part in state for _, v in part]:
                    walk_containers(label, (*path, None), v)

        for i, (name, value) in enumerate(zip(self.names, (*args, *kwargs.values()), strict=True)):
            walk_containers(name, (i,), value)
        return ArgumentContainers(found)

    def plan_aliasing(self, trace: Trace, captured: list[Tensor]) -> AliasPlan:
        """`plan_aliasing` for this call's inputs, followed by the tensors `captured` from outside."""
        return plan_aliasing(trace, self.flat + captured)

    def functionalize(self, trace: Trace, captured: list[Tensor], plan: AliasPlan,
                      no_grad: frozenset[str] = frozenset()) -> tuple[Trace, FunctionalizeResult, InputAliasing | None]:
        """`functionalize_for_call` by `plan` for this call's inputs, followed by the tensors `captured` from outside."""
        return functionalize_for_call(trace, self.flat + captured, no_grad, plan)


def tensor_shapes(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[
        tuple[str, tuple[int, ...]]]:
    """The shape of each tensor among the call's arguments, in the order `CallArguments.proxify` takes them,
    labelled by the argument that holds it (`input_ids`, `past[1]`)."""
    shapes = []
    for name, value in zip(parameter_names(fn, args, kwargs), (*args, *kwargs.values()), strict=True):
        if type(value) is set:
            continue
        tensors = [x for x in flatten(value, input_leaf(True))[1] if isinstance(x, Tensor)]
        shapes += [(name if len(tensors) == 1 else f"{name}[{k}]", tuple(t.shape)) for k, t in enumerate(tensors)]
    return shapes


def read_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   symbolic: bool) -> CallArguments:
    """The call's arguments read in one pass, before the traced code runs (it might change one): per argument,
    its name, its checks, its structure and input leaves."""
    names = parameter_names(fn, args, kwargs)
    params, checks = [], _call_state_checks()
    state_checks = getattr(fn, "state_checks", None)
    is_leaf = input_leaf(symbolic)
    parts: list[tuple[Spec, list[Any]] | None] = []
    flat: list[Any] = []
    for i, (name, value) in enumerate(zip(names, (*args, *kwargs.values()), strict=True)):
        params.append(_param_name(name, params))
        checks += _argument_checks(name, params[-1], value, i, i >= len(args), state_checks, symbolic)
        if type(value) is set:
            parts.append(None)
            continue
        spec, found = flatten(value, is_leaf)
        parts.append((spec, found))
        flat += found
    return CallArguments(fn, args, kwargs, symbolic, names, params, checks, parts, flat)


def call_checks(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                symbolic: bool) -> tuple[list[str], list[Check]]:
    """The parameters and checks of `check_call`: grad mode, autocast state, then each argument in order.

    `check_call` takes the positional arguments, then the keyword arguments' values, each
    under its parameter's name (`parameter_names`). `read_arguments` makes the same checks.
    """
    params, checks = [], _call_state_checks()
    state_checks = getattr(fn, "state_checks", None)
    for i, (name, value) in enumerate(zip(parameter_names(fn, args, kwargs), (*args, *kwargs.values()), strict=True)):
        params.append(_param_name(name, params))
        checks += _argument_checks(name, params[-1], value, i, i >= len(args), state_checks, symbolic)
    return params, checks


def _param_name(name: str, taken: list[str]) -> str:
    """`check_call`'s parameter for the argument `name`: `safe_name`, with a suffix where an earlier argument took
    it (a module's forward taking `**kwargs` may be given a keyword named as its leading `params`)."""
    param, n = safe_name(name), 0
    while param in taken:
        n += 1
        param = f"{safe_name(name)}_{n}"
    return param


def _call_state_checks() -> list[Check]:
    """The checks on the state a call is made in: grad mode and autocast."""
    return [Check("torch.is_grad_enabled()", "grad mode", GRAD_MODE, torch.is_grad_enabled(), explain=_grad_mode_changed),
            Check("autocast", "autocast", AUTOCAST, any_autocast_enabled() and autocast_state(), explain=_autocast_changed)]


def _argument_checks(name: str, param: str, value: Any, position: int, keyword: bool,
                     state_checks: Callable[..., Any] | None, symbolic: bool) -> list[Check]:
    """The checks on one argument, `param` in `check_call` and the call's `position`-th: its keyword's name, then
    what `walk` specialises on (a module's forward names its parameters and its tree's state by path, its first two
    arguments: minijit.runtime.module_forward)."""
    checks = [Check(argument_label(name), "keyword", param, name)] if keyword else []
    found = state_checks(position, param, value, symbolic) if state_checks is not None and not keyword else None
    if found is None:
        walk(value, checks, symbolic, (argument_label(name), param))
    else:
        checks += found
    return checks


def _grad_mode_changed(now: Any, expected: Any) -> str:
    return f"torch.is_grad_enabled(): value {now} (bool) != {expected} (bool)"


def _autocast_changed(now: Any, expected: Any) -> str:
    """`torch.is_autocast_enabled('cpu'): value True (bool) != False (bool)`, per device whose state changed."""
    def by_device(state: Any) -> dict[str, Any]:
        return {d: dtype for d, dtype in state[:-1]} if state else {}
    new, old = by_device(now), by_device(expected)
    reasons = []
    for d in sorted(set(new) | set(old)):
        if (d in new) != (d in old):
            reasons.append(f"torch.is_autocast_enabled({d!r}): value {d in new} (bool) != {d in old} (bool)")
            dtype = new.get(d, old.get(d))
            reasons.append(f"torch.get_autocast_dtype({d!r}): {dtype} {'not present before' if d in new else 'no longer'}")
        elif new[d] != old[d]:
            reasons.append(f"torch.get_autocast_dtype({d!r}): value {new[d]} (dtype) != {old[d]} (dtype)")
    if not reasons and now and expected:
        reasons.append(f"torch.is_autocast_cache_enabled(): value {now[-1]} (bool) != {expected[-1]} (bool)")
    return "; ".join(reasons)


def object_arguments(params: list[str], checks: list[Check], args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> list[tuple[str, Any]]:
    """(subject, object) for each argument the call's checks specialise on by identity."""
    try:
        return [(c.subject, _read(tuple(params), c.subject)(*args, *kwargs.values())) for c in checks
                if c.aspect == "object"]
    except Exception:  # a subject that is not a plain expression over the parameters: no rebinding
        return []


@functools.lru_cache(maxsize=256)  # asked again on each rebind (a generate() per call)
def _read(params: tuple[str, ...], subject: str) -> Callable[..., Any]:
    return eval(f"lambda {', '.join(params)}: ({subject})")  # our own generated subject, as the prologue's


def refuse_tensor_subclass(t: Tensor, what: str) -> None:
    """Refuse a Tensor subclass whose `__torch_function__` eager would call: the trace sees plain tensors.
    Refuse a tensor of another layout than strided too (sparse, MKL-DNN): a trace holds strided tensors.

    Subclasses that disable it (`nn.Parameter`, DTensor) behave as plain tensors and pass.
    """
    if t.layout != torch.strided:
        raise UnsupportedOpError(
            f"{what} is a {t.layout} tensor{where_now()}; minijit traces strided tensors only. Convert it "
            "(t.to_dense()) before the call, or call the function without minijit")
    cls = type(t)
    if cls is Tensor or cls.__torch_function__ is torch._C._disabled_torch_function_impl:
        return
    raise UnsupportedOpError(
        f"{what} is a {cls.__qualname__}, a Tensor subclass with __torch_function__, which eager calls on every "
        f"torch function{where_now()}; minijit traces plain tensors. Pass t.as_subclass(torch.Tensor) (and wrap "
        "it inside the function), or set __torch_function__ = torch._C._disabled_torch_function_impl")


def make_sizes_symbolic(p: TensorProxy, constant: tuple[int | None, ...] | None = None) -> None:
    """Sizes 0 stay constants, and so do the sizes `constant` gives as ints; the others become IntegerProxy, sizes
    of 1 included.

    The guard checks the kind of size: `x.shape[0] == 0`, `x.shape[1] > 1`, or `x.shape[2] >= 1`
    for a size traced at 1 (`x.shape[3] == 8` for a size kept constant). A trace made for a size of 1 serves
    larger ones where nothing depended on the 1: whatever did (a broadcast against another size, `squeeze`, a
    branch) compared the size and so recorded `x.shape[2] == 1`. A trace made for a larger size does not
    serve a size of 1 (ops may have assumed a size that does not broadcast).
    """
    shape: list[Any] = []
    for i, d in enumerate(p.shape):
        expr = f"{p.name}.shape[{i}]"
        if d == 0 or (constant is not None and constant[i] is not None):
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


# --- the containers among the arguments: changes replayed or refused -----------------------------------------


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


# The arguments of the call in progress, as one tuple (positional, then keyword values), while a trace that
# writes into an argument's list or dict runs (set by minijit.runtime.jit).
CALL_ARGUMENTS: ContextVar[tuple[Any, ...]] = ContextVar("minijit_call_arguments")


@dataclass(frozen=True)
class ArgumentPath:
    """A list or dict among a call's arguments: the argument's position, then the keys down to it."""

    path: tuple[Any, ...]
    label: str

    def resolve(self, arguments: tuple[Any, ...]) -> Any:
        """The container this call was given at the path."""
        value = arguments[self.path[0]]
        for key in self.path[1:]:
            value = value[key]
        return value

    def __str__(self) -> str:
        keys = "".join(f"[{k!r}]" for k in self.path[1:])
        return f"argument '{self.label}'{keys}"


class ArgumentContainers:
    """The containers the traced function was given — lists, dicts, sets, dataclasses, iterators' stand-ins, ... —
    each with a copy of its state from before the capture.

    They are rebuilt copies of the caller's: a change the traced code made is replayed into the
    caller's container on every call (`replay_changes`: a list, dict or set argument; `iterators_consumed`:
    the items taken from an iterator argument) or refused (`check_unchanged`). Each is
    (label, path, container, state): `path` is the argument's position, then the keys down to it.
    """

    def __init__(self, found: list[tuple[str, tuple[Any, ...], Any, Any]]):
        self.found = found
        self.replayed: set[int] = set()

    def replay_changes(self, effects: list[Effect]) -> None:
        """Append to `effects` the new contents of each list, dict or set argument the traced code changed (appended
        to, assigned an item, popped, updated), which go back into the caller's on every call. Replayed are the
        containers that every path to is keys of lists, dicts and tuples and that hold none of the other
        argument containers (whose identity a rebuilt copy would lose)."""
        containers = {id(c) for _, _, c, _ in self.found}
        for label, path, container, before in self.found:
            if _unchanged(container, before) or type(container) not in (list, dict, set) or None in path[1:]:
                continue
            values = container.values() if isinstance(container, dict) else container
            if isinstance(container, set) and len(path) > 1:
                continue  # a set inside another argument was not copied for the trace: refused
            if any(id(v) in containers for v in values):
                continue
            contents = type(container)(container)  # a copy of the final contents
            effects.append(Effect("replace", ArgumentPath(path, label), None, contents))
            self.replayed.add(id(container))

    def iterators_consumed(self) -> dict[int, int]:
        """argument position -> how many items the traced code took from the iterator passed there."""
        taken = {}
        for _, path, container, before in self.found:
            if isinstance(container, ArgumentIterator) and len(path) == 1:
                taken[path[0]] = consumed(container.position, before)
                self.replayed.add(id(container))
        return taken

    def changed(self) -> bool:
        """Whether the traced code changed any of the containers (an iterator's stand-in: took an item from it)."""
        return any(not _unchanged(container, before) for _, _, container, before in self.found)

    def check_unchanged(self) -> None:
        """Refuse a traced function that changed a container it was given that is not replayed."""
        for label, _, container, before in self.found:
            if id(container) not in self.replayed and not _unchanged(container, before):
                raise UnsupportedSyntaxError(
                    f"the jitted function modified the {type(container).__name__} passed as argument '{label}' in "
                    "place; minijit would not repeat that on later calls. Return the new values instead"
                )


# --- how the inputs share memory: alias groups, synthetic bases, and their checks ----------------------------


def _storage_key(t: Tensor) -> int:
    ptr = t.untyped_storage().data_ptr()
    return ptr if ptr else id(t)  # empty storages share address 0 without sharing memory


# Tensor methods called through `map`, one C call per tensor (a guard over an optimizer's state calls them on
# hundreds of tensors per call).
_UNTYPED_STORAGE = Tensor.untyped_storage
_STORAGE_ADDRESS = torch.UntypedStorage.data_ptr
_IS_CONTIGUOUS = Tensor.is_contiguous


@functools.lru_cache(maxsize=256)
def _apart(n: int) -> tuple[int, ...]:
    """The alias pattern of `n` inputs that share no storage."""
    return tuple(range(n))


def alias_pattern(*values: Any) -> tuple[int, ...]:
    """Which inputs share storage: the position of the first input with the same storage, per input.

    Part of the guard of traces that write into their inputs (docs/design.md, invariant 1): a trace
    functionalized for distinct inputs is wrong for aliased ones, and the other way round.
    """
    # The usual answer first, in C calls: every tensor has a storage of its own (none of them empty, whose
    # address 0 says nothing), so each input is its own first.
    tensors = [v for v in values if isinstance(v, Tensor)]
    addresses = {*map(_STORAGE_ADDRESS, map(_UNTYPED_STORAGE, tensors))}
    if len(addresses) == len(tensors) and 0 not in addresses:
        return _apart(len(values))
    first: dict[int, int] = {}
    pattern = []
    for i, v in enumerate(values):  # (a loop, `_storage_key` written out: part of every hit's guard)
        pattern.append(first.setdefault(v.untyped_storage().data_ptr() or id(v), i) if isinstance(v, Tensor) else i)
    return tuple(pattern)


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
        (identical if _same_view(values, group) else partial).append(group)
    return identical, partial


def _same_view(values: list[Any], group: list[int]) -> bool:
    """Whether the tensors at `group` are one view: the same memory, sizes, strides and dtype."""
    lead = values[group[0]]
    return all((values[i].data_ptr(), values[i].shape, values[i].stride(), values[i].dtype)
               == (lead.data_ptr(), lead.shape, lead.stride(), lead.dtype) for i in group)


def _overlapping(values: list[Any], group: list[int]) -> list[list[int]]:
    """The inputs at `group` (tensors sharing one storage) split into groups whose byte ranges overlap, in order.

    Ranges that overlap count as overlapping even where the elements interleave (`t[::2]`, `t[1::2]`)."""
    spans = []
    for i in group:
        v = values[i]
        start = v.storage_offset() * v.element_size()
        extent = sum((s - 1) * st for s, st in zip(v.shape, v.stride(), strict=True)) + 1 if v.numel() else 0
        spans.append((start, start + extent * v.element_size(), i))
    components = [[i] for start, stop, i in spans if stop == start]  # an empty tensor overlaps nothing
    end = -1
    for start, stop, i in sorted(s for s in spans if s[1] > s[0]):
        if start < end:
            components[-1].append(i)
            end = max(end, stop)
        else:
            components.append([i])
            end = stop
    return [sorted(c) for c in components]


def repeating(values: tuple[Any, ...], positions: tuple[int, ...]) -> tuple[int, ...]:
    """The positions among `positions` of the tensors in `values` that repeat their own elements (`o.expand(4, 4)`).

    A trace that writes such an input rebuilds it from a synthetic base; one that writes a plain tensor copies
    back into it, which eager refuses for a tensor repeating elements: the guard keeps them apart."""
    # (a contiguous tensor repeats none: asked first, it answers faster than the overlap check; all of them at once
    # in C calls where every one is a tensor)
    try:
        if all(map(_IS_CONTIGUOUS, [values[i] for i in positions])):
            return ()
    except TypeError:  # (not a tensor: asked one by one below)
        pass
    return tuple(i for i in positions if isinstance(v := values[i], Tensor) and not v.is_contiguous()
                 and torch._debug_has_internal_overlap(v) == 1)


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
    # The positions of the written inputs, and those of them that repeat their elements (`repeating`).
    written: tuple[int, ...] = ()
    repeating: tuple[int, ...] = ()

    def checks(self, input_names: list[str] | tuple[str, ...], env: dict[str, Any]) -> list[Check]:
        """The guard's checks that a call's inputs (named `input_names`) share memory as this call's did."""
        env["_alias_pattern"] = alias_pattern
        call = f"_alias_pattern({', '.join(input_names)})"
        checks = [Check("inputs share memory", "aliases", call, self.pattern, keyed=False,
                        explain=lambda now, expected: f"inputs share memory differently: {now} != {expected}")]
        if self.written:
            env["_repeating"] = repeating
            call = f"_repeating(({''.join(n + ', ' for n in input_names)}), {self.written!r})"
            checks.append(Check("written inputs repeating their elements", "aliases", call, self.repeating,
                                keyed=False, explain=lambda now, expected: "written inputs that repeat their "
                                f"elements (expanded) changed: positions {now} != {expected}"))
        if self.layout:  # made for inputs that share memory: where each sits in it matters too
            env["_alias_layout"] = alias_layout
            call = f"_alias_layout({', '.join(input_names)}, also={self.layout_also!r})"
            checks.append(Check("inputs sit in shared memory", "aliases", call, self.layout, keyed=False,
                                explain=lambda now, expected: "inputs that share memory sit differently in it "
                                f"(offsets or strides changed): {now} != {expected}"))
        return checks


@dataclass(frozen=True)
class AliasPlan:
    """How a trace is to be functionalized for the inputs of one call, decided before functionalizing it.

    `written`: the trace inputs it writes (`minijit.transforms.memory.inputs_written`). `identical`: groups of
    positions of inputs that are one memory (the same view); `partial`: groups that overlap otherwise (or an
    input repeating its own elements), at least one of each written. `pins`: positions of such inputs traced
    with symbolic sizes, which must be traced again with constant ones (identical inputs are one memory only at
    equal sizes, a synthetic base is built from concrete layouts); empty when the plan can be carried out.
    """

    written: tuple[str, ...]
    identical: tuple[tuple[int, ...], ...] = ()
    partial: tuple[tuple[int, ...], ...] = ()
    pins: frozenset[int] = frozenset()


def plan_aliasing(trace: Trace, flat: list[Any]) -> AliasPlan:
    """The `AliasPlan` of `trace` (a captured trace) for a call whose trace inputs are `flat`, without
    functionalizing it: the written inputs come from the memory model (docs/design.md, invariant 1)."""
    with outside_capture():  # the query's view decisions guard nothing: functionalize records those it relies on
        written = inputs_written(trace, view_shares_memory)
    if not written:
        return AliasPlan(written)
    mutated = set(written)
    identical, sharing = alias_groups(flat)
    # Inputs that share a storage but whose bytes all lie apart (the parameters viewing one flat buffer, FSDP's flat
    # gradients) are independent memories: each is an input of its own, as unaliased inputs are. The guard checks
    # where each sits in the storage (`alias_layout`), and their sizes are constant (pinned below), so they lie
    # apart on every call the entry serves. Where any of them overlap, the storage's inputs stay one group: a
    # synthetic base spans its storage from the start, over the bytes of the others too.
    # The same view passed more than once among them is one memory, as identical inputs are. Not where an op
    # reads the layout of one (`as_strided`, which may reach past its bytes into the others'), nor where one
    # repeats its elements (rebuilt from a synthetic base).
    partial, apart = [], []
    reads_layout = layout_read(trace)
    for group in sharing:
        components = _overlapping(flat, group)
        if (all(len(c) == 1 or _same_view(flat, c) for c in components)
                and not any(id(trace.args[i]) in reads_layout for i in group)
                and not any(torch._debug_has_internal_overlap(flat[i]) == 1 for i in group)):
            apart += [c for c in components if len(c) == 1]
            identical += [c for c in components if len(c) > 1]
        else:
            partial.append(group)
    # Inputs that repeat elements (`o.expand(4, 4)`, which eager lets zero_ fill) cannot take a copy back:
    # written, they are rebuilt from a synthetic base, alone or with the other inputs sharing their storage.
    repeats = [g for g in identical if torch._debug_has_internal_overlap(flat[g[0]]) == 1]
    identical = [g for g in identical if g not in repeats]
    partial = partial + repeats
    grouped = {i for group in identical + partial for i in group}
    partial = partial + [[i] for i, p in enumerate(trace.args) if i not in grouped and p.name in mutated
                         and isinstance(flat[i], torch.Tensor) and torch._debug_has_internal_overlap(flat[i]) == 1]
    written_groups = [group for group in partial if any(trace.args[i].name in mutated for i in group)]
    pins = frozenset(i for group in identical + written_groups + apart for i in group
                     if not all(type(d) is int for d in trace.args[i].shape))
    return AliasPlan(written, tuple(map(tuple, identical)), tuple(map(tuple, written_groups)), pins)


def functionalize_for_call(trace: Trace, flat: list[Any], no_grad: frozenset[str] = frozenset(),
                           plan: AliasPlan | None = None) -> tuple[Trace, FunctionalizeResult, InputAliasing | None]:
    """`functionalize`, told which inputs of this call share memory (docs/design.md, invariant 1): run once.

    The same tensor passed twice (or identical views) is one memory that a write updates
    for every name; inputs that overlap differently (`t[1:3]` and `t[2:4]`, `t` and `t.t()`)
    are rebuilt, where the trace writes into one, as views of one synthetic base input.
    `plan` (default: `plan_aliasing(trace, flat)`) must need no pins.
    Returns the functional trace, what functionalize found, and how the inputs share memory,
    which the entry's guard must check (None when the trace writes into no input).
    """
    plan = plan_aliasing(trace, flat) if plan is None else plan
    assert not plan.pins, f"inputs at {sorted(plan.pins)} must be traced with constant sizes first"
    # Eager refuses in-place writes into leaves that require grad, not into other tensors that do.
    non_leaf = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.requires_grad and not x.is_leaf]
    if not plan.written:
        functional, result = functionalize_trace(trace, non_leaf_inputs=non_leaf, no_grad=no_grad)
        if result.mutated_inputs:
            # The plan said no input is written, so the guard will not check how the inputs share memory: a
            # trace that does write one must not be reused for aliased inputs. Loud, never silently wrong.
            raise TraceInvariantError(
                f"trace {trace.fn_name}: functionalize writes the inputs {list(result.mutated_inputs)} where the "
                "memory model found none written (minijit.transforms.memory.inputs_written); please report it")
        return functional, result, None  # aliasing cannot matter: the guard need not look at it
    mutated = set(plan.written)
    bases = [_synthetic_base(trace, flat, list(group), mutated) for group in plan.partial]
    # Functionalized for this aliasing only (none: the plain trace): the guard below keeps other calls away.
    functional, result = functionalize_trace(trace, input_aliases=[list(g) for g in plan.identical],
                                             non_leaf_inputs=non_leaf, no_grad=no_grad, synthetic_bases=bases)
    layout_also = tuple(b.members[0] for b in bases if len(b.members) == 1)
    written = tuple(i for i, p in enumerate(trace.args) if p.name in mutated)
    return functional, result, InputAliasing(
        pattern=alias_pattern(*flat), layout=alias_layout(*flat, also=layout_also), layout_also=layout_also,
        synthetic_bases=tuple((b.members[0], b.length) for b in bases), written=written,
        repeating=repeating(tuple(flat), written))


def _synthetic_base(trace: Trace, flat: list[Any], group: list[int], mutated: set[str]) -> SyntheticBase:
    """The synthetic base of inputs that overlap in memory without being the same view; AliasError where unsupported."""
    names = [trace.args[i].name for i in group]
    written = next(n for n in names if n in mutated)
    tensors = [flat[i] for i in group]
    why = None
    if len({t.dtype for t in tensors}) > 1:
        why = "they view it with different dtypes"
    elif torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        why = "one of them requires grad (the gradient through the shared memory is not supported)"
    if why is not None:
        raise AliasError(
            f"inputs {', '.join(names)} overlap in memory without being the same view, and the function writes "
            f"into {written} in place; minijit cannot rebuild them from their common storage because {why}. "
            "Pass a clone of one of them"
        )
    length, layouts = synthetic_base_layout(flat, group)
    return SyntheticBase(tuple(group), layouts, length)
