"""Distributed training with minijit: DDP and FSDP2, jitted either way round, through torch.compile, and tensor
parallelism.

Runs on a CPU: two processes on 127.0.0.1 talk over gloo. Each pattern trains the same MLP
with SGD for a few steps from the same weights and batches; the table shows how far its
parameters end up from eager DDP's / FSDP2's (0 or rounding: the same training) and its time
per step, next to eager and torch.compile (inductor, where a C++ compiler is available).
A second table does the same for tensor parallelism (a 2-rank device mesh): the MLP with
Colwise/Rowwise, and a Llama block with torchtitan's sequence-parallel plan.

    python examples/distributed.py [--steps 20] [--width 256] [--no-inductor]
    python examples/distributed.py --fsdp-tp [--steps 20]

`--fsdp-tp` runs instead FSDP2 x TP on a 2x2 device mesh ("dp", "tp") over four processes, torchtitan's
order: the TP plan on the "tp" sub-mesh, the leaves jitted (`jit_leaves`), then `fully_shard(...,
mesh=mesh["dp"])` per layer and on the root; the same MLP and Llama block, trained with AdamW, against the
same 2-D setup run eagerly.

The patterns (see README, "Scaling out"):

- DDP: `DDP(minijit.jit(model))` or `minijit.jit(DDP(model))`: DDP's own work (the reducer,
  bucketed all-reduces in backward) stays eager around the jitted module.
- FSDP2: `fully_shard(minijit.jit(model))`, `minijit.jit(fully_shard(model))`, or per layer:
  `fully_shard(minijit.jit(layer))` for each layer, then `fully_shard(model)`. FSDP2's hooks
  (all-gather before a module's forward, reshard after, reduce-scatter in backward) run
  eagerly around each jitted module.
- torch.compile with `backend="minijit"`: `torch.compile(DDP(model), backend="minijit")` (Dynamo
  splits the graph at DDP's buckets, minijit compiles each piece), and for FSDP2 per layer,
  `fully_shard(torch.compile(layer, backend="minijit"))`, as with `minijit.jit`. (In torch 2.13,
  `torch.compile(model)` over a per-layer FSDP2 model compiles nothing: Dynamo skips the frames
  where FSDP2's hooks break its graph inside a loop.)
- Tensor parallelism: `parallelize_module(model, mesh, plan)` first, then each parallelized module
  that holds no other parallelized one jitted in place (`jit_leaves`), and the layers between
  them. DTensor's hooks (turning a rank's local tensor into a DTensor, redistributing, and back)
  run eagerly around each compiled call; the trace computes on the DTensor parameters and
  inputs, whose ops DTensor runs. A module holding parallelized ones (the attention's core
  between wq/wk/wv and wo) runs eagerly; jitting it, or the whole model, is refused.
- FSDP2 x TP (`--fsdp-tp`): the tensor parallel pattern, then `fully_shard(layer, mesh=mesh["dp"])` on each
  jitted layer (or on the block holding them) and on the root: FSDP2's hooks run around the jitted module as
  in the FSDP2 pattern, DTensor's around the compiled call inside it.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import minijit
import minijit.backend

WORLD = 2


class MLP(nn.Sequential):
    def forward(self, x):  # its own forward: torch.compile compiles user code, not torch.nn's Sequential.forward
        for layer in self:
            x = layer(x)
        return x


def make_model(width: int) -> MLP:
    torch.manual_seed(0)
    return MLP(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 8))


def shard_per_layer(model: MLP, wrap: Callable[[nn.Module], nn.Module] = lambda layer: layer) -> nn.Module:
    """FSDP2 as recommended: each Linear its own unit (wrapped first by `wrap`: jitted or compiled), then the root."""
    for i, layer in enumerate(model):
        if isinstance(layer, nn.Linear):
            model[i] = fully_shard(wrap(layer))
    return fully_shard(model)


def patterns(width: int, inductor: bool) -> dict[str, tuple[str, Callable[[], nn.Module]]]:
    """name -> (the eager pattern it is compared with, a function building the model)."""
    m = lambda: make_model(width)
    table = {
        "DDP eager": ("DDP eager", lambda: DDP(m())),
        "DDP(minijit.jit(m))": ("DDP eager", lambda: DDP(minijit.jit(m()))),
        "minijit.jit(DDP(m))": ("DDP eager", lambda: minijit.jit(DDP(m()))),
        "torch.compile(DDP(m), backend='minijit')": ("DDP eager", lambda: torch.compile(DDP(m()), backend="minijit")),
        "torch.compile(DDP(m))  [inductor]": ("DDP eager", lambda: torch.compile(DDP(m()))),
        "FSDP2 eager (per layer)": ("FSDP2 eager (per layer)", lambda: shard_per_layer(m())),
        "fully_shard(minijit.jit(layer)) per layer": ("FSDP2 eager (per layer)", lambda: shard_per_layer(m(), minijit.jit)),
        "FSDP2 eager (root only)": ("FSDP2 eager (per layer)", lambda: fully_shard(m())),
        "fully_shard(minijit.jit(m))": ("FSDP2 eager (per layer)", lambda: fully_shard(minijit.jit(m()))),
        "minijit.jit(fully_shard(m))": ("FSDP2 eager (per layer)", lambda: minijit.jit(fully_shard(m()))),
        "fully_shard(torch.compile(layer, backend='minijit'))":
            ("FSDP2 eager (per layer)", lambda: shard_per_layer(m(), lambda layer: torch.compile(layer, backend="minijit"))),
        "fully_shard(torch.compile(layer))  [inductor]":
            ("FSDP2 eager (per layer)", lambda: shard_per_layer(m(), torch.compile)),
    }
    return {k: v for k, v in table.items() if inductor or "inductor" not in k}


def train(model: nn.Module, rank: int, steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """`steps` SGD steps on this rank's batches: the full parameters after, and each step's seconds."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seconds = []
    for i in range(steps):
        g = torch.Generator().manual_seed(1000 * i + rank)
        x, y = torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)
        dist.barrier()
        start = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds.append(time.perf_counter() - start)
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return [p.detach().clone() for p in params], seconds


