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


def test_forward_hooks_are_refused_clearly(mlp):
    mlp.fc1.register_forward_hook(lambda module, args, out: out * 2)
    jm = minijit.jit(mlp)
    with pytest.raises(minijit.UnsupportedSyntaxError, match="Linear has forward or backward hooks"):
        jm(torch.randn(2, 8))
