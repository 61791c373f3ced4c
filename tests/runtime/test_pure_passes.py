"""Every pass of the pipeline leaves the trace it was given as it was; facts travel as typed results.

Each trace the pipeline makes is snapshotted right after its pass (when the trace verifier
looks at it) and compared again once the whole compile, the call and the backward are done:
a later pass that renamed a proxy, edited a bound symbol list or rewrote an output of an
earlier trace shows up as a difference. Results are compared with eager PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.extend import OperatorExecutor
from minijit.ir import BoundSymbol, Proxy, Trace, tree_iter
from minijit.transforms.verify import TraceChecker

TensorList = list[torch.Tensor]


def _proxies(trace: Trace) -> list[Proxy]:
    found = [p for p in tree_iter((trace.args, trace.output)) if isinstance(p, Proxy)]

    def visit(bsyms: tuple[BoundSymbol, ...] | list[BoundSymbol]) -> None:
        for b in bsyms:
            found.extend(b.proxy_args())
            found.extend(b.proxy_outputs())
            visit(b.subsymbols)

    visit(trace.bound_symbols)
    return found


def _snapshot(trace: Trace) -> tuple[Any, ...]:
    """What a pass could change in a trace it was given: its source, its bound symbols, its proxies' names."""
    return (
        trace.python(subsymbol_depth=8),
        trace.fn_name,
        trace.pass_name,
        [id(b) for b in trace.bound_symbols],
        [(id(b.args), id(b.kwargs), id(b.output), id(b.subsymbols)) for b in trace.bound_symbols],
        [id(p) for p in trace.args],
        id(trace.output),
        [(id(p), p.name) for p in _proxies(trace)],
        [list(g) for g in trace.input_alias_groups],
        trace.output_note,
    )


@pytest.fixture
def snapshots(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Trace, tuple[Any, ...]]]:
    """Each trace the pipeline makes, with its snapshot taken right after the pass that made it."""
    taken: list[tuple[Trace, tuple[Any, ...]]] = []
    check = TraceChecker.check

    def check_and_snapshot(self: TraceChecker, trace: Trace, **kwargs: Any) -> None:
        check(self, trace, **kwargs)
        taken.append((trace, _snapshot(trace)))

    monkeypatch.setenv("MINIJIT_CHECK_TRACES", "1")  # the pipeline then shows every trace to the checker
    monkeypatch.setattr(TraceChecker, "check", check_and_snapshot)
    return taken


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)).sum(dim=-1) * 2


def _in_place(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    x[0].mul_(y[0])
    y.t().zero_()
    return x * 2 + y.sum()


def _opaque_and_no_grad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        scale = b.abs().max() + 1
    return torch.linalg.solve(a, b / scale).exp()


_SCALE = torch.randn(3)
_STORE: dict[str, torch.Tensor] = {}


def _captured_and_effect(x: torch.Tensor) -> dict[str, torch.Tensor]:
    _STORE["y"] = x * _SCALE  # a tensor read from outside the call, a write into an object from outside
    return {"z": _STORE["y"].relu()}


def _in_place_with_grad(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    x.add_(w)
    return (x * w).sum()


class _ClampedExp(torch.autograd.Function):
    """A custom Function: minijit traces its forward, and its backward as the VJP rule."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.clamp(max=2).exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return g * y


def _custom_function(x: torch.Tensor) -> torch.Tensor:
    return _ClampedExp.apply(x * 3).sum()


def _identical_inputs_written(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x + y


def _gelu_rewriting_executor() -> OperatorExecutor:
    """An executor whose execution transform rewrites `gelu` into its own operator (claim's rewrite path)."""
    ex = OperatorExecutor("puregelu")
    fast_gelu = ex.register_operator("fast_gelu", like=torch.nn.functional.gelu,
                                     fn=lambda a, approximate="none": torch.nn.functional.gelu(a))
    ex.register_implementation(torch.nn.functional.gelu, execution_transform=lambda a, approximate="none": fast_gelu(a))
    return ex


Case = tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]], tuple[int, ...], Callable[[], list[Any]]]


