"""Normalization and reduction ops on inputs with a zero-size dim (in each position the op accepts), jitted against
eager: outputs (values, nan placement, dtypes) and `torch.autograd.grad` of every floating input, for a fresh jit, one
that saw the empty dims at sizes 2 and 4 first, and the gradients taken inside the traced function; where eager raises,
the jitted call must raise too. `python scripts/sweeps/empty_inputs.py [-v]`: one line per mismatch, then counts.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

import minijit

F = torch.nn.functional
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
Case = tuple[str, Callable[..., Any], Callable[[torch.dtype], tuple[Any, ...]]]


def _randn(*shape: int) -> Callable[[torch.dtype], torch.Tensor]:
    return lambda dtype: torch.randn(shape, dtype=dtype)


def _args(*makers: Any) -> Callable[[torch.dtype], tuple[Any, ...]]:
    """Arguments made in a dtype: each a tensor maker (`_randn`), or any other value passed as it is."""
    return lambda dtype: tuple(m(dtype) if callable(m) else m for m in makers)


def _norm_cases() -> list[Case]:
    found: list[Case] = []
    for shape in [(1, 6, 0), (0, 6, 3), (0, 6), (2, 6, 0, 3), (2, 0, 3)]:
        c = shape[1]
        found.append((f"group_norm {shape}", lambda x, w, b: F.group_norm(x, 2, w, b),
                      _args(_randn(*shape), _randn(c), _randn(c))))
        found.append((f"group_norm no affine {shape}", lambda x: F.group_norm(x, 2), _args(_randn(*shape))))
    for shape, norm in [((0, 4), (4,)), ((3, 0), (0,)), ((3, 0, 4), (4,)), ((3, 4, 0), (4, 0)), ((0,), (0,))]:
        found.append((f"layer_norm {shape} over {norm}", lambda x, w, b, n=norm: F.layer_norm(x, n, w, b),
                      _args(_randn(*shape), _randn(*norm), _randn(*norm))))
        found.append((f"layer_norm no affine {shape} over {norm}", lambda x, n=norm: F.layer_norm(x, n),
                      _args(_randn(*shape))))
        found.append((f"rms_norm {shape} over {norm}", lambda x, w, n=norm: F.rms_norm(x, n, w),
                      _args(_randn(*shape), _randn(*norm))))
    for shape in [(0, 3, 4), (2, 3, 0), (2, 0, 4), (2, 3, 0, 2)]:
        c = shape[1]
        found.append((f"instance_norm {shape}", lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
                      _args(_randn(*shape), _randn(c), _randn(c))))
        found.append((f"instance_norm running stats {shape}",
                      lambda x, w, b: F.instance_norm(x, torch.zeros(x.shape[1]), torch.ones(x.shape[1]), w, b),
                      _args(_randn(*shape), _randn(c), _randn(c))))
        found.append((f"local_response_norm {shape}", lambda x: F.local_response_norm(x, 2), _args(_randn(*shape))))
    for shape in [(0, 3), (4, 3, 0), (0, 3, 5), (2, 0), (2, 0, 3)]:
        c = shape[1]
        for training in (True, False):
            found.append((f"batch_norm training={training} {shape}",
                          lambda x, w, b, t=training: F.batch_norm(x, torch.zeros(x.shape[1]), torch.ones(x.shape[1]),
                                                                   w, b, training=t),
                          _args(_randn(*shape), _randn(c), _randn(c))))
        found.append((f"batch_norm no stats {shape}", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                      _args(_randn(*shape), _randn(c), _randn(c))))
    for shape in [(0, 3), (3, 0), (2, 0, 3)]:
        for dim in (0, 1, -1):
            for p in (2.0, 1.0):
                found.append((f"normalize p={p} dim={dim} {shape}", lambda x, d=dim, q=p: F.normalize(x, q, d),
                              _args(_randn(*shape))))
    return found


def _reduction_cases() -> list[Case]:
    found: list[Case] = []
    shapes = [(0,), (0, 3), (3, 0), (2, 0, 3)]
    for shape in shapes:
        dims: list[Any] = [None, 0, -1, (0, -1)]
        for dim in dims:
            for correction in (0, 1):
                for name in ("var", "std", "var_mean", "std_mean"):
                    fn = getattr(torch, name)
                    found.append((f"{name} dim={dim} correction={correction} {shape}",
                                  lambda x, f=fn, d=dim, c=correction: f(x, d, correction=c), _args(_randn(*shape))))
            found.append((f"mean dim={dim} {shape}", lambda x, d=dim: x.mean(d) if d is not None else x.mean(),
                          _args(_randn(*shape))))
            found.append((f"sum dim={dim} {shape}", lambda x, d=dim: x.sum(d) if d is not None else x.sum(),
                          _args(_randn(*shape))))
            found.append((f"logsumexp dim={dim} {shape}",
                          lambda x, d=dim: torch.logsumexp(x, d if d is not None else tuple(range(x.ndim))),
                          _args(_randn(*shape))))
            for p in (2.0, 1.0, 3.0, 0.0, float("inf"), -float("inf")):
                found.append((f"vector_norm p={p} dim={dim} {shape}",
                              lambda x, d=dim, q=p: torch.linalg.vector_norm(x, q, d), _args(_randn(*shape))))
            found.append((f"norm dim={dim} {shape}", lambda x, d=dim: torch.norm(x, dim=d), _args(_randn(*shape))))
            for name in ("amax", "amin"):
                found.append((f"{name} dim={dim} {shape}",
                              lambda x, n=name, d=dim: getattr(torch, n)(x, d if d is not None else ()),
                              _args(_randn(*shape))))
        for dim in range(-len(shape), len(shape)):
            for name in ("softmax", "log_softmax"):
                found.append((f"{name} dim={dim} {shape}", lambda x, n=name, d=dim: getattr(F, n)(x, d),
                              _args(_randn(*shape))))
            for name in ("cumsum", "cumprod"):
                found.append((f"{name} dim={dim} {shape}", lambda x, n=name, d=dim: getattr(torch, n)(x, d),
                              _args(_randn(*shape))))
            for name in ("max", "min"):
                found.append((f"{name} dim={dim} {shape}", lambda x, n=name, d=dim: getattr(torch, n)(x, d),
                              _args(_randn(*shape))))
            found.append((f"prod dim={dim} {shape}", lambda x, d=dim: x.prod(d), _args(_randn(*shape))))
        found.append((f"max {shape}", lambda x: x.max(), _args(_randn(*shape))))
    return found


def _more_reduction_cases() -> list[Case]:
    """Reduction and scan forms beyond the plain ones: keepdim, dtype=, the nan-skipping and running ones."""
    found: list[Case] = []
    for shape in [(0,), (0, 3), (3, 0), (2, 0, 3)]:
        x = _args(_randn(*shape))
        for dim in (0, -1):
            found += [
                (f"var keepdim dim={dim} {shape}", lambda x, d=dim: x.var(d, keepdim=True), x),
                (f"std unbiased=False dim={dim} {shape}", lambda x, d=dim: torch.std(x, d, unbiased=False), x),
                (f"var_mean correction=2 dim={dim} {shape}", lambda x, d=dim: torch.var_mean(x, d, correction=2), x),
                (f"mean keepdim dtype dim={dim} {shape}",
                 lambda x, d=dim: x.mean(d, keepdim=True, dtype=torch.float64), x),
                (f"sum dtype dim={dim} {shape}", lambda x, d=dim: x.sum(d, dtype=torch.float64), x),
                (f"nanmean dim={dim} {shape}", lambda x, d=dim: x.nanmean(d), x),
                (f"nansum dim={dim} {shape}", lambda x, d=dim: x.nansum(d), x),
                (f"logcumsumexp dim={dim} {shape}", lambda x, d=dim: torch.logcumsumexp(x, d), x),
                (f"cummax dim={dim} {shape}", lambda x, d=dim: torch.cummax(x, d), x),
                (f"cummin dim={dim} {shape}", lambda x, d=dim: torch.cummin(x, d), x),
                (f"aminmax dim={dim} {shape}", lambda x, d=dim: torch.aminmax(x, dim=d), x),
                (f"softmax dtype dim={dim} {shape}", lambda x, d=dim: F.softmax(x, d, dtype=torch.float64), x),
                (f"softmin dim={dim} {shape}", lambda x, d=dim: F.softmin(x, d), x),
                (f"logsumexp keepdim dim={dim} {shape}", lambda x, d=dim: torch.logsumexp(x, d, keepdim=True), x),
                (f"vector_norm keepdim dim={dim} {shape}",
                 lambda x, d=dim: torch.linalg.vector_norm(x, 2, d, keepdim=True), x),
                (f"normalize p=inf dim={dim} {shape}", lambda x, d=dim: F.normalize(x, float("inf"), d), x),
            ]
        found += [(f"nanmean {shape}", lambda x: x.nanmean(), x), (f"prod {shape}", lambda x: x.prod(), x),
                  (f"std_mean {shape}", lambda x: torch.std_mean(x), x)]
        if len(shape) == 2:
            found += [(f"matrix norm {p} {shape}", lambda x, q=p: torch.linalg.matrix_norm(x, q), x)
                      for p in ("fro", 1, float("inf"))]
    return found


def _more_norm_cases() -> list[Case]:
    """Normalization forms beyond the plain ones: one affine tensor, no running statistics, only some grads."""
    found: list[Case] = []
    for shape, norm in [((0, 4), (4,)), ((3, 0), (0,)), ((3, 0, 4), (4,))]:
        found += [(f"layer_norm weight only {shape}", lambda x, w, n=norm: F.layer_norm(x, n, w),
                   _args(_randn(*shape), _randn(*norm))),
                  (f"layer_norm bias only {shape}", lambda x, b, n=norm: F.layer_norm(x, n, None, b),
                   _args(_randn(*shape), _randn(*norm))),
                  (f"rms_norm eps {shape}", lambda x, w, n=norm: F.rms_norm(x, n, w, 1e-3),
                   _args(_randn(*shape), _randn(*norm)))]
    for shape in [(1, 6, 0), (2, 6, 0, 3), (0, 6, 3)]:
        found += [(f"group_norm weight only {shape}", lambda x, w: F.group_norm(x, 3, w), _args(_randn(*shape),
                                                                                                  _randn(6))),
                  (f"group_norm groups=channels {shape}", lambda x, w, b: F.group_norm(x, 6, w, b),
                   _args(_randn(*shape), _randn(6), _randn(6))),
                  (f"group_norm one group {shape}", lambda x, w, b: F.group_norm(x, 1, w, b),
                   _args(_randn(*shape), _randn(6), _randn(6))),
                  (f"group_norm affine only {shape}", lambda x, w, b: F.group_norm(x.detach(), 2, w, b),
                   _args(_randn(*shape), _randn(6), _randn(6))),
                  (f"GroupNorm module-like bfloat16 weight {shape}",
                   lambda x, w, b: F.group_norm(x, 2, w.bfloat16(), b.bfloat16()),
                   _args(_randn(*shape), _randn(6), _randn(6)))]
    for shape in [(0, 3, 4), (2, 3, 0)]:
        found += [(f"instance_norm running stats, use_input_stats=False {shape}",
                   lambda x, w, b: F.instance_norm(x, torch.zeros(3), torch.ones(3), w, b, use_input_stats=False),
                   _args(_randn(*shape), _randn(3), _randn(3)))]
    for shape in [(0, 3), (0, 3, 5), (4, 3, 0)]:
        found += [(f"batch_norm eval, input grad only {shape}",
                   lambda x, w, b: F.batch_norm(x, torch.zeros(3), torch.ones(3), w.detach(), b.detach()),
                   _args(_randn(*shape), _randn(3), _randn(3)))]
    return found


def _pointwise_loss_cases() -> list[Case]:
    """Losses of empty batches: a mean over nothing is nan, its gradient empty."""
    found: list[Case] = []
    for shape in [(0,), (0, 3), (3, 0)]:
        for reduction in ("mean", "sum", "none"):
            xy = _args(_randn(*shape), _randn(*shape))
            found += [(f"{name} {reduction} {shape}", lambda x, y, n=name, r=reduction: getattr(F, n)(x, y, reduction=r),
                       xy) for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
                                        "binary_cross_entropy_with_logits")]
            found.append((f"binary_cross_entropy {reduction} {shape}",
                          lambda x, y, r=reduction: F.binary_cross_entropy(x.sigmoid(), y.sigmoid(), reduction=r), xy))
            found.append((f"kl_div {reduction} {shape}",
                          lambda x, y, r=reduction: F.kl_div(x, y.log_softmax(-1), reduction=r, log_target=True), xy))
        found.append((f"kl_div batchmean {shape}",
                      lambda x, y: F.kl_div(x, y.softmax(-1), reduction="batchmean"), _args(_randn(*shape),
                                                                                           _randn(*shape))))
        if len(shape) == 2:
            found += [(f"cosine_similarity dim={d} {shape}", lambda x, y, d=d: F.cosine_similarity(x, y, d),
                       _args(_randn(*shape), _randn(*shape))) for d in (0, 1)]
            found.append((f"pairwise_distance {shape}", lambda x, y: F.pairwise_distance(x, y),
                          _args(_randn(*shape), _randn(*shape))))
    return found


def _loss_cases() -> list[Case]:
    found: list[Case] = []
    empty_targets = lambda dtype: torch.zeros(0, dtype=torch.long)
    for reduction in ("mean", "sum", "none"):
        for weighted in (False, True):
            w = (lambda dtype: torch.rand(5, dtype=dtype)) if weighted else None
            found.append((f"cross_entropy {reduction} weighted={weighted} (0, 5)",
                          lambda x, t, wt, r=reduction: F.cross_entropy(x, t, wt, reduction=r),
                          _args(_randn(0, 5), empty_targets, w)))
            found.append((f"cross_entropy smoothed {reduction} weighted={weighted} (0, 5)",
                          lambda x, t, wt, r=reduction: F.cross_entropy(x, t, wt, reduction=r, label_smoothing=0.1),
                          _args(_randn(0, 5), empty_targets, w)))
            found.append((f"nll_loss {reduction} weighted={weighted} (0, 5)",
                          lambda x, t, wt, r=reduction: F.nll_loss(x, t, wt, reduction=r),
                          _args(_randn(0, 5), empty_targets, w)))
            found.append((f"nll_loss {reduction} weighted={weighted} (0, 5, 2)",
                          lambda x, t, wt, r=reduction: F.nll_loss(x, t, wt, reduction=r),
                          _args(_randn(0, 5, 2), lambda dtype: torch.zeros(0, 2, dtype=torch.long), w)))
            found.append((f"nll_loss {reduction} weighted={weighted} (2, 5, 0)",
                          lambda x, t, wt, r=reduction: F.nll_loss(x, t, wt, reduction=r),
                          _args(_randn(2, 5, 0), lambda dtype: torch.zeros(2, 0, dtype=torch.long), w)))
        found.append((f"cross_entropy probabilities {reduction} (0, 5)",
                      lambda x, t, r=reduction: F.cross_entropy(x, t, reduction=r),
                      _args(_randn(0, 5), lambda dtype: torch.rand(0, 5, dtype=dtype))))
    return found


def cases() -> list[Case]:
    """(label, function, arguments in a dtype) for every op and empty shape the sweep tries."""
    return (_norm_cases() + _more_norm_cases() + _reduction_cases() + _more_reduction_cases() + _loss_cases()
            + _pointwise_loss_cases())


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for v in x for t in _flat(v)]
    return []


def _run(fn: Callable[..., Any], args: tuple[Any, ...], seed: int) -> tuple[str, Any]:
    """("raised", the error) or ("returned", (outputs, grads of the floating inputs)); the cotangents from `seed`."""
    args = tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    try:
        out = fn(*args)
        outs = [t for t in _flat(out) if t.requires_grad]
        g = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in outs]
        grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True) if outs else ()
    except Exception as e:  # any error is an outcome to compare
        return "raised", e
    return "returned", (_flat(out), list(grads))


def _differences(have: list[Any], want: list[Any], what: str) -> list[str]:
    if len(have) != len(want):
        return [f"{what}: {len(have)} tensors (jit) != {len(want)} (eager)"]
    found = []
    for i, (h, w) in enumerate(zip(have, want, strict=True)):
        if h is None or w is None:
            if (h is None) != (w is None):
                found.append(f"{what}[{i}]: jit {'None' if h is None else 'a tensor'}, eager "
                             f"{'None' if w is None else 'a tensor'}")
            continue
        if h.shape != w.shape or h.dtype != w.dtype:
            found.append(f"{what}[{i}]: {h.dtype}{tuple(h.shape)} (jit) != {w.dtype}{tuple(w.shape)} (eager)")
        elif not torch.allclose(h.detach(), w.detach(), rtol=1e-5, atol=1e-6, equal_nan=True):
            found.append(f"{what}[{i}]: jit {h.detach().flatten()[:6].tolist()} eager "
                         f"{w.detach().flatten()[:6].tolist()}")
    return found


def _resized(args: tuple[Any, ...], size: int) -> tuple[Any, ...]:
    """`args` with each tensor's empty dims of `size` instead (integer tensors of zeros: valid class targets)."""
    def grown(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        shape = tuple(size if d == 0 else d for d in a.shape)
        return torch.randn(shape, dtype=a.dtype) if a.is_floating_point() else torch.zeros(shape, dtype=a.dtype)
    return tuple(grown(a) for a in args)


def _with_grads(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` returning its outputs detached and `torch.autograd.grad` of them (cotangents of ones) for its floating
    inputs."""
    def both(*args: Any) -> Any:
        out = fn(*args)
        outs = [t for t in _flat(out) if t.requires_grad]
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        ones = [torch.ones_like(t) for t in outs]
        grads = torch.autograd.grad(outs, leaves, ones, allow_unused=True) if outs else ()
        return [t.detach() for t in _flat(out)], grads
    return both


MODES = ("fresh", "after sizes 2, 4", "grads traced")


def compare(fn: Callable[..., Any], make: Callable[[torch.dtype], tuple[Any, ...]], dtype: torch.dtype,
            mode: str) -> list[str]:
    """The differences between eager and a fresh jit of `fn` on these arguments, in words. Modes: "fresh"; "after
    sizes 2, 4": the jit is first called with the empty dims of those sizes (its default cache mode then traces
    symbolic sizes); "grads traced": `fn` and its gradients in one traced function."""
    torch.manual_seed(0)
    args = make(dtype)
    fn = _with_grads(fn) if mode == "grads traced" else fn
    want_kind, want = _run(fn, args, 1)
    jitted = minijit.jit(fn)
    for size in (2, 4) if mode == "after sizes 2, 4" else ():
        _run(jitted, _resized(args, size), 1)
    have_kind, have = _run(jitted, args, 1)
    if want_kind != have_kind:
        return [f"eager {want_kind}{'' if want_kind == 'returned' else ' ' + repr(want)[:150]}, jit {have_kind}"
                f"{'' if have_kind == 'returned' else ' ' + repr(have)[:150]}"]
    if want_kind == "raised":
        return []
    return _differences(have[0], want[0], "output") + _differences(have[1], want[1], "grad")


def main(verbose: bool) -> None:
    warnings.simplefilter("ignore")
    total = bad = 0
    for label, fn, make in cases():
        for dtype in DTYPES:
            for mode in MODES:
                total += 1
                found = compare(fn, make, dtype, mode)
                what = f"{label} {dtype} ({mode})"
                if found:
                    bad += 1
                    print(f"MISMATCH {what}:\n    " + "\n    ".join(found), flush=True)
                elif verbose:
                    print(f"ok {what}", flush=True)
    print(f"{total} cases, {bad} mismatches")


if __name__ == "__main__":
    main("-v" in sys.argv)
