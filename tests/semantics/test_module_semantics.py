"""Everyday module patterns, eager against jitted (issue 12, parts 3 and 6: hooks; the jitted module is a module).

Each pattern builds the same model twice from the same seed, wraps one in `minijit.jit`, and makes
CALLS calls of the same step on each. After every call it compares the step's results (values and
dtypes, real tensors only), every parameter, gradient and buffer, the training flags, and the state
outside the model that the pattern keeps. The error patterns assert the specific MinijitError.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import minijit

CALLS = 3


# -- the harness ----------------------------------------------------------------------------------

def assert_same(got: Any, expected: Any, where: str = "result") -> None:
    """Equal values and dtypes, leaf by leaf; tensors must be real tensors of the same type."""
    if isinstance(expected, torch.Tensor):
        assert type(got) is type(expected), f"{where}: {type(got).__name__} != {type(expected).__name__}"
        torch.testing.assert_close(got, expected, msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, torch.optim.Optimizer):
        assert type(got) is type(expected), where
        assert_same(got.state_dict(), expected.state_dict(), f"{where}.state_dict()")
    elif isinstance(expected, list | tuple):
        assert type(got) is type(expected) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_same(g, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert type(got) is type(expected) and list(got) == list(expected), where
        for k in expected:
            assert_same(got[k], expected[k], f"{where}[{k!r}]")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def assert_same_model(got: nn.Module, expected: nn.Module) -> None:
    """Same parameters, gradients, buffers (names, values, dtypes) and training flags."""
    got_params, expected_params = dict(got.named_parameters()), dict(expected.named_parameters())
    assert list(got_params) == list(expected_params)
    for name, p in expected_params.items():
        assert_same(got_params[name].detach(), p.detach(), name)
        assert got_params[name].requires_grad == p.requires_grad, name
        assert (got_params[name].grad is None) == (p.grad is None), f"{name}.grad"
        if p.grad is not None:
            assert_same(got_params[name].grad, p.grad, f"{name}.grad")
    assert_same(dict(got.named_buffers()), dict(expected.named_buffers()), "buffers")
    assert [m.training for m in got.modules()] == [m.training for m in expected.modules()]


Build = Callable[[], tuple[nn.Module, dict[str, Any]]]
Step = Callable[[nn.Module, dict[str, Any], int], Any]


def run_differential(build: Build, step: Step, calls: int = CALLS) -> Any:
    """Build twice, jit one copy, run `step` `calls` times on each and compare after every call."""
    eager_model, eager_state = build()
    model, state = build()
    jm = minijit.jit(model)
    try:
        for i in range(calls):
            expected = step(eager_model, eager_state, i)
            got = step(jm, state, i)
            assert_same(got, expected, f"call {i}")
            assert_same_model(model, eager_model)
            assert_same({k: v for k, v in state.items() if k != "handles"},
                        {k: v for k, v in eager_state.items() if k != "handles"}, f"outside state after call {i}")
    finally:
        for handle in (*eager_state.get("handles", ()), *state.get("handles", ())):
            handle.remove()
    return jm


class Net(nn.Module):
    """A small model with a submodule tree, a buffer and a keyword argument."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)
        self.register_buffer("shift", torch.linspace(-1, 1, 3))

    def forward(self, x, scale=1.0):
        return self.fc2(self.act(self.fc1(x))) * scale + self.shift


def net(**state: Any) -> Build:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        torch.manual_seed(0)
        return Net(), copy.deepcopy(state)
    return build


