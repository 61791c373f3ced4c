"""minijit.jit(module): parameters are inputs, weights update without re-tracing, train/eval re-trace."""

import pytest
import torch

import minijit


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x)))) + self.shift


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return MLP().eval()


def test_module_output_equals_eager_and_params_are_named_inputs(mlp):
    jm = minijit.jit(mlp)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(jm(x), mlp(x))
    header = minijit.last_traces(jm)[-1].python().splitlines()[0]
    assert header == "def mlp_forward(fc1_weight, fc1_bias, fc2_weight, fc2_bias, shift, x):"


def test_changing_parameter_values_does_not_retrace(mlp):
    jm = minijit.jit(mlp)
    x = torch.randn(3, 8)
    with torch.no_grad():
        jm(x)
        mlp.fc1.weight.mul_(2.0)
        mlp.shift.add_(1.0)
        torch.testing.assert_close(jm(x), mlp(x))
        mlp.fc2.weight = torch.nn.Parameter(torch.randn(4, 16))  # a new Parameter object
        torch.testing.assert_close(jm(x), mlp(x))
    info = minijit.cache_info(jm)
    assert (info.misses, info.hits) == (1, 2)


def test_train_and_eval_retrace(mlp):
    jm = minijit.jit(mlp)
    x = torch.randn(3, 8)
    with torch.no_grad():
        jm(x)
        assert jm.train() is jm and mlp.training
        out = jm(x)
        assert out.shape == (3, 4)
        jm.eval()
        torch.testing.assert_close(jm(x), mlp(x))
    info = minijit.cache_info(jm)
    assert (info.misses, info.hits) == (2, 1)
    assert info.miss_reasons[1].startswith("self.training: value True (bool) != False (bool)")


def test_a_replaced_submodule_is_seen(mlp):
    jm = minijit.jit(mlp)
    x = torch.randn(3, 8)
    with torch.no_grad():
        jm(x)
        mlp.fc2 = torch.nn.Linear(16, 4)
        torch.testing.assert_close(jm(x), mlp(x))


def test_tied_weights_are_one_input():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 6)
            self.head = torch.nn.Linear(6, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx):
            return self.head(self.emb(idx))

    model = Tied()
    jm = minijit.jit(model)
    idx = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(jm(idx), model(idx))
    assert minijit.last_traces(jm)[-1].python().splitlines()[0] == "def tied_forward(emb_weight, idx):"


def test_module_api_passes_through(mlp):
    jm = minijit.jit(mlp)
    assert list(jm.parameters()) == list(mlp.parameters())
    assert jm.state_dict().keys() == mlp.state_dict().keys()
    assert jm.fc1 is mlp.fc1
    jm.new_attribute = 3
    assert mlp.new_attribute == 3


def test_a_submodule_of_another_class_is_a_new_trace(mlp):
    jm = minijit.jit(mlp)
    x = torch.randn(3, 8)
    with torch.no_grad():
        jm(x)
        mlp.drop = torch.nn.Tanh()
        torch.testing.assert_close(jm(x), mlp(x))
    assert minijit.cache_info(jm).miss_reasons[1].startswith("self.drop: module Tanh at 0x")


def test_hooks_present_when_jitted_run_as_in_eager(mlp):
    mlp.fc1.register_forward_hook(lambda module, args, out: out * 2)
    mlp.register_forward_pre_hook(lambda module, args: (args[0] + 1,))
    jm = minijit.jit(mlp)
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(jm(x), mlp(x))
    assert (minijit.cache_info(jm).misses, minijit.cache_info(jm).hits) == (1, 1)


def test_a_hook_added_or_removed_later_is_an_explained_retrace(mlp):
    present = mlp.fc2.register_forward_hook(lambda module, args, out: out - 1)
    jm = minijit.jit(mlp)
    x = torch.randn(2, 8)
    with torch.no_grad():
        jm(x)
        added = mlp.fc1.register_forward_hook(lambda module, args, out: out + 4.3)
        torch.testing.assert_close(jm(x), mlp(x))
        added.remove()
        torch.testing.assert_close(jm(x), mlp(x))  # the first entry again: a hit
        present.remove()
        torch.testing.assert_close(jm(x), mlp(x))
        mlp.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
        torch.testing.assert_close(jm(x), mlp(x))
    info = minijit.cache_info(jm)
    assert info.miss_reasons[1:] == ["self.fc1: forward hook added", "self.fc2: forward hook removed",
                                     "self: forward pre-hook added"]
    assert (info.misses, info.hits) == (4, 1)


def test_a_global_hook_is_seen_by_every_module(mlp):
    jm = minijit.jit(mlp)
    x = torch.randn(2, 8)

    def shift_linears(module, args, out):
        return out + 1 if isinstance(module, torch.nn.Linear) else out

    with torch.no_grad():
        jm(x)
        handle = torch.nn.modules.module.register_module_forward_hook(shift_linears)
        try:
            torch.testing.assert_close(jm(x), mlp(x))
        finally:
            handle.remove()
        torch.testing.assert_close(jm(x), mlp(x))
    reasons = minijit.cache_info(jm).miss_reasons
    assert reasons[1] == "torch.nn.modules.module: global forward hook added"
    assert minijit.cache_info(jm).misses == 2


def test_old_style_backward_hooks_are_refused_under_grad_and_skipped_without(mlp):
    # Full backward hooks and pre-hooks run (tests/semantics/test_full_backward_hooks.py); the old kind sees the
    # last autograd node of the module's forward, which a trace does not have.
    mlp.fc2.register_backward_hook(lambda module, gin, gout: None)
    jm = minijit.jit(mlp)
    x = torch.randn(2, 8)
    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"Linear at self.fc2 has a backward hook \(register_"):
        jm(x)
    with torch.no_grad():  # backward hooks never run without grad: the trace leaves them out
        torch.testing.assert_close(jm(x), mlp(x))


def test_a_global_old_style_backward_hook_is_refused_under_grad(mlp):
    module = torch.nn.modules.module
    kind = module._global_is_full_backward_hook  # kept by torch after removal: it refuses the other kind
    module._global_is_full_backward_hook = None
    handle = module.register_module_backward_hook(lambda module, gin, gout: None)
    try:
        with pytest.raises(minijit.UnsupportedSyntaxError, match=r"every module .*\(register_module_backward_hook"):
            minijit.jit(mlp)(torch.randn(2, 8))
    finally:
        handle.remove()
        module._global_is_full_backward_hook = kind


class _Named(torch.nn.Module):
    """A forward taking arguments named as minijit's own leading ones (RWKV's forward takes `state`)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x, state=None, params=None):
        return self.fc(x) * state + params.sum()


class _Keywords(_Named):
    def forward(self, x, **kwargs):
        return self.fc(x) * kwargs["state"] + kwargs["params"].sum()


@pytest.mark.parametrize("cls", [_Named, _Keywords])
def test_arguments_named_params_or_state_are_the_callers(cls):
    torch.manual_seed(0)
    module = cls()
    jm = minijit.jit(module)
    for n in (2, 2, 4):  # a new shape, then other values of the same
        x, state, params = torch.randn(n, 3), torch.randn(3), torch.randn(n)
        torch.testing.assert_close(jm(x, state=state, params=params), module(x, state=state, params=params))
