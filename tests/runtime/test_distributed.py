"""DDP, FSDP2 and tensor parallelism with minijit, in both orders and through torch.compile(backend="minijit"): 3 SGD
steps on 2 gloo ranks (127.0.0.1, CPU) give eager DDP's / FSDP2's / TP's losses and parameters, or a MinijitError
naming the patterns that work. One pair of processes runs every pattern; each test checks one.
(`torch.compile(DDP(m), backend="minijit")`, whose DDP graph splitting takes seconds to compile, is in
examples/distributed.py.)"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import socket
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import minijit
import minijit.backend

_spec = importlib.util.spec_from_file_location(
    "distributed_example", pathlib.Path(__file__).parents[2] / "examples" / "distributed.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)  # its Llama block, torchtitan's plan for it and jit_leaves

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

STEPS, WORLD = 3, 2


class Net(nn.Sequential):
    """An MLP whose forward is user code (Dynamo compiles no frame of torch.nn's own, such as Sequential.forward)."""

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


def _model() -> Net:
    torch.manual_seed(0)
    return Net(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _shard_layers(m: Net, wrap=lambda layer: layer) -> Net:
    """FSDP2 per layer: each Linear, wrapped by `wrap` first, is a unit; then the root."""
    from torch.distributed.fsdp import fully_shard

    for i, layer in enumerate(m):
        if isinstance(layer, nn.Linear):
            m[i] = fully_shard(wrap(layer))
    return fully_shard(m)


def _patterns() -> dict[str, tuple[str, Any]]:
    """name -> (the eager pattern it must equal, a function building the model to train)."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    return {
        "DDP eager": ("DDP eager", lambda: DDP(_model())),
        "DDP(jit(m))": ("DDP eager", lambda: DDP(minijit.jit(_model()))),
        "jit(DDP(m))": ("DDP eager", lambda: minijit.jit(DDP(_model()))),
        "jit(DDP(jit(m)))": ("DDP eager", lambda: minijit.jit(DDP(minijit.jit(_model())))),
        "FSDP2 eager, per layer": ("FSDP2 eager, per layer", lambda: _shard_layers(_model())),
        "fully_shard(jit(m))": ("FSDP2 eager, per layer", lambda: fully_shard(minijit.jit(_model()))),
        "jit(fully_shard(m))": ("FSDP2 eager, per layer", lambda: minijit.jit(fully_shard(_model()))),
        "fully_shard(jit(layer)) per layer, then fully_shard(m)":
            ("FSDP2 eager, per layer", lambda: _shard_layers(_model(), minijit.jit)),
        "per-layer fully_shard, then jit(m)": ("FSDP2 eager, per layer", lambda: minijit.jit(_shard_layers(_model()))),
        # torch 2.13's Dynamo compiles no graph of a module whose FSDP2 hooks run inside it (it skips the frame):
        # torch.compile goes under fully_shard, as minijit.jit does.
        "fully_shard(torch.compile(layer, backend='minijit')) per layer":
            ("FSDP2 eager, per layer", lambda: _shard_layers(_model(), lambda m: torch.compile(m, backend="minijit"))),
    }


def _jitted_calls(model: nn.Module) -> int:
    """Calls that went through minijit: of jitted modules anywhere in `model`, and of torch.compile pieces."""
    calls = sum(info.hits + info.misses for info in minijit.backend.cache_info())
    seen, todo = set(), [model]
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if isinstance(m, minijit.JitModule):
            info = minijit.cache_info(m)
            calls += info.hits + info.misses
            todo += [m._orig_mod, *m.__dict__.get("_minijit_wrapped", ())[2:]]
        todo += [c for c in vars(m).get("_modules", {}).values() if c is not None]
        todo += [vars(m)["_orig_mod"]] if "_orig_mod" in vars(m) else []  # torch.compile's OptimizedModule
    return calls


def _train(model: nn.Module, rank: int) -> tuple[list[float], list[torch.Tensor], int]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(STEPS):
        g = torch.Generator().manual_seed(10 * i + rank)  # each rank its own batch
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return losses, [p.detach().clone() for p in params], _jitted_calls(model)


def _refused_calls() -> dict[str, Exception | None]:
    """Communication reached by traced code itself (not through DDP/FSDP2 around a jitted module): refused."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model())

    def barrier_inside(x):
        dist.barrier()
        return x * 2

    found: dict[str, Exception | None] = {}
    for name, fn in {"dist.barrier()": barrier_inside, "DDP.forward traced": lambda x: ddp.forward(x)}.items():
        try:
            minijit.jit(fn)(torch.randn(4, 8))
            found[name] = None
        except minijit.MinijitError as e:
            found[name] = e
    return found


def _tp_patterns() -> dict[str, Any]:
    """Tensor parallelism (the same batch on every rank): name -> a function building the model to train."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (WORLD,))
    tp = lambda m: parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return {
        "one process": _model,
        "TP eager": lambda: tp(_model()),
        "jit(TP(m))": lambda: minijit.jit(tp(_model())),
        "TP(m), then jit(layer) per layer": lambda: _jit_layers(tp(_model())),
        "a parallelized layer never called": lambda: _uncalled_layer(mesh),
        "jit, a parallelized layer never called": lambda: minijit.jit(_uncalled_layer(mesh)),
        "Llama block, sequence parallel": lambda: _block(mesh),
        "Llama block, sequence parallel, then jit_leaves": lambda: example.jit_leaves(_block(mesh)),
        "jit(sequence parallel Llama block)": lambda: minijit.jit(_block(mesh)),
    }


class _SkipsLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = _model(), nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def _uncalled_layer(mesh: Any) -> nn.Module:
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    return parallelize_module(_SkipsLayer(), mesh, {"unused": ColwiseParallel()})


def _block(mesh: Any) -> nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    return parallelize_module(example.Block(), mesh, example.block_plan())


def _train_sequence_parallel(model: nn.Module, rank: int) -> tuple[list[float], list[torch.Tensor], int]:
    """As `_train`, each rank given its half of the sequence of the same batch (the block's input and output
    are sharded along the sequence)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(STEPS):
        g = torch.Generator().manual_seed(10 * i)
        x, y = (t.chunk(WORLD, dim=1)[rank] for t in (torch.randn(2, 8, 16, generator=g), torch.randn(2, 8, 16, generator=g)))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.full_tensor().detach().clone() for p in model.parameters()], _jitted_calls(model)


def _jit_layers(m: Net) -> Net:
    """Each layer of `m` jitted in place: the parallelized Linears (DTensor parameters, hooks run around the
    compiled call) and the layers between them."""
    for i, layer in enumerate(m):
        m[i] = minijit.jit(layer)
    return m


def _tp_results(rank: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, build in _tp_patterns().items():
        try:
            found[name] = _train_sequence_parallel(build(), rank) if "Llama" in name else _train(build(), rank=0)
        except minijit.MinijitError as e:
            found[name] = e
        except Exception:
            found[name] = RuntimeError(traceback.format_exc())
    return found


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results: dict[str, Any] = {}
    try:
        for name, (_, build) in _patterns().items():
            try:
                results[name] = _train(build(), rank)
            except minijit.MinijitError as e:
                results[name] = e
            except Exception:
                results[name] = RuntimeError(traceback.format_exc())
            torch._dynamo.reset()
            minijit.backend.minijit_backend.reset()
        results["refused"] = _refused_calls()
        results["tp"] = _tp_results(rank)
    finally:
        dist.destroy_process_group()
    torch.save(results, f"{out}.{rank}")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path_factory.mktemp("distributed") / "results")
    mp.spawn(_worker, args=(port, out), nprocs=WORLD)
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(WORLD)]


