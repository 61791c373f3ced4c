"""Data parallel training with minijit: DDP and FSDP2, jitted either way round, and through torch.compile.

Runs on a CPU: two processes on 127.0.0.1 talk over gloo. Each pattern trains the same MLP
with SGD for a few steps from the same weights and batches; the table shows how far its
parameters end up from eager DDP's / FSDP2's (0 or rounding: the same training) and its time
per step, next to eager and torch.compile (inductor, where a C++ compiler is available).

    python examples/distributed.py [--steps 20] [--width 256] [--no-inductor]

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
    dist.destroy_process_group()
    if rank == 0:
        print(f"\n{WORLD} ranks (gloo, CPU), MLP width {width}, batch 32 per rank, {steps} SGD steps\n")
        print(f"{'pattern':<52} {'equals eager':<13} {'max |Δ param|':<14} {'compiled':<18} "
              "time per step (median after the first)")
        for row in rows:
            print(f"{row[0]:<52} {row[1]:<13} {row[2]:<14} {row[4]:<18} {row[3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--no-inductor", action="store_true", help="leave out torch.compile with its default backend")
    opts = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, opts.steps, opts.width, not opts.no_inductor), nprocs=WORLD)


if __name__ == "__main__":
    main()