def jitted_traces(model: nn.Module) -> int:
    """How many traces minijit compiled for `model`: its jitted modules' cache entries, wherever they sit."""
    found, todo, seen = 0, [model], set()
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if isinstance(m, minijit.JitModule):
            wrapped = m.__dict__.get("_minijit_wrapped")  # jit(DDP(m)): the jitted module inside DDP
            found += 0 if wrapped else minijit.cache_info(m).entries
            todo += [m._orig_mod, *(wrapped[2:] if wrapped else ())]
        todo += [c for c in vars(m).get("_modules", {}).values() if c is not None]
    return found


class Attention(nn.Module):
    """Llama's attention, as torchtitan writes it: heads counted from the local shard (`view(b, s, -1, ...)`)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """Llama's SwiGLU feed-forward."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w2, self.w3 = (nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False),
                                     nn.Linear(dim, hidden, bias=False))

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """A Llama transformer block (pre-norm attention and feed-forward, RMSNorm)."""

    def __init__(self, dim: int = 16, heads: int = 4, hidden: int = 32):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention, self.feed_forward = Attention(dim, heads), FeedForward(dim, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def mlp_plan() -> dict[str, object]:
    """Megatron's MLP split: the first Linear by columns, the second by rows (one all-reduce after it)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def block_plan() -> dict[str, object]:
    """torchtitan's plan for a Llama block: sequence parallel norms (activations sharded along the sequence),
    Colwise wq/wk/wv/w1/w3, Rowwise wo/w2 reduce-scattering back to sequence shards."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attention_norm": SequenceParallel(), "attention": gather(),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(), "feed_forward": gather(),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def jit_leaves(model: nn.Module) -> nn.Module:
    """Each module of `model` that holds no other module, jitted in place: after parallelize_module, the
    parallelized layers (their DTensor hooks run around the compiled call) and the layers between them."""
    for name, module in list(model.named_modules()):
        if name and not any(True for _ in module.children()):
            parent, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(parent), attribute, minijit.jit(module))
    return model


