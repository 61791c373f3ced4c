"""GPU benchmarks: each workload under eager, minijit's executors, torch.compile and CUDA graphs, on one CUDA device.

Writes a markdown report (--out, default docs/gpu.md, '' for none), rewritten after every workload, and with
--json PATH one JSON line per row as soon as it is done (a run killed by a timeout keeps the rows done so far).
Progress goes to stderr with the elapsed seconds, the final tables to stdout. The "minijit" variant is `jit` with
its default executors, which on CUDA fuse with Triton (minijit.extend: a default where a CUDA device is present);
"minijit+triton" names it. On the GPU machine:

    PYTHONPATH=. python scripts/bench_gpu.py [--only copy,overhead,pointwise,adam,gpt,llama]
        [--variants eager,minijit,...] [--repeats 5] [--budget-s 300] [--no-compile] [--json gpu.jsonl]
    python scripts/bench.py --device cuda [the same options]          # the same thing

Rehearsal on a CPU (tiny sizes; the host clock in place of CUDA events; no kernel counts):

    PYTHONPATH=. python scripts/bench_gpu.py --device cpu --small --out /tmp/gpu.md --json /tmp/gpu.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
for _path in (str(ROOT), str(SCRIPTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs: nothing to download

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench import CausalLMLoss, add_one, fmt_time, pointwise_chain  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402

import minijit  # noqa: E402

FUSED, REDUCE_OVERHEAD = "eager fused=True", "torch.compile(reduce-overhead)"
VARIANTS = ("eager", "minijit", "minijit+triton", "minijit+inductor", "torch.compile", "minijit+graphs", REDUCE_OVERHEAD)
WORKLOADS = ("copy", "overhead", "pointwise", "adam", "gpt", "llama")  # cheapest first
PROFILED = ("adam", "gpt", "llama")  # kernel counts and host time per iteration
START = time.perf_counter()


def log(msg: str) -> None:
    """A progress line on stderr with the seconds since the start."""
    print(f"[{time.perf_counter() - START:7.1f} s] {msg}", file=sys.stderr, flush=True)


def reason(e: BaseException) -> str:
    """A short reason for a cell: the exception's type and the start of its first line."""
    text = (str(e).strip().splitlines() or [""])[0]
    if "no CUDA device" in text:
        return "no CUDA device"
    return f"{type(e).__name__}: {text[:60]}" if text else type(e).__name__


@dataclass
class Ctx:
    """The run's options and shared state."""

    opts: argparse.Namespace
    dev: torch.device
    json_file: IO[str] | None
    copy_gbs: float | None = None
    notes: list[str] = field(default_factory=list)  # the Notes section of the report already at --out

    @property
    def cuda(self) -> bool:
        return self.dev.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def over_budget(self) -> bool:
        return time.perf_counter() - START > self.opts.budget_s

    def emit(self, record: dict[str, Any]) -> None:
        """One JSON line, flushed at once."""
        if self.json_file is not None:
            self.json_file.write(json.dumps({"t_s": round(time.perf_counter() - START, 2), **record}, default=str) + "\n")
            self.json_file.flush()


@dataclass
class Case:
    """One variant's state: the callable the variant wraps, and one iteration through the wrapped one."""

    fn: Callable[..., Any]
    step: Callable[[Callable[..., Any]], list[torch.Tensor]]  # returns the results compared with eager's


@dataclass
class Workload:
    """A benchmark: `setup()` builds the shared state and returns `prepare(variant) -> Case`."""

    key: str
    title: str
    setup: Callable[[], Callable[[str], Case]]
    fixed_iters: int | None = None  # per block, timed by the host clock (default: ~--block-ms of eager, CUDA events)
    bytes_moved: int | None = None  # per iteration, for GB/s


