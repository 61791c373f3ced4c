"""torch's random numbers in jitted code, against eager: bit-equal values, gradients and generator state.

Each pattern runs eagerly and jitted for 3 calls from the same seed (and 3 calls in a
row from one seed), comparing results with torch.equal and `torch.get_rng_state()`
after every call: random ops draw from torch's default generator in eager's order,
seeds and state changes inside the function happen on every call, and the backward
reuses the forward's dropout mask.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minijit
from minijit.extend import FusionExecutor
from minijit.ir import BoundSymbol

CALLS = 3
G = torch.Generator()  # a generator from outside the calls


def _leaves(x: Any) -> list[Any]:
    return [v for item in x for v in _leaves(item)] if isinstance(x, tuple | list) else [x]


def _fresh(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)


def _equal(got: Any, want: Any, what: str) -> None:
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape, f"{what}, output {i}: {g.dtype}{list(g.shape)}"
            assert torch.equal(g.detach(), w.detach()), f"{what}, output {i}: values differ"
        else:
            assert g == w, f"{what}, output {i}: {g!r} != {w!r}"


def _grads(out: Any, args: tuple[Any, ...]) -> list[torch.Tensor | None]:
    diff = [o for o in _leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not diff:
        return []
    sum((o.float() * (i + 1)).sum() for i, o in enumerate(diff)).backward()
    return [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def check_rng(fn: Callable[..., Any], *args: Any, executors: Any = None, exact_values: bool = True) -> Any:
    """fn eagerly and jitted: 3 calls each reseeded, then 3 calls in a row; equal outputs, grads and RNG state."""
    jf = minijit.jit(fn, executors=executors)

    def both(call: str, seed: int | None) -> None:
        results = []
        for f in (fn, jf):
            if seed is not None:
                torch.manual_seed(seed)
            else:
                torch.set_rng_state(start)
            fargs = _fresh(args)
            out = f(*fargs)
            state = torch.get_rng_state()
            results.append((out, state, _grads(out, fargs)))
        (want, want_state, want_grads), (got, got_state, got_grads) = results
        if exact_values:
            _equal(got, want, f"{call}")
            _equal(got_grads, want_grads, f"{call}, gradients")
        assert torch.equal(got_state, want_state), f"{call}: the generator is not where eager leaves it"

    for call in range(CALLS):
        both(f"call {call}", seed=call)
    torch.manual_seed(100)
    for call in range(CALLS):
        start = torch.get_rng_state()
        both(f"call {call} in a row", seed=None)
        torch.set_rng_state(start)
        fn(*_fresh(args))  # advance as one eager call would
    return jf


X = torch.randn(4, 6)


def _rx() -> torch.Tensor:
    return X.clone().requires_grad_()


# -- random ops ----------------------------------------------------------------------------------------

def test_dropout_values_mask_and_gradient() -> None:
    jf = check_rng(lambda x: F.dropout(x * 2, 0.3) + F.dropout(x, p=0.5, training=True), _rx())
    # The backward multiplies by the forward's noise: it draws nothing itself.
    for trace in minijit.last_backward_traces(jf):
        assert not any("bernoulli" in b.sym.name for b in trace.bound_symbols), trace


def test_dropout_of_bfloat16_and_of_a_transposed_tensor() -> None:
    check_rng(lambda x, y: (F.dropout(x, 0.25), F.dropout(y.t(), 0.25)),
              torch.randn(5, 7, dtype=torch.bfloat16).requires_grad_(), _rx())


def test_dropout_modules_train_and_eval() -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.4), nn.ReLU(), nn.Dropout(0.2))
    eager = copy.deepcopy(model)
    jitted = minijit.jit(model)
    for training in (True, False, True):
        model.train(training)
        eager.train(training)
        for seed in range(CALLS):
            x = torch.randn(3, 6)
            torch.manual_seed(seed)
            want = eager(x)
            want.sum().backward()
            state = torch.get_rng_state()
            torch.manual_seed(seed)
            got = jitted(x)
            got.sum().backward()
            assert torch.equal(got, want)
            assert torch.equal(torch.get_rng_state(), state)
            for p, q in zip(eager.parameters(), model.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-6)


def test_dropout_edge_probabilities_and_empty_input() -> None:
    check_rng(lambda x, e: (F.dropout(x, 0.0), F.dropout(x, 1.0), F.dropout(e, 0.5), F.dropout(x, 0.5, training=False)),
              _rx(), torch.randn(0, 3))


def test_attention_dropout_with_grad() -> None:
    q = torch.randn(2, 2, 5, 8).requires_grad_()
    k = torch.randn(2, 2, 5, 8).requires_grad_()
    check_rng(lambda q, k: F.scaled_dot_product_attention(q, k, k, dropout_p=0.3, is_causal=True), q, k)


def test_rand_randn_and_like_ops() -> None:
    def fn(x: torch.Tensor, t: torch.Tensor) -> Any:
        return (x + torch.rand(4, 6), torch.randn(3), torch.randn((2, 2), dtype=torch.float64), torch.rand(17),
                torch.rand_like(t), torch.randn_like(t), torch.rand_like(t, memory_format=torch.contiguous_format),
                torch.randn_like(x, dtype=torch.bfloat16))

    check_rng(fn, X, torch.randn(6, 4).t())  # a transposed tensor: rand_like draws in its memory order


def test_integer_draws() -> None:
    def fn(x: torch.Tensor) -> Any:
        return (torch.randint(10, (5,)), torch.randint(3, 10, (2, 3)), torch.randint(0, 4, size=(3,), dtype=torch.int32),
                torch.randint_like(x, 7), torch.randint_like(x, 2, 5), torch.randperm(12), torch.randperm(3, dtype=torch.int32))

    check_rng(fn, X)


def test_bernoulli_normal_multinomial() -> None:
    def fn(x: torch.Tensor) -> Any:
        p = x.sigmoid()
        return (torch.bernoulli(p), torch.bernoulli(x, 0.25), p.bernoulli(), torch.normal(x, 0.5),
                torch.normal(x, x.abs()), torch.normal(1.0, x.abs()), torch.normal(0.0, 2.0, (3, 3)),
                torch.multinomial(x.softmax(-1), 3), torch.multinomial(x.softmax(-1), 8, replacement=True))

    check_rng(fn, X)


def test_in_place_fills_of_a_clone_and_of_an_input() -> None:
    def fn(x: torch.Tensor, buf: torch.Tensor) -> Any:
        buf.uniform_(-1, 1)
        return (buf, x.clone().normal_(2, 3), x.clone().bernoulli_(0.3), x.clone().bernoulli_(x.sigmoid()),
                x.clone().exponential_(2.0), x.clone().random_(0, 5), x.clone().random_(9), x.clone().random_())

    jf = minijit.jit(fn)
    for seed in range(CALLS):
        buf_e, buf_j = torch.zeros(3, 4).t(), torch.zeros(3, 4).t()
        torch.manual_seed(seed)
        want = fn(X, buf_e)
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        got = jf(X, buf_j)
        _equal(got, want, f"call {seed}")
        assert torch.equal(buf_j, buf_e) and torch.equal(torch.get_rng_state(), state)


def test_unused_draws_still_advance_the_generator() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch.rand(3)
        F.dropout(x, 0.5)
        return x * 2

    check_rng(fn, X)


def test_random_op_under_grad_with_a_tensor_argument_needs_no_gradient() -> None:
    # rand_like takes x's size and layout only: the output does not require grad, as in eager.
    jf = minijit.jit(lambda x: torch.rand_like(x) + x.detach())
    torch.manual_seed(0)
    out = jf(_rx())
    assert not out.requires_grad


# -- seeding and the generator's state inside the function -----------------------------------------------

def test_manual_seed_inside_runs_on_every_call() -> None:
    def fn(x: torch.Tensor) -> Any:
        a = torch.rand(2)
        torch.manual_seed(7)
        b = x + torch.rand(4, 6)
        torch.random.manual_seed(8)
        torch.default_generator.manual_seed(9)
        return a, b, torch.randn(2), torch.initial_seed()

    check_rng(fn, X)


def test_get_and_set_rng_state_inside() -> None:
    def fn(x: torch.Tensor) -> Any:
        state = torch.get_rng_state()
        a = torch.rand(3)
        torch.set_rng_state(state)
        b = torch.rand(3)  # the same draws again
        return a, b, x + torch.rand(4, 6)

    check_rng(fn, X)


def test_fork_rng_inside_restores_the_state() -> None:
    def fn(x: torch.Tensor) -> Any:
        with torch.random.fork_rng(devices=[]):
            a = F.dropout(x, 0.5)
        return a, torch.rand(3)

    check_rng(fn, X)


def test_torch_seed_inside_reseeds_on_every_call() -> None:
    jf = minijit.jit(lambda x: (torch.seed(), x + torch.rand(4, 6)))
    seeds = []
    for _ in range(CALLS):
        seed, out = jf(X)
        assert torch.initial_seed() == seed
        torch.manual_seed(seed)
        want = X + torch.rand(4, 6)
        assert torch.equal(out, want)
        seeds.append(seed)
    assert len(set(seeds)) == CALLS  # not frozen at trace time


def test_seed_value_cannot_decide_a_branch() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if torch.seed() % 2 else x

    with pytest.raises(minijit.UnsupportedSyntaxError, match="only known when the trace runs"):
        minijit.jit(fn)(X)


@pytest.mark.parametrize("call, name", [
    (lambda: torch.cuda.manual_seed(0), "torch.cuda.manual_seed"),
    (lambda: torch.Generator().manual_seed(0), r"torch\.Generator\(\)"),  # made inside: refused where it is made
    (lambda: G.manual_seed(0), "torch.Generator.manual_seed"),
])
def test_other_generators_are_refused(call: Callable[[], Any], name: str) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        call()
        return x + 1

    with pytest.raises(minijit.MinijitError, match=name) as err:
        minijit.jit(fn)(X)
    assert "test_rng.py" in str(err.value)


def test_explicit_generator_draws_as_eager() -> None:
    # More cases in tests/semantics/test_explicit_generator.py.
    mine, theirs = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    jf = minijit.jit(lambda x: x + torch.rand(4, 6, generator=mine))
    for _ in range(CALLS):
        assert torch.equal(jf(X), X + torch.rand(4, 6, generator=theirs))
    assert torch.equal(mine.get_state(), theirs.get_state())


# -- fusion executors ------------------------------------------------------------------------------------

def test_triton_regions_leave_draws_to_torch() -> None:
    pytest.importorskip("triton")
    # The mask comes from torch's generator as in eager; Triton's arithmetic may round differently.
    jf = check_rng(lambda x: F.dropout(x * 2, 0.3).sin(), _rx(), executors=["triton"], exact_values=False)
    final = minijit.last_traces(jf)[-1]
    drawing = [b for b in final.bound_symbols if "bernoulli" in b.sym.name]
    assert drawing and all(b.sym.namespace == "torchex" for b in drawing), final
    torch.manual_seed(0)
    want = F.dropout(X * 2, 0.3)
    torch.manual_seed(0)
    got = jf(X)
    assert torch.equal(got == 0, want.sin() == 0)


class _PointwiseFuser(FusionExecutor):
    """A fusion executor that would fuse every prim of a few kinds, random ones included if allowed."""

    def __init__(self, name: str, random_draws: str | None):
        super().__init__(name)
        self.random_draws = random_draws

    def fusible(self, bsym: BoundSymbol) -> bool:
        return bsym.sym.namespace == "prims" and bsym.sym.name in ("bernoulli", "div", "mul")

    def fuse(self, region: Any) -> Any:
        from minijit.runtime import trace_callable

        body = minijit.ir.Trace("region")
        body.args, body.bound_symbols = list(region.inputs), list(region.members)
        body.output = tuple(region.outputs)
        return trace_callable(body)


@pytest.mark.parametrize("random_draws", [None, "one Philox stream per region, seeded from torch's generator"])
def test_fusion_executor_claims_random_prims_only_saying_how_it_draws(random_draws: str | None) -> None:
    ex = _PointwiseFuser(f"fuser{'_random' if random_draws else ''}", random_draws)
    jf = minijit.jit(lambda x: F.dropout(x, 0.5) * 3, executors=[ex])
    jf(_rx())
    printed = str(minijit.last_traces(jf)[-1])
    fused = [line for line in printed.splitlines() if f"{ex.namespace}.fusion" in line and "=" in line]
    if random_draws is None:
        assert "torchex.prims_bernoulli" in printed or "torchex.bernoulli" in printed, printed
        assert all("random numbers" not in line for line in fused), printed
    else:
        assert any(f"random numbers: {random_draws}" in line for line in fused), printed


def test_draws_keep_their_order_around_a_region_that_draws() -> None:
    ex = _PointwiseFuser("fuser_order", "its own stream")
    jf = minijit.jit(lambda x: (F.dropout(x, 0.5) * 3, torch.rand(4, 6)), executors=[ex])
    jf(X)
    names = [b.sym.name for b in minijit.last_traces(jf)[-1].bound_symbols]
    # torch.rand is not the fuser's, and does not depend on the region, yet stays after it.
    assert names.index("rand") > names.index("fusion_0"), names


def test_dropout_on_cuda_is_eagers_fused_kernel() -> None:
    # No GPU needed: the capture of a CUDA proxy, and its forward/backward split.
    from minijit.ir import TensorProxy, Trace, tracing
    from minijit.ops import ltorch
    from minijit.transforms.grad import split_forward_backward

    trace = Trace("cuda_dropout")
    with tracing(trace):
        x = trace.add_input(TensorProxy((4, 6), torch.float32, torch.device("cuda"), requires_grad=True), "x")
        trace.output = ltorch.dropout(x, 0.3)
    (dropout,) = trace.bound_symbols
    assert [b.sym.id for b in dropout.subsymbols] == ["prims.native_dropout"]
    fwd, bwd, _ = split_forward_backward(trace)
    assert "prims.native_dropout" in [b.sym.id for b in fwd.bound_symbols]
    assert [b.sym.id for b in bwd.bound_symbols] == ["prims.native_dropout_backward"]