def _assert_same(results: list[dict[str, Any]], name: str, eager: str) -> None:
    for rank, per_rank in enumerate(results):
        have = per_rank[name]
        if isinstance(have, Exception):
            raise AssertionError(f"rank {rank}: {name} raised {have!r}")
        (want_losses, want_params, _), (have_losses, have_params, jitted_calls) = per_rank[eager], have
        if "eager" not in name:
            assert jitted_calls >= STEPS, f"rank {rank}: {name} ran {jitted_calls} calls through minijit"
        torch.testing.assert_close(torch.tensor(have_losses), torch.tensor(want_losses))
        assert len(have_params) == len(want_params)
        for w, h in zip(want_params, have_params):
            torch.testing.assert_close(h, w)


@pytest.mark.parametrize("name", [n for n in _patterns() if "eager" not in n and n != "per-layer fully_shard, then jit(m)"])
def test_pattern_matches_eager(results, name):
    _assert_same(results, name, _patterns()[name][0])


def test_eager_ddp_and_fsdp2_agree(results):
    # The references themselves: data parallel over 2 ranks is the same SGD, however it is sharded.
    _assert_same(results, "FSDP2 eager, per layer", "DDP eager")


def test_jitting_over_per_layer_fsdp2_names_the_patterns_that_work(results):
    for per_rank in results:
        error = per_rank["per-layer fully_shard, then jit(m)"]
        assert isinstance(error, minijit.UnsupportedSyntaxError), repr(error)
        assert "at self.0" in str(error)
        assert "fully_shard(minijit.jit(layer))" in str(error) and "backend='minijit'" in str(error)
        assert "FSDP2's" in str(error) and "DTensor" not in str(error)


