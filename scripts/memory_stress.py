"""A stress run whose memory must end flat (issue 38, part 4): calls that miss, raise, rebind and differentiate.

Each step: a call with a new shape (the cache drops its least recently used entry past `max_entries`),
a call that raises while tracing (its miss reason is counted, not kept for ever), a call reading a
global tensor rebound to a new one, two training-style calls with a backward and a double backward, and
a call with a new object holding a tensor (the entry is rebound to it). After the cache has filled,
the Python heap (tracemalloc), the live tensors and the process's RSS must stay where they are.

Run: PYTHONPATH=. python scripts/memory_stress.py [--steps 3000] [--every 500] [--max-entries 32]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import minijit

g = torch.randn(4)


class Holder:
    def __init__(self) -> None:
        self.t = torch.randn(4)


def shaped(x):
    return (x * 2 + 1).sin()


def raising(x):
    if x.shape[0] > 2:
        raise ValueError("too long")
    return x


def reads_global(x):
    return x * g


def loss(x, w):
    return (x * 2 + w).sum(-1)


def hidden(x, w):
    return (torch.relu(x) @ w).sum()


def holder(x, h):
    return x + h.t


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> None:
    global g
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--max-entries", type=int, default=32)
    options = parser.parse_args()
    jitted = {f.__name__: minijit.jit(f, max_entries=options.max_entries, cache="constant values")
              for f in (shaped, raising, reads_global, loss, hidden, holder)}
    tracemalloc.start()
    print(f"{'step':>6} {'heap MiB':>9} {'tensors':>8} {'rss MiB':>8} {'entries':>8} {'reasons':>8}")
    for step in range(1, options.steps + 1):
        jitted["shaped"](torch.randn(step % 500 + 1))  # under cache="constant values": a new entry
        try:
            jitted["raising"](torch.randn(3))
        except ValueError:
            pass
        g = torch.randn(4)
        jitted["reads_global"](torch.randn(4))
        w = torch.randn(4, requires_grad=True)
        y = jitted["loss"](torch.randn(3, 4), w)
        (gw,) = torch.autograd.grad(y, w, torch.ones(3, requires_grad=True), create_graph=True)
        gw.sum().backward()
        # Saves relu's result: a hidden output of the call's node, which a double backward differentiates.
        x = torch.randn(3, 4, requires_grad=True) * 1
        gx, gw = torch.autograd.grad(jitted["hidden"](x, w), (x, w), create_graph=True)
        (gx.pow(2).sum() + gw.pow(2).sum()).backward()
        del x, gx
        jitted["holder"](torch.randn(4), Holder())
        del y, gw, w
        if step % options.every == 0:
            gc.collect()
            heap = tracemalloc.get_traced_memory()[0] / 2**20
            tensors = sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))
            infos = [minijit.cache_info(j) for j in jitted.values()]
            print(f"{step:>6} {heap:>9.2f} {tensors:>8} {rss_mib():>8.1f} {sum(i.entries for i in infos):>8} "
                  f"{sum(len(i.miss_reasons) for i in infos):>8}")


if __name__ == "__main__":
    main()