def x_for(i: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.linspace(-2, 2, 8, dtype=dtype).reshape(2, 4) * (i + 1)


def forward_step(model: nn.Module, state: dict[str, Any], i: int) -> Any:
    with torch.no_grad():
        return model(x_for(i))


def grad_step(model: nn.Module, state: dict[str, Any], i: int) -> Any:
    model.zero_grad()
    out = model(x_for(i))
    out.square().sum().backward()
    return out.detach()


def with_hooks(register: Callable[[nn.Module, dict[str, Any]], Any], **state: Any) -> Build:
    """`net()` with hooks registered by `register(model, state)` (it returns the handles)."""
    def build() -> tuple[nn.Module, dict[str, Any]]:
        model, st = net(**state)()
        handles = register(model, st)
        st["handles"] = list(handles) if isinstance(handles, list | tuple) else [handles]
        return model, st
    return build


# -- hooks present when the module is jitted ------------------------------------------------------

HOOKS_AT_JIT_TIME = {
    "forward hook on a submodule": lambda m, s: m.fc1.register_forward_hook(lambda mod, args, out: out * 2 - 1),
    "forward pre-hook on the root": lambda m, s: m.register_forward_pre_hook(lambda mod, args: (args[0].flip(0),)),
    "pre-hook with kwargs": lambda m, s: m.register_forward_pre_hook(
        lambda mod, args, kwargs: (args, {**kwargs, "scale": 0.5}), with_kwargs=True),
    "forward hook with kwargs": lambda m, s: m.register_forward_hook(
        lambda mod, args, kwargs, out: out + kwargs.get("scale", 3.0), with_kwargs=True),
    "always_call forward hook": lambda m, s: m.fc2.register_forward_hook(lambda mod, args, out: out.tanh(),
                                                                         always_call=True),
    "hook returning None": lambda m, s: m.act.register_forward_hook(lambda mod, args, out: None),
    "prepended hook runs first": lambda m, s: [m.fc1.register_forward_hook(lambda mod, args, out: out * 3),
                                               m.fc1.register_forward_hook(lambda mod, args, out: out + 1, prepend=True)],
    "hooks on every level": lambda m, s: [m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,)),
                                          m.fc1.register_forward_hook(lambda mod, args, out: out.relu()),
                                          m.act.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,)),
                                          m.register_forward_hook(lambda mod, args, out: out.sum(-1))],
    "global forward hook": lambda m, s: torch_module.register_module_forward_hook(
        lambda mod, args, out: out * 2 if isinstance(mod, nn.Linear) else out),
    "global forward pre-hook": lambda m, s: torch_module.register_module_forward_pre_hook(
        lambda mod, args: (args[0] + 0.25,) if isinstance(mod, nn.Linear) else None),
    "full backward hook without grad": lambda m, s: m.fc2.register_full_backward_hook(lambda mod, gin, gout: None),
}


@pytest.mark.parametrize("register", HOOKS_AT_JIT_TIME.values(), ids=HOOKS_AT_JIT_TIME.keys())
def test_hooks_present_when_jitted(register):
    jm = run_differential(with_hooks(register), forward_step)
    assert minijit.cache_info(jm).misses == 1


@pytest.mark.parametrize("register", [v for k, v in HOOKS_AT_JIT_TIME.items() if "backward" not in k],
                         ids=[k for k in HOOKS_AT_JIT_TIME if "backward" not in k])
def test_hooks_present_when_jitted_with_gradients(register):
    run_differential(with_hooks(register), grad_step)


def test_hook_reading_a_changing_closure_value():
    def register(model, state):
        def hook(mod, args, out):
            return out * factor[0]
        factor = state["factor"]
        return model.fc1.register_forward_hook(hook)

    def step(model, state, i):
        state["factor"][0] = float(i + 1)
        return forward_step(model, state, i)

    run_differential(with_hooks(register, factor=[1.0]), step)


def test_hooks_on_a_transformer_style_block():
    def build():
        torch.manual_seed(0)
        block = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        block[1].register_forward_hook(lambda mod, args, out: out * 0.5)
        block.register_forward_pre_hook(lambda mod, args: (args[0] - args[0].mean(),))
        return block, {}

    def step(model, state, i):
        model.zero_grad()
        x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(i))
        out = model(x)
        out.sum().backward()
        return out.detach()

    run_differential(build, step)


# -- hooks added or removed later -----------------------------------------------------------------