@pytest.mark.parametrize("name", ["dist.barrier()", "DDP.forward traced"])
def test_communication_in_traced_code_is_refused(results, name):
    # Run once while recording, it would never run again: refused (DDP's reducer bookkeeping included).
    for per_rank in results:
        error = per_rank["refused"][name]
        assert isinstance(error, minijit.UnsupportedSyntaxError), repr(error)
        assert "communicates with other processes" in str(error) and "DDP(minijit.jit(m))" in str(error)


@pytest.mark.parametrize(("name", "where", "line"), [
    ("jit(TP(m))", "Linear at self.0", "(x = layer(x))"),
    ("jit(sequence parallel Llama block)", "RMSNorm at self.attention_norm", "(h = x + self.attention(self.attention_norm(x)))"),
])
def test_jitting_over_tensor_parallel_layers_names_dtensor_and_the_patterns_that_work(results, name, where, line):
    for per_rank in results:
        error = per_rank["tp"][name]
        assert isinstance(error, minijit.UnsupportedSyntaxError), repr(error)
        message = str(error)
        assert where in message and "DTensor" in message and "parallelize_module" in message
        assert "where it is called at " in message and line in message  # the line calling the layer
        assert "FSDP2" not in message


def test_eager_tensor_parallelism_is_one_process_training(results):
    # The reference itself: Colwise/Rowwise over 2 ranks trains the model as one process does.
    for per_rank in results:
        tp, one = per_rank["tp"]["TP eager"], per_rank["tp"]["one process"]
        torch.testing.assert_close(torch.tensor(tp[0]), torch.tensor(one[0]))
        for w, h in zip(one[1], tp[1], strict=True):
            torch.testing.assert_close(h, w)


@pytest.mark.parametrize(("name", "eager", "jitted_modules"), [
    ("jit, a parallelized layer never called", "a parallelized layer never called", 1),  # its hooks never run
    ("TP(m), then jit(layer) per layer", "TP eager", 5),  # the 5 layers
    ("Llama block, sequence parallel, then jit_leaves", "Llama block, sequence parallel", 9),  # 2 norms, 7 Linears
])
def test_jitted_layers_of_a_tensor_parallel_model_match_eager(results, name, eager, jitted_modules):
    for rank, per_rank in enumerate(results):
        have, (want_losses, want_params, _) = per_rank["tp"][name], per_rank["tp"][eager]
        assert not isinstance(have, Exception), f"rank {rank}: {have!r}"
        losses, params, jitted_calls = have
        assert jitted_calls == STEPS * jitted_modules, f"rank {rank}: {jitted_calls} calls through minijit"
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses))
        for w, h in zip(want_params, params, strict=True):
            torch.testing.assert_close(h, w)
