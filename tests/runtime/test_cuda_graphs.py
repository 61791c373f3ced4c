"""`minijit.jit(fn, cuda_graphs=True)` against eager PyTorch.

Without a GPU, a stand-in for torch.cuda's graphs runs on the CPU (`FakeGraphs`): its capture
runs the function and then puts the inputs back (a capture records, it does not run), and its
replay runs the function again on the call's arguments, writing the results into the
tensors the capture returned, as a replay writes into the graph's memory (it reads the arguments of
the call: a CUDA graph reads the addresses it was captured with, which hold them). That checks
what the runtime does around a graph (buffers, inputs read in place, results copied out,
views handed out and waited for, captures again when an input moves) against eager. The
`cuda`-marked tests run the real graphs on a GPU, HF Llama training with AdamW among them.
"""

from __future__ import annotations

import gc
import types
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import minijit
from minijit.ir import tree_flatten
from minijit.runtime import cuda_graphs
from minijit.testing import tolerance


class FakeGraphs:
    """Graphs on the CPU: capture leaves the inputs as they were; replay writes into the captured results."""

    device_type = "cpu"

    @staticmethod
    def capture(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, Any]:
        before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
        with torch.no_grad():
            result = fn(*args)
            for a, b in zip(args, before):
                if b is not None:
                    a.copy_(b)
        return types.SimpleNamespace(fn=fn, result=result), result  # holding no argument, as a CUDA graph

    @staticmethod
    def replay(graph: Any, inputs: tuple[Any, ...], buffers: list[Any]) -> None:
        with torch.no_grad():
            fresh = graph.fn(*(x if b is None else b for x, b in zip(inputs, buffers)))
            for static, new in zip(tree_flatten(graph.result), tree_flatten(fresh)):
                if isinstance(static, torch.Tensor):
                    static.copy_(new)


@pytest.fixture
def fake_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_graphs, "BACKEND", FakeGraphs)


def _parts(jitted: Any) -> str:
    return "\n".join(minijit.cache_info(jitted).cuda_graphs)


def _replays(jitted: Any, part: str) -> int:
    """Replays of the jitted function's graphed `part` ("forward", "backward", "computation"), all entries."""
    return sum(int(line.split(": ", 1)[1].split(" replay")[0]) for line in minijit.cache_info(jitted).cuda_graphs
               if line.startswith(f"{part}: "))


