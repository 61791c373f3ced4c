"""Symbolic sizes that only the backward reads, under `cache="symbolic values"`, compared with eager.

The forward/backward split saves the sizes a VJP rule reads (a slice's padding, a
reshape's input shape). A size computed inside an op's decomposition (`w[pos]` slices
`pos:pos + 1`, whose length is `i5 = (pos + 1) - pos`) must stay defined in the forward
that returns it; the verifier (on in the tests) names a forward that does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit


def _w(n: int, m: int = 3) -> torch.Tensor:
    return torch.randn(n, m, requires_grad=True)


CASES: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[Any, Any]]]] = {
    "index by int": (lambda w, pos: w[pos] * 2, lambda n, s: (_w(n), s % n)),
    "index by int, negative": (lambda w, pos: w[-pos].exp(), lambda n, s: (_w(n), 1 + s % n)),
    "index by 0-d tensor": (lambda w, pos: w[pos] * 2, lambda n, s: (_w(n), torch.tensor(s % n))),
    "index by tensor": (lambda w, pos: w[pos].sin(), lambda n, s: (_w(n), torch.tensor([s % n, 0, s % n]))),
    "two ints": (lambda w, pos: w[pos, 1] * w[0], lambda n, s: (_w(n), s % n)),
    "slice from pos": (lambda w, pos: w[pos:pos + 2].sin(), lambda n, s: (_w(n), s % (n - 1))),
    "reshape to a computed size": (lambda w, pos: w.reshape(w.shape[0] * w.shape[1] // 2, 2).cos(),
                                   lambda n, s: (_w(n, 4), s)),
    "view with -1": (lambda w, pos: (w.view(-1, 2) * pos).sum(1), lambda n, s: (_w(n, 4), s)),
    "expand to pos": (lambda w, pos: w[:1].expand(pos + 1, -1) * 3, lambda n, s: (_w(n), s + 1)),
    "narrow at pos": (lambda w, pos: w.narrow(0, pos, 2).exp(), lambda n, s: (_w(n), s % (n - 1))),
    "arange(n)": (lambda w, pos: w * torch.arange(w.shape[0])[:, None], lambda n, s: (_w(n), s)),
    "arange(pos)": (lambda w, pos: w[:pos] * torch.arange(pos)[:, None], lambda n, s: (_w(n), 1 + s % n)),
    "select then unsqueeze": (lambda w, pos: w.select(0, pos).unsqueeze(0).expand(2, -1) ** 2,
                              lambda n, s: (_w(n), s % n)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sizes_read_by_the_backward_only_match_eager(name: str) -> None:
    fn, make = CASES[name]
    jf = minijit.jit(fn, cache="symbolic values")
    for seed, (n, s) in enumerate(((5, 2), (7, 3), (4, 1))):
        torch.manual_seed(seed)
        w, pos = make(n, s)
        w_eager = w.detach().clone().requires_grad_()
        got, expected = jf(w, pos), fn(w_eager, pos)
        torch.testing.assert_close(got, expected)
        grad = torch.randn_like(expected)
        got.backward(grad)
        expected.backward(grad)
        torch.testing.assert_close(w.grad, w_eager.grad)
    # New sizes and positions reuse the one trace.
    assert minijit.cache_info(jf).entries == 1
