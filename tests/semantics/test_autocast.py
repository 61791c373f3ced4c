"""torch.autocast inside and around jitted code, against eager: dtypes, values and gradients over 3 calls.

Inside a jitted function, autocast casts what eager casts (the casts are
`prims.convert_element_type` lines of the trace); around a call, its state is part of
the cache key; the AMP training loop (forward under autocast, backward outside) gives
eager's gradients within bfloat16 tolerance, with no lossless cast round trips.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minijit
from minijit.ir import BoundSymbol, Trace

BF16 = torch.bfloat16
CALLS = 3


def _leaves(x: Any) -> list[Any]:
    return [v for item in x for v in _leaves(item)] if isinstance(x, tuple | list) else [x]


def assert_same(got: Any, want: Any, *, exact: bool = True) -> None:
    """Same structure, dtypes and values (bit for bit unless `exact` is False: bfloat16 tolerance)."""
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype, f"dtype {g.dtype} != eager's {w.dtype}"
        if exact:
            assert torch.equal(g, w), f"values differ by {(g.double() - w.double()).abs().max()}"
        else:
            torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)


def check_calls(fn: Callable[..., Any], make_args: Callable[[], tuple[Any, ...]], around: Any = None) -> Any:
    """fn eagerly and jitted, CALLS times on fresh arguments (under the context `around()` if given)."""
    jf = minijit.jit(fn)
    for call in range(CALLS):
        torch.manual_seed(call)
        args = make_args()
        with around() if around else contextlib.nullcontext():
            want = fn(*args)
            got = jf(*args)
        assert_same(got, want)
    return jf


def _mats() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 8), torch.randn(8, 3)


# -- autocast inside the jitted function -----------------------------------------------------------

def _inside(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.autocast("cpu", dtype=BF16):
        y = x @ w
        with torch.autocast("cpu", enabled=False):
            z = x @ w  # float32 again
        s = torch.softmax(y, -1)  # no CPU policy: bfloat16 in, bfloat16 out
    return y, z, s, y.float() + z


def test_autocast_inside_follows_eager_and_shows_its_casts() -> None:
    jf = check_calls(_inside, _mats)
    trace = minijit.last_traces(jf)[0]
    casts = [b for b in trace.bound_symbols if b.sym.id == "prims.convert_element_type"]
    assert [b.args[1] for b in casts][:2] == [BF16, BF16], trace


def test_autocast_spellings_and_decorator() -> None:
    @torch.autocast("cpu", dtype=BF16)
    def helper(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.cpu.amp.autocast is deprecated
            with torch.cpu.amp.autocast():
                a = x @ w
        with torch.amp.autocast("cpu"):
            b = F.linear(x, w.t())
        return a, b, helper(x, w), x @ w

    check_calls(fn, _mats)


def test_autocast_float16_on_cpu() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.mm(x, w), torch.cat([x.half(), x]), F.mse_loss(x.half(), x)

    check_calls(fn, _mats)


def _policies(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.autocast("cpu", dtype=BF16):
        y = x @ w  # lower precision
        loss = F.mse_loss(y, torch.zeros_like(y))  # float32 on CPU
        ce = F.cross_entropy(y, torch.tensor([0, 1, 2, 0]))  # float32 on CPU
        joined = torch.cat([y, x[:, :3]])  # widest: float32
        copied = x.index_copy(0, torch.tensor([1]), y[:1].repeat(1, 3)[:, :8])  # widest: float32
        kept = torch.sum(y, dim=0), y.exp(), torch.prod(y, 0)  # CPU: no policy, no policy, float32
        double = x.double() @ w.double()  # float64 is never autocast
    return y, loss, ce, joined, copied, kept, double


def test_autocast_policies_on_cpu() -> None:
    check_calls(_policies, _mats)


def test_autocast_around_the_call_is_part_of_the_cache_key() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w) + 1

    jf = minijit.jit(fn)
    states = [None, BF16, None, torch.float16, BF16]
    for dtype in states:
        x, w = _mats()
        around = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with around:
            want, got = fn(x, w), jf(x, w)
        assert_same(got, want)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (3, 2)
    assert "torch.is_autocast_enabled('cpu'): value True (bool) != False (bool)" in info.miss_reasons[1]
    assert "torch.get_autocast_dtype('cpu')" in info.miss_reasons[2]


def test_compiled_trace_runs_without_autocast_around_it() -> None:
    # Traced with autocast off around the call and disabled inside; called under autocast, the float32
    # matmul inside must stay float32 (the trace's casts are explicit; torch must not add its own).
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return x @ w

    jf = minijit.jit(fn)
    x, w = _mats()
    for _ in range(CALLS):
        with torch.autocast("cpu", dtype=BF16):
            assert_same(jf(x, w), fn(x, w))


def test_autocast_casts_a_captured_global_tensor() -> None:
    weight = torch.randn(8, 3)

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=BF16):
            return x @ weight

    check_calls(fn, lambda: (torch.randn(4, 8),))


# -- the AMP training loop: forward under autocast, backward outside -------------------------------

class Block(nn.Module):
    """A pre-norm transformer block built from torch.nn modules."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (u.view(b, t, self.heads, c // self.heads).transpose(1, 2) for u in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class TiedMLP(nn.Module):
    """The same Linear twice: autocast casts its weight once and shares the cast (eager's cast cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.relu(self.lin(x)))


class TwoRegions(nn.Module):
    """Two autocast regions: eager clears its cast cache when leaving the first."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=BF16):
            y = self.lin(torch.relu(self.lin(x)))
        with torch.autocast("cpu", dtype=BF16):
            return self.lin(y)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def lossless_round_trips(trace: Trace) -> list[str]:
    """`a -> wider -> a` cast pairs: x bf16 -> f32 -> bf16 is x again (docs/design.md invariant 5)."""
    made_by: dict[str, BoundSymbol] = {p.name: b for b in trace.bound_symbols for p in b.proxy_outputs()}
    found = []
    for b in trace.bound_symbols:
        if not b.sym.name.endswith("convert_element_type"):
            continue
        src = made_by.get(getattr(b.args[0], "name", ""))
        if src is None or not src.sym.name.endswith("convert_element_type"):
            continue
        original, middle, final = src.args[0].dtype, src.args[1], b.args[1]
        if final == original and torch.finfo(middle).bits > torch.finfo(original).bits:
            found.append(f"{src.args[0].name}: {original} -> {middle} -> {final}")
    return found