@dataclass
class Row:
    """A variant's figures on one workload."""

    note: str | None = None  # "n/a: ..." where it did not run
    first_call_s: float | None = None
    rel_diff: float | None = None
    ms: float | None = None  # median per iteration
    samples_ms: list[float] = field(default_factory=list)
    iters: int | None = None  # per timed block
    kernels: int | None = None
    memcpy: int | None = None
    memset: int | None = None
    kernel_ms: float | None = None  # summed kernel time of one iteration
    host_ms: float | None = None  # issuing one iteration, without waiting for the device
    explain: str | None = None  # minijit variants: cache_info() after the run (CUDA graph replays, reasons)
    built: Any = field(default=None, repr=False)  # the variant's callable (not in the JSON)


# -- variants and measurements ----------------------------------------------------------

def wrap(variant: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The callable a variant runs `fn` as; raises where the variant cannot run."""
    if variant in ("eager", FUSED):
        return fn
    if variant in ("minijit", "minijit+triton", "minijit+inductor"):
        return minijit.jit(fn, executors=[variant[8:]] if "+" in variant else None)
    if variant == "torch.compile":
        return torch.compile(fn)
    if variant == "minijit+graphs":
        try:
            return minijit.jit(fn, executors=["triton"], cuda_graphs=True)
        except TypeError as e:
            if "cuda_graphs" in str(e):
                raise TypeError("jit() has no cuda_graphs option yet") from e
            raise
    if variant == REDUCE_OVERHEAD:
        compiled = torch.compile(fn, mode="reduce-overhead")

        def run(*args: Any, **kwargs: Any) -> Any:
            torch.compiler.cudagraph_mark_step_begin()  # each call is a new iteration for the cudagraph trees
            return compiled(*args, **kwargs)
        return run
    raise ValueError(variant)


def rel_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """max over results of max|got - want| / max(max|want|, 1e-6), in float64 (inf where shapes differ)."""
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        if g is None or w is None or g.shape != w.shape:
            if g is not None or w is not None:
                return math.inf
        elif w.numel():
            g64, w64 = g.detach().double(), w.detach().double()
            worst = max(worst, ((g64 - w64).abs().max() / w64.abs().max().clamp_min(1e-6)).item())
    return worst


def time_block(ctx: Ctx, it: Callable[[], Any], n: int, host_clock: bool = False) -> float:
    """Seconds per iteration over a block of n: CUDA events, or the host clock and a final synchronize."""
    ctx.sync()
    if ctx.cuda and not host_clock:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            it()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / n
    t0 = time.perf_counter()
    for _ in range(n):
        it()
    ctx.sync()
    return (time.perf_counter() - t0) / n


def profile_iteration(ctx: Ctx, it: Callable[[], Any]) -> tuple[int, int, int, float]:
    """(kernels, memcpys, memsets, summed kernel ms) of one iteration under torch.profiler (zeros on a CPU)."""
    ctx.sync()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if ctx.cuda else [])]) as prof:
        it()
        ctx.sync()
    kernels = memcpy = memset = 0
    busy_us = 0.0
    for evt in prof.events():
        if evt.device_type != DeviceType.CUDA:
            continue
        kind, name = (getattr(evt, "activity_type", None) or "").lower(), evt.name or ""
        if kind == "gpu_memcpy" or name.startswith("Memcpy"):
            memcpy += 1
        elif kind == "gpu_memset" or name.startswith("Memset"):
            memset += 1
        elif kind in ("kernel", "") and not getattr(evt, "is_user_annotation", False):
            kernels += 1  # its duration: the attribute names changed across torch versions
            busy_us += getattr(evt, "device_time_total", 0) or getattr(evt, "cuda_time_total", 0) or \
                evt.time_range.elapsed_us()
    return kernels, memcpy, memset, busy_us / 1e3


def host_ms(ctx: Ctx, it: Callable[[], Any], reps: int = 5) -> float:
    """Median wall ms of issuing one iteration (synchronized before, not after)."""
    times = []
    for _ in range(reps):
        ctx.sync()
        t0 = time.perf_counter()
        it()
        times.append(time.perf_counter() - t0)
    ctx.sync()
    return statistics.median(times) * 1e3


def free_memory(ctx: Ctx) -> None:
    """Drop compiled state (the cudagraph trees' pools too) and cached device memory."""
    try:
        gc.collect()
        torch._dynamo.reset()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()
    except Exception as e:  # a broken CUDA context: the next workloads will say so
        log(f"freeing memory failed: {reason(e)}")


def bench_copy(ctx: Ctx) -> None:
    """Device-to-device copy bandwidth, (bytes read + written) / median time, into ctx.copy_gbs."""
    n = 2**20 if ctx.opts.small else 2**28
    src = torch.randn(n, device=ctx.dev)
    dst = torch.empty_like(src)
    it = lambda: dst.copy_(src)
    it()
    iters = max(1, min(10000, round(ctx.opts.block_ms / 1e3 / min(time_block(ctx, it, 1) for _ in range(3)))))
    times = [time_block(ctx, it, iters) for _ in range(ctx.opts.repeats)]
    ctx.copy_gbs = 2 * 4 * n / statistics.median(times) / 1e9
    log(f"copy: {ctx.copy_gbs:.0f} GB/s")
    ctx.emit({"workload": "copy", "bytes": 4 * n, "ms": statistics.median(times) * 1e3, "gbs": ctx.copy_gbs,
              "samples_ms": [t * 1e3 for t in times], "iters": iters})


def first_call(ctx: Ctx, v: str, prepare: Callable[[str], Case], row: Row,
               ref: list[torch.Tensor] | None) -> tuple[Callable[[], Any], list[torch.Tensor] | None]:
    """Build the variant and time its first iteration (the results checked against `ref`), then warm it up 3 times."""
    case = prepare(v)
    ctx.sync()
    t0 = time.perf_counter()
    fn = row.built = wrap(v, case.fn)
    got = case.step(fn)
    ctx.sync()
    row.first_call_s = time.perf_counter() - t0
    if ref is None and v == "eager":
        ref = [t.detach().clone() if t is not None else None for t in got]
    elif ref is not None:
        row.rel_diff = rel_diff(got, ref)
    del got
    it = lambda: case.step(fn)
    for _ in range(3):
        it()
    ctx.sync()
    return it, ref


def run_workload(ctx: Ctx, work: Workload, rows: dict[str, Row]) -> None:
    """Fill `rows` (a Row per variant): build each variant (first call timed, checked against eager, warmed up),
    time them interleaved, profile."""
    variants = list(rows)
    prepare = work.setup() if not ctx.over_budget() else None  # (unused then: every variant is over budget)
    ref: list[torch.Tensor] | None = None
    live: dict[str, Callable[[], Any]] = {}
    for v in variants:
        if ctx.over_budget():
            rows[v].note = "n/a: time budget"
        else:
            log(f"{work.key} / {v}: build + first call")
            try:
                live[v], ref = first_call(ctx, v, prepare, rows[v], ref)
            except Exception as e:  # a variant that cannot run is reported, never fatal
                rows[v].note = f"n/a: {reason(e)}"
                log(f"{work.key} / {v}: {rows[v].note}")
            if v not in live and ctx.cuda:  # what the failed variant held (out of the traceback by now)
                gc.collect()
                torch.cuda.empty_cache()
        ctx.emit({"workload": work.key, "variant": v, "record": "first call", "note": rows[v].note,
                  "first_call_s": rows[v].first_call_s, "rel_diff": rows[v].rel_diff})
    if not live:
        return
    host_clock = work.fixed_iters is not None
    base = live.get("eager") or next(iter(live.values()))
    n = work.fixed_iters or max(1, min(10000, round(
        ctx.opts.block_ms / 1e3 / max(min(time_block(ctx, base, 1) for _ in range(3)), 1e-9))))
    log(f"{work.key}: timing {len(live)} variants, {ctx.opts.repeats} blocks of {n} iterations each")
    for _ in range(ctx.opts.repeats):
        for v, it in list(live.items()):
            try:
                rows[v].samples_ms.append(time_block(ctx, it, n, host_clock) * 1e3)
            except Exception as e:
                rows[v].note = f"n/a: timing: {reason(e)}"
                del live[v]
    eager_ms = statistics.median(rows["eager"].samples_ms) if "eager" in live else None
    for v, it in live.items():
        row = rows[v]
        row.ms, row.iters = statistics.median(row.samples_ms), n
        if work.key in PROFILED and not ctx.over_budget():
            try:
                row.kernels, row.memcpy, row.memset, row.kernel_ms = profile_iteration(ctx, it)
                row.host_ms = host_ms(ctx, it)
            except Exception as e:
                log(f"{work.key} / {v}: profile: {reason(e)}")
        if v.startswith("minijit"):
            row.explain = str(minijit.cache_info(row.built))
        ctx.emit({"workload": work.key, "variant": v, "record": "row",
                  **{f.name: getattr(row, f.name) for f in fields(row) if f.name != "built"},
                  "ratio": eager_ms / row.ms if eager_ms else None,
                  "gbs": work.bytes_moved / row.ms / 1e6 if work.bytes_moved else None,
                  "host_us_per_kernel": row.host_ms * 1e3 / row.kernels if row.host_ms and row.kernels else None})
        log(f"{work.key} / {v}: {fmt_time(row.ms / 1e3)} per iteration")
    for row in rows.values():
        row.built = None  # the variants' models, caches and graphs go with the workload


# -- workloads ----------------------------------------------------------------------------

def gpt_block_loss(x, ln1_w, ln1_b, w_attn, b_attn, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_fc2, b_fc2,
                   n_head: int = 8):
    """bench.py's gpt_block_loss with `n_head` heads (bench.py's has 4)."""
    B, T, C = x.shape
    h = F.layer_norm(x, (C,), ln1_w, ln1_b)
    q, k, v = F.linear(h, w_attn, b_attn).split(C, dim=2)
    q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
    k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
    v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), w_proj, b_proj)
    x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,), ln2_w, ln2_b), w_fc, b_fc)), w_fc2, b_fc2)
    return x.square().mean()


