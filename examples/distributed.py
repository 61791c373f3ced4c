"""Data parallel training with minijit: DDP and FSDP2, jitted either way round, and through torch.compile.

Runs on a CPU: two processes on 127.0.0.1 talk over gloo. Each pattern trains the same MLP
with SGD for a few steps from the same weights and batches; the table shows how far its
parameters end up from eager DDP's / FSDP2's (0 or rounding: the same training) and its time
per step, next to eager and torch.compile (inductor, where a C++ compiler is available).

    python examples/distributed.py [--steps 10] [--width 256] [--no-inductor]

The patterns (see README, "Scaling out"):

- DDP: `DDP(minijit.jit(model))` or `minijit.jit(DDP(model))`: DDP's own work (the reducer,
  bucketed all-reduces in backward) stays eager around the jitted module.
- FSDP2: `fully_shard(minijit.jit(model))`, `minijit.jit(fully_shard(model))`, or per layer:
  `fully_shard(minijit.jit(layer))` for each layer, then `fully_shard(model)`. FSDP2's hooks
  (all-gather before a module's forward, reshard after, reduce-scatter in backward) run
  eagerly around each jitted module.
- `torch.compile(model, backend="minijit")` over either: Dynamo runs the hooks and splits the
  graphs, minijit compiles each piece.
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
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import minijit

WORLD = 2


def make_model(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 8))


def shard_per_layer(model: nn.Sequential, jit_layers: bool = False) -> nn.Module:
    """FSDP2 as recommended: each Linear its own unit (jitted first, if asked), then the root."""
    for i, layer in enumerate(model):
        if isinstance(layer, nn.Linear):
            model[i] = fully_shard(minijit.jit(layer) if jit_layers else layer)
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
        "fully_shard(minijit.jit(layer)) per layer": ("FSDP2 eager (per layer)", lambda: shard_per_layer(m(), True)),
        "fully_shard(minijit.jit(m))": ("FSDP2 eager (per layer)", lambda: fully_shard(minijit.jit(m()))),
        "minijit.jit(fully_shard(m))": ("FSDP2 eager (per layer)", lambda: minijit.jit(fully_shard(m()))),
        "torch.compile(FSDP2, backend='minijit')":
            ("FSDP2 eager (per layer)", lambda: torch.compile(shard_per_layer(m()), backend="minijit")),
        "torch.compile(FSDP2)  [inductor]": ("FSDP2 eager (per layer)", lambda: torch.compile(shard_per_layer(m()))),
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


def worker(rank: int, port: int, steps: int, width: int, inductor: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)  # two ranks on one machine: one core each
    reference: dict[str, list[torch.Tensor]] = {}
    rows = []
    for name, (eager, build) in patterns(width, inductor).items():
        torch._dynamo.reset()
        try:
            params, seconds = train(build(), rank, steps)
        except Exception as e:  # reported in the table, as the user would see it
            rows.append((name, f"{type(e).__name__}: {str(e)[:60]}", "", ""))
            continue
        reference.setdefault(name, params)
        diff = max((p - q).abs().max().item() for p, q in zip(params, reference[eager], strict=True))
        steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
        rows.append((name, "yes" if diff <= 1e-5 else "NO", f"{diff:.1e}", f"{steady * 1e3:.2f} ms  (first {seconds[0]:.2f} s)"))
    dist.destroy_process_group()
    if rank == 0:
        print(f"\n{WORLD} ranks (gloo, CPU), MLP width {width}, batch 32 per rank, {steps} SGD steps\n")
        print(f"{'pattern':<46} {'equals eager':<13} {'max |Δ param|':<14} time per step (median after the first)")
        for row in rows:
            print(f"{row[0]:<46} {row[1]:<13} {row[2]:<14} {row[3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--no-inductor", action="store_true", help="leave out torch.compile with its default backend")
    opts = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, opts.steps, opts.width, not opts.no_inductor), nprocs=WORLD)


if __name__ == "__main__":
    main()