@pytest.mark.parametrize("make_model, shape", [(_mlp, (2, 5, 8)), (Block, (2, 5, 16)), (TiedMLP, (3, 8)),
                                               (TwoRegions, (3, 8))],
                         ids=["mlp", "transformer_block", "tied_weights", "two_regions"])
def test_amp_training_loop_gives_eager_gradients(make_model: Callable[[], nn.Module], shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    eager = make_model()
    model = copy.deepcopy(eager)
    jitted = minijit.jit(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for _ in range(CALLS):
        x = torch.randn(shape)
        for m, opt in zip((eager, jitted), opts, strict=True):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=BF16):
                out = m(x)
            out.float().pow(2).mean().backward()
        assert_same(jitted(x).detach(), eager(x).detach(), exact=False)
        for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
            assert q.grad is not None and q.grad.dtype == p.grad.dtype == torch.float32, name
            torch.testing.assert_close(q.grad, p.grad, atol=2e-2, rtol=2e-2, msg=lambda m, n=name: f"{n}: {m}")
        for opt in opts:
            opt.step()
    for trace in minijit.last_backward_traces(jitted):
        assert not lossless_round_trips(trace), trace


@pytest.mark.parametrize("make_model, casts", [(TiedMLP, 1), (TwoRegions, 2)], ids=["one_region", "two_regions"])
def test_a_weight_is_cast_once_per_autocast_region(make_model: Callable[[], nn.Module], casts: int) -> None:
    model = make_model()
    jitted = minijit.jit(model)
    with torch.autocast("cpu", dtype=BF16) if make_model is TiedMLP else contextlib.nullcontext():
        jitted(torch.randn(3, 8))
    trace = minijit.last_traces(jitted)[0]
    weight_casts = [b for b in trace.bound_symbols
                    if b.sym.id == "prims.convert_element_type" and b.args[0].name == "lin_weight"]
    assert len(weight_casts) == casts, trace


# -- custom autograd.Functions under autocast ------------------------------------------------------

class _CastingMM(torch.autograd.Function):
    """torch.amp.custom_fwd/custom_bwd: the forward runs in float32 with autocast off."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a.mm(b)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return g.mm(b.t()), a.t().mm(g)


class _PlainMM(torch.autograd.Function):
    """No decorators: the forward sees autocast, the backward (run later, outside it) does not."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a.mm(b)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return g.float().mm(b.t()), a.t().mm(g.float())


def test_custom_functions_under_autocast() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        with torch.autocast("cpu", dtype=BF16):
            return _CastingMM.apply(a, b), _PlainMM.apply(a, b)

    jf = minijit.jit(fn)
    for call in range(CALLS):
        torch.manual_seed(call)
        a, b = torch.randn(3, 4), torch.randn(4, 5)
        grads = []
        for f in (fn, jf):
            ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
            outs = f(ra, rb)
            sum(o.float().sum() for o in outs).backward()
            grads.append((outs, ra.grad, rb.grad))
        (want, *want_grads), (got, *got_grads) = grads
        assert_same(got, want)
        assert_same(got_grads, want_grads)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_layout_of_a_result_of_cast_arguments_is_known(requires_grad: bool) -> None:
    """The casts autocast records in front of an op are prims, whose layout was unknown: `contiguous()`, `stride()`
    of a matmul's or an attention's result were refused (a Hugging Face model's `attn_output.transpose(1,
    2).contiguous()` under autocast). A cast lays its result out as eager's `to` does."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = (x @ w).transpose(0, 1)
        a = F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None]).transpose(1, 2)
        return y.contiguous(), a.contiguous(), torch.tensor(y.stride())

    x, w = torch.randn(3, 4, requires_grad=requires_grad), torch.randn(4, 5, requires_grad=requires_grad)
    jf = minijit.jit(fn)
    with torch.autocast("cpu", dtype=BF16):
        for _ in range(2):
            want, got = fn(x, w), jf(x, w)
            assert_same(got, want)
            assert [g.stride() for g in got] == [v.stride() for v in want]
