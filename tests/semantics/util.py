"""Running one everyday pattern eagerly and jitted, side by side, and comparing everything observable.

A pattern is a factory that builds fresh state (modules, optimizers, lists, globals it
owns) and returns `(step, observe)`: `step(*inputs)` is the function users would jit,
`observe()` returns what the outside world looks like (parameters, optimizer state,
lists, attributes). `assert_same_as_eager` builds the state twice, calls eager `step`
and `minijit.jit(step)` on the same inputs for several calls, and after every call
compares the results, their types and dtypes, and the observed state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import minijit
from minijit.ir import Proxy

Pattern = Callable[[], tuple[Callable[..., Any], Callable[[], Any]]]


def assert_same(got: Any, want: Any, where: str = "result", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Equal values, types and dtypes, recursively; no proxy anywhere."""
    assert not isinstance(got, Proxy), f"{where}: a proxy reached the user"
    assert type(got) is type(want), f"{where}: type {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad differs"
        torch.testing.assert_close(got.detach(), want.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]", rtol, atol)
        if hasattr(want, "__dict__"):
            assert_same(dict(vars(got)), dict(vars(want)), f"{where}.__dict__", rtol, atol)
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]", rtol, atol)
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}", rtol, atol)
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def assert_same_as_eager(pattern: Pattern, inputs: Callable[[int], tuple[Any, ...]], calls: int = 3,
                         rtol: float = 1e-5, atol: float = 1e-6, **jit_options: Any) -> Callable[..., Any]:
    """Run `pattern` eagerly and jitted for `calls` calls; after each, results and observed state must match.

    `inputs(i)` gives the arguments of call i (the same objects go to both, so they must not be
    mutated; use the state for that). Returns the jitted step, for further checks.
    """
    eager_step, eager_observe = pattern()
    jit_step_fn, jit_observe = pattern()
    jitted = minijit.jit(jit_step_fn, **jit_options)
    assert_same(jit_observe(), eager_observe(), "state before the first call", rtol, atol)
    for i in range(calls):
        args = inputs(i)
        want = eager_step(*args)
        got = jitted(*args)
        assert_same(got, want, f"call {i}: result", rtol, atol)
        assert_same(jit_observe(), eager_observe(), f"call {i}: state", rtol, atol)
    return jitted


def tensors_of(module_or_tensors: Any) -> list[torch.Tensor]:
    """Parameters (with their .grad) and buffers of a module, as plain tensors to compare."""
    out: list[Any] = []
    for p in module_or_tensors.parameters():
        out.append(p.detach().clone())
        out.append(None if p.grad is None else p.grad.clone())
    out += [b.clone() for b in module_or_tensors.buffers()]
    return out


def optimizer_state(opt: torch.optim.Optimizer) -> list[Any]:
    """An optimizer's per-parameter state and hyperparameters, in a comparable form."""
    state = []
    for group in opt.param_groups:
        state.append({k: v for k, v in group.items() if k != "params"})
        for p in group["params"]:
            s = opt.state.get(p, {})
            state.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()})
    return state
