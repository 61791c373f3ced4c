"""The GPU check of issue 16: minijit's executors on a CUDA device against eager torch, in one command.

On the GPU machine, from the repository root:

    PYTHONPATH=. python scripts/gpu_check.py            # details to gpu_check.log, a table last

Each check runs a workload eagerly and under `minijit.jit` on fresh random inputs and
compares the results (and gradients, and the inputs a step writes). Before each jitted
call the CUDA caching allocator is *poisoned*: a large block filled with NaN is freed, so
an output the executor forgot to write shows up as NaN instead of as stale correct values.

Without CUDA the same checks run on the CPU, the Triton kernels through Triton's
interpreter (`TRITON_INTERPRET=1`), at small sizes (`--small`, the default there): that
is how the tests check this script. Sizes in brackets are the GPU ones.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "scripts", ROOT / "examples"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch.nn.functional as F  # noqa: E402

import minijit  # noqa: E402
from minijit.testing import tolerance  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def poison(device: str) -> None:
    """Leave a NaN-filled block in the CUDA caching allocator for the next allocations to reuse."""
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        block = torch.empty(min(free // 4, 1 << 30) // 4, device=device).fill_(float("nan"))
        del block


def close(got: object, want: object, dtype: torch.dtype = torch.float32, what: str = "result",
          reduction_length: int = 1) -> None:
    """Assert two results (tensors, or nested tuples/lists of them) are equal within the tolerance of
    `minijit.testing.tolerance` for dtype and the length of the longest sum behind them."""
    if isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), f"{what}: {type(got)} != {type(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            close(g, w, dtype, f"{what}[{i}]", reduction_length)
        return
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{what}: {type(got).__name__} is not a tensor"
        torch.testing.assert_close(got, want, **tolerance(dtype, reduction_length), msg=lambda m: f"{what}: {m}")
        return
    assert got == want, f"{what}: {got!r} != {want!r}"


def fused(jf: Callable[..., object]) -> bool:
    """Whether the last call's final trace ran a Triton region."""
    return "tritonex.fusion_" in minijit.last_traces(jf)[-1].python()


# -- the checks: each returns a short detail for the table, or raises ---------------------------------

