"""torch.nn layers (convolution, normalization, pooling, resampling, recurrent) and a small ResNet under
minijit.jit: outputs, gradients and buffer updates equal eager's, call after call."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import minijit

RTOL, ATOL = 1e-4, 1e-5


def _close(have, want, what: str) -> None:
    torch.testing.assert_close(have, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _run_both(eager: nn.Module, make_inputs, calls: int = 2) -> minijit.JitFunction:
    """Call eager and jitted copies `calls` times: outputs, input and parameter gradients, buffers equal."""
    jitted = copy.deepcopy(eager)
    jm = minijit.jit(jitted)
    for call in range(calls):
        inputs = make_inputs()
        want_in = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
        have_in = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
        want, have = _first(eager(*want_in)), _first(jm(*have_in))
        _close(have, want, f"call {call}: output")
        ct = torch.randn_like(want)
        want.backward(ct)
        have.backward(ct)
        for w, h in zip(want_in, have_in):
            if w.grad is not None:
                _close(h.grad, w.grad, f"call {call}: input grad")
        for (name, p), q in zip(eager.named_parameters(), jitted.parameters()):
            _close(q.grad, p.grad, f"call {call}: grad of {name}")
        for (name, b), c in zip(eager.named_buffers(), jitted.buffers()):
            _close(c, b, f"call {call}: buffer {name}")
    return jm


LAYERS = {
    "Conv1d": (lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9)),
    "Conv2d": (lambda: nn.Conv2d(4, 6, (3, 2), dilation=(1, 2), groups=2, padding="same"), (2, 4, 7, 7)),
    "Conv2d_reflect": (lambda: nn.Conv2d(3, 4, 3, padding=2, padding_mode="reflect", bias=False), (2, 3, 6, 6)),
    "Conv2d_circular": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), (2, 3, 5, 6)),
    "Conv3d": (lambda: nn.Conv3d(2, 3, 2, stride=(1, 2, 1)), (1, 2, 4, 5, 4)),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), (2, 3, 4, 5)),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 4)),
    "InstanceNorm1d_running": (lambda: nn.InstanceNorm1d(3, track_running_stats=True), (2, 3, 6)),
    "LocalResponseNorm": (lambda: nn.LocalResponseNorm(3), (2, 5, 4, 4)),
    "MaxPool2d": (lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 7, 7)),
    "AvgPool2d": (lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (2, 3, 7, 6)),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d((3, 2)), (2, 3, 7, 5)),
    "AdaptiveMaxPool1d": (lambda: nn.AdaptiveMaxPool1d(4), (2, 3, 9)),
    "Upsample_bilinear": (lambda: nn.Upsample(scale_factor=1.5, mode="bilinear"), (2, 3, 4, 5)),
    "Upsample_nearest": (lambda: nn.Upsample(size=(6, 7)), (2, 3, 4, 5)),
    "PixelShuffle": (lambda: nn.PixelShuffle(2), (2, 8, 3, 3)),
    "LSTM": (lambda: nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True), (2, 3, 4)),
    "LSTM_proj": (lambda: nn.LSTM(4, 5, proj_size=3), (3, 2, 4)),
    "GRU": (lambda: nn.GRU(4, 5, num_layers=2), (3, 2, 4)),
    "RNN_relu_unbatched": (lambda: nn.RNN(4, 5, nonlinearity="relu", bias=False), (3, 4)),
    "LSTMCell": (lambda: nn.LSTMCell(4, 5), (2, 4)),
    "GRUCell": (lambda: nn.GRUCell(4, 5), (2, 4)),
    "RNNCell": (lambda: nn.RNNCell(4, 5), (2, 4)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_eager(name: str) -> None:
    torch.manual_seed(0)
    make, shape = LAYERS[name]
    jm = _run_both(make(), lambda: (torch.randn(shape),))
    info = minijit.cache_info(jm)
    assert (info.misses, info.hits) == (1, 1)


class WithState(nn.Module):
    """A recurrent layer called with an initial state."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, h, c=None):
        return self.layer(x, h if c is None else (h, c))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layer_with_initial_state(kind: str) -> None:
    torch.manual_seed(0)
    layer = getattr(nn, kind)(4, 5, num_layers=2)
    states = 2 if kind == "LSTM" else 1
    _run_both(WithState(layer), lambda: (torch.randn(3, 2, 4), *(torch.randn(2, 2, 5) for _ in range(states))))


def test_jitted_rnn_leaves_no_proxy_in_the_module() -> None:
    lstm = nn.LSTM(4, 5)
    x = torch.randn(3, 2, 4)
    minijit.jit(lstm)(x)
    assert all(w is p for w, p in zip(lstm._flat_weights, lstm.parameters()))
    assert all(r() is p for r, p in zip(lstm._flat_weight_refs, lstm.parameters()))
    torch.testing.assert_close(lstm(x)[0], minijit.jit(lstm)(x)[0])


@pytest.mark.parametrize("options", [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}],
                         ids=["default", "cumulative", "no_affine", "no_running_stats"])
def test_batch_norm_training_updates_buffers_like_eager(options) -> None:
    torch.manual_seed(0)
    _run_both(nn.BatchNorm2d(3, **options), lambda: (torch.randn(4, 3, 5, 5) * 2 + 1,), calls=3)


def test_batch_norm_eval_and_train_again() -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    jitted = copy.deepcopy(eager)
    jm = minijit.jit(jitted)
    for training in (True, False, True):
        eager.train(training)
        jm.train(training)
        x = torch.randn(5, 4)
        _close(jm(x), eager(x), f"training={training}")
        _close(jitted[1].running_mean, eager[1].running_mean, "running_mean")
        _close(jitted[1].running_var, eager[1].running_var, "running_var")
        assert jitted[1].num_batches_tracked.item() == eager[1].num_batches_tracked.item()
    assert minijit.cache_info(jm).misses == 2  # train and eval traces, the first reused


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, classes)

    def forward(self, x, target):
        logits = self.head(torch.flatten(self.pool(self.layers(self.stem(x))), 1))
        return nn.functional.cross_entropy(logits, target)


def test_small_resnet_trains_like_eager() -> None:
    torch.manual_seed(0)
    eager = ResNet()
    jitted = copy.deepcopy(eager)
    jm = minijit.jit(jitted)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_j = torch.optim.SGD(jitted.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, target = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        loss_e, loss_j = eager(x, target), jm(x, target)
        _close(loss_j, loss_e, f"step {step}: loss")
        loss_e.backward()
        loss_j.backward()
        for (name, p), q in zip(eager.named_parameters(), jitted.parameters()):
            _close(q.grad, p.grad, f"step {step}: grad of {name}")
        opt_e.step()
        opt_j.step()
        opt_e.zero_grad()
        opt_j.zero_grad()
        for (name, b), c in zip(eager.named_buffers(), jitted.buffers()):
            _close(c, b, f"step {step}: buffer {name}")
    eager.eval()
    jm.eval()
    x, target = torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))
    with torch.no_grad():
        _close(jm(x, target), eager(x, target), "eval loss")
    info = minijit.cache_info(jm)
    assert (info.misses, info.hits) == (2, 2)