def tp_patterns() -> dict[str, tuple[str, Callable[[], nn.Module], Callable[[int, int], tuple[torch.Tensor, ...]]]]:
    """Tensor parallelism: name -> (the eager pattern it is compared with, the model, the batch of step i on rank r)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (WORLD,))
    mlp = lambda: parallelize_module(make_model(64), mesh, mlp_plan())
    block = lambda: parallelize_module((torch.manual_seed(0), Block())[1], mesh, block_plan())

    def same_batch(i: int, rank: int) -> tuple[torch.Tensor, ...]:  # TP: every rank sees the whole batch
        g = torch.Generator().manual_seed(1000 * i)
        return torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)

    def sequence_shard(i: int, rank: int) -> tuple[torch.Tensor, ...]:  # SP: each rank its half of the sequence
        g = torch.Generator().manual_seed(1000 * i)
        return tuple(t.chunk(WORLD, dim=1)[rank] for t in (torch.randn(4, 16, 16, generator=g),
                                                           torch.randn(4, 16, 16, generator=g)))

    return {
        "MLP, Colwise/Rowwise, eager": ("MLP, Colwise/Rowwise, eager", mlp, same_batch),
        "MLP, parallelize, then jit_leaves": ("MLP, Colwise/Rowwise, eager", lambda: jit_leaves(mlp()), same_batch),
        "minijit.jit(parallelized MLP)  [refused]": ("MLP, Colwise/Rowwise, eager", lambda: minijit.jit(mlp()),
                                                     same_batch),
        "Llama block, sequence parallel, eager": ("Llama block, sequence parallel, eager", block, sequence_shard),
        "Llama block, parallelize, then jit_leaves":
            ("Llama block, sequence parallel, eager", lambda: jit_leaves(block()), sequence_shard),
    }


def train_on(model: nn.Module, batch: Callable[[int, int], tuple[torch.Tensor, ...]], rank: int, steps: int,
             optimizer: Callable[[object], torch.optim.Optimizer]) -> tuple[list[float], list[torch.Tensor], list[float]]:
    """`steps` optimizer steps on `batch(step, rank)`: the losses, the full parameters after, and each step's seconds."""
    opt = optimizer(model.parameters())
    losses, seconds = [], []
    for i in range(steps):
        x, y = batch(i, rank)
        dist.barrier()
        start = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return losses, [p.detach().clone() for p in params], seconds


def tp_rows(rank: int, steps: int) -> list[tuple[str, ...]]:
    """The tensor parallel table's rows: each pattern against its eager reference."""
    return compare_rows(tp_patterns(), rank, steps, lambda params: torch.optim.SGD(params, lr=0.05))


def compare_rows(table: dict[str, tuple[str, Callable[[], nn.Module], Callable[[int, int], tuple[torch.Tensor, ...]]]],
                 rank: int, steps: int, optimizer: Callable[[object], torch.optim.Optimizer]) -> list[tuple[str, ...]]:
    """Each pattern of `table` trained with `optimizer`, against its eager reference: the rows of a table."""
    reference: dict[str, tuple[list[float], list[torch.Tensor]]] = {}
    rows = []
    for name, (eager, build, batch) in table.items():
        try:
            model = build()
            losses, params, seconds = train_on(model, batch, rank, steps, optimizer)
        except minijit.MinijitError as e:
            rows.append((name, "refused", "", "", "", f"{type(e).__name__}: {e}"))
            continue
        reference.setdefault(name, (losses, params))
        want_losses, want_params = reference[eager]
        diff = max((p - q).abs().max().item() for p, q in zip(params, want_params, strict=True))
        diff = max(diff, max(abs(a - b) for a, b in zip(losses, want_losses, strict=True)))
        steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
        compiled = f"{jitted_traces(model)} minijit traces" if "jit" in name else "-"
        rows.append((name, "yes" if diff <= 1e-5 else "NO", f"{diff:.1e}", f"{steady * 1e3:.2f} ms", compiled))
    return rows