def test_forward_hook_added_after_the_first_call():
    def step(model, state, i):
        if i == 1:
            state["handles"].append(model.fc1.register_forward_hook(lambda mod, args, out: out + 4.3))
        return forward_step(model, state, i)

    jm = run_differential(with_hooks(lambda m, s: []), step)
    assert minijit.cache_info(jm).miss_reasons[1] == "self.fc1: forward hook added"


def test_forward_hook_removed_after_the_first_call():
    def step(model, state, i):
        if i == 1:
            state["handles"].pop().remove()
        return forward_step(model, state, i)

    jm = run_differential(with_hooks(lambda m, s: m.act.register_forward_hook(lambda mod, a, out: -out)), step)
    assert minijit.cache_info(jm).miss_reasons[1] == "self.act: forward hook removed"


def test_forward_hook_replaced_on_every_call():
    def step(model, state, i):
        if state["handles"]:
            state["handles"].pop().remove()
        state["handles"].append(model.fc2.register_forward_hook(lambda mod, args, out, i=i: out * (i + 2)))
        return forward_step(model, state, i)

    jm = run_differential(with_hooks(lambda m, s: []), step)
    assert minijit.cache_info(jm).misses == CALLS


def test_pre_hook_added_on_a_submodule_then_removed():
    def step(model, state, i):
        if i == 1:
            state["handles"].append(model.fc2.register_forward_pre_hook(lambda mod, args: (args[0] ** 2,)))
        if i == 2:
            state["handles"].pop().remove()
        return forward_step(model, state, i)

    jm = run_differential(with_hooks(lambda m, s: []), step)
    info = minijit.cache_info(jm)
    assert (info.misses, info.hits) == (2, 1)


def test_global_hook_added_after_the_first_call():
    eager, _ = net()()
    model, _ = net()()
    jm = minijit.jit(model)
    handle = None
    try:
        for i in range(CALLS):
            if i == 1:  # one global hook, seen by both models
                handle = torch_module.register_module_forward_hook(
                    lambda mod, args, out: out + 1 if isinstance(mod, nn.ReLU) else out)
            assert_same(forward_step(jm, {}, i), forward_step(eager, {}, i), f"call {i}")
    finally:
        if handle is not None:
            handle.remove()
    assert minijit.cache_info(jm).miss_reasons[1] == "torch.nn.modules.module: global forward hook added"


def test_hook_registered_through_the_jitted_module():
    def step(model, state, i):
        if i == 0:
            state["handles"].append(model.register_forward_hook(lambda mod, args, out: out.abs()))
        return grad_step(model, state, i)

    run_differential(with_hooks(lambda m, s: []), step)


def test_hook_on_a_jitted_submodule_of_an_eager_parent():
    def build(jit_child):
        model, state = net()()
        parent = nn.Sequential(nn.Linear(4, 4), model)
        state["handles"] = [model.fc2.register_forward_hook(lambda mod, args, out: out * -2)]
        if jit_child:
            parent[1] = minijit.jit(parent[1])
        return parent, state

    (eager, eager_state), (parent, state) = build(False), build(True)
    try:
        for i in range(CALLS):
            assert_same(grad_step(parent, state, i), grad_step(eager, eager_state, i), f"call {i}")
            assert_same_model(parent, eager)
    finally:
        for handle in (*eager_state["handles"], *state["handles"]):
            handle.remove()


def test_state_dict_hooks_through_the_jitted_module():
    def register(model, state):
        def post(module, sd, prefix, local_metadata):
            sd[prefix + "extra"] = torch.ones(1)
        return [model.register_state_dict_post_hook(post),
                model.register_load_state_dict_post_hook(lambda module, keys: state["loads"].append(len(keys.missing_keys)))]

    def step(model, state, i):
        sd = model.state_dict()
        sd.pop("extra")
        model.load_state_dict(sd, strict=False)
        return dict(model.state_dict())

    run_differential(with_hooks(register, loads=[]), step)


# -- old-style backward hooks: refused while grad mode is on (full ones run: test_full_backward_hooks.py) ----

