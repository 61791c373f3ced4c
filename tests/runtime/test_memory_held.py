"""What a jitted function keeps alive after a call: no more than eager keeps (checked with weakrefs)."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minijit

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _young_heap() -> Any:
    """The objects alive before these tests (a worker's whole heap, after thousands of tests) frozen out of the
    collector: each `gc.collect()` here then walks what these tests made, milliseconds instead of seconds."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _freed_after_call(fn: Callable[..., Any], x_grad: bool, w_grad: bool, non_leaf: bool) -> bool:
    """Whether `x` is freed once the caller drops it, the call's result still alive (its graph too)."""
    x = torch.randn(3, 4, dtype=F64, requires_grad=x_grad)
    if non_leaf:
        x = x * 1
    w = torch.randn(4, dtype=F64, requires_grad=w_grad)
    ref = weakref.ref(x)
    result = fn(x, w)
    del x
    gc.collect()
    freed = ref() is None
    del result
    return freed


CASES = {
    "x * 2 + w": lambda x, w: (x * 2 + w).sum(-1),
    "x * w": lambda x, w: (x * w).sum(),
    "sin(x) * w": lambda x, w: (x.sin() * w).sum(),
    "linear": lambda x, w: F.linear(x, w.unsqueeze(0)).sum(),
    "exp(x) + w": lambda x, w: (x.exp() + w).sum(),
    "relu(x) + w": lambda x, w: (torch.relu(x) + w).sum(),
    # Eager keeps x for sin's backward; relu's and exp's keep their results instead, and mm keeps relu's.
    "sin(x)": lambda x, w: x.sin().sum(),
    "relu(x) @ w": lambda x, w: (torch.relu(x) @ w).sum(),
    "exp(x) * w": lambda x, w: (x.exp() * w).sum(),
}
# (x requires grad, w requires grad, x is a non-leaf). A leaf requiring grad is kept by eager's graph.
GRADS = [(False, True, False), (True, True, False), (True, False, True), (True, True, True)]


@pytest.mark.parametrize("name", CASES)
def test_an_input_is_freed_where_eager_frees_it(name: str) -> None:
    fn = CASES[name]
    for x_grad, w_grad, non_leaf in GRADS:
        want = _freed_after_call(fn, x_grad, w_grad, non_leaf)
        have = _freed_after_call(minijit.jit(fn), x_grad, w_grad, non_leaf)
        assert have == want, f"{name}, x requires grad {x_grad}, w {w_grad}, x a non-leaf {non_leaf}: eager frees x: {want}"


def test_the_issues_example_frees_x_and_differentiates_twice_as_eager() -> None:
    def f(x, w):
        return (x * 2 + w).sum(-1)

    def run(fn: Callable[..., Any]) -> tuple[bool, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        x = torch.randn(3, 4, dtype=F64)
        w = torch.randn(4, dtype=F64, requires_grad=True)
        ref = weakref.ref(x)
        y = fn(x, w)
        del x
        gc.collect()
        # A double backward after x is gone: through the cotangent, as eager's.
        v = torch.randn(3, dtype=F64, requires_grad=True)
        (gw,) = torch.autograd.grad(y, w, v, create_graph=True)
        (gv,) = torch.autograd.grad((gw * gw).sum(), v)
        return ref() is None, (gw.detach(), gv)

    eager_freed, want = run(f)
    jit_freed, have = run(minijit.jit(f))
    assert eager_freed and jit_freed
    for a, b in zip(have, want, strict=True):
        torch.testing.assert_close(a, b)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1)).to(F64)


@pytest.mark.parametrize("params_grad", [True, False], ids=["parameters train", "parameters frozen"])
def test_an_mlps_non_leaf_input_is_freed_where_eager_frees_it(params_grad: bool) -> None:
    # Eager's first linear keeps its input only for its weight's gradient; the GELU keeps the linear's result.
    eager = _mlp().requires_grad_(params_grad)
    jitted = minijit.jit(copy.deepcopy(eager))
    for x_grad in (True, False):
        want = _freed_after_call(lambda x, w: eager(x).sum(), x_grad, False, non_leaf=x_grad)
        for _ in range(2):  # a trace, then a cache hit
            have = _freed_after_call(lambda x, w: jitted(x).sum(), x_grad, False, non_leaf=x_grad)
            assert have == want, f"x requires grad {x_grad}, parameters {params_grad}: eager frees x: {want}"


