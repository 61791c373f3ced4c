"""How many analyses one compile builds: each analysis of a trace (its memory model, view graph, `MustShare`,
producers for layouts, layout reads) at most once per trace content (minijit/ir/trace.py, `Trace.analysis`;
minijit/transforms/memory.py), on a module with in-place ops called with grad."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.ir import Proxy, Trace, tree_iter
from minijit.ops import strides
from minijit.transforms import memory


class _ReluInPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y.relu_()
        return y.sum()


class _ViewsWritten(_ReluInPlace):
    """Writes through a view, and a reshape of a transpose (whose layout decides whether it views)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * 1
        y.reshape(-1).mul_(2)
        y[:, 1:].add_(1)
        y.relu_()
        z = y.t().reshape(-1)
        return (y * 2).sum() + (z * z).sum()


class _Builds:
    """Every analysis built, by kind and by the content of the trace it was built for."""

    def __init__(self) -> None:
        self.by_content: Counter[tuple[Any, ...]] = Counter()
        self.kinds: Counter[str] = Counter()
        self._kept: list[Any] = []  # what the keys name by id, kept alive so no other object takes an id

    def note(self, kind: str, trace: Trace, walked: Any = None) -> None:
        bsyms = list(trace.bound_symbols if walked is None else walked)
        outputs = [p for p in tree_iter(trace.output) if isinstance(p, Proxy)]
        self._kept.append((bsyms, outputs, list(trace.args)))
        self.kinds[kind] += 1
        self.by_content[(kind, tuple(map(id, bsyms)), tuple(map(id, outputs)), tuple(p.name for p in trace.args),
                         tuple(map(id, trace.args)), tuple(map(tuple, trace.input_alias_groups)))] += 1


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> _Builds:
    builds = _Builds()

    def counted(cls: type, kind: Callable[..., str], walked: Callable[..., Any] = lambda *a, **k: None) -> None:
        init = cls.__init__

        def noting(self: Any, trace: Trace, *args: Any, **kwargs: Any) -> None:
            builds.note(kind(*args, **kwargs), trace, walked(*args, **kwargs))
            init(self, trace, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", noting)

    def model_kind(bound_symbols: Any = None, *, allocates: Any = None, views: Any = None) -> str:
        return f"memory model (views by {getattr(views, '__name__', None)})"

    counted(memory.MemoryModel, model_kind, lambda bound_symbols=None, **_: bound_symbols)
    counted(memory.ViewGraph, lambda: "view graph")
    # The memory model's (asked before functionalization, deciding for no particular call) and functionalization's
    # own (the call's aliased inputs, the views it makes in its new trace, recording the layout checks it relies
    # on) are two analyses; each at most once per trace.
    counted(memory.MustShare, lambda rule, same_memory=(), same_as=None:
            "must share" + (" (functionalization's)" if same_as is not None else " (the model's)"))
    for module, name, kind in ((strides, "_producers", "producers"), (memory, "_layout_read", "layout read")):
        build = getattr(module, name)

        def noting_walk(trace: Trace, build: Callable[[Trace], Any] = build, kind: str = kind) -> Any:
            builds.note(kind, trace)
            return build(trace)

        monkeypatch.setattr(module, name, noting_walk)
    return builds


@pytest.mark.parametrize("module_class", [_ReluInPlace, _ViewsWritten])
def test_a_compile_builds_each_analysis_once_per_trace(monkeypatch, module_class):
    torch.manual_seed(0)
    eager_module = module_class()
    jit_module = module_class()
    jit_module.load_state_dict(eager_module.state_dict())
    x = torch.randn(2, 4, requires_grad=True)
    x_jit = x.detach().clone().requires_grad_()
    builds = _count_builds(monkeypatch)
    got = minijit.jit(jit_module)(x_jit)
    got.backward()
    monkeypatch.undo()
    expected = eager_module(x)
    expected.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x_jit.grad, x.grad)
    for (name, p), (_, q) in zip(jit_module.named_parameters(), eager_module.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert builds.kinds["memory model (views by None)"] > 0
    if module_class is _ViewsWritten:
        assert builds.kinds["view graph"] > 0 and builds.kinds["producers"] > 0
    twice = {key[0]: n for key, n in builds.by_content.items() if n > 1}
    assert not twice, f"built more than once for one trace: {twice}; all builds: {dict(builds.kinds)}"
