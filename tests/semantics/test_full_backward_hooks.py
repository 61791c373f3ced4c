"""Modules' full backward hooks and backward pre-hooks under `minijit.jit(model)`: run where eager runs them.

Each case builds a model and an eager deep copy, registers the same kind of hook on both (each recording
into its own list), runs several forward/backward calls side by side, and compares what the hooks saw, in
order, and the gradients and parameters that follow.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.modules.module as torch_module
from torch import nn

import minijit
from minijit.errors import InplaceError

Record = list[tuple[Any, ...]]


def _copy(grads: Any) -> tuple[Any, ...]:
    return tuple(None if g is None else g.detach().clone() for g in grads)


def recording_hook(record: Record, scale: float | None = None) -> Callable[..., Any]:
    """A full backward hook recording (module type, grad_input, grad_output); with `scale`, it returns grad_input
    scaled (Nones kept)."""
    def hook(module: nn.Module, grad_input: Any, grad_output: Any) -> Any:
        record.append(("full", type(module).__name__, _copy(grad_input), _copy(grad_output)))
        if scale is not None:
            return tuple(None if g is None else g * scale for g in grad_input)
        return None
    return hook


def recording_pre_hook(record: Record, scale: float | None = None) -> Callable[..., Any]:
    """A backward pre-hook recording (module type, grad_output); with `scale`, it returns grad_output scaled."""
    def hook(module: nn.Module, grad_output: Any) -> Any:
        record.append(("pre", type(module).__name__, _copy(grad_output)))
        if scale is not None:
            return tuple(None if g is None else g * scale for g in grad_output)
        return None
    return hook


def assert_same_records(got: Record, want: Record) -> None:
    assert [r[:2] for r in got] == [r[:2] for r in want], "the hooks ran in another order or number"
    for i, (g, w) in enumerate(zip(got, want)):
        for part, (gs, ws) in enumerate(zip(g[2:], w[2:])):
            assert [x is None for x in gs] == [x is None for x in ws], f"record {i} part {part}: Nones differ"
            for a, b in zip(gs, ws):
                if b is not None:
                    torch.testing.assert_close(a, b, msg=lambda m, i=i: f"record {i}: {m}")


def assert_same_grads(got: nn.Module, want: nn.Module) -> None:
    for (name, w), g in zip(want.named_parameters(), got.parameters()):
        assert (g.grad is None) == (w.grad is None), name
        if w.grad is not None:
            torch.testing.assert_close(g.grad, w.grad, msg=lambda m, name=name: f"{name}.grad: {m}")


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def run_side_by_side(model: nn.Module, register: Callable[[nn.Module, Record], Any], calls: int = 3,
                     x_grad: bool = True, between: Callable[[int, list[Any]], None] | None = None
                     ) -> tuple[Record, Record, Any]:
    """`register(model, record)` on the model and an eager copy; `calls` calls of each, compared after each.

    `between(i, handles)` runs before call i with the handles `register` returned (eager's first).
    Returns both records and the jitted model.
    """
    eager, jit_model = model, copy.deepcopy(model)
    records: tuple[Record, Record] = ([], [])
    handles = [register(eager, records[0]), register(jit_model, records[1])]
    jitted = minijit.jit(jit_model)
    for i in range(calls):
        if between is not None:
            between(i, handles)
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(i))
        xe, xj = x.clone().requires_grad_(x_grad), x.clone().requires_grad_(x_grad)
        want, got = eager(xe), jitted(xj)
        torch.testing.assert_close(got, want)
        want.pow(2).sum().backward()
        got.pow(2).sum().backward()
        assert_same_records(records[1], records[0])
        assert_same_grads(jit_model, eager)
        if x_grad:
            torch.testing.assert_close(xj.grad, xe.grad)
    return records[0], records[1], jitted


def test_a_hook_on_the_jitted_module_itself() -> None:
    eager, _, _ = run_side_by_side(mlp(), lambda m, r: m.register_full_backward_hook(recording_hook(r)))
    assert len(eager) == 3


def test_a_hook_on_a_child_and_a_pre_hook_on_another() -> None:
    def register(m: nn.Module, r: Record) -> Any:
        return (m[2].register_full_backward_hook(recording_hook(r)),
                m[0].register_full_backward_pre_hook(recording_pre_hook(r)))

    eager, _, _ = run_side_by_side(mlp(), register)
    assert [kind for kind, *_ in eager[:2]] == ["full", "pre"]


def test_hooks_returning_modified_grads() -> None:
    def register(m: nn.Module, r: Record) -> Any:
        return (m[2].register_full_backward_pre_hook(recording_pre_hook(r, scale=3.0)),
                m[2].register_full_backward_hook(recording_hook(r, scale=0.5)),
                m.register_full_backward_hook(recording_hook(r, scale=-1.0)))

    run_side_by_side(mlp(), register)


def test_hooks_on_a_module_whose_input_needs_no_grad() -> None:
    # Eager then runs the full hook at the results, with grad_input of Nones, and warns.
    def register(m: nn.Module, r: Record) -> Any:
        return (m[0].register_full_backward_hook(recording_hook(r)), m[2].register_full_backward_hook(recording_hook(r)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager, _, _ = run_side_by_side(mlp(), register, x_grad=False)
    assert eager[1][2] == (None,)
    assert any("no inputs require gradients" in str(w.message) for w in caught)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.a(x) * scale + self.b(y) + z.sum(), x.sum(dim=1), y * 0


class UsesTwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TwoInputs()
        self.proj = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, s, _unused = self.inner(x, self.proj(x), 2.0, torch.ones(2))
        return h + s.unsqueeze(1)


def test_a_module_with_several_inputs_and_results() -> None:
    # grad_input has one entry per positional argument (None for the number, and for z needing no grad);
    # grad_output one per result (the unused result's gradient is zeros, as eager materialises it).
    def register(m: nn.Module, r: Record) -> Any:
        return (m.inner.register_full_backward_hook(recording_hook(r, scale=2.0)),
                m.inner.register_full_backward_pre_hook(recording_pre_hook(r)))

    torch.manual_seed(0)
    eager, _, _ = run_side_by_side(UsesTwoInputs(), register)
    assert len(eager[1][2]) == 4 and len(eager[1][3]) == 3


def test_a_hook_removed_between_calls_and_one_added_after_the_first_call() -> None:
    added: list[Any] = []

    def between(i: int, handles: list[Any]) -> None:
        if i == 1:
            for handle in handles:
                handle.remove()
        if i == 2:
            for model, record in added:
                model[2].register_full_backward_pre_hook(recording_pre_hook(record, scale=2.0))

    def register(m: nn.Module, r: Record) -> Any:
        added.append((m, r))
        return m[0].register_full_backward_hook(recording_hook(r))

    eager, _, jitted = run_side_by_side(mlp(), register, calls=4, between=between)
    assert [kind for kind, *_ in eager] == ["full", "pre", "pre"]
    reasons = minijit.cache_info(jitted).miss_reasons
    assert len(reasons) == 3 and "backward hook removed" in reasons[1] and "backward pre-hook added" in reasons[2]


def test_a_global_full_backward_hook() -> None:
    records: tuple[Record, Record] = ([], [])
    eager, jit_model = mlp(), mlp()
    jitted = minijit.jit(jit_model)
    for model, record in ((eager, records[0]), (jitted, records[1])):
        # torch keeps the kind of the last global backward hook after its removal, and refuses the other kind.
        kind = torch_module._global_is_full_backward_hook
        torch_module._global_is_full_backward_hook = None
        handle = torch_module.register_module_full_backward_hook(recording_hook(record))
        try:
            for i in range(2):
                x = torch.randn(5, 3, generator=torch.Generator().manual_seed(i), requires_grad=True)
                model(x).sum().backward()
        finally:
            handle.remove()
            torch_module._global_is_full_backward_hook = kind
    assert_same_records(records[1], records[0])
    assert_same_grads(jit_model, eager)


def test_hooks_do_not_run_without_grad_and_an_old_style_hook_is_refused() -> None:
    model = mlp()
    record: Record = []
    model[2].register_full_backward_hook(recording_hook(record))
    jitted = minijit.jit(model)
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), model(x))
    assert record == []
    model[0].register_backward_hook(lambda mod, gin, gout: None)
    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"Linear at self.0 has a backward hook \(register_backward_hook"):
        jitted(torch.randn(2, 3, requires_grad=True))


def test_a_hook_returning_a_gradient_of_the_wrong_shape_is_an_error() -> None:
    model = mlp()
    model[2].register_full_backward_hook(lambda mod, gin, gout: (gin[0][:1],))
    with pytest.raises(RuntimeError):  # eager refuses it too
        model(torch.randn(5, 3, requires_grad=True)).sum().backward()
    out = minijit.jit(model)(torch.randn(5, 3, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"a backward hook of Linear replaced grad_input\[0\]"):
        out.sum().backward()


def test_a_hooked_module_called_by_a_jitted_function() -> None:
    # Not a jitted module: the function reads the module's hook dicts, and its guard notices a hook added or removed.
    torch.manual_seed(0)
    eager = nn.Linear(3, 2)
    model = copy.deepcopy(eager)
    records: tuple[Record, Record] = ([], [])
    steps = [lambda x: eager(x).pow(2).sum(), minijit.jit(lambda x: model(x).pow(2).sum())]
    handles: list[Any] = []
    for i in range(4):
        if i == 1:
            handles = [m.register_full_backward_hook(recording_hook(r)) for m, r in zip((eager, model), records)]
        if i == 3:
            for handle in handles:
                handle.remove()
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        for step, xi in zip(steps, xs):
            step(xi).backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad)
    assert_same_records(records[1], records[0])
    assert len(records[0]) == 2


def test_an_in_place_write_into_a_hooked_modules_input_is_refused_as_in_eager() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True))
    model[1].register_full_backward_hook(lambda mod, gin, gout: None)
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified inplace"):
        model(x)
    with pytest.raises(InplaceError, match=r"module_hooks.inputs returned \(eager: a view created inside a "
                                                   r"custom Function"):
        minijit.jit(model)(x)
