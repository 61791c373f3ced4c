"""torch.optim under minijit.jit: `opt.step()` (foreach and for-loop implementations) and the functional
`torch.optim.adamw.adamw` give eager's parameters and state, step after step, writing every update straight
into the parameter and state tensors (each a `copy_to_out_` done in place; no real copy left)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import minijit

STEPS = 3

OPTIMIZERS = {
    "AdamW foreach": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=True),
    "AdamW for-loop": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=False),
    "SGD momentum foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "SGD momentum for-loop": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
    "Adam amsgrad foreach": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, foreach=True),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _backward(model: nn.Module, i: int) -> None:
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)
    nn.functional.mse_loss(model(x), y).backward()


def _state(opt: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for s in opt.state.values() for k, v in s.items() if isinstance(v, torch.Tensor)]


def _assert_no_real_copy(trace: minijit.ir.Trace, written: int) -> dict[str, int]:
    """Every write into an input is one `copy_to_out_` done in place, and nothing else copies."""
    names = [b.sym.name for b in trace.bound_symbols]
    copies = [b for b in trace.bound_symbols if b.sym.name == "copy_to_out_"]
    real = [b.note for b in copies if not b.note.startswith("in place")]
    assert not real, f"real copies left: {real}"
    assert "copy_" not in names
    assert len(copies) == written, f"{len(copies)} copy_to_out_ for {written} tensors written"
    return {"copy_to_out_": len(copies), "in place": len(copies) - len(real)}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_opt_step_matches_eager_and_writes_in_place(name: str) -> None:
    runs = []
    for use_jit in (False, True):
        model = _model()
        opt = OPTIMIZERS[name](model.parameters())
        step = minijit.jit(lambda opt=opt: opt.step()) if use_jit else opt.step
        history = []
        for i in range(STEPS):
            opt.zero_grad()
            _backward(model, i)
            pointers = [p.data_ptr() for p in model.parameters()]
            step()
            assert [p.data_ptr() for p in model.parameters()] == pointers
            history.append(([p.detach().clone() for p in model.parameters()],
                            [(k, v.clone()) for k, v in _state(opt)]))
        runs.append((history, step, model, opt))
    (eager, *_), (jitted, step, model, opt) = runs
    for i, ((want_p, want_s), (have_p, have_s)) in enumerate(zip(eager, jitted)):
        for w, h in zip(want_p, have_p, strict=True):
            torch.testing.assert_close(h, w, msg=lambda m, i=i: f"step {i}: parameter: {m}")
        assert [k for k, _ in have_s] == [k for k, _ in want_s]
        for (k, w), (_, h) in zip(want_s, have_s):
            torch.testing.assert_close(h, w, msg=lambda m, i=i, k=k: f"step {i}: state {k}: {m}")
    written = len(list(model.parameters())) + len(_state(opt))
    _assert_no_real_copy(minijit.last_traces(step)[-1], written)
    assert minijit.cache_info(step).misses == 2  # the first step creates the state: one more trace


@pytest.mark.parametrize("foreach", [False, True])
def test_functional_adamw_matches_eager(foreach: bool) -> None:
    from torch.optim.adamw import adamw

    def update(params, grads, exp_avgs, exp_avg_sqs, steps):
        adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=foreach, amsgrad=False, beta1=0.9,
              beta2=0.999, lr=0.01, weight_decay=0.01, eps=1e-8, maximize=False)

    def state():
        g = torch.Generator().manual_seed(0)
        shapes = [(8, 4), (8,), (3, 8)]
        params = [torch.randn(s, generator=g) for s in shapes]
        return params, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params], \
            [torch.tensor(0.0) for _ in params]

    (want_p, want_m, want_v, want_t), (have_p, have_m, have_v, have_t) = state(), state()
    jitted = minijit.jit(update)
    for i in range(STEPS):
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + i)) for p in want_p]
        update(want_p, grads, want_m, want_v, want_t)
        jitted(have_p, grads, have_m, have_v, have_t)
        for want, have in zip(want_p + want_m + want_v + want_t, have_p + have_m + have_v + have_t, strict=True):
            torch.testing.assert_close(have, want, msg=lambda m, i=i: f"step {i}: {m}")
    _assert_no_real_copy(minijit.last_traces(jitted)[-1], written=4 * len(want_p))


def test_hand_written_sgd_under_no_grad_in_the_function() -> None:
    """In-place updates of leaves that require grad, inside `torch.no_grad()` in the jitted function: the
    parameters passed as arguments, or read from a model the function closes over (with their `.grad`)."""

    def sgd(params, grads, lr):
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(lr * g)

    def closure_sgd(model):
        def step():
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
                    p.grad.zero_()

        return step

    models = [_model() for _ in range(4)]
    steps = [lambda m: sgd(list(m.parameters()), [p.grad for p in m.parameters()], 0.1),
             (lambda jf: lambda m: jf(list(m.parameters()), [p.grad for p in m.parameters()], 0.1))(minijit.jit(sgd)),
             closure_sgd(models[2]), minijit.jit(closure_sgd(models[3]))]
    for i in range(STEPS):
        for n, (model, step) in enumerate(zip(models, steps)):
            if n < 2:
                model.zero_grad()
            _backward(model, i)
            step(model) if n < 2 else step()
        for have in models[1:]:
            for w, h in zip(models[0].parameters(), have.parameters(), strict=True):
                torch.testing.assert_close(h, w)
                assert h.requires_grad and h.is_leaf
        assert not any(p.grad.any() for p in models[3].parameters())


def test_opt_step_after_torch_compile_has_run():
    """Once torch.compile has run, torch.optim's `_init_group`s are wrapped by torch._dynamo.disable: still traced."""
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    assert getattr(torch.optim.AdamW._init_group, "_torchdynamo_disable", False)
    test_opt_step_matches_eager_and_writes_in_place("AdamW for-loop")


