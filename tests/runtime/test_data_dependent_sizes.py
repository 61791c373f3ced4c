"""Sizes that depend on the values (`nonzero`, `torch.where(mask)`, `x[mask]`, `unique`) are sizes the trace computes
(minijit/ops/unbacked.py): one trace for every count, where a trace per count was made before (issue 39 part 2).
Every result, gradient and parameter is compared with eager's, run side by side; traces are counted."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minijit
from minijit.errors import MinijitError
from minijit.testing import tolerance
from tests.semantics.util import assert_same

TOL = tolerance(torch.float32, reduction_length=16)


def masked_arithmetic(x, mask):
    idx = torch.nonzero(mask)
    rows, cols = torch.where(mask)
    picked = x[mask]
    spread = picked.unsqueeze(1) * x[rows]  # sizes of two ops on one mask: one size
    return (picked * 2 + picked.sum(), idx.sum(0), (rows * 3 + cols).float().sum() / (rows.shape[0] + 1), spread.sum(0),
            torch.unique(x.round(), return_counts=True)[1].sum(), picked.shape[0] + 1)


def _masks(shape, seed=0):
    """Masks with different counts of True: some, none, all, one, more."""
    g = torch.Generator().manual_seed(seed)
    one = torch.zeros(shape, dtype=torch.bool)
    one[1, 2] = True
    return [torch.rand(shape, generator=g) < 0.5, torch.zeros(shape, dtype=torch.bool),
            torch.ones(shape, dtype=torch.bool), one, torch.rand(shape, generator=g) < 0.8]


@pytest.mark.parametrize("cache", ["automatic", "symbolic values", "constant values"])
def test_counts_of_true_trace_once(cache):
    jf = minijit.jit(masked_arithmetic, cache=cache)
    torch.manual_seed(0)
    for mask in _masks((4, 5)):
        x = torch.randn(4, 5)
        assert_same(jf(x, mask), masked_arithmetic(x, mask))
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (1, 4), info
    assert "check_value" not in minijit.last_traces(jf)[-1].python()


def test_counts_and_input_sizes_change_together_under_symbolic_values():
    jf = minijit.jit(masked_arithmetic, cache="symbolic values")
    torch.manual_seed(0)
    for rows, mask in [(4, m) for m in _masks((4, 5))] + [(6, m) for m in _masks((6, 5), seed=1)]:
        x = torch.randn(rows, 5)
        assert_same(jf(x, mask), masked_arithmetic(x, mask))
    assert minijit.cache_info(jf).misses == 1


def masked_loss(x, w, mask):
    picked = (x @ w)[mask]
    rows, _ = torch.where(mask)
    return (picked.square() * rows.float()).sum() + torch.masked_select(x, mask).sum()


def test_gradients_through_a_boolean_mask():
    jf = minijit.jit(masked_loss)
    torch.manual_seed(0)
    w = torch.randn(5, 5, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    for mask in _masks((4, 5)):
        x = torch.randn(4, 5, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, want = jf(x, w, mask), masked_loss(x_eager, w_eager, mask)
        assert_same(got, want)
        got.backward()
        want.backward()
        torch.testing.assert_close(x.grad, x_eager.grad, **TOL)
        torch.testing.assert_close(w.grad, w_eager.grad, **TOL)
    assert minijit.cache_info(jf).misses == 1


def shaped_selection(x):
    picked = x[x > 0]
    return (torch.cat([picked, x]) * torch.arange(picked.shape[0] + x.shape[0]),  # a slice of (n + 6) - n: 6
            F.pad(picked, (1, 2)), picked.reshape(1, -1) * 2, torch.stack([picked, picked * 3]),
            picked.unsqueeze(0).t().contiguous(), picked[:2] * 5)


def test_gradients_through_shape_ops_on_a_selection():
    """cat, pad, reshape, stack, transpose and slices of a selection, under grad: the VJP rules give each input a
    gradient of its own size, without comparing sizes only the trace knows (which refused)."""
    jf = minijit.jit(shaped_selection)
    for mask in ([1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 1, 0], [0] * 6):
        mask = torch.tensor(mask)
        x = torch.randn(6).abs() * (mask * 2 - 1)
        x, x_eager = x.requires_grad_(), x.detach().clone().requires_grad_()
        got, want = jf(x), shaped_selection(x_eager)
        assert_same(got, want)
        sum(o.sum() for o in got).backward()
        sum(o.sum() for o in want).backward()
        torch.testing.assert_close(x.grad, x_eager.grad, **TOL)
    assert minijit.cache_info(jf).eager_calls == 0


def branch_on_count(x):
    kept = x[x > 0]
    if kept.shape[0] > 2:  # a decision on the count: one trace per outcome, checked by the trace
        return kept.sum()
    return kept.sum() - kept.shape[0]


def test_a_branch_on_the_count_traces_per_outcome():
    jf = minijit.jit(branch_on_count)
    for v in ([1.0, 2, 3, -1], [1.0, -2, -3, -1], [1.0, 2, 3, 4], [0.0, 0, 0, 0], [5.0, 6, -7, 8]):
        assert_same(jf(torch.tensor(v)), branch_on_count(torch.tensor(v)))
    assert minijit.cache_info(jf).entries == 2


def test_the_count_as_text_is_refused_naming_the_op_and_the_line():
    def describe(x):
        return f"{x[x > 0].shape[0]} positive"

    with pytest.raises(MinijitError, match=r"Tensor.__getitem__'s result at \S*test_data_dependent_sizes\.py:\d+.*"
                                           r"only known when the trace runs"):
        minijit.jit(describe)(torch.randn(5))


# -- a mixture of experts, routed as litgpt's LLaMAMoE routes -------------------------------------------------

class Expert(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.fc_1, self.fc_2 = nn.Linear(c, h, bias=False), nn.Linear(c, h, bias=False)
        self.proj = nn.Linear(h, c, bias=False)

    def forward(self, x):
        return self.proj(F.silu(self.fc_1(x)) * self.fc_2(x))


class TopTwoMoE(nn.Module):
    """litgpt's LLaMAMoE: router, softmax over the top 2, each expert on its tokens from `torch.where(mask)`."""

    def __init__(self, c=8, h=16, n_expert=4, k=2, index_add=False):
        super().__init__()
        self.gate = nn.Linear(c, n_expert, bias=False)
        self.experts = nn.ModuleList(Expert(c, h) for _ in range(n_expert))
        self.k, self.index_add = k, index_add

    def forward(self, x):
        b, t, c = x.size()
        x = x.view(-1, c)
        probs, indices = torch.topk(self.gate(x), self.k)
        probs = probs.softmax(dim=1, dtype=torch.float).to(dtype=x.dtype)
        masks = (indices.unsqueeze(-1) == torch.arange(len(self.experts), device=x.device)).permute(2, 0, 1)
        y = torch.zeros_like(x)
        for mask, expert in zip(masks, self.experts, strict=True):
            token_idx, expert_idx = torch.where(mask)
            out = probs[token_idx, expert_idx, None] * expert(x[token_idx])
            if self.index_add:
                y = y.index_add(0, token_idx, out)
            else:
                y[token_idx] += out
        return y.view(b, t, c)


