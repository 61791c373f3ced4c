"""`torch.compile(model, backend="minijit")`: each graph Dynamo captures runs through minijit; values and
gradients equal eager's, across graph breaks and for a Hugging Face model."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import minijit
import minijit.backend


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    minijit.backend.minijit_backend.reset()
    yield
    torch._dynamo.reset()


class Branchy(nn.Module):
    """A data-dependent branch (a graph break), a buffer updated in place, and a no_grad region."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        with torch.no_grad():
            self.seen.add_(h.mean(0))
        if h.sum() > 0:
            return self.b(h).relu()
        return self.b(-h) * self.seen.sum()


def _compare(model: nn.Module, inputs: list, out=lambda o: o, rtol: float = 1.3e-6, atol: float = 1e-5) -> nn.Module:
    """Eager `model` against `torch.compile(copy, backend="minijit")`: outputs, gradients, buffers."""
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="minijit")
    for i, args in enumerate(inputs):
        want, have = out(model(*args)), out(compiled(*args))
        torch.testing.assert_close(have, want, rtol=rtol, atol=atol, msg=lambda m, i=i: f"call {i}: {m}")
        want.sum().backward()
        have.sum().backward()
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}.grad: {m}")
    for p, q in zip(model.buffers(), compiled_model.buffers(), strict=True):
        torch.testing.assert_close(q, p)
    return compiled


def test_graph_break_pieces_run_through_minijit():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    _compare(Branchy(), [(x,), (-x,), (x,)])
    pieces = minijit.backend.pieces()
    assert len(pieces) >= 3  # before the branch, and each side of it
    traces = minijit.backend.last_traces()
    assert len(traces) == len(pieces)
    for piece_traces in traces:
        source = piece_traces[-1].python()
        assert "torchex." in source  # run by minijit's executors
    assert any("copy_to_out_" in t[-1].python() for t in traces)  # the buffer update, written in place
    assert any(t for t in minijit.backend.last_backward_traces())
    assert sum(info.hits for info in minijit.backend.cache_info()) >= 1  # the third call reuses traces


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)

    def inner(self, x):
        return self.b(torch.tanh(self.a(x)))

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False).sum(-1)


def test_checkpoint_in_a_dynamo_graph():
    # Dynamo keeps the checkpointed function as a subgraph under torch.ops.higher_order.tag_activation_checkpoint.
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    _compare(Checkpointed(), [(x,)])
    assert "tag_activation_checkpoint" in minijit.backend.pieces()[0].fn.__self__.code  # the graph minijit ran


class _GeLU(torch.autograd.Function):
    """BLOOM's GeLUFunction: a tanh GeLU saving its input, its backward written out."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return g * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))


class CustomFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        return _GeLU.apply(self.a(x)).sum(-1)


def test_a_custom_autograd_function_in_a_dynamo_graph(recwarn):
    # Dynamo keeps it as torch.ops.higher_order.autograd_function_apply(fwd_body, bwd_body, *args): traced as the
    # custom Function it stands for, not run eagerly (no TracingRaisedWarning).
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    _compare(CustomFunction(), [(x,)])
    assert "autograd_function_apply" in minijit.backend.pieces()[0].fn.__self__.code
    assert "autograd_function." in minijit.backend.last_traces()[0][0].python()  # as captured
    assert not [w for w in recwarn if issubclass(w.category, minijit.TracingRaisedWarning)]


def test_sizes_dynamo_made_dynamic_stay_symbolic():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).view(x.shape[0], 2, 2).softmax(-1).reshape(-1, 4)

    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="minijit", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), model(x))
    (piece,) = minijit.backend.pieces()
    assert minijit.cache_info(piece).misses == 1  # one trace for the three sizes


def test_a_backend_with_options():
    backend = minijit.backend.Backend(cache="no caching")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), model(x))
    (piece,) = backend.pieces()
    assert minijit.cache_info(piece).misses == 2 and not minijit.backend.pieces()


def test_hugging_face_llama_matches_eager():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 8))
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="minijit")
    for _ in range(2):
        want, have = model(input_ids=ids, labels=ids), compiled(input_ids=ids, labels=ids)
        torch.testing.assert_close(have.logits, want.logits)
        torch.testing.assert_close(have.loss, want.loss)
        want.loss.backward()
        have.loss.backward()
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, name=name: f"{name}.grad: {m}")
    assert minijit.backend.pieces() and all("torchex." in t[-1].python() for t in minijit.backend.last_traces())


def test_a_backward_called_in_compiled_code_is_not_captured_by_dynamo():
    """`loss.backward()` inside the compiled function: autograd runs the pieces' backward from a frame Dynamo
    evaluates; minijit's generated backward is skipped by Dynamo with all it calls. (It was captured as user code and
    jitted again as more pieces; an opaque op's gradient, weight_norm's, then ran Dynamo out of memory.)"""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    compiled_model = copy.deepcopy(model)

    def step(m, x, y):
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        return loss.detach()

    compiled_step = torch.compile(step, backend="minijit")
    for n in (3, 5):
        x, y = torch.randn(n, 4), torch.randn(n, 3)
        torch.testing.assert_close(compiled_step(compiled_model, x, y), step(model, x, y))
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    traced = [n.meta.get("stack_trace", "") for piece in minijit.backend.pieces() for n in piece.fn.__self__.graph.nodes]
    assert not any("<minijit" in t for t in traced)