def _train(model: nn.Module, opt_step: Callable[[], Any], opt: torch.optim.Optimizer, steps: int,
           device: str = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Losses of `steps` steps on fresh batches, then the parameters."""
    losses = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(6, 4, generator=gen).to(device)
        loss = model(x).square().mean()
        loss.backward()
        opt_step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in model.parameters()]


def _mlp(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)


@pytest.mark.parametrize("optimizer", ["SGD momentum", "Adam"])
def test_training_steps_match_eager(fake_graphs: None, optimizer: str) -> None:
    def make(model: nn.Module) -> torch.optim.Optimizer:
        if optimizer == "Adam":
            return torch.optim.Adam(model.parameters(), lr=0.01)
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    eager_model = _mlp()
    eager_opt = make(eager_model)
    want = _train(eager_model, eager_opt.step, eager_opt, steps=5)
    model = _mlp()
    opt = make(model)
    jmodel = minijit.jit(model, cuda_graphs=True)
    step = minijit.jit(lambda: opt.step(), cuda_graphs=True)
    have = _train(jmodel, step, opt, steps=5)
    for h, w in zip(have, want, strict=True):
        torch.testing.assert_close(h, w)
    # Gradients kept by the optimizer's entry (its trace's first inputs) keep a backward graph busy: a second.
    assert _replays(jmodel, "forward") == 3 and _replays(jmodel, "backward") >= 2
    # The optimizer's first step makes its state: a second entry, whose second call captures.
    assert _replays(step, "forward") + _replays(step, "computation") == 2


def test_results_are_not_overwritten_by_later_replays(fake_graphs: None) -> None:
    f = minijit.jit(lambda x, w: (x @ w).sin(), cuda_graphs=True)
    w = torch.randn(4, 4)
    xs = [torch.randn(3, 4) for _ in range(5)]
    outs = [f(x, w) for x in xs]  # every output held while the later calls replay
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, (x @ w).sin())
    assert "3 capture(s)" in _parts(f) and "hold results still alive" in _parts(f)


def test_two_forwards_before_one_backward(fake_graphs: None) -> None:
    """The first forward's saved views are alive at the second: that one replays a second graph."""
    w = torch.randn(4, 4, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    f = minijit.jit(lambda x, w: (x @ w).tanh().sum(), cuda_graphs=True)
    for i in range(4):
        x1, x2 = torch.randn(3, 4), torch.randn(3, 4)
        (f(x1, w) + f(x2, w)).backward()
        ((x1 @ w_eager).tanh().sum() + (x2 @ w_eager).tanh().sum()).backward()
        torch.testing.assert_close(w.grad, w_eager.grad)
    assert "forward: 5 replay(s), 2 capture(s)" in _parts(f)


def test_writes_into_new_input_tensors(fake_graphs: None) -> None:
    """An input that lives somewhere new on each call is copied into the graph's buffer and back."""
    def f(buf, x):
        buf.mul_(2).add_(x)
        return buf.sum()

    jf = minijit.jit(f, cuda_graphs=True)
    for _ in range(4):
        buf, x = torch.randn(5), torch.randn(5)
        buf_eager = buf.clone()
        torch.testing.assert_close(jf(buf, x), f(buf_eager, x))
        torch.testing.assert_close(buf, buf_eager)
    assert "2 replay(s)" in _parts(jf)


def test_input_read_in_place_moves(fake_graphs: None) -> None:
    """A parameter given new storage (`p.data = ...`) is captured again, in a buffer of the graph's own."""
    lin = nn.Linear(4, 4)
    jlin = minijit.jit(lin, cuda_graphs=True)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for i in range(5):
            if i == 3:
                lin.weight.data = torch.randn(4, 4)
            torch.testing.assert_close(jlin(x), lin(x))
    assert "2 capture(s)" in _parts(jlin)


def test_results_that_view_inputs_are_views_of_the_calls_inputs(fake_graphs: None) -> None:
    """A result that is a view of an input (a slice, the saved input of a backward, a gradient passed through)
    is that view of the call's own input, as an ordinary run returns it."""
    f = minijit.jit(lambda x: (x[1:], x * 2), cuda_graphs=True)
    for _ in range(6):
        x = torch.randn(4)
        view, doubled = f(x)
        assert view._base is x and view.data_ptr() == x[1:].data_ptr()
        torch.testing.assert_close(doubled, x * 2)
    # (the second call's input may sit where the first call's did: read in place, then captured again buffered)
    assert _replays(f, "computation") >= 2


def test_value_reads_and_seeding_are_never_captured(fake_graphs: None) -> None:
    """`.item()` waits for the device (a capture would fail); `torch.manual_seed` inside would run only at the
    capture, so replays would draw from whatever state the generator had."""
    f = minijit.jit(lambda x: x * x.sum().item(), cuda_graphs=True)
    g = minijit.jit(lambda x: (torch.manual_seed(0), x + 1)[1], cuda_graphs=True)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(f(x), x * x.sum().item())
        torch.testing.assert_close(g(x), x + 1)
    assert "item synchronizes with the CPU" in _parts(f) and _replays(f, "computation") == 0
    assert "manual_seed sets or reads the random generator's state" in _parts(g) and _replays(g, "computation") == 0


def test_symbolic_sizes_read_in_the_trace_do_not_wait_for_the_device(fake_graphs: None) -> None:
    """`prims.shape` reads metadata only: a trace of symbolic sizes replays (one graph per size)."""
    f = minijit.jit(lambda x: x.reshape(-1) * x.shape[0], cache="symbolic values", cuda_graphs=True)
    for n in (3, 3, 3, 5, 5, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(f(x), x.reshape(-1) * n)
    assert _replays(f, "computation") >= 2, _parts(f)


def test_cpu_tensors_and_cpu_random_are_named() -> None:
    """With torch's graphs on a CPU-only call: ordinary launches, the reason in cache_info."""
    f = minijit.jit(lambda x: x * 2, cuda_graphs=True)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2)
    assert "input 0 (x) is a cpu tensor" in str(minijit.cache_info(f))
    g = minijit.jit(lambda x: torch.nn.functional.dropout(x, 0.5), cuda_graphs=True)
    g(x)
    assert "draws random numbers on cpu" in _parts(g)


# -- on a GPU ---------------------------------------------------------------------------------------------------

def cuda(test: Callable[..., Any]) -> Callable[..., Any]:
    """A test of real CUDA graphs: marked `cuda`, skipped with the reason where there is no GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


@cuda
@pytest.mark.parametrize("executors", [None, ["triton"]])
def test_cuda_mlp_training_with_capturable_adam(executors: list[str] | None) -> None:
    eager_model = _mlp("cuda")
    eager_opt = torch.optim.Adam(eager_model.parameters(), lr=0.01, capturable=True)
    want = _train(eager_model, eager_opt.step, eager_opt, steps=5, device="cuda")
    model = _mlp("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    jmodel = minijit.jit(model, executors=executors, cuda_graphs=True)
    step = minijit.jit(lambda: opt.step(), executors=executors, cuda_graphs=True)
    have = _train(jmodel, step, opt, steps=5, device="cuda")
    for h, w in zip(have, want, strict=True):
        torch.testing.assert_close(h, w, **tolerance(torch.float32, 8))
    assert _replays(jmodel, "forward") == 3 and _replays(jmodel, "backward") >= 2
    assert _replays(step, "forward") + _replays(step, "computation") == 2


@cuda
def test_cuda_default_adam_runs_ordinarily_and_matches() -> None:
    """torch.optim.Adam keeps `step` on the CPU: its step cannot be replayed, and says so."""
    eager_model = _mlp("cuda")
    eager_opt = torch.optim.Adam(eager_model.parameters(), lr=0.01)
    want = _train(eager_model, eager_opt.step, eager_opt, steps=4, device="cuda")
    model = _mlp("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = minijit.jit(lambda: opt.step(), cuda_graphs=True)
    have = _train(minijit.jit(model, cuda_graphs=True), step, opt, steps=4, device="cuda")
    for h, w in zip(have, want, strict=True):
        torch.testing.assert_close(h, w, **tolerance(torch.float32, 8))
    assert "cpu tensor" in _parts(step)


@cuda
def test_cuda_dropout_draws_anew_on_each_replay() -> None:
    """Philox offsets advance per replay: the draws equal eager's from the same seed, and differ per step."""
    def f(x):
        return torch.nn.functional.dropout(x, 0.5).sum(dim=0)

    jf = minijit.jit(f, cuda_graphs=True)
    x = torch.ones(64, 1024, device="cuda")
    torch.manual_seed(1)
    want = [f(x) for _ in range(5)]
    torch.manual_seed(1)
    have = [jf(x).clone() for _ in range(5)]  # each result let go at once: one graph replays
    for h, w in zip(have, want):
        torch.testing.assert_close(h, w)
    assert not torch.equal(have[3], have[4])
    assert "3 replay(s)" in _parts(jf)


@cuda
def test_cuda_sync_in_trace_is_named() -> None:
    def f(x):
        return x * x.sum().item()

    jf = minijit.jit(f, cuda_graphs=True)
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        torch.testing.assert_close(jf(x), f(x))
    assert "synchronizes with the CPU" in _parts(jf)


@cuda
def test_cuda_hf_llama_three_steps_with_adamw() -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    def run(jitted: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = LlamaForCausalLM(config).cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
        forward = minijit.jit(lambda ids: model(input_ids=ids, labels=ids).loss, cuda_graphs=True) if jitted \
            else (lambda ids: model(input_ids=ids, labels=ids).loss)
        step = minijit.jit(lambda: opt.step(), cuda_graphs=True) if jitted else opt.step
        gen = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(3 + 3):  # warm-up steps (ordinary, then capture; AdamW's first makes its state), 3 replays
            ids = torch.randint(3, 256, (2, 16), generator=gen).cuda()
            loss = forward(ids)
            loss.backward()
            step()
            opt.zero_grad()
            losses.append(loss.detach())
        if jitted:
            assert _replays(forward, "forward") == 4 and _replays(forward, "backward") >= 3, _parts(forward)
            assert _replays(step, "forward") + _replays(step, "computation") == 3, _parts(step)
        return losses + [p.detach() for p in model.parameters()]

    for h, w in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(h, w, **tolerance(torch.float32, 64))


def test_kinds_of_call_past_the_bound_are_forgotten(fake_graphs: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A number traced as a symbolic value, passed anew on each call: each value is a kind of call of its own.
    made: list[weakref.ref[Any]] = []

    class Graph(types.SimpleNamespace):  # one that a weakref can watch
        pass

    class Counting(FakeGraphs):
        @staticmethod
        def capture(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, Any]:
            graph, result = FakeGraphs.capture(fn, args)
            graph = Graph(**vars(graph))
            made.append(weakref.ref(graph))
            return graph, result

    monkeypatch.setattr(cuda_graphs, "BACKEND", Counting)
    jf = minijit.jit(lambda x, s: x * s, cache="symbolic values", cuda_graphs=True)
    x = torch.randn(4)
    for k in range(3 * cuda_graphs.MAX_KINDS):
        for _ in range(3):  # ordinary launches, a capture, a replay
            torch.testing.assert_close(jf(x, k + 0.5), x * (k + 0.5))
    gc.collect()
    assert len(made) == 3 * cuda_graphs.MAX_KINDS and minijit.cache_info(jf).entries == 1
    assert sum(r() is not None for r in made) == cuda_graphs.MAX_KINDS