@pytest.mark.parametrize(("make_opt", "index_add"), [
    (lambda ps: torch.optim.SGD(ps, lr=0.1), False),
    (lambda ps: torch.optim.AdamW(ps, lr=0.02), True),
], ids=["SGD-setitem", "AdamW-index_add"])
def test_moe_training_traces_at_most_twice(make_opt, index_add):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), TopTwoMoE(index_add=index_add))
    eager = copy.deepcopy(model)
    jitted = minijit.jit(model)
    opt, eager_opt = make_opt(model.parameters()), make_opt(eager.parameters())
    for _ in range(20):
        x = torch.randn(2, 5, 8)
        loss, eager_loss = jitted(x).square().mean(), eager(x).square().mean()
        torch.testing.assert_close(loss, eager_loss, **TOL)
        loss.backward()
        eager_loss.backward()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
        opt.step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p, q, **TOL)
    assert minijit.cache_info(jitted).misses <= 2, minijit.cache_info(jitted)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: torch.cat([x[x > 0], x]) * 2, id="cat"),
    pytest.param(lambda x: x[x > 0][1:], id="slice"),
    pytest.param(lambda x: x[x > 0].softmax(0), id="softmax"),
    pytest.param(lambda x: x[x > 0].cumsum(0), id="cumsum"),
    pytest.param(lambda x: x[x > 0] @ x[x > 0], id="matmul-two-masks"),
    pytest.param(lambda x: torch.stack([x[x > 0], x[x > 0] * 2]).sum(0), id="stack-two-masks"),
    pytest.param(lambda x: torch.zeros(6).index_add(0, torch.nonzero(x > 0).squeeze(1), x[x > 0]), id="index_add"),
    pytest.param(lambda x: x[x > 0].view(-1, 1).expand(-1, 3).reshape(-1), id="views"),
])
def test_ops_on_counts_compare_outcomes_not_counts(fn):
    # Their rules ask whether a count is 0, or two counts are equal: the trace checks that outcome, not the count.
    jf = minijit.jit(fn)
    for v in ([1.0, 2, -3, 4, -5, 6], [1.0, -2, -3, 4, -5, -6], [1.0, 2, 3, 4, 5, 6], [-1.0, 2, 3, -4, -5, -6]):
        assert_same(jf(torch.tensor(v)), fn(torch.tensor(v)))
    assert minijit.cache_info(jf).misses == 1, minijit.cache_info(jf)