def _every_optimizer() -> dict[str, Any]:
    """Each torch.optim optimizer, with its foreach and its for-loop implementation."""
    made = {
        "Adam": lambda p, **k: torch.optim.Adam(p, lr=0.01, **k),
        "AdamW": lambda p, **k: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, **k),
        "Adam amsgrad": lambda p, **k: torch.optim.Adam(p, lr=0.01, amsgrad=True, **k),
        "NAdam": lambda p, **k: torch.optim.NAdam(p, lr=0.01, **k),
        "RAdam": lambda p, **k: torch.optim.RAdam(p, lr=0.01, **k),
        "Adamax": lambda p, **k: torch.optim.Adamax(p, lr=0.01, **k),
        "Adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.01, **k),
        "Adadelta": lambda p, **k: torch.optim.Adadelta(p, lr=0.5, **k),
        "RMSprop": lambda p, **k: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, **k),
        "ASGD": lambda p, **k: torch.optim.ASGD(p, lr=0.01, **k),
        "SGD nesterov": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, **k),
        "Rprop": lambda p, **k: torch.optim.Rprop(p, lr=0.01, **k),
    }
    return {f"{name} {'foreach' if foreach else 'for-loop'}": functools.partial(make, foreach=foreach)
            for name, make in made.items() for foreach in (True, False)}


EVERY_OPTIMIZER = _every_optimizer()


@pytest.mark.parametrize("name", ["Adam", "RAdam"])
def test_foreach_step_counts_are_python_numbers_as_in_eager(name: str) -> None:
    """A foreach optimizer's step list holds the state's own tensors from the second step on; `_get_value(step)`
    reads each as a Python number, as eager does, so the bias corrections are float64 number ops and the update
    equals eager's to the bit (they were float32 tensor ops: RAdam's `rho_t`, about 1999 - 1992, lost digits)."""
    runs = []
    for use_jit in (False, True):
        model = _model()
        opt = getattr(torch.optim, name)(model.parameters(), lr=0.01, foreach=True)
        step = minijit.jit(opt.step) if use_jit else opt.step
        for i in range(7):  # RAdam rectifies from step 6 on
            opt.zero_grad()
            _backward(model, i)
            step()
        runs.append([t.detach() for t in (*model.parameters(), *(v for _, v in _state(opt)))])
    for want, have in zip(*runs, strict=True):
        assert torch.equal(have, want), (have - want).abs().max()


@pytest.mark.parametrize("name", list(EVERY_OPTIMIZER))
def test_every_optimizer_under_an_lr_schedule_matches_eager_with_two_traces(name: str) -> None:
    """A new lr on every step (a cosine schedule) is a number of the trace, not a trace per value; the step count
    the bias corrections read (`_get_value(step)`) is a number the trace computes."""
    runs = []
    for use_jit in (False, True):
        model = _model()
        opt = EVERY_OPTIMIZER[name](model.parameters())
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
        step = minijit.jit(lambda opt=opt: opt.step()) if use_jit else opt.step
        for i in range(6):
            opt.zero_grad()
            _backward(model, i)
            step()
            schedule.step()
        runs.append(([p.detach().clone() for p in model.parameters()], _state(opt), step))
    (want_p, want_s, _), (have_p, have_s, step) = runs
    for w, h in zip(want_p, have_p, strict=True):
        torch.testing.assert_close(h, w)
    for (k, w), (_, h) in zip(want_s, have_s, strict=True):
        torch.testing.assert_close(h, w, msg=lambda m, k=k: f"state {k}: {m}")
    # The state made, then lr symbolic; RAdam also branches on the step count (`rho_t > 5`, true from step 6 on):
    # one trace per outcome, as for any `if` on a number the trace computes.
    assert minijit.cache_info(step).misses <= (3 if name.startswith("RAdam") else 2), minijit.cache_info(step)