SECOND_ORDER = {**CASES, "mlp": lambda x, w: (_mlp_once()(x) * w[:1]).sum()}
_MODELS: list[nn.Module] = []


def _mlp_once() -> nn.Module:
    if not _MODELS:
        _MODELS.append(_mlp())
    return _MODELS[0]


@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_and_third_order_after_the_input_is_freed_match_eager(name: str) -> None:
    fn = SECOND_ORDER[name]

    def orders(f: Callable[..., Any]) -> tuple[bool, list[torch.Tensor]]:
        torch.manual_seed(1)
        leaf = torch.randn(3, 4, dtype=F64, requires_grad=True)
        w = torch.randn(4, dtype=F64, requires_grad=True)
        v = torch.randn(3, 4, dtype=F64)
        x = leaf * 1
        ref = weakref.ref(x)
        y = f(x, w)
        del x
        gc.collect()
        freed = ref() is None
        gl, gw = torch.autograd.grad(y, (leaf, w), torch.ones_like(y), create_graph=True, allow_unused=True)
        second = sum((g * u).sum() for g, u in ((gl, v), (gw, w.detach())) if g is not None and g.requires_grad)
        if not isinstance(second, torch.Tensor):  # the gradients are constants (a linear function)
            return freed, [gl, gw]
        hv, hw = torch.autograd.grad(second, (leaf, w), create_graph=True, allow_unused=True)
        third = sum(h.pow(2).sum() for h in (hv, hw) if h is not None and h.requires_grad)
        if not isinstance(third, torch.Tensor):
            return freed, [gl, gw, hv, hw]
        return freed, [gl, gw, hv, hw, *torch.autograd.grad(third, (leaf, w), allow_unused=True)]

    eager_freed, want = orders(fn)
    jit_freed, have = orders(minijit.jit(fn))
    assert jit_freed == eager_freed
    assert len(have) == len(want)
    for a, b in zip(have, want, strict=True):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b)


def test_a_rebound_global_tensor_is_freed() -> None:
    scope: dict[str, Any] = {"g": torch.randn(3)}
    exec("def f(x):\n    return x * g\n", scope)
    jf = minijit.jit(scope["f"])
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), x * scope["g"])
    old = weakref.ref(scope["g"])
    scope["g"] = torch.randn(3)
    torch.testing.assert_close(jf(x), x * scope["g"])  # the same entry: the global is read again
    gc.collect()
    assert old() is None
    assert jf.cache_info().entries == 1


def test_a_rebound_attribute_and_parameter_are_freed() -> None:
    class State:
        pass

    state = State()
    state.scale = torch.randn(3)
    model = nn.Linear(3, 3)

    def f(x):
        return model(x) * state.scale

    jf = minijit.jit(f)
    x = torch.randn(2, 3)
    jf(x).sum().backward()
    olds = [weakref.ref(state.scale), weakref.ref(model.weight)]
    state.scale = torch.randn(3)
    model.weight = nn.Parameter(torch.randn(3, 3))
    torch.testing.assert_close(jf(x), f(x))
    gc.collect()
    assert [r() for r in olds] == [None, None]


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
def test_the_cache_keeps_no_argument_tensor(cache: str) -> None:
    def f(x, xs, d):
        return x + xs[0] * d["a"]

    jf = minijit.jit(f, cache=cache)
    refs = []
    for n in (3, 3, 4):  # a trace, a hit, a miss
        x, xs, d = torch.randn(n, requires_grad=True), [torch.randn(n)], {"a": torch.randn(n)}
        refs += [weakref.ref(x), weakref.ref(xs[0]), weakref.ref(d["a"])]
        jf(x, xs, d).sum().backward()
        del x, xs, d
    gc.collect()
    assert all(r() is None for r in refs)