def check_triton_tests(device: str, small: bool) -> str:
    """tests/executors/test_triton.py, which runs on CUDA where there is one: every op the executor claims."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                          str(ROOT / "tests" / "executors" / "test_triton.py")], cwd=ROOT, capture_output=True, text=True)
    log(run.stdout[-4000:] + run.stderr[-2000:])
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr.strip()[-200:]
    assert run.returncode == 0, last
    return last


def check_norms(device: str, small: bool) -> str:
    """softmax, layer_norm and rms_norm, forward and backward, fused by Triton, at rows of [4k, 8k, 32k]."""
    widths = [33, 256] if small else [4096, 8192, 32768]
    rows = 4 if small else 64
    fns = {
        "softmax": lambda x, w, b: torch.softmax(x, -1),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
        "rms_norm": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w),
    }
    done = 0
    for name, fn in fns.items():
        for width in widths:
            for dtype in DTYPES:
                for strided in (False, True):
                    torch.manual_seed(width)
                    x = torch.randn(rows, 2 * width if strided else width, device=device).to(dtype)
                    x = x[:, ::2] if strided else x
                    w = torch.randn(width, device=device, dtype=dtype)
                    b = torch.randn(width, device=device, dtype=dtype)
                    grad = torch.randn(rows, width, device=device, dtype=dtype)
                    ins = [t.detach().clone().requires_grad_() for t in (x, w, b)]
                    want = fn(*ins)
                    want_grads = torch.autograd.grad(want, ins, grad, allow_unused=True)
                    jf = minijit.jit(fn, executors=["triton"])
                    jins = [t.detach().clone().requires_grad_() for t in (x, w, b)]
                    poison(device)
                    got = jf(*jins)
                    assert fused(jf), f"{name}: no Triton region in the final trace"
                    poison(device)
                    got_grads = torch.autograd.grad(got, jins, grad, allow_unused=True)
                    where = f"{name} width {width} {dtype} {'strided' if strided else 'contiguous'}"
                    close(got, want, dtype, where, width)
                    # The weight and bias gradients also sum over the rows.
                    close([g for g in got_grads if g is not None], [g for g in want_grads if g is not None],
                          dtype, f"{where} grads", width * rows)
                    done += 1
    return f"{done} cases (3 ops x {len(widths)} widths x 3 dtypes x 2 layouts), fwd+bwd"


def check_gpt_training(device: str, small: bool) -> str:
    """examples/gpt.py's GPT trained 3 AdamW steps with executors=['triton'], equal to eager at each step."""
    import gpt

    torch.manual_seed(0)
    config = gpt.GPTConfig() if small else gpt.GPTConfig(vocab_size=512, block_size=256, n_layer=4, n_head=8, n_embd=256)
    eager = gpt.GPT(config).to(device)
    jitted = copy.deepcopy(eager)
    jmodel = minijit.jit(jitted, executors=["triton"])
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, jitted)]
    seq = 16 if small else 256
    for step in range(3):
        idx = torch.randint(0, config.vocab_size, (4, seq), device=device)
        targets = torch.randint(0, config.vocab_size, (4, seq), device=device)
        poison(device)
        results = []
        for model, opt in zip((eager, jmodel), opts, strict=True):
            logits, loss = model(idx, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            results.append((logits, loss))
        # The longest sums: the weight gradients', over the batch's 4 x seq tokens.
        close(results[1], results[0], torch.float32, f"logits and loss at step {step}", 4 * seq)
    close(list(jitted.parameters()), list(eager.parameters()), torch.float32, "parameters after 3 steps", 4 * seq)
    return f"3 steps, loss {results[0][1].item():.4f}; Triton regions: {fused(jmodel)}"


def check_index_copy_sdpa(device: str, small: bool) -> str:
    """index_copy_ twice then sdpa (the copy check on): outputs and the written q, k equal eager."""
    from bench import index_copy_sdpa

    b, h, t, d = (1, 2, 8, 16) if small else (8, 16, 1024, 64)
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device=device) for _ in range(3))
    mask = torch.ones(t, t, device=device, dtype=torch.bool).tril()
    idx = torch.tensor([0, t // 2], device=device)
    src = torch.randn(b, h, 2, d, device=device)
    want_q, want_k = q.clone(), k.clone()
    want = index_copy_sdpa(want_q, want_k, v, mask, idx, src)
    jf = minijit.jit(index_copy_sdpa, executors=["triton"])
    poison(device)
    got = jf(q, k, v, mask, idx, src)
    close([got, q, k], [want, want_q, want_k], torch.float32, "output, q, k", t)  # sums over the keys
    return "output and both written inputs equal eager"


def check_adam(device: str, small: bool) -> str:
    """jit(opt.step) for torch.optim.Adam, default options (foreach on CUDA, its `step` on the CPU) with the
    default executors and with Triton, then capturable and fused: the parameters written in place equal
    eager's after 3 steps."""
    sizes = [(64,), (8, 33)] if small else [(1 << 20,)] * 20
    variants = [({}, None), ({}, ["triton"]), ({"foreach": True}, ["triton"]), ({"fused": True}, None)]
    if device == "cuda":
        variants += [({"capturable": True}, ["triton"]), ({"fused": True}, ["triton"])]
    for options, executors in variants:
        torch.manual_seed(0)
        params = [torch.randn(s, device=device, requires_grad=True) for s in sizes]
        twins = [p.detach().clone().requires_grad_() for p in params]
        opt, twin_opt = torch.optim.Adam(params, lr=1e-2, **options), torch.optim.Adam(twins, lr=1e-2, **options)
        step = minijit.jit(opt.step, executors=executors)
        for i in range(3):
            for p, q in zip(params, twins, strict=True):
                p.grad = torch.randn_like(p)
                q.grad = p.grad.clone()
            poison(device)
            step()
            twin_opt.step()
            close(params, twins, torch.float32, f"Adam {options} executors={executors}: parameters after step {i}")
    return f"{len(sizes)} parameters, 3 steps, {len(variants)} variants (default options included)"


def check_cpu_scalar(device: str, small: bool) -> str:
    """A 0-dim CPU tensor mixed with device tensors, as eager allows."""
    def fn(x, scale):
        return (x * scale + scale).sin()

    x, scale = torch.randn(16, 16, device=device), torch.tensor(0.5)
    close(minijit.jit(fn, executors=["triton"])(x, scale), fn(x, scale))
    return f"{device} tensor times a 0-dim cpu tensor"


def check_hf_llama(device: str, small: bool) -> str:
    """The Hugging Face Llama of the benchmark (random weights, built from a config): loss and gradients."""
    from bench import hf_llama

    model = hf_llama().to(device)
    twin = copy.deepcopy(model)
    jmodel = minijit.jit(twin, executors=["triton"])
    torch.manual_seed(1)
    ids = torch.randint(0, 2048, (2, 16 if small else 128), device=device)
    want = model(ids, ids)
    want.backward()
    poison(device)
    got = jmodel(ids, ids)
    got.backward()
    # The longest sums: the weight gradients', over the tokens (and the loss's over the vocabulary).
    close(got, want, torch.float32, "loss", 2048)
    close([p.grad for p in twin.parameters()], [p.grad for p in model.parameters()], torch.bfloat16, "gradients",
          ids.numel())
    return f"loss {want.item():.4f}, gradients of {sum(1 for _ in model.parameters())} parameters"


CHECKS: dict[str, Callable[[str, bool], str]] = {
    "triton ops (test_triton.py)": check_triton_tests,
    "norm kernels": check_norms,
    "GPT 3 training steps": check_gpt_training,
    "index_copy_ x2 + sdpa": check_index_copy_sdpa,
    "Adam step in place": check_adam,
    "0-dim cpu tensor": check_cpu_scalar,
    "HF Llama fwd+bwd": check_hf_llama,
}
# Not checked yet (issue 16): a user's Triton kernel writing in place under jit (the Liger case).

_LOG: list[str] = []


def log(text: str) -> None:
    """Keep `text` for the log file."""
    _LOG.append(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", default=None, help="small sizes (the default without CUDA)")
    parser.add_argument("--only", nargs="*", default=None, help="run the checks whose names contain one of these")
    parser.add_argument("--log", default="gpu_check.log")
    opts = parser.parse_args()
    small = opts.small if opts.small is not None else opts.device != "cuda"
    rows = []
    for name, check in CHECKS.items():
        if opts.only is not None and not any(word in name for word in opts.only):
            continue
        log(f"== {name}")
        try:
            rows.append((name, "PASS", check(opts.device, small)))
        except Exception as e:  # a failing check is reported, and the others still run
            log(traceback.format_exc())
            rows.append((name, "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"))
        log(f"-> {rows[-1][1]}: {rows[-1][2]}")
    Path(opts.log).write_text("\n".join(_LOG) + "\n")
    device = torch.cuda.get_device_name() if opts.device == "cuda" else "cpu (Triton interpreter)"
    print(f"\ngpu_check on {device}, torch {torch.__version__}, {'small' if small else 'full'} sizes "
          f"(details: {opts.log})")
    width = max(len(r[0]) for r in rows) if rows else 0
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status}  {detail}")
    return 0 if all(status == "PASS" for _, status, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
