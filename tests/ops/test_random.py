"""Random ltorch ops against eager, bit for bit: their decompositions into random prims, and the ops themselves.

From the same seed, eager torch, the op's decomposition run prim by prim, and the
ltorch-level trace (each op as its torch call) give equal values and leave torch's
generator in the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import minijit
from minijit.errors import MetaError, UnsupportedOpError
from minijit.ops import ltorch
from tests.oputil import run_decomposed, run_trace_source, trace_call

X = torch.randn(5, 7)
XT = torch.randn(7, 5).t()  # a transposed tensor: *_like ops draw in its memory order
XB = torch.randn(5, 7, dtype=torch.bfloat16)

# (id, the ltorch call, the same call in eager torch, its tensor arguments)
CASES: list[tuple[str, Callable[..., Any], Callable[..., Any], tuple[torch.Tensor, ...]]] = [
    ("rand", lambda: ltorch.rand(3, 4), lambda: torch.rand(3, 4), ()),
    ("rand_long", lambda: ltorch.rand(40, dtype=torch.float64), lambda: torch.rand(40, dtype=torch.float64), ()),
    ("randn", lambda: ltorch.randn((2, 9)), lambda: torch.randn((2, 9)), ()),
    ("rand_like_t", ltorch.rand_like, torch.rand_like, (XT,)),
    ("randn_like_t", ltorch.randn_like, torch.randn_like, (XT,)),
    ("randn_like_bf16", ltorch.randn_like, torch.randn_like, (XB,)),
    ("randint", lambda: ltorch.randint(2, 9, (5, 3)), lambda: torch.randint(2, 9, (5, 3)), ()),
    ("randint_high", lambda: ltorch.randint(9, (4,), dtype=torch.int32),
     lambda: torch.randint(9, (4,), dtype=torch.int32), ()),
    ("randint_like", lambda x: ltorch.randint_like(x, 3, 8), lambda x: torch.randint_like(x, 3, 8), (XT,)),
    ("randperm", lambda: ltorch.randperm(11), lambda: torch.randperm(11), ()),
    ("bernoulli_probs", lambda x: ltorch.bernoulli(ltorch.sigmoid(x)), lambda x: torch.bernoulli(x.sigmoid()), (XT,)),
    ("bernoulli_p", lambda x: ltorch.bernoulli(x, 0.3), lambda x: torch.bernoulli(x, 0.3), (XT,)),
    ("normal_tensor_number", lambda x: ltorch.normal(x, 0.5), lambda x: torch.normal(x, 0.5), (X,)),
    ("normal_tensors", lambda x: ltorch.normal(x, ltorch.abs(x)), lambda x: torch.normal(x, x.abs()), (X,)),
    ("normal_number_tensor", lambda x: ltorch.normal(2.0, ltorch.abs(x)), lambda x: torch.normal(2.0, x.abs()), (X,)),
    ("normal_numbers", lambda: ltorch.normal(1.0, 3.0, (4, 2)), lambda: torch.normal(1.0, 3.0, (4, 2)), ()),
    ("multinomial", lambda x: ltorch.multinomial(ltorch.softmax(x, -1), 4),
     lambda x: torch.multinomial(x.softmax(-1), 4), (X,)),
    ("multinomial_replacement", lambda x: ltorch.multinomial(ltorch.softmax(x, -1), 9, True),
     lambda x: torch.multinomial(x.softmax(-1), 9, True), (X,)),
    ("dropout", lambda x: ltorch.dropout(x, 0.3), lambda x: F.dropout(x, 0.3), (XT,)),
    ("dropout_bf16", lambda x: ltorch.dropout(x, 0.6), lambda x: F.dropout(x, 0.6), (XB,)),
]
FILLS = [
    ("uniform_", lambda a: ltorch.uniform_(a, -2.0, 3.0), lambda a: a.uniform_(-2.0, 3.0)),
    ("normal_", lambda a: ltorch.normal_(a, 1.0, 0.5), lambda a: a.normal_(1.0, 0.5)),
    ("bernoulli_", lambda a: ltorch.bernoulli_(a, 0.2), lambda a: a.bernoulli_(0.2)),
    ("exponential_", lambda a: ltorch.exponential_(a, 3.0), lambda a: a.exponential_(3.0)),
    ("random_", lambda a: ltorch.random_(a, 0, 7), lambda a: a.random_(0, 7)),
]


def _draw(fn: Callable[..., Any], *args: Any) -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    out = fn(*args)
    return out, torch.get_rng_state()


@pytest.mark.parametrize("op, eager, args", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_random_op_draws_as_eager(op: Callable[..., Any], eager: Callable[..., Any],
                                  args: tuple[torch.Tensor, ...]) -> None:
    want, want_state = _draw(eager, *args)
    for runner in (run_decomposed, run_trace_source):
        got, state = _draw(lambda *a, runner=runner: runner(op, *a), *args)
        assert got.dtype == want.dtype and torch.equal(got, want), runner.__name__
        assert torch.equal(state, want_state), runner.__name__


@pytest.mark.parametrize("op, eager", [f[1:] for f in FILLS], ids=[f[0] for f in FILLS])
def test_in_place_fill_draws_as_eager(op: Callable[..., Any], eager: Callable[..., Any]) -> None:
    want, want_state = _draw(eager, XT.clone())
    for runner in (run_decomposed, run_trace_source):
        target = XT.clone()
        got, state = _draw(lambda a, runner=runner: runner(op, a), target)
        assert torch.equal(got, want) and torch.equal(target, want), runner.__name__
        assert torch.equal(state, want_state), runner.__name__


def test_attention_dropout_draws_as_eager() -> None:
    # Prim by prim the softmax rounds differently from torch's kernel: the same mask, close values.
    q = torch.randn(2, 3, 4, 8)
    op = lambda q: ltorch.scaled_dot_product_attention(q, q, q, dropout_p=0.4)
    want, want_state = _draw(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.4), q)
    got, state = _draw(lambda q: run_trace_source(op, q), q)
    assert torch.equal(got, want) and torch.equal(state, want_state)
    got, state = _draw(lambda q: run_decomposed(op, q), q)
    torch.testing.assert_close(got, want)
    assert torch.equal(state, want_state)


def test_random_ops_declare_the_effect_and_are_kept_in_order() -> None:
    trace = trace_call(lambda x: (ltorch.rand(2), ltorch.dropout(x, 0.5), ltorch.rand(2)), X)
    assert [b.sym.name for b in trace.bound_symbols] == ["rand", "dropout", "rand"]
    assert all(b.sym.effects.random for b in trace.bound_symbols)


@pytest.mark.parametrize("call, message", [
    (lambda x: ltorch.rand(3, dtype=torch.int64), "needs a floating point dtype"),
    (lambda x: ltorch.rand_like(x, memory_format=torch.channels_last), "memory_format"),
    (lambda x: ltorch.randint(1.5, (3,)), "bounds must be Python ints"),
    (lambda x: ltorch.normal(x, x.double()), "one dtype"),
    (lambda x: ltorch.multinomial(x, 9), "without replacement"),
    (lambda x: ltorch.uniform_(x.long()), "needs a floating dtype"),
])
def test_bad_calls_name_the_problem(call: Callable[..., Any], message: str) -> None:
    with pytest.raises(MetaError, match=message):
        trace_call(call, X)


def bernoulli_times_p(p):
    return torch.bernoulli(p) * p


def test_probabilities_that_require_grad_run_as_the_torch_op() -> None:
    # Eager gives them a zero gradient, which the decomposition does not reproduce: it declines the call,
    # which is then recorded as the opaque torch op (same draws, torch's own gradient).
    with pytest.raises(UnsupportedOpError, match="detach"):
        trace_call(lambda p: ltorch.bernoulli(p), torch.rand(3, requires_grad=True))
    p = torch.rand(6, requires_grad=True)
    torch.manual_seed(4)
    got = minijit.jit(bernoulli_times_p)(p)
    torch.manual_seed(4)
    want = bernoulli_times_p(p)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), p), torch.autograd.grad(want.sum(), p))


LSTM = torch.nn.LSTM(4, 4, num_layers=2, dropout=0.5, batch_first=True)


def unused_lstm_then_rand(x):
    LSTM(x)  # unused, but its dropout between the layers draws, so the next draw depends on it
    return torch.rand(3)


def test_an_unused_composite_that_draws_is_kept() -> None:
    x = torch.randn(2, 3, 4)
    torch.manual_seed(1)
    got = minijit.jit(unused_lstm_then_rand)(x)
    torch.manual_seed(1)
    want = unused_lstm_then_rand(x)
    torch.testing.assert_close(got, want)
