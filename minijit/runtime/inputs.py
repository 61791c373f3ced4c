"""Trace inputs: which call arguments become inputs, their proxies, and flattening at call time.

In "constant values" mode the inputs are the tensors among the arguments; shapes and
Python numbers are constants of the trace. In "symbolic values" mode every dimension
other than 0 and 1 is an `IntegerProxy` (bound by a `prims.shape` call at the top of
the trace), and Python ints and floats among the arguments are inputs too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import UnsupportedOpError, UnsupportedSyntaxError
from minijit.ir import FloatProxy, IntegerProxy, Proxy, TensorProxy, Trace, tree_iter, tree_map
from minijit.ir.context import add_constraint, where_now
from minijit.ops import prims

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
                      symbolic: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace the arguments that are trace inputs by proxies named after their parameters.

    Must be called while `trace` records: in symbolic mode it records the `prims.shape` calls.
    """
    values = list(args) + list(kwargs.values())
    proxied = []
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

        def to_proxy(x: Any, is_module_params: bool = is_module_params) -> Any:
            if isinstance(x, Tensor):
                p = trace.add_input(TensorProxy(tuple(x.shape), x.dtype, x.device, x.requires_grad), wanted_name())
                if symbolic and is_module_params:
                    # A module's parameters keep their sizes: specialise on them, checked by the guard.
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

        proxied.append(tree_map(to_proxy, value))
    return tuple(proxied[: len(args)]), dict(zip(kwargs, proxied[len(args):], strict=True))


def _make_sizes_symbolic(p: TensorProxy) -> None:
    """Sizes 0 and 1 stay constants (broadcasting depends on them); the others become IntegerProxy.

    Either way the guard checks the kind of size: `x.shape[0] == 1` or `x.shape[1] > 1`.
    """
    shape: list[Any] = []
    for i, d in enumerate(p.shape):
        expr = f"{p.name}.shape[{i}]"
        if d <= 1:
            add_constraint(f"{expr} == {d}")
            shape.append(d)
        else:
            add_constraint(f"{expr} > 1")
            shape.append(IntegerProxy(d, expr=expr))
    p.shape = tuple(shape)
    if any(isinstance(d, IntegerProxy) for d in shape):
        prims.shape(p)


def flat_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], symbolic: bool) -> list[Any]:
    """The values that a compiled trace takes, in the order of its inputs."""
    if symbolic:
        return [x for x in tree_iter((args, kwargs)) if isinstance(x, Tensor) or is_symbolic_number(x)]
    return [x for x in tree_iter((args, kwargs)) if isinstance(x, Tensor)]


def input_names(trace: Trace) -> list[str]:
    """The trace's input names, as the guard function's parameters."""
    return [p.name for p in trace.args if isinstance(p, Proxy)]


def tensor_capturer(trace: Trace) -> Callable[[Tensor], Proxy]:
    """The `trace.capture_tensor` hook: a real tensor becomes `prims.tensor_constant(tensor)`, once per tensor."""
    captured: dict[int, Proxy] = {}

    def capture(t: Tensor) -> Proxy:
        proxy = captured.get(id(t))
        if proxy is None:
            if t.requires_grad and torch.is_grad_enabled():
                raise UnsupportedOpError(
                    f"a tensor that requires grad reached the trace from outside the function's inputs"
                    f"{where_now()}; its gradient would be lost. Pass it as an argument (or register it "
                    "as a parameter of the jitted module)"
                )
            trace.capture_tensor = None  # the constant's own call must not capture again
            try:
                proxy = prims.tensor_constant(t)
            finally:
                trace.capture_tensor = capture
            captured[id(t)] = proxy
            trace.info.setdefault("captured_tensors", []).append(t)  # keeps it alive with the trace
        return proxy

    return capture


def snapshot_containers(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The lists, dicts and sets among the (proxied) arguments, each with a shallow copy of its contents."""
    found: list[Any] = []

    def walk(label: str, x: Any) -> None:
        t = type(x)
        if t is list or t is dict or t is set:
            found.append((label, x, list(x.items()) if t is dict else list(x)))
        if t is list or t is tuple:
            for v in x:
                walk(label, v)
        elif t is dict:
            for v in x.values():
                walk(label, v)

    for name, value in zip(parameter_names(fn, args, kwargs), (*args, *kwargs.values()), strict=True):
        walk(name, value)
    return found


def check_containers_unchanged(snapshot: list[Any]) -> None:
    """Refuse a traced function that changed a list, dict or set it was given: that would not be replayed."""
    for label, container, contents in snapshot:
        now = list(container.items()) if type(container) is dict else list(container)
        same = len(now) == len(contents) and all(
            (a[0] == b[0] and a[1] is b[1]) if type(container) is dict else a is b for a, b in zip(now, contents))
        if not same:
            raise UnsupportedSyntaxError(
                f"the jitted function modified the {type(container).__name__} passed as argument '{label}' in place; "
                "minijit would not repeat that on later calls. Return the new values instead"
            )


def _storage_key(t: Tensor) -> int:
    ptr = t.untyped_storage().data_ptr()
    return ptr if ptr else id(t)  # empty storages share address 0 without sharing memory


def alias_pattern(*values: Any) -> tuple[int, ...]:
    """Which inputs share storage: the position of the first input with the same storage, per input.

    Part of the guard of traces that write into their inputs (DESIGN.md, invariant 1): a trace
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
