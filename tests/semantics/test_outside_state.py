"""State outside the call: read afresh (guarded), written back on every call (replayed), as eager does.

Each pattern is run eagerly and jitted for several calls; results and the outside state
(parameters, gradients, optimizer state, lists, attributes, globals) must match after every call.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn

import minijit
from tests.semantics.util import assert_same_as_eager, optimizer_state, tensors_of

SCALE = 2.0
BUFFER = torch.zeros(3)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _data(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1),
    "SGD momentum nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "SGD weight decay dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, dampening=0.1, weight_decay=0.01),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "Adam amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.1),
}


def _compare_optimizer_steps(make_opt: Any, schedule: bool = False, calls: int = 3, bound: bool = False) -> Any:
    """Eager `opt.step()` against `minijit.jit(lambda: opt.step())` (`bound`: `minijit.jit(opt.step)`), on
    identical models and gradients."""
    states = []
    jitted = None
    for use_jit in (False, True):
        model = _model()
        opt = make_opt(model.parameters())
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if schedule else None
        step = (minijit.jit(opt.step if bound else lambda opt=opt: opt.step())) if use_jit else opt.step
        jitted = step if use_jit else jitted
        history = []
        for i in range(calls):
            x, y = _data(i)
            opt.zero_grad()  # set_to_none: every call sees new .grad tensors
            nn.functional.mse_loss(model(x), y).backward()
            step()
            if scheduler is not None:
                scheduler.step()
            history.append((tensors_of(model), optimizer_state(opt)))
        states.append(history)
    for i, (eager, jit) in enumerate(zip(*states)):
        for a, b in zip(eager[0], jit[0]):
            torch.testing.assert_close(b, a, msg=lambda m, i=i: f"step {i}: {m}")
        assert len(eager[1]) == len(jit[1])
        for a, b in zip(eager[1], jit[1]):
            assert a.keys() == b.keys(), f"step {i}: optimizer state keys differ"
            for k in a:
                if isinstance(a[k], torch.Tensor):
                    torch.testing.assert_close(b[k], a[k])
                else:
                    assert b[k] == a[k], f"step {i}: {k}"
    return jitted


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_in_a_closure_matches_eager(name):
    jitted = _compare_optimizer_steps(OPTIMIZERS[name])
    assert minijit.cache_info(jitted).misses <= 2  # the first step initialises the state: one more trace


def test_optimizer_step_after_torch_compile_has_run_matches_eager():
    # Once torch.compile has run, Dynamo rebinds optimizers' methods (`_init_group`) to its wrappers.
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    compiled(torch.ones(2))
    _compare_optimizer_steps(OPTIMIZERS["Adam"])


def test_optimizer_step_follows_a_learning_rate_schedule():
    jitted = _compare_optimizer_steps(OPTIMIZERS["SGD"], schedule=True)
    assert "lr" in str(minijit.cache_info(jitted))


@pytest.mark.parametrize("name", ["SGD momentum nesterov", "AdamW"])
def test_jitted_bound_step_under_a_learning_rate_schedule_matches_eager(name):
    # An lr scheduler replaces `opt.step` by a function reaching the optimizer through a weakref.
    _compare_optimizer_steps(OPTIMIZERS[name], schedule=True, bound=True)


def test_a_weakref_from_outside_reads_its_referent_afresh():
    def run(use_jit: bool) -> list[torch.Tensor]:
        held = torch.ones(3)
        ref = weakref.ref(held)

        def f(x):
            ref().add_(1)
            return x * ref()

        g = minijit.jit(f) if use_jit else f
        return [g(torch.full((3,), float(i))) for i in range(3)] + [held]

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(b, a)


def test_optimizer_step_writes_parameters_in_place_and_bumps_versions():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = minijit.jit(lambda: opt.step())
    x, y = _data(0)
    nn.functional.mse_loss(model(x), y).backward()
    weight = model[0].weight
    version = weight._version
    step()
    assert model[0].weight is weight and weight._version > version
    final = str(minijit.last_traces(step)[-1])
    assert "copy_to_out_" in final and "grad" in final


def test_in_place_update_under_no_grad_in_the_function():
    def pattern():
        w = torch.linspace(-1, 1, 3).requires_grad_()

        def step(g):
            with torch.no_grad():
                w.sub_(0.1 * g)
            return w * 1.0

        return step, lambda: [w.detach().clone(), w.requires_grad, w.is_leaf]

    assert_same_as_eager(pattern, lambda i: (torch.randn(3),))


def test_closure_model_parameters_get_gradients():
    def pattern():
        model = _model()

        def step(x, y):
            return nn.functional.mse_loss(model(x), y)

        def observe():
            return tensors_of(model)

        return step, observe

    eager_step, eager_observe = pattern()
    jit_fn, jit_observe = pattern()
    jitted = minijit.jit(jit_fn)
    for i in range(3):
        x, y = _data(i)
        eager_step(x, y).backward()
        jitted(x, y).backward()
        for a, b in zip(eager_observe(), jit_observe()):
            torch.testing.assert_close(b, a)


def test_replaced_parameter_of_a_closure_model_is_seen():
    model = _model()
    jitted = minijit.jit(lambda x: model(x))
    x, _ = _data(0)
    torch.testing.assert_close(jitted(x), model(x))
    model[0].weight = nn.Parameter(torch.randn(8, 4))
    torch.testing.assert_close(jitted(x), model(x))


def _accumulate(x):
    BUFFER.add_(x)
    return BUFFER * 2


def test_writes_into_a_global_tensor_are_replayed():
    xs = [torch.randn(3) for _ in range(3)]
    runs = []
    for fn in (_accumulate, minijit.jit(_accumulate)):
        BUFFER.zero_()
        runs.append([(fn(x), BUFFER.clone()) for x in xs])
    for (want, want_buffer), (got, got_buffer) in zip(*runs):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_buffer, want_buffer)


def test_writes_into_a_closure_tensor_are_replayed():
    def pattern():
        running = torch.zeros(3)

        def step(x):
            running.mul_(0.9).add_(x, alpha=0.1)
            return x - running

        return step, lambda: running.clone()

    assert_same_as_eager(pattern, lambda i: (torch.randn(3),))


@pytest.mark.parametrize("cache, misses", [("constant values", 3), ("automatic", 2)])
def test_a_reassigned_global_number_retraces(cache, misses):
    # With constant values a new value is a new trace; by default the global goes symbolic once it changed.
    global SCALE
    jitted = minijit.jit(lambda x: x * SCALE, cache=cache)
    x = torch.ones(2)
    try:
        for s in (2.0, 3.0, 3.0, 4.0):
            SCALE = s
            torch.testing.assert_close(jitted(x), x * s)
    finally:
        SCALE = 2.0
    info = minijit.cache_info(jitted)
    assert info.misses == misses and "SCALE" in str(info)


def test_a_changed_nonlocal_is_seen():
    def make():
        k = 1.0

        def step(x):
            return x * k

        def set_k(v):
            nonlocal k
            k = v

        return step, set_k

    step, set_k = make()
    jitted = minijit.jit(step)
    x = torch.ones(2)
    for v in (1.0, 5.0, -2.0):
        set_k(v)
        torch.testing.assert_close(jitted(x), step(x))


def test_appending_to_a_captured_list():
    def pattern():
        log: list[Any] = []

        def step(x):
            log.append(x.sum())
            log.append(len(log))
            return x

        return step, lambda: list(log)

    assert_same_as_eager(pattern, lambda i: (torch.randn(3) + i,))


def test_setting_items_of_a_captured_dict():
    def pattern():
        cache: dict[str, Any] = {"calls": 0}

        def step(x):
            cache["calls"] += 1
            cache["last"] = x * 2
            return x + cache["calls"]

        return step, lambda: dict(cache)

    assert_same_as_eager(pattern, lambda i: (torch.randn(3),))


def test_reading_a_captured_list_that_changes_outside():
    def pattern():
        weights = [1.0, 2.0]

        def step(x):
            if len(weights) > 2:
                return x * weights[-1]
            return x * sum(weights)

        def observe():
            weights.append(float(len(weights)))  # changed between calls
            return list(weights)

        return step, observe

    assert_same_as_eager(pattern, lambda i: (torch.randn(2),))


def test_attributes_of_an_argument_object_are_guarded():
    class Config:
        def __init__(self):
            self.scale = 1.0

    cfg = Config()
    jitted = minijit.jit(lambda x, c: x * c.scale)
    x = torch.ones(2)
    for s in (1.0, 4.0, 4.0):
        cfg.scale = s
        torch.testing.assert_close(jitted(x, cfg), x * s)


class Registry(dict):
    """A dict subclass whose `get` means something else (as transformers' _CanRecordRegistry.get(model))."""

    def get(self, obj):
        return super().get(type(obj).__name__) or {}


REGISTRY = Registry(Linear={"scale": 3.0})


def test_items_of_a_dict_subclass_are_guarded_by_the_dict_itself():
    layer = nn.Linear(2, 2)

    def step(x):
        return layer(x) * REGISTRY.get(layer).get("scale", 1.0)

    jitted = minijit.jit(step)
    x = torch.randn(2)
    for scale in (3.0, 3.0, 5.0):
        REGISTRY["Linear"] = {"scale": scale}
        torch.testing.assert_close(jitted(x), step(x))
    info = minijit.cache_info(jitted)
    assert (info.hits, info.misses) == (1, 2)


def test_a_module_caches_an_activation_on_itself():
    class Caching(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.calls = 0

        def forward(self, x):
            self.last = self.fc(x)
            self.calls += 1
            return self.last.relu()

    def pattern():
        torch.manual_seed(1)
        m = Caching()
        return m, lambda: [m.calls, m.last.detach().clone() if hasattr(m, "last") else None]

    assert_same_as_eager(pattern, lambda i: (torch.randn(2, 3),))


def test_print_runs_on_every_call(capsys):
    def step(x):
        print("sum is", x.shape[0])
        return x * 2

    jitted = minijit.jit(step)
    for _ in range(3):
        jitted(torch.ones(4))
    assert capsys.readouterr().out.count("sum is 4") == 3