def _cases() -> list[Case]:
    """(name, function, fresh arguments, positions of the arguments that require grad, executors) for each program."""
    def square() -> torch.Tensor:
        return torch.randn(3, 3) + 3 * torch.eye(3)

    def shared() -> tuple[Any, ...]:
        t = torch.randn(4)
        return (t, t)

    return [
        ("backward", _linear_gelu, lambda: (torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)), (0, 1, 2), list),
        ("in place", _in_place, lambda: (torch.randn(3, 3), torch.randn(3, 3)), (), list),
        ("in place, backward", _in_place_with_grad, lambda: (torch.randn(3), torch.randn(3)), (0,), list),
        ("opaque op, no_grad, backward", _opaque_and_no_grad, lambda: (square(), torch.randn(3, 2)), (0, 1), list),
        ("captured tensor, effect", _captured_and_effect, lambda: (torch.randn(3),), (), list),
        ("same tensor twice, written", _identical_inputs_written, shared, (), list),
        ("custom autograd.Function, backward", _custom_function, lambda: (torch.randn(4),), (0,), list),
        ("execution transform", _linear_gelu, lambda: (torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)), (),
         lambda: [_gelu_rewriting_executor()]),
        ("fusion executor, in place", _in_place, lambda: (torch.randn(3, 3), torch.randn(3, 3)), (), lambda: ["triton"]),
    ]


def _prepare(args: tuple[Any, ...], grad: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(a.requires_grad_() if i in grad else a for i, a in enumerate(args))


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    memo: dict[int, torch.Tensor] = {}

    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            if id(a) not in memo:
                memo[id(a)] = a.detach().clone().requires_grad_(a.requires_grad)
            return memo[id(a)]
        return a

    return tuple(one(a) for a in args)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_every_pass_leaves_its_input_trace_unchanged(case: Any, snapshots: list[tuple[Trace, Any]]) -> None:
    _, fn, make_args, grad, make_executors = case
    executors = make_executors()
    if "triton" in executors:
        pytest.importorskip("triton", reason="the triton extra is not installed")
    args = _prepare(make_args(), grad)
    eager_args, jit_args = _clone(args), _clone(args)
    _STORE.clear()
    want = fn(*eager_args)
    stored_want = dict(_STORE)
    got = minijit.jit(fn, executors=executors)(*jit_args)
    assert _STORE.keys() == stored_want.keys()
    for key, value in stored_want.items():
        torch.testing.assert_close(_STORE[key], value)
    leaves_want = [x for x in tree_iter(want) if isinstance(x, torch.Tensor)]
    leaves_got = [x for x in tree_iter(got) if isinstance(x, torch.Tensor)]
    for g, w in zip(leaves_got, leaves_want, strict=True):
        torch.testing.assert_close(g, w)
    if grad:
        sum(x.sum() for x in leaves_want).backward()
        sum(x.sum() for x in leaves_got).backward()
        for a, b in zip(jit_args, eager_args, strict=True):
            if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad)
    for a, b in zip(jit_args, eager_args, strict=True):  # the writes into inputs
        torch.testing.assert_close(a.detach(), b.detach())

    assert len(snapshots) >= 6, "the pipeline showed the checker fewer traces than it has passes"
    for trace, before in snapshots:
        assert not hasattr(trace, "info"), "facts between passes go in typed results, not on the trace"
        after = _snapshot(trace)
        changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
        assert not changed, f"a later pass changed the trace of pass {trace.pass_name!r} (snapshot fields {changed}):\n" \
                            f"{before[0]}\n--- now ---\n{after[0]}"


def test_pass_results_are_typed_records_on_the_cache_entry() -> None:
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3)
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * _SCALE).sum() + w.add_(1).sum()

    w_jit = w.clone()
    jf = minijit.jit(f)
    torch.testing.assert_close(jf(x, w_jit), f(x, w))
    torch.testing.assert_close(w_jit, w)
    entry = jf.last_entry()
    assert entry.functionalized.mutated_inputs == ("w",)
    assert entry.split is not None and entry.split.differentiable_outputs == (0,)
    assert [source.label for _, source, _ in entry.capture.captured_inputs] == ["_SCALE"]