BACKWARD_HOOKS = {
    "old-style backward hook": (lambda m: m.fc2.register_backward_hook(lambda mod, gin, gout: None),
                                r"Linear at self.fc2 has a backward hook \(register_backward_hook"),
    "global old-style backward hook": (lambda m: torch_module.register_module_backward_hook(lambda mod, gin, gout: None),
                                       r"every module .* \(register_module_backward_hook"),
}


@pytest.mark.parametrize("register, message", BACKWARD_HOOKS.values(), ids=BACKWARD_HOOKS.keys())
def test_backward_hooks_are_refused_with_grad(register, message):
    model, _ = net()()
    kind = torch_module._global_is_full_backward_hook  # kept by torch after removal: it refuses the other kind
    torch_module._global_is_full_backward_hook = None
    handle = register(model)
    try:
        jm = minijit.jit(model)
        for _ in range(CALLS):
            with pytest.raises(minijit.UnsupportedSyntaxError, match=message):
                jm(x_for(0))
    finally:
        handle.remove()
        torch_module._global_is_full_backward_hook = kind


# -- hooks with effects outside the model (part 2 decides: reproduced on every call, or refused) ----

def _eager_state_or_refused(build: Build, step: Step) -> None:
    try:
        run_differential(build, step)
    except minijit.MinijitError:
        pass


def test_hook_recording_activations_into_a_list():
    register = lambda m, s: m.fc1.register_forward_hook(lambda mod, args, out: s["acts"].append(out.detach()))
    _eager_state_or_refused(with_hooks(register, acts=[]), forward_step)


def test_hook_counting_calls():
    def register(model, state):
        def count(mod, args):
            state["calls"][type(mod).__name__] = state["calls"].get(type(mod).__name__, 0) + 1
        return model.fc2.register_forward_pre_hook(count)

    _eager_state_or_refused(with_hooks(register, calls={}), forward_step)


# -- the jitted module is an nn.Module ------------------------------------------------------------

