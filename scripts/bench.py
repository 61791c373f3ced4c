"""One benchmark suite: each workload under eager, minijit.jit, minijit.jit with Inductor, torch.compile (and Thunder).

Steady-state figures come from one process, the variants interleaved (repeat r times:
time every variant once) so that machine noise hits them alike; the median per
iteration is reported with its ratio to eager (>1 is faster). First-call figures
(tracing and compiling included, imports excluded) come from fresh subprocesses, each
with an empty Inductor cache directory. Correctness is the largest absolute
difference from eager over every result (outputs, gradients, mutated inputs), each
variant run once from the same fresh state.

Run: python scripts/bench.py [--quick] [--repeats N] [--no-first-call] [--out docs/benchmarks.md]
On a GPU: python scripts/bench.py --device cuda [options of scripts/bench_gpu.py]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "scripts"):  # minijit, and bench_loops beside this file (also when loaded by a test)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_import_start = time.perf_counter()
import minijit  # noqa: E402

IMPORT_S = time.perf_counter() - _import_start  # `import minijit` after torch, for the first-call notes

import bench_loops  # noqa: E402  (beside this file)

VARIANTS = ("eager", "minijit", "minijit+inductor", "torch.compile", "thunder")
FIRST_CALL = {"mlp": ("eager", "minijit", "minijit+inductor", "torch.compile"),
              "adam": ("eager", "minijit", "minijit+inductor", "torch.compile"),
              "llama": ("eager", "minijit"),
              "generate-llama-dynamic": ("eager", "minijit", "torch.compile"),
              "lr-schedule": ("eager", "minijit", "torch.compile"),
              "lr-schedule-small": ("eager", "minijit", "torch.compile"),
              "serving": ("eager", "minijit", "torch.compile")}
# Fresh processes per first-call figure (the median is reported) where a run takes seconds, not minutes.
FIRST_CALL_RUNS = {"eager": 3, "minijit": 3}


# -- workloads -------------------------------------------------------------------------

def add_one(a):
    return a + 1


def pointwise_chain(x):
    y = x.sin()
    y = y * 2.0
    y = y + 1.0
    y = y.exp()
    y = y - x
    y = y.tanh()
    y = y * 0.5
    y = y + x
    return y.relu()


def mlp_loss(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2).square().mean()


def adam_step(params, grads, exp_avgs, exp_avg_sqs):
    # torch.optim.Adam's update at step 3 (lr 1e-3, betas (0.9, 0.999), eps 1e-8), bias corrections folded in.
    step_size = 1e-3 / (1 - 0.9 ** 3)
    bias_correction2_sqrt = math.sqrt(1 - 0.999 ** 3)
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        denom = (v.sqrt() / bias_correction2_sqrt).add_(1e-8)
        p.addcdiv_(m, denom, value=-step_size)


def optimizer_step(opt):
    # The same update through torch.optim: the minijit column is minijit.jit(lambda: opt.step()) (the optimizer
    # passed in rather than closed over: the bench's variants wrap a function of the workload's arguments).
    opt.step()


def gpt_block_loss(x, ln1_w, ln1_b, w_attn, b_attn, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_fc2, b_fc2):
    B, T, C = x.shape
    h = F.layer_norm(x, (C,), ln1_w, ln1_b)
    q, k, v = F.linear(h, w_attn, b_attn).split(C, dim=2)
    q = q.view(B, T, 4, C // 4).transpose(1, 2)
    k = k.view(B, T, 4, C // 4).transpose(1, 2)
    v = v.view(B, T, 4, C // 4).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), w_proj, b_proj)
    x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,), ln2_w, ln2_b), w_fc, b_fc)), w_fc2, b_fc2)
    return x.square().mean()


def sdpa_loss(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().mean()


def index_copy_sdpa(q, k, v, mask, idx, src):
    q.index_copy_(2, idx, src)
    k.index_copy_(2, idx, src)
    return F.scaled_dot_product_attention(q, k, v, mask)


class CausalLMLoss(torch.nn.Module):
    """A Hugging Face causal LM's loss on (input_ids, labels), called as users call the model."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels).loss


