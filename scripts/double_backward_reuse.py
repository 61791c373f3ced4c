"""Double backward (`create_graph=True`, then the gradient of the gradients) through a reused symbolic entry.

For ~30 common ops (mul, matmul, softmax, layer_norm, tanh, sums over dims, mean, index_select, gather, conv2d,
linear, cross_entropy, ...), one `minijit.jit` per op in the default cache mode is called at sizes 4, 5, 7, 6, 2
and 1: the second call switches to symbolic sizes, the later ones hit that entry (or widen it, where a size
becomes 1). Each call's outputs, gradients of `sum(out * w)` and Hessian-vector products are compared with
eager's, and a gradient made with create_graph=True must carry history where eager's does.

    PYTHONPATH=. python scripts/double_backward_reuse.py
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import minijit


def _idx(n: int) -> torch.Tensor:
    return torch.tensor([n - 1, 0, 1])


CASES: dict[str, tuple[Callable[..., Any], Callable[[int], list[Any]]]] = {
    "mul": (lambda x, y: x * y, lambda n: [(n, 3), (n, 3)]),
    "mul broadcast": (lambda x, y: x * y, lambda n: [(n, 3), (1, 3)]),
    "add broadcast": (lambda x, y: (x + y) ** 2, lambda n: [(n, 3), (3,)]),
    "div": (lambda x, y: x / (y * y + 1), lambda n: [(n, 3), (n, 3)]),
    "matmul": (lambda x, y: x @ y, lambda n: [(n, 4), (4, n + 1)]),
    "batched matmul": (lambda x, y: torch.matmul(x, y), lambda n: [(2, n, 4), (4, 3)]),
    "softmax": (lambda x: torch.softmax(x, -1), lambda n: [(3, n)]),
    "softmax, dim an argument": (lambda x, d: torch.softmax(x, d), lambda n: [(n, 3), n % 2]),
    "log_softmax": (lambda x: torch.log_softmax(x, 0), lambda n: [(n, 3)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), lambda n: [(2, n), (n,), (n,)]),
    "tanh": (lambda x: torch.tanh(x), lambda n: [(n, 2)]),
    "sigmoid": (lambda x: torch.sigmoid(x), lambda n: [(n,)]),
    "exp": (lambda x: x.exp(), lambda n: [(n, 2)]),
    "sin * cos": (lambda x: x.sin() * x.cos(), lambda n: [(n,)]),
    "sum over dims": (lambda x: x.sum((0, 2)) ** 2, lambda n: [(n, 3, n + 1)]),
    "sum keepdim": (lambda x: (x.sum(1, keepdim=True) * x), lambda n: [(n, 3)]),
    "mean": (lambda x: x.mean(0) ** 3, lambda n: [(n, 3)]),
    "mean of all": (lambda x: x.mean() * x, lambda n: [(n, 3)]),
    "var": (lambda x: x.var(0), lambda n: [(n, 3)]),
    "amax": (lambda x: x.amax(1) ** 2, lambda n: [(3, n)]),
    "index_select": (lambda x, i: x.index_select(0, i) ** 2, lambda n: [(n, 3), _idx(n)]),
    "gather": (lambda x, i: x.gather(0, i) ** 2, lambda n: [(n, 3), torch.tensor([[n - 1, 0, 1]])]),
    "indexing": (lambda x, i: x[i] ** 3, lambda n: [(n, 2), _idx(n)]),
    "slices": (lambda x: x[1:] * x[:-1], lambda n: [(n, 2)]),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), lambda n: [(1, 2, n, n), (3, 2, 3, 3)]),
    "linear": (lambda x, w, b: F.linear(x, w, b).tanh(), lambda n: [(n, 4), (3, 4), (3,)]),
    "expand": (lambda x: x.expand(3, -1) * x, lambda n: [(1, n)]),
    "reshape": (lambda x: x.reshape(-1).exp().reshape(x.shape) * x, lambda n: [(n, 2)]),
    "transpose": (lambda x: (x.t() @ x) ** 2, lambda n: [(n, 3)]),
    "cumsum": (lambda x: x.cumsum(0) ** 2, lambda n: [(n, 3)]),
    "where": (lambda x: torch.where(x > 0, x * x, x.exp()), lambda n: [(n, 3)]),
    "pow": (lambda x, y: x.abs() ** y, lambda n: [(n,), (n,)]),
    "mse_loss": (lambda x, y: F.mse_loss(x, y), lambda n: [(n, 3), (n, 3)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.zeros(x.shape[0], dtype=torch.long)), lambda n: [(n, 4)]),
    "dist": (lambda x, y: torch.dist(x, y), lambda n: [(n, 3), (1, 3)]),
}


def _arguments(spec: list[Any]) -> list[Any]:
    """A float64 tensor requiring grad for each shape; other values as they are."""
    return [torch.randn(s, dtype=torch.float64, requires_grad=True) if isinstance(s, tuple) else s for s in spec]


def _second(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, list[Any], list[Any], list[bool]]:
    """The output, the gradients (create_graph=True), their Hessian-vector products, and which carry history."""
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    out = fn(*args)
    w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * w).sum(), leaves, create_graph=True, allow_unused=True)
    history = [g is not None and g.requires_grad for g in grads]
    terms = [(g * torch.randn(g.shape, dtype=g.dtype, generator=torch.Generator().manual_seed(2))).sum()
             for g, h in zip(grads, history) if h]
    hvp = torch.autograd.grad(sum(terms), leaves, allow_unused=True) if terms else [None] * len(leaves)
    zeros = [torch.zeros_like(x) if g is None else g for g, x in zip(hvp, leaves)]
    return out, [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)], zeros, history


def _copy(args: list[Any]) -> list[Any]:
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def _differs(got: Any, expected: Any) -> str | None:
    """None if the results of `_second` agree, else why not."""
    if got[3] != expected[3]:
        return f"gradients with history {got[3]}, eager's {expected[3]}"
    for a, b in zip([got[0], *got[1], *got[2]], [expected[0], *expected[1], *expected[2]]):
        try:
            torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-7, equal_nan=True)
        except AssertionError as e:
            return " ".join(str(e).split())[:200]
    return None


def main() -> None:
    """Every case at every size; prints the mismatches and the refusals, then counts."""
    torch.manual_seed(0)
    wrong = refused = 0
    for name, (fn, spec) in CASES.items():
        jf = minijit.jit(fn)
        for n in (4, 5, 7, 6, 2, 1):
            args = _arguments(spec(n))
            try:
                expected = _second(fn, _copy(args))
            except Exception:  # eager refuses these sizes
                continue
            before = minijit.cache_info(jf).hits
            try:
                got = _second(jf, _copy(args))
            except minijit.MinijitError as e:
                refused += 1
                print(f"{name} n={n}: refused: {str(e).splitlines()[0][:150]}")
                continue
            info = minijit.cache_info(jf)
            why = _differs(got, expected)
            if why is not None:
                wrong += 1
                print(f"{name} n={n} (hit={info.hits > before}, symbolic={bool(info.dynamic)}): WRONG {why}")
        info = minijit.cache_info(jf)
        print(f"{name}: {info.hits} hits, {info.entries} entries, symbolic={bool(info.dynamic)}")
    print(f"wrong {wrong}, refused {refused}")


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    main()