def train_step(fn: Callable[..., Any], args: list[Any], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """Grads set to None, loss = fn(*args), loss.backward(); returns the loss and the grads."""
    for t in leaves:
        t.grad = None
    loss = fn(*args)
    loss.backward()
    return [loss.detach(), *(t.grad for t in leaves)]


def workloads(dev: torch.device, small: bool) -> list[Workload]:
    """The workloads at the GPU sizes (tiny ones with `small`), cheapest first; copy is measured apart."""
    def overhead() -> Callable[[str], Case]:
        a = torch.randn(1, device=dev)
        return lambda v: Case(add_one, lambda fn: [fn(a)])

    n_pw = 2**16 if small else 64 * 2**20

    def pointwise() -> Callable[[str], Case]:
        torch.manual_seed(0)
        x = torch.randn(n_pw, device=dev)
        return lambda v: Case(pointwise_chain, lambda fn: [fn(x)])

    n_adam = 2**10 if small else 2**22

    def adam() -> Callable[[str], Case]:
        def prepare(v: str) -> Case:  # each variant its own parameters and optimizer, from the same seed
            torch.manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(n_adam, device=dev)) for _ in range(20)]
            for p in params:
                p.grad = torch.randn(n_adam, device=dev) * 0.01
            opt = torch.optim.Adam(params, lr=1e-3, fused=True if v == FUSED else None)
            for _ in range(2):  # the state at step 2, by eager steps
                opt.step()

            def step(fn: Callable[..., Any]) -> list[torch.Tensor]:
                with torch.no_grad():
                    fn()
                return list(params)
            return Case(opt.step, step)
        return prepare

    B, T, C = (2, 32, 64) if small else (8, 1024, 1024)

    def gpt() -> Callable[[str], Case]:
        torch.manual_seed(0)
        r = lambda *shape: torch.randn(*shape, device=dev) * 0.02
        o, z = lambda n: torch.ones(n, device=dev), lambda n: torch.zeros(n, device=dev)
        params = [t.to(torch.bfloat16).requires_grad_() for t in (
            o(C), z(C), r(3 * C, C), z(3 * C), r(C, C), z(C), o(C), z(C), r(4 * C, C), z(4 * C), r(C, 4 * C), z(C))]
        x = torch.randn(B, T, C, device=dev).to(torch.bfloat16)
        return lambda v: Case(gpt_block_loss, lambda fn: train_step(fn, [x, *params], params))

    ls = (dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64) if small else
          dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
               num_key_value_heads=8, max_position_embeddings=1024))
    LB, LT = (2, 32) if small else (4, 512)

    def llama() -> Callable[[str], Case]:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(**ls, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = CausalLMLoss(LlamaForCausalLM(config).train()).to(device=dev, dtype=torch.bfloat16)
        ids = torch.randint(3, ls["vocab_size"], (LB, LT), device=dev)
        params = list(model.parameters())
        return lambda v: Case(model, lambda fn: train_step(fn, [ids, ids], params))

    size = lambda n: f"{n // 2**20}M" if n % 2**20 == 0 else str(n)
    return [
        Workload("overhead", "per call, a + 1 on 1 element (host clock)", overhead, fixed_iters=200 if small else 2000),
        Workload("pointwise", f"9-op pointwise chain, {size(n_pw)} f32", pointwise, bytes_moved=2 * 4 * n_pw),
        Workload("adam", f"torch.optim.Adam step, 20 x {size(n_adam)} f32", adam),
        Workload("gpt", f"GPT block fwd+bwd, bf16 (B={B}, T={T}, C={C}, 8 heads)", gpt),
        Workload("llama", f"HF Llama fwd+bwd, bf16 (B={LB}, T={LT}, hidden {ls['hidden_size']}, "
                 f"{ls['num_hidden_layers']} layers, vocab {ls['vocab_size']})", llama),
    ]


# -- report -------------------------------------------------------------------------------

def fmt(x: float | None, spec: str, none: str = "-") -> str:
    """A number, or `none`."""
    return none if x is None else format(x, spec)


def detail_table(ctx: Ctx, work: Workload, rows: dict[str, Row]) -> list[str]:
    """One workload's markdown table, a row per variant."""
    profiled = work.key in PROFILED
    head = ["variant", "time/iter", "vs eager", "first call", "max rel diff"]
    head += ["GB/s", "% of copy"] if work.bytes_moved else []
    head += ["kernels/iter", "memcpy+memset", "kernel time/iter", "host time/iter", "host µs/kernel"] if profiled else []
    lines = [f"### {work.key}: {work.title}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    eager = rows.get("eager")
    for v, r in rows.items():
        first = fmt_time(r.first_call_s) if r.first_call_s is not None else ""
        diff = "0" if r.rel_diff == 0 else fmt(r.rel_diff, ".1e", "ref" if v == "eager" and first else "-" if first else "")
        if r.ms is None:
            cells = [v, r.note or "n/a", "", first, diff] + [""] * (len(head) - 5)
        else:
            cells = [v, fmt_time(r.ms / 1e3), f"{eager.ms / r.ms:.2f}×" if eager and eager.ms else "-", first, diff]
            if work.bytes_moved:
                gbs = work.bytes_moved / r.ms / 1e6
                cells += [f"{gbs:.0f}", fmt(100 * gbs / ctx.copy_gbs if ctx.copy_gbs else None, ".0f")]
            if profiled:
                k = r.kernels if ctx.cuda else None
                cells += [fmt(k, "d"), f"{r.memcpy}+{r.memset}" if k is not None else "-",
                          fmt_time(r.kernel_ms / 1e3) if k else "-", fmt_time(r.host_ms / 1e3) if r.host_ms else "-",
                          fmt(r.host_ms * 1e3 / k if k and r.host_ms else None, ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_table(works: list[Workload], results: dict[str, dict[str, Row]]) -> list[str]:
    """Workloads x variants: speed-up over eager and the time per iteration."""
    variants = [v for v in ("eager", FUSED, *VARIANTS[1:]) if any(v in rows for rows in results.values())]
    lines = ["| workload | " + " | ".join(variants) + " |", "|" + " --- |" * (len(variants) + 1)]
    for work in (w for w in works if w.key in results):
        rows, cells = results[work.key], []
        eager_ms = rows["eager"].ms if "eager" in rows else None
        for v in variants:
            r = rows.get(v)
            if r is None or r.ms is None:
                note = "—" if r is None else r.note or "n/a"
                cells.append(note if len(note) <= 40 else note[:39] + "…")
            else:
                t = fmt_time(r.ms / 1e3)
                cells.append(t if v == "eager" or not eager_ms else f"{eager_ms / r.ms:.2f}× ({t})")
        lines.append(f"| {work.key} | " + " | ".join(cells) + " |")
    return lines


def machine(ctx: Ctx) -> list[tuple[str, str]]:
    """The device, versions, revision and date."""
    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.dev)
        device = f"{torch.cuda.get_device_name(ctx.dev)} ({props.total_memory / 2**30:.0f} GiB)"
        sms = str(props.multi_processor_count)
    else:
        device, sms = platform.processor() or "CPU", "-"
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
        device = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), device)
    try:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.strip()
        rev = (git("rev-parse", "--short", "HEAD") or "?") + (" + uncommitted changes" if git("status", "--porcelain",
                                                                                             "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        rev = "?"
    return [("device", device), ("SMs", sms), ("CPU cores", str(os.cpu_count())), ("torch", torch.__version__),
            ("CUDA", str(torch.version.cuda)), ("triton", version("triton")), ("transformers", version("transformers")),
            ("python", platform.python_version()), ("minijit", rev),
            ("date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))]


def report(ctx: Ctx, works: list[Workload], results: dict[str, dict[str, Row]], info: list[tuple[str, str]]) -> str:
    """The markdown document."""
    o = ctx.opts
    lines = ["# GPU benchmarks", "", "Written by `python scripts/bench_gpu.py` (or `python scripts/bench.py --device cuda`). "
             "Summary cells: speed-up over eager (>1 is faster) and the median time per iteration.", ""]
    lines += [f"- {k}: {v}" for k, v in info]
    lines += [f"- options: repeats={o.repeats}, block={o.block_ms:g} ms of eager, budget={o.budget_s:g} s, "
              f"small={o.small}, no-compile={o.no_compile}; the run took {(time.perf_counter() - START) / 60:.1f} min", ""]
    if ctx.copy_gbs is not None:
        lines += [f"Device-to-device copy (`dst.copy_(src)`, {'4 MiB' if o.small else '1 GiB'} f32): "
                  f"**{ctx.copy_gbs:.0f} GB/s** (bytes read + written / median time).", ""]
    lines += ["## Summary", "", *summary_table(works, results), "", "## Details", ""]
    for work in (w for w in works if w.key in results):
        lines += [*detail_table(ctx, work, results[work.key]), ""]
    lines += ["## Method", "",
              f"- Time per iteration: 3 warm-up iterations, then blocks of N iterations (N: ~{o.block_ms:g} ms of "
              f"eager, at least 1) timed with CUDA events, the median of {o.repeats} blocks, the variants interleaved "
              "(each repeat times every variant once). `overhead`: blocks of 2000 calls (200 with --small) timed by "
              "the host clock, one synchronize at the end.",
              "- First call: building the variant and running its first iteration, synchronized, in this one process "
              "(after the variants before it: warm imports, Inductor's and Triton's on-disk caches as they were).",
              "- Max rel diff: max over the results (loss and grads; the parameters after one step for adam; the "
              "output otherwise) of max|x - eager| / max|eager| in float64, from the same state.",
              "- Kernels/iter and kernel time/iter: one iteration under `torch.profiler` (CUDA kernels; memcpy and "
              "memset counted apart). Host time/iter: issuing one iteration without waiting for the device, median of "
              "5; host µs/kernel = host time / kernels.",
              "- pointwise GB/s: 2 × 4 × n bytes / time (one read, one write); % of the copy bandwidth above. adam: "
              "each variant its own optimizer and parameters from the same seed, at step 2 after two eager steps; the "
              "compiled variants wrap `opt.step` itself. gpt, llama: parameters shared by the variants, grads set to "
              "None every iteration.",
              "- torch.compile(reduce-overhead) calls `torch.compiler.cudagraph_mark_step_begin()` before each call.",
              "", "## Notes", "", *(ctx.notes or ["- (notes from the run go here)"]), ""]
    return "\n".join(lines)


def kept_notes(path: str) -> list[str]:
    """The Notes section of an earlier report at `path` (kept when the report is written again), or []."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    if "\n## Notes\n" not in text:
        return []
    return text.split("\n## Notes\n", 1)[1].strip("\n").splitlines()


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run the workloads, write the report and the JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a rehearsal")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a CPU rehearsal in a minute or two)")
    parser.add_argument("--only", default=None, help=f"comma-separated workloads (default all: {','.join(WORKLOADS)})")
    parser.add_argument("--variants", default=None, help=f"comma-separated variants (default all: {','.join(VARIANTS)})")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per variant (the median is reported)")
    parser.add_argument("--block-ms", type=float, default=50.0, help="eager milliseconds per timed block")
    parser.add_argument("--budget-s", type=float, default=300.0, help="variants not started by then are skipped")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    parser.add_argument("--out", default=str(ROOT / "docs" / "gpu.md"), help="markdown file ('' for none)")
    parser.add_argument("--json", default=None, help="JSON lines file, one line per row as it finishes")
    opts = parser.parse_args(argv)
    dev = torch.device(opts.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here (rehearse with --device cpu --small)")
    keys = opts.only.split(",") if opts.only else list(WORKLOADS)
    variants = opts.variants.split(",") if opts.variants else list(VARIANTS)
    if not set(keys) <= set(WORKLOADS) or not set(variants) <= set(VARIANTS):
        parser.error(f"workloads: {', '.join(WORKLOADS)}; variants: {', '.join(VARIANTS)}")
    variants = ["eager", *(v for v in variants if v != "eager" and not (opts.no_compile and v.startswith("torch.compile")))]
    warnings.filterwarnings("ignore")
    json_file = open(opts.json, "w") if opts.json else None  # open for the whole run, flushed per line
    ctx = Ctx(opts, dev, json_file, notes=kept_notes(opts.out) if opts.out else [])
    info = machine(ctx)
    ctx.emit({"record": "machine", **dict(info), "options": vars(opts)})
    log(f"{info[0][1]}; workloads {','.join(keys)}; variants {','.join(variants)}")
    if ctx.cuda:  # the context, cuBLAS and the caching allocator start here rather than in eager's first call
        for dtype in (torch.float32, torch.bfloat16):
            (torch.ones(64, 64, device=dev, dtype=dtype) @ torch.ones(64, 64, device=dev, dtype=dtype)).sum().item()
    found = {w.key: w for w in workloads(dev, opts.small)}
    works = [found[k] for k in keys if k in found]  # in the order asked for
    results: dict[str, dict[str, Row]] = {}
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # a timeout: the report still written
    try:
        if "copy" in keys:
            try:
                if ctx.over_budget():
                    log("copy: skipped, time budget")
                else:
                    bench_copy(ctx)
            except Exception as e:
                log(f"copy: n/a: {reason(e)}")
            free_memory(ctx)
        for work in works:
            wanted = [*variants[:1], FUSED, *variants[1:]] if work.key == "adam" else variants
            log(f"== {work.key}: {work.title}")
            results[work.key] = rows = {v: Row() for v in wanted}
            try:
                run_workload(ctx, work, rows)
            except Exception as e:  # the shared setup failed (or memory ran out): the cells not done say why
                log(f"{work.key}: n/a: {reason(e)}")
                for row in rows.values():
                    row.note = row.note or (f"n/a: {reason(e)}" if row.ms is None else None)
            free_memory(ctx)
            if opts.out:
                Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
                Path(opts.out).write_text(report(ctx, works, results, info))
    finally:  # also when killed by SIGTERM: the rows done so far
        for row in (r for rows in results.values() for r in rows.values() if r.ms is None and r.note is None):
            row.note = "n/a: not finished"
        if json_file is not None:
            json_file.close()
        text = report(ctx, works, results, info)
        if opts.out:
            Path(opts.out).write_text(text)
        print(text[text.index("## Summary"):text.index("## Method")])
        log(f"finished{f'; wrote {opts.out}' if opts.out else ''}")


if __name__ == "__main__":
    main()
