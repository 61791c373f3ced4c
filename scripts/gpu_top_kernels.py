"""The kernels that take the most device time in one iteration of a bench_gpu workload, per variant.

    PYTHONPATH=. python scripts/gpu_top_kernels.py [--only llama] [--variants minijit+triton] [--small --device cpu]
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from bench_gpu import workloads, wrap
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity


def main() -> None:
    """Print, per variant, the top kernels by summed device time over one profiled iteration."""
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="llama")
    p.add_argument("--variants", default="minijit+triton,torch.compile")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true")
    p.add_argument("--top", type=int, default=25)
    o = p.parse_args()
    dev = torch.device(o.device)
    work = next(w for w in workloads(dev, o.small) if w.key == o.only)
    prepare = work.setup()
    for v in o.variants.split(","):
        case = prepare(v)
        fn = wrap(v, case.fn)
        for _ in range(3):
            case.step(fn)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with torch.profiler.profile(activities=acts) as prof:
            case.step(fn)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        total, count = defaultdict(float), defaultdict(int)
        for evt in prof.events():
            if dev.type == "cuda" and evt.device_type != DeviceType.CUDA:
                continue
            us = getattr(evt, "device_time_total", 0) or evt.time_range.elapsed_us()
            total[evt.name[:110]] += us
            count[evt.name[:110]] += 1
        print(f"== {o.only} / {v}: {sum(count.values())} events, {sum(total.values()) / 1e3:.2f} ms")
        for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:o.top]:
            print(f"{us / 1e3:8.3f} ms {count[name]:5d}x  {name}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