def optimizer_step(make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> Step:
    def step(model, state, i):
        if "opt" not in state:
            state["opt"] = make_optimizer(model.parameters())
        state["opt"].zero_grad()
        loss = model(x_for(i)).square().mean()
        loss.backward()
        state["opt"].step()
        return loss.detach()
    return step


OPTIMIZERS = {
    "SGD momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "Adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_training_with_an_optimizer_on_the_jitted_parameters(make_optimizer):
    jm = run_differential(net(), optimizer_step(make_optimizer))
    assert minijit.cache_info(jm).misses == 1


def test_optimizer_state_dict_round_trip():
    def step(model, state, i):
        out = optimizer_step(OPTIMIZERS["Adam"])(model, state, i)
        state["opt"].load_state_dict(state["opt"].state_dict())
        return out

    run_differential(net(), step)


class Gated(Net):
    """Different arithmetic in training and in evaluation."""

    def forward(self, x, scale=1.0):
        out = super().forward(x, scale)
        return out * 2 if self.training else out - 1


def test_train_and_eval_each_call():
    def build():
        torch.manual_seed(0)
        return Gated(), {}

    def step(model, state, i):
        assert (model.train() if i % 2 else model.eval()) is model
        return grad_step(model, state, i)

    jm = run_differential(build, step, calls=4)
    assert minijit.cache_info(jm).misses == 2


@pytest.mark.parametrize("convert, dtype", [(lambda m: m.to(torch.float64), torch.float64),
                                            (lambda m: m.double(), torch.float64),
                                            (lambda m: m.bfloat16(), torch.bfloat16),
                                            (lambda m: m.to(dtype=torch.float16), torch.float16)],
                         ids=["to", "double", "bfloat16", "to-float16"])
def test_dtype_conversion_after_the_first_call(convert, dtype):
    def step(model, state, i):
        if i == 1:
            assert convert(model) is model
        x = x_for(i, torch.float32 if i == 0 else dtype)
        with torch.no_grad():
            return model(x)

    run_differential(net(), step)


def test_freezing_a_layer_with_requires_grad_():
    def step(model, state, i):
        if i == 1:
            assert model.fc1.requires_grad_(False) is model.fc1
        return grad_step(model, state, i)

    run_differential(net(), step)


def test_zero_grad_keeping_tensors():
    def step(model, state, i):
        out = model(x_for(i)).sum()
        out.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=False)
        return out.detach(), grads

    run_differential(net(), step)


def test_apply_reinitialises_the_weights():
    def init(module):
        if isinstance(module, nn.Linear):
            nn.init.constant_(module.weight, 0.1)
            nn.init.zeros_(module.bias)

    def step(model, state, i):
        if i == 1:
            assert model.apply(init) is model
        return grad_step(model, state, i)

    run_differential(net(), step)


def test_load_state_dict_from_another_model():
    def step(model, state, i):
        if i == 1:
            torch.manual_seed(1)
            model.load_state_dict(Net().state_dict())
        return grad_step(model, state, i)

    jm = run_differential(net(), step)
    assert minijit.cache_info(jm).misses == 1


def test_replacing_a_submodule_with_another_class():
    def step(model, state, i):
        if i == 1:
            model.act = nn.Tanh()
        return grad_step(model, state, i)

    jm = run_differential(net(), step)
    assert minijit.cache_info(jm).miss_reasons[1].startswith("self.act: module Tanh at")


def test_setting_an_attribute_read_by_forward():
    class Scaled(Net):
        def forward(self, x, scale=1.0):
            return super().forward(x, scale) * self.gain

    def build():
        torch.manual_seed(0)
        model = Scaled()
        model.gain = 1.0
        return model, {}

    def step(model, state, i):
        model.gain = float(i + 2)
        return forward_step(model, state, i)

    run_differential(build, step)


def test_deepcopy_gives_an_independent_model():
    def step(model, state, i):
        clone = copy.deepcopy(model)
        with torch.no_grad():
            clone.fc1.weight.mul_(i + 2)
            return clone(x_for(i)), model(x_for(i))

    run_differential(net(), step)


def test_pickle_round_trip_each_call():
    def step(model, state, i):
        loaded = pickle.loads(pickle.dumps(model))
        assert type(loaded) is type(model)
        out = grad_step(model, state, i)
        with torch.no_grad():
            return out, loaded(x_for(i))

    run_differential(net(), step)


def test_jitted_child_in_an_eager_parent_trains():
    def build(jit_child):
        torch.manual_seed(0)
        parent = nn.Sequential(nn.Linear(4, 4), nn.GELU(), Net())
        if jit_child:
            parent[2] = minijit.jit(parent[2])
        return parent, torch.optim.SGD(parent.parameters(), lr=0.05, momentum=0.5)

    (eager, eager_opt), (parent, opt) = build(False), build(True)
    assert list(parent.state_dict()) == list(eager.state_dict())
    for i in range(CALLS):
        for model, optimizer in ((eager, eager_opt), (parent, opt)):
            optimizer.zero_grad()
            model(x_for(i)).square().mean().backward()
            optimizer.step()
        assert_same_model(parent, eager)


def test_jit_of_a_parent_whose_child_is_jitted():
    def build(jit_child):
        torch.manual_seed(0)
        parent = nn.Sequential(nn.Linear(4, 4), nn.GELU(), Net())
        if jit_child:
            parent[2] = minijit.jit(parent[2])
        return parent

    eager, parent = build(False), build(True)
    jp = minijit.jit(parent)
    for i in range(CALLS):
        assert_same(grad_step(jp, {}, i), grad_step(eager, {}, i), f"call {i}")
        assert_same_model(parent, eager)
    assert minijit.cache_info(jp).misses == 1


def test_transformer_encoder_layer_trains():
    def build():
        torch.manual_seed(0)
        return nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True), {}

    def step(model, state, i):
        model.zero_grad()
        out = model(torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(i)))
        out.sum().backward()
        return out.detach()

    run_differential(build, step)