def hf_llama() -> CausalLMLoss:
    """A randomly initialised Hugging Face Llama: hidden 256, 4 layers, 8 heads sharing 4 key/value heads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config: nothing to download
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return CausalLMLoss(LlamaForCausalLM(config).train())


def _randn(*shape, scale=1.0, grad=False):
    t = torch.randn(*shape) * scale
    return t.requires_grad_() if grad else t


@dataclass
class Workload:
    """A benchmark: the function, fresh arguments by seed, and how one iteration runs it."""

    key: str
    title: str
    fn: Callable[..., Any]
    make: Callable[[], list[Any]]
    # "forward": call; "train": call, then backward of the loss; "inplace": call under no_grad;
    # "optimizer": call `fn(opt)` under no_grad, compare the optimizer's parameters and state;
    # "loop": `loop(fn, args)` runs a whole loop of calls that differ (scripts/bench_loops.py).
    kind: str
    iters: int = 1  # iterations per timed sample (set from eager's time per iteration)
    loop: Callable[..., list[torch.Tensor]] | None = None

    def args(self, seed: int = 0) -> list[Any]:
        torch.manual_seed(seed)
        return self.make()

    def step(self, fn: Callable[..., Any], args: list[Any]) -> list[torch.Tensor]:
        """One iteration; returns every result to compare with eager."""
        if self.loop is not None:
            return self.loop(fn, args)
        if self.kind == "train":
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if isinstance(self.fn, torch.nn.Module):  # shared by every variant's wrapper of the module
                leaves += list(self.fn.parameters())
            for t in leaves:
                t.grad = None
            loss = fn(*args)
            loss.backward()
            return [loss.detach(), *(t.grad for t in leaves)]
        if self.kind == "optimizer":  # args: [an optimizer]; results: its parameters and state after the step
            with torch.no_grad():
                fn(*args)
            opt = args[0]
            return [*(p for group in opt.param_groups for p in group["params"]),
                    *(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))]
        if self.kind == "inplace":
            with torch.no_grad():
                out = fn(*args)
            flat = [t for a in args for t in (a if isinstance(a, list) else [a])]
            return [*([out] if isinstance(out, torch.Tensor) else []), *flat]
        return [fn(*args)]


def workloads() -> list[Workload]:
    """The workloads of issue 8, at the issue's sizes, and a Hugging Face Llama (issue 13)."""
    def adam_args():
        shapes = [(1000, 1000)] * 20
        return [[torch.randn(s) for s in shapes], [torch.randn(s) * 0.01 for s in shapes],
                [torch.randn(s) * 0.01 for s in shapes], [torch.rand(s) * 1e-4 for s in shapes]]

    def optimizer_args():
        # torch.optim.Adam (default implementation: for-loop on a CPU) on adam_args' tensors, its state at step 2,
        # so that the first step is adam_step's update (the timed ones go on from there).
        params, grads, exp_avgs, exp_avg_sqs = adam_args()
        opt = torch.optim.Adam(params, lr=1e-3)
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            p.grad = g
            opt.state[p] = {"step": torch.tensor(2.0), "exp_avg": m, "exp_avg_sq": v}
        return [opt]

    def gpt_args():
        C = 256
        p = [torch.ones(C), torch.zeros(C), _randn(3 * C, C, scale=0.02), torch.zeros(3 * C),
             _randn(C, C, scale=0.02), torch.zeros(C), torch.ones(C), torch.zeros(C),
             _randn(4 * C, C, scale=0.02), torch.zeros(4 * C), _randn(C, 4 * C, scale=0.02), torch.zeros(C)]
        return [torch.randn(4, 128, C), *(t.requires_grad_() for t in p)]

    def mutation_args():
        B, H, T, D = 4, 4, 128, 64
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return [torch.randn(B, H, T, D), torch.randn(B, H, T, D), torch.randn(B, H, T, D), mask,
                torch.arange(0, T, 8), torch.randn(B, H, T // 8, D)]

    def llama_args():
        ids = torch.randint(3, 2048, (4, 128))
        return [ids, ids.clone()]

    found = [
        Workload("overhead", "per call, a + 1 on 1 element", add_one, lambda: [torch.randn(1)], "forward"),
        Workload("pointwise", "9-op pointwise chain, 4M f32", pointwise_chain, lambda: [torch.randn(4 * 2**20)],
                 "forward"),
        Workload("mlp", "MLP 1024-4096-1024 fwd+bwd, batch 64", mlp_loss,
                 lambda: [torch.randn(64, 1024), _randn(4096, 1024, scale=0.02, grad=True),
                          _randn(4096, grad=True), _randn(1024, 4096, scale=0.02, grad=True),
                          _randn(1024, grad=True)], "train"),
        Workload("adam", "Adam in-place, 20 x 1M", adam_step, adam_args, "inplace"),
        Workload("adam-optim", "jit(opt.step), torch.optim.Adam, 20 x 1M", optimizer_step, optimizer_args, "optimizer"),
        Workload("gpt", "GPT block fwd+bwd (B=4, T=128, C=256)", gpt_block_loss, gpt_args, "train"),
        Workload("mutation", "index_copy_ x2 + sdpa (issue 5)", index_copy_sdpa, mutation_args, "inplace"),
        Workload("sdpa", "causal SDPA fwd+bwd (B=1, H=4, T=1024, E=64)", sdpa_loss,
                 lambda: [_randn(1, 4, 1024, 64, grad=True) for _ in range(3)], "train"),
    ]
    fn, make, loop = bench_loops.lr_schedule_loop()
    found.append(Workload("lr-schedule", "jit(opt.step) AdamW 8 x 256², cosine lr schedule (a new lr each step)",
                          fn, make, "loop", loop=loop))
    fn, make, loop = bench_loops.lr_schedule_loop(bench_loops.TRANSFORMER_SHAPES)
    found.append(Workload("lr-schedule-small", "jit(opt.step) AdamW, 60 parameters of a small transformer (128² and "
                          "512 x 128 weights, biases, norms), cosine lr schedule", fn, make, "loop", loop=loop))
    for whole in (True, False):
        fn, make, loop = bench_loops.train_step_loop(whole)
        found.append(Workload("train-step" if whole else "train-step-parts",
                              "training step, 2 encoder layers 128 wide, B=8 T=64, AdamW + clipping: " + (
                                  "the whole step jitted" if whole else "forward+loss jitted, and opt.step"),
                              fn, make, "loop", loop=loop))
    if importlib.util.find_spec("transformers") is not None:
        found.append(Workload("llama", "HF Llama fwd+bwd (B=4, T=128, hidden 256, 4 layers)", hf_llama(), llama_args,
                              "train"))
        # (an encoder-decoder too: its decoder takes one new token per call, and only its cache grows)
        generations = [(arch, cache) for arch in ("llama", "qwen2") for cache in ("dynamic", "static")]
        for arch, cache in [*generations, ("bart", "dynamic")]:
            fn, make, loop = bench_loops.generate_loop(arch, cache)
            found.append(Workload(f"generate-{arch}-{cache}", f"generate() {bench_loops.NEW_TOKENS} tokens, tiny "
                                  f"{arch}, {cache} cache, batch 2 (jitted forward)", fn, make, "loop", loop=loop))
        fn, make, loop = bench_loops.serving_loop()
        found.append(Workload("serving", "tiny BERT serving batches 1-8 x lengths 5-64 (8 shapes)", fn, make, "loop",
                              loop=loop))
    else:
        print("bench: transformers is not installed: no Hugging Face Llama row", file=sys.stderr)
    return found


# -- variants --------------------------------------------------------------------------

def build(variant: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The callable a variant runs `fn` as; raises with the reason where the variant cannot run."""
    if variant == "eager":
        return fn
    if variant == "minijit":
        return minijit.jit(fn)
    if variant == "minijit+inductor":
        return minijit.jit(fn, executors=["inductor"])
    if variant == "torch.compile":
        return torch.compile(fn)
    if variant == "thunder":
        if importlib.util.find_spec("thunder") is None:
            raise NotAvailable("not installed")
        import thunder

        return thunder.jit(fn)
    raise ValueError(variant)


class NotAvailable(Exception):
    """A variant that cannot run here, for a reason given as is."""


def _reason(e: BaseException) -> str:
    if isinstance(e, NotAvailable):
        return str(e)
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:70]}" if text else type(e).__name__


def max_abs_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest |got - want| over all results (inf where shapes or counts differ)."""
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        if g is None or w is None:
            if g is not w:
                return math.inf
            continue
        if g.shape != w.shape:
            return math.inf
        if g.numel():
            worst = max(worst, (g.detach().double() - w.detach().double()).abs().max().item())
    return worst


def time_iters(work: Workload, fn: Callable[..., Any], args: list[Any]) -> float:
    """Seconds per iteration over one sample of `work.iters` iterations."""
    start = time.perf_counter()
    for _ in range(work.iters):
        work.step(fn, args)
    return (time.perf_counter() - start) / work.iters


@dataclass
class Result:
    """A variant's figures on one workload."""

    seconds: float | None = None  # median steady-state seconds per iteration
    diff: float | None = None
    note: str | None = None  # why there are no figures ("n/a: ...")
    first_call: float | None = None
    first_call_note: str | None = None
    first_call_no_pyc: float | None = None  # the same without compiled bytecode of minijit's modules
    import_s: float | None = None
    traces: str | None = None  # a jitted loop workload's traces over every call the run made


def steady_state(work: Workload, variants: list[str], repeats: int, sample_s: float) -> dict[str, Result]:
    """Build each variant, check it against eager once, warm up, then time the variants interleaved.

    Each sample runs as many iterations as take eager about `sample_s` seconds.
    """
    results: dict[str, Result] = {}
    runners: dict[str, tuple[Callable[..., Any], list[Any]]] = {}
    want = work.step(work.fn, work.args(0))
    probe = work.args(1)
    work.iters = 1
    eager_s = min(time_iters(work, work.fn, probe) for _ in range(3))
    work.iters = max(1, min(20000, round(sample_s / max(eager_s, 1e-9))))
    for variant in variants:
        try:
            fn = build(variant, work.fn)
            got = work.step(fn, work.args(0))
            args = work.args(1)
            for _ in range(2):
                work.step(fn, args)
        except Exception as e:  # a variant that cannot run this workload is reported, not fatal
            results[variant] = Result(note=f"n/a: {_reason(e)}")
            continue
        results[variant] = Result(diff=max_abs_diff(got, want))
        runners[variant] = (fn, args)
    samples: dict[str, list[float]] = {v: [] for v in runners}
    for _ in range(repeats):
        for variant, (fn, args) in runners.items():
            samples[variant].append(time_iters(work, fn, args))
    for variant, times in samples.items():
        results[variant].seconds = statistics.median(times)
        if work.kind == "loop" and variant.startswith("minijit"):
            results[variant].traces = bench_loops.traces_note(runners[variant][0])
    return results


def first_call_in_subprocess(key: str, variant: str, timeout: float,
                             pycache: str | None) -> tuple[float | None, str | None, float | None]:
    """Seconds of the first call (tracing and compiling included) in a fresh process with a cold Inductor cache.

    `pycache` is a bytecode cache directory (PYTHONPYCACHEPREFIX) holding minijit's compiled
    modules, as an installed package has them; None runs with none, so that every module of
    the checkout is compiled from source as it is imported. Returns (seconds, note, import_s).
    """
    with tempfile.TemporaryDirectory(prefix="minijit_bench_") as cache_dir:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPYCACHEPREFIX", None)
        if pycache is not None:
            env["PYTHONPYCACHEPREFIX"] = pycache
        try:
            proc = subprocess.run([sys.executable, __file__, "--first-call", key, variant], capture_output=True,
                                  text=True, env=env, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return None, f"n/a: over {timeout:.0f} s", None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            return data.get("seconds"), data.get("note"), data.get("import_s")
    return None, f"n/a: exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:90]}", None


def compiled_bytecode_cache(directory: str) -> str:
    """Compile the checkout's modules into `directory` (a PYTHONPYCACHEPREFIX), as installing a package does."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=directory)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "minijit", "executors", "scripts"], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    return directory


def first_calls(key: str, variant: str, timeout: float, pycache: str, result: Result) -> None:
    """Fill `result`'s first-call figures: the median over fresh processes, with and without bytecode."""
    runs = FIRST_CALL_RUNS.get(variant, 1)
    found = [first_call_in_subprocess(key, variant, timeout, pycache) for _ in range(runs)]
    seconds = [f[0] for f in found if f[0] is not None]
    if not seconds:
        result.first_call_note = found[-1][1]
        return
    result.first_call = statistics.median(seconds)
    result.import_s = statistics.median([f[2] for f in found if f[2] is not None] or [math.nan])
    if variant == "minijit":
        no_pyc = [first_call_in_subprocess(key, variant, timeout, None)[0] for _ in range(runs)]
        no_pyc = [x for x in no_pyc if x is not None]
        result.first_call_no_pyc = statistics.median(no_pyc) if no_pyc else None


def first_call_here(key: str, variant: str) -> None:
    """The --first-call mode: time building the variant and its first iteration, print JSON."""
    work = next(w for w in workloads() if w.key == key)
    args = work.args(0)
    try:
        start = time.perf_counter()
        fn = build(variant, work.fn)
        work.step(fn, args)
        print(json.dumps({"seconds": time.perf_counter() - start, "import_s": IMPORT_S}))
    except Exception as e:
        print(json.dumps({"seconds": None, "note": f"n/a: {_reason(e)}"}))


# -- report ----------------------------------------------------------------------------

def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def cell(res: Result, eager: Result) -> str:
    if res.seconds is None:
        return res.note or "n/a"
    traces = f", {res.traces}" if res.traces else ""
    if eager.seconds is None:
        return fmt_time(res.seconds) + traces
    return f"{eager.seconds / res.seconds:.2f}× ({fmt_time(res.seconds)}{traces})"


def fmt_diff(d: float | None) -> str:
    if d is None:
        return "-"
    return "0" if d == 0 else f"{d:.1e}"


def table_rows(works: list[Workload], all_results: dict[str, dict[str, Result]], variants: list[str]) -> list[list[str]]:
    rows = []
    for work in works:
        res = all_results[work.key]
        eager = res["eager"]
        row = [work.title, fmt_time(eager.seconds) if eager.seconds else (eager.note or "n/a")]
        row += [cell(res[v], eager) for v in variants if v != "eager"]
        row.append(" / ".join(fmt_diff(res[v].diff) for v in variants if v != "eager"))
        rows.append(row)
    for key, fc_variants in FIRST_CALL.items():
        if key not in all_results:
            continue
        work = next(w for w in works if w.key == key)
        res = all_results[key]
        fc_variants = [v for v in fc_variants if v in res]
        if all(res[v].first_call is None and res[v].first_call_note is None for v in fc_variants):
            continue
        row = [f"first call, {work.title}"]
        for v in variants:
            if v in fc_variants:
                fc = res[v].first_call
                cell_text = fmt_time(fc) if fc is not None else (res[v].first_call_note or "n/a")
                if res[v].first_call_no_pyc is not None:
                    cell_text += f" ({fmt_time(res[v].first_call_no_pyc)} without .pyc)"
                row.append(cell_text)
            else:
                row.append(res[v].note or "—")
        row.append("")
        rows.append(row)
    return rows


def headers(variants: list[str]) -> list[str]:
    shown = [v for v in variants if v != "eager"]
    return ["workload", "eager", *shown, "max abs diff vs eager (" + " / ".join(s.replace("minijit+", "") for s in shown) + ")"]


def print_table(head: list[str], rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(" | ".join(head))
        for r in rows:
            print(" | ".join(r))
        return
    table = Table(title="minijit benchmarks (speed-up over eager, >1 is faster; steady state)")
    for h in head:
        table.add_column(h)
    for r in rows:
        table.add_row(*r)
    Console(width=200).print(table)


def machine() -> dict[str, str]:
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        rev = "?"
    return {"cpu": model, "cores": str(os.cpu_count()), "torch threads": str(torch.get_num_threads()),
            "python": platform.python_version(), "torch": torch.__version__, "minijit": f"0.1.0 ({rev or '?'})",
            "thunder": "not installed" if importlib.util.find_spec("thunder") is None else "installed",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def write_markdown(path: Path, head: list[str], rows: list[list[str]], info: dict[str, str], loads: tuple[str, str],
                   opts: argparse.Namespace, elapsed: float) -> None:
    lines = ["# Benchmarks", "",
             "Written by `python scripts/bench.py` (last run below). Each cell: speed-up over eager in the same run "
             "(>1 is faster) and the median time per iteration. First-call rows: time from the start of the first "
             "call to its end (building the jitted function, tracing and compiling included, imports excluded), in "
             "fresh processes with an empty Inductor cache, the median of 3 for eager and minijit; minijit's modules "
             "load from compiled bytecode as in an installed package (in parentheses: without .pyc files, as this "
             "checkout runs under PYTHONDONTWRITEBYTECODE=1, so each module imported during the call is compiled from "
             "source). Where each target is missed and why: [profiles.md](profiles.md).", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += [f"- load average (1 min) at start / end: {loads[0]} / {loads[1]}",
              f"- options: repeats={opts.repeats}, quick={opts.quick}, first call={'no' if opts.no_first_call else 'yes'}, "
              f"torch.compile first call={'yes' if opts.first_call_torch_compile else 'no'}; "
              f"the run took {elapsed / 60:.1f} min", ""]
    lines += ["## Notes", "",
              "- **Noise.** This machine has 2 cores and other processes may be running "
              "during a run (see the load average): figures are noisy, and differences under ~1.5× on the big "
              "workloads are within the noise. The variants are interleaved so that noise hits them alike.",
              "- **Backward.** The fwd+bwd workloads run minijit's compiled forward and backward traces (the grad "
              "transform), joined to torch autograd by one autograd.Function per call.",
              "- **Inductor executor.** A region compiles on its first run (torch.compile's own laziness, with the "
              "call's tensors, so that its guards hold on the calls after), so its compile time is in the first "
              "call. Matmuls, "
              "attention, views with symbolic sizes and the integer arithmetic on those sizes join the regions, so a "
              "decode step's forward is one compiled region; pointwise ops, reductions, LayerNorm, GELU and the "
              "in-place updates are fused (the whole Adam step is one region writing straight into the parameters). "
              "A float the trace computes (an lr, `Tensor.item()`) is a region input, and the arithmetic on it runs "
              "between regions.",
              "- **torch.compile** is `torch.compile(fn)` with default options; its first call (a cold Inductor "
              "compile of the whole function, about as long as the minijit+inductor one) is timed only with "
              "`--first-call-torch-compile`, to keep the run under 10 minutes. **Thunder** is not installed here.",
              "- Samples: each runs as many iterations as take eager about 0.25 s (0.1 s with --quick); the median "
              "of the interleaved samples is reported.",
              "- Correctness column: largest absolute difference from eager over outputs, gradients and mutated "
              "inputs, one iteration from the same state, per variant in column order.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", default="cpu")
    known, rest = pre.parse_known_args(argv)
    if known.device != "cpu":  # the GPU suite, with the other options
        import bench_gpu  # beside this file

        bench_gpu.main(["--device", known.device, *rest])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: runs scripts/bench_gpu.py with the other options")
    parser.add_argument("--quick", action="store_true", help="shorter samples (0.1 s of eager instead of 0.25 s), 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved samples per variant (default 3, quick 2)")
    parser.add_argument("--no-first-call", action="store_true", help="skip the fresh-process first-call figures")
    parser.add_argument("--first-call-torch-compile", action="store_true",
                        help="also time torch.compile's first call (a cold Inductor compile: minutes on 2 cores)")
    parser.add_argument("--first-call-timeout", type=float, default=240.0)
    parser.add_argument("--only", default=None,
                        help="comma-separated workload keys (overhead,pointwise,mlp,adam,adam-optim,gpt,mutation,sdpa,"
                             "llama,lr-schedule,lr-schedule-small,train-step,train-step-parts,generate-{llama,qwen2}-{dynamic,static},generate-bart-dynamic,serving)")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated variants, eager first (default: all of {','.join(VARIANTS)})")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown file to write ('' for none)")
    parser.add_argument("--first-call", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.first_call:
        first_call_here(*opts.first_call)
        return
    opts.repeats = opts.repeats or (2 if opts.quick else 3)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    load_start = f"{os.getloadavg()[0]:.1f}"
    works = workloads()
    if opts.only:
        keys = opts.only.split(",")
        works = [w for w in works if w.key in keys]
    variants = opts.variants.split(",") if opts.variants else list(VARIANTS)
    if variants[0] != "eager" or not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: eager first, then some of {', '.join(VARIANTS[1:])}")
    all_results: dict[str, dict[str, Result]] = {}
    for work in works:
        print(f"[{time.perf_counter() - start:6.0f} s] steady state: {work.title}", file=sys.stderr, flush=True)
        all_results[work.key] = steady_state(work, variants, opts.repeats, 0.1 if opts.quick else 0.25)
    if not opts.no_first_call:
        with tempfile.TemporaryDirectory(prefix="minijit_pyc_") as pycache:
            compiled_bytecode_cache(pycache)
            for key, fc_variants in FIRST_CALL.items():
                if key not in all_results:
                    continue
                for v in fc_variants:
                    if v not in variants or all_results[key][v].note:
                        continue
                    if v == "torch.compile" and not opts.first_call_torch_compile:
                        all_results[key][v].first_call_note = "not run (--first-call-torch-compile)"
                        continue
                    print(f"[{time.perf_counter() - start:6.0f} s] first call: {key} / {v}", file=sys.stderr, flush=True)
                    first_calls(key, v, opts.first_call_timeout, pycache, all_results[key][v])
    head, rows = headers(variants), table_rows(works, all_results, variants)
    print_table(head, rows)
    elapsed = time.perf_counter() - start
    info = machine()
    imports = [r.import_s for res in all_results.values() for r in res.values() if r.import_s is not None]
    if imports:
        info["import minijit (after torch, fresh process, with .pyc)"] = fmt_time(statistics.median(imports))
    if opts.out:
        write_markdown(Path(opts.out), head, rows, info, (load_start, f"{os.getloadavg()[0]:.1f}"), opts, elapsed)
        print(f"wrote {opts.out} ({elapsed / 60:.1f} min)")


if __name__ == "__main__":
    main()