def fsdp_tp_patterns() -> dict[str, tuple[str, Callable[[], nn.Module], Callable[[int, int], tuple[torch.Tensor, ...]]]]:
    """FSDP2 x TP on a 2x2 mesh, torchtitan's order (TP plan on "tp", then fully_shard on "dp" per layer and the
    root): name -> (the eager pattern it is compared with, the model, the batch of step i on global rank r)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]

    def mlp(jit: bool) -> nn.Module:  # each (jitted) Linear its own FSDP2 unit, then the root
        model = parallelize_module(make_model(64), tp, mlp_plan())
        model = jit_leaves(model) if jit else model
        for i, layer in enumerate(model):
            if isinstance(getattr(layer, "_orig_mod", layer), nn.Linear):
                model[i] = fully_shard(layer, mesh=dp)
        return fully_shard(model, mesh=dp)

    def block(jit: bool) -> nn.Module:  # the block one FSDP2 unit, as torchtitan shards each block
        model = parallelize_module((torch.manual_seed(0), Block())[1], tp, block_plan())
        return fully_shard(jit_leaves(model) if jit else model, mesh=dp)

    def batch_per_dp(i: int, rank: int) -> tuple[torch.Tensor, ...]:  # each data-parallel group its own batch
        g = torch.Generator().manual_seed(1000 * i + dp.get_local_rank())
        return torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)

    def sequence_shard_per_dp(i: int, rank: int) -> tuple[torch.Tensor, ...]:  # and in it, each rank its half
        g = torch.Generator().manual_seed(1000 * i + dp.get_local_rank())
        return tuple(t.chunk(2, dim=1)[tp.get_local_rank()] for t in (torch.randn(4, 16, 16, generator=g),
                                                                     torch.randn(4, 16, 16, generator=g)))

    mlp_eager, block_eager = "MLP, FSDP2 x TP, eager", "Llama block, FSDP2 x sequence parallel, eager"
    return {
        mlp_eager: (mlp_eager, lambda: mlp(False), batch_per_dp),
        "MLP, parallelize, jit_leaves, fully_shard": (mlp_eager, lambda: mlp(True), batch_per_dp),
        block_eager: (block_eager, lambda: block(False), sequence_shard_per_dp),
        "Llama block, parallelize, jit_leaves, fully_shard": (block_eager, lambda: block(True), sequence_shard_per_dp),
    }


def print_table(title: str, rows: list[tuple[str, ...]]) -> None:
    """The rows under `title`, one line each."""
    print(f"\n{title}\n")
    print(f"{'pattern':<52} {'equals eager':<13} {'max |Δ|':<14} {'compiled':<18} time per step (median after the first)")
    for row in rows:
        print(f"{row[0]:<52} {row[1]:<13} {row[2]:<14} {row[4]:<18} {row[3]}")
    for row in rows:
        if len(row) > 5:
            print(f"\n{row[0]}: {row[5]}")


def worker(rank: int, port: int, steps: int, width: int, inductor: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)  # two ranks on one machine: one core each
    reference: dict[str, list[torch.Tensor]] = {}
    rows = []
    for name, (eager, build) in patterns(width, inductor).items():
        torch._dynamo.reset()
        counters.clear()
        minijit.backend.minijit_backend.reset()
        try:
            model = build()
            params, seconds = train(model, rank, steps)
        except Exception as e:  # reported in the table, as the user would see it
            rows.append((name, f"{type(e).__name__}: {str(e)[:60]}", "", "", ""))
            continue
        reference.setdefault(name, params)
        diff = max((p - q).abs().max().item() for p, q in zip(params, reference[eager], strict=True))
        steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
        compiled = f"{counters['stats']['unique_graphs']} Dynamo graphs" if "torch.compile" in name else ""
        compiled = compiled or (f"{jitted_traces(model)} minijit traces" if "jit" in name else "-")
        rows.append((name, "yes" if diff <= 1e-5 else "NO", f"{diff:.1e}", f"{steady * 1e3:.2f} ms  (first {seconds[0]:.2f} s)",
                     compiled))
    tp = tp_rows(rank, steps)
    dist.destroy_process_group()
    if rank == 0:
        print_table(f"{WORLD} ranks (gloo, CPU), MLP width {width}, batch 32 per rank, {steps} SGD steps", rows)
        print_table(f"Tensor parallelism over a {WORLD}-rank mesh, {steps} SGD steps (Δ: losses and parameters)", tp)


def fsdp_tp_worker(rank: int, port: int, steps: int) -> None:
    """One of the four processes of `--fsdp-tp`: FSDP2 x TP, eager and jitted, with AdamW."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    torch.set_num_threads(1)
    rows = compare_rows(fsdp_tp_patterns(), rank, steps, lambda params: torch.optim.AdamW(params, lr=0.01))
    dist.destroy_process_group()
    if rank == 0:
        print_table(f"FSDP2 x TP on a 2x2 mesh (dp, tp), 4 ranks, {steps} AdamW steps (Δ: losses and parameters)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--no-inductor", action="store_true", help="leave out torch.compile with its default backend")
    parser.add_argument("--fsdp-tp", action="store_true", help="only FSDP2 x TP on a 2x2 mesh, over 4 processes")
    opts = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if opts.fsdp_tp:
        mp.spawn(fsdp_tp_worker, args=(port, opts.steps), nprocs=4)
    else:
        mp.spawn(worker, args=(port, opts.steps, opts.width, not opts.no_inductor), nprocs=WORLD)


if __name__ == "__main__":
    main()
