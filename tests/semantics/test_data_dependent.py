"""Control flow on tensor values (`if x.sum() > 0`, `range(int(n.item()))`, `t.tolist()`), against eager.

The capture reads each such value on the call's real inputs and the trace checks it on every call;
a call that reads another value runs again with the entry traced for it (one entry per branch or
value seen, the same value is a hit). Each case runs over several calls whose inputs change the
branch or value, comparing results, written inputs, gradients and random draws with eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import minijit
from minijit.errors import MinijitError, ValueGuardError
from minijit.extend import OperatorExecutor
from tests.semantics.util import assert_same


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)


def _run_both(fn: Callable[..., Any], calls: list[tuple[Any, ...]], **options: Any) -> Any:
    """Call eager `fn` and `minijit.jit(fn)` on copies of each call's arguments; results and arguments must match."""
    jf = minijit.jit(fn, **options)
    for args in calls:
        eager_args, jit_args = _clone(args), _clone(args)
        assert_same(jf(*jit_args), fn(*eager_args))
        for got, want in zip(jit_args, eager_args, strict=True):
            assert_same(got, want, "argument after the call")
    return jf


def branch_on_sum(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def loop_bounded_by_item(x, n):
    for _ in range(int(n.item())):
        x = x * 2
    return x


def python_list_from_tolist(x, t):
    vals = t.tolist()
    return x * sum(v * v for v in vals) + len(vals)


def halve_until_small(x):
    while x.abs().max() > 1:
        x = x / 2
    return x


def item_compared_and_converted(x, n):
    k = n.item()
    if k > 2:  # a comparison: one trace per outcome
        x = x + 1
    return x[: int(n)] * float(n) + bool(n > 3)  # conversions: one trace per value


def size_from_data(x, n):
    return torch.zeros(int(n.item()), x.shape[0]) + x


def two_values_compared(a, b):
    return a * 2 if a.max().item() > b.max().item() else b * 3


def test_branch_on_a_sum_keeps_a_trace_per_branch() -> None:
    signs = [1.0, -1.0, 2.0, -3.0, 4.0]
    jf = _run_both(branch_on_sum, [(torch.full((3,), s),) for s in signs])
    info = minijit.cache_info(jf)
    assert (info.misses, info.entries, info.hits) == (2, 2, 3)  # the same branch again is a hit
    assert info.value_switches == 4  # calls 2 (traced) to 5: each ran the last branch's trace up to the check
    assert "value guard: bool(" in info.miss_reasons[1] and "test_data_dependent.py" in info.miss_reasons[1]
    assert "2 entries told apart by values read from tensors" in str(info)


def test_loop_bounded_by_item() -> None:
    calls = [(torch.ones(2), torch.tensor(n)) for n in (3, 1, 3, 0, 1)]
    jf = _run_both(loop_bounded_by_item, calls)
    assert minijit.cache_info(jf).entries == 3


def test_python_list_from_tolist_with_tensors() -> None:
    t1, t2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0, 0.5])
    jf = _run_both(python_list_from_tolist, [(torch.randn(2), t) for t in (t1, t2, t1, t2)])
    assert minijit.cache_info(jf).entries == 2


def test_data_dependent_while_loop() -> None:
    calls = [(torch.tensor([5.0, 2.0]),), (torch.tensor([0.5, 0.1]),), (torch.tensor([50.0, -3.0]),),
             (torch.tensor([5.0, 3.0]),), (torch.tensor([0.25, 0.5]),)]
    jf = _run_both(halve_until_small, calls)
    assert minijit.cache_info(jf).entries == 3  # 3 halvings, none, 6 halvings


def test_item_comparisons_and_conversions() -> None:
    calls = [(torch.arange(6.0), torch.tensor(n)) for n in (4, 1, 4, 3, 1)]
    jf = _run_both(item_compared_and_converted, calls)
    assert minijit.cache_info(jf).entries == 3


def test_size_read_from_data() -> None:
    _run_both(size_from_data, [(torch.randn(3), torch.tensor(n)) for n in (2, 4, 2)])


def test_two_data_dependent_numbers_compared() -> None:
    calls = [(torch.tensor([1.0, 5.0]), torch.tensor([2.0])), (torch.tensor([1.0]), torch.tensor([2.0, 0.0])),
             (torch.tensor([9.0, 5.0]), torch.tensor([2.0]))]
    _run_both(two_values_compared, calls)


def test_item_as_a_scale_is_not_read() -> None:
    # Arithmetic on x.item() is computed when the trace runs: one trace for every value.
    calls = [(torch.ones(2), torch.tensor(v)) for v in (1.0, 2.0, 3.0)]
    jf = _run_both(lambda x, s: x * s.item() + s.item() ** 2 - float(s), calls)
    assert minijit.cache_info(jf).entries == 1


def written_input_and_branch(x, y):
    y.add_(1)  # written before the value is read: the write must not land twice, nor on a failed run
    if (x > 0).all():
        y.mul_(2)
        return x * y
    return x - y


def test_writes_into_inputs_land_once() -> None:
    calls = [(torch.tensor([s, 1.0]), torch.ones(2)) for s in (1.0, -1.0, 2.0, -2.0)]
    for executors in (None, ["triton"], ["inductor"]):  # fusion executors keep the write after the check too
        _run_both(written_input_and_branch, calls, executors=executors)


def random_then_branch(x):
    r = torch.rand(3)
    if x.sum() > 0:
        return x + r
    return x - r + torch.randn(3)


def test_random_draws_match_eager_after_a_failed_check() -> None:
    jf = minijit.jit(random_then_branch)
    for s in (1.0, -5.0, 2.0, -6.0):
        torch.manual_seed(s.__hash__() % 100)
        got = jf(torch.tensor([s, 1.0, 2.0]))
        got_state = torch.get_rng_state()
        torch.manual_seed(s.__hash__() % 100)
        want = random_then_branch(torch.tensor([s, 1.0, 2.0]))
        assert torch.equal(got, want)
        assert torch.equal(got_state, torch.get_rng_state())


def test_outside_state_is_written_once_per_call() -> None:
    seen: list[torch.Tensor] = []

    def f(x):
        seen.append(x.sum())
        if x.sum() > 0:
            return x.exp()
        return x

    jf = minijit.jit(f)
    for s in (1.0, -1.0, 2.0, -2.0):
        x = torch.full((2,), s)
        assert_same(jf(x), x.exp() if s > 0 else x)
    assert [v.item() for v in seen] == [2.0, -2.0, 4.0, -4.0]


def scaled_by_own_norm(x, w):
    y = x @ w
    s = y.abs().max()
    if s > 1:
        return y / s
    return y * float(s)


def test_under_grad_with_backward() -> None:
    jf = minijit.jit(scaled_by_own_norm)
    for scale in (1.0, 0.01, 2.0, 0.02):
        x = torch.full((2, 3), scale, requires_grad=True)
        w = torch.linspace(-1, 1, 9).reshape(3, 3).requires_grad_()
        (xe, we), (xj, wj) = _clone((x, w)), _clone((x, w))
        want, got = scaled_by_own_norm(xe, we), jf(xj, wj)
        assert_same(got, want)
        want.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(xj.grad, xe.grad)
        torch.testing.assert_close(wj.grad, we.grad)
    assert minijit.cache_info(jf).entries == 2


class EarlyExit(nn.Module):
    """Two blocks; the second runs only where the first's output is not yet small (a threshold layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.threshold = 1.0

    def forward(self, x):
        h = torch.relu(self.first(x))
        if h.norm() < self.threshold:
            return h
        return self.second(h)


def test_early_exit_module_with_grad() -> None:
    torch.manual_seed(0)
    eager = EarlyExit()
    jitted = minijit.jit(EarlyExit())
    jitted.load_state_dict(eager.state_dict())
    for scale in (10.0, 0.001, 5.0, 0.002):
        x = torch.randn(2, 4) * scale
        want, got = eager(x), jitted(x)
        assert_same(got, want)
        want.sum().backward()
        got.sum().backward()
        for (name, p), q in zip(eager.named_parameters(), jitted.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert minijit.cache_info(jitted).entries == 2


def test_symbolic_values_mode() -> None:
    calls = [(torch.full((n,), s),) for n, s in ((3, 1.0), (5, -1.0), (4, 2.0), (6, -2.0))]
    jf = _run_both(branch_on_sum, calls, cache="symbolic values")
    assert minijit.cache_info(jf).entries == 2  # one per branch, for every size


def test_truth_of_an_item_keeps_a_trace_per_truth_value() -> None:
    jf = _run_both(lambda x, n: x + 1 if n.item() else x - 1, [(torch.ones(2), torch.tensor(v)) for v in (3, 0, 5, 0)])
    assert minijit.cache_info(jf).entries == 2


def test_new_values_warn_as_retraces() -> None:
    jf = minijit.jit(loop_bounded_by_item, warn_retraces_after=1)
    jf(torch.ones(1), torch.tensor(1))
    with pytest.warns(minijit.RetraceWarning, match=r"value guard: i\d+ is 2 "):
        jf(torch.ones(1), torch.tensor(2))


def test_too_many_values_is_a_clear_error() -> None:
    jf = minijit.jit(loop_bounded_by_item)
    jf.max_value_entries = 2
    jf(torch.ones(1), torch.tensor(1))
    jf(torch.ones(1), torch.tensor(2))
    with pytest.raises(ValueGuardError, match=r"value guard: i\d+ is 3 at .*test_data_dependent.py.*2 entries"):
        jf(torch.ones(1), torch.tensor(3))


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2 if x.sum() > 0 else x

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_value_read_where_only_the_trace_knows_it_is_refused() -> None:
    with pytest.raises(MinijitError, match=r"test_data_dependent\.py"):
        minijit.jit(lambda x: _Double.apply(x))(torch.ones(2))
    with pytest.raises(MinijitError, match="only known when the trace runs"):
        minijit.jit(lambda x: f"{x.sum().item()}")(torch.ones(2))


# -- results whose shape depends on the values: sizes known only when the trace runs, one trace for all --------

def masked_with_grad(x):
    kept = x[x > 0]
    return kept.square().sum() + torch.masked_select(x, x < -1).sum()


def test_boolean_mask_and_masked_select_with_grad() -> None:
    jf = minijit.jit(masked_with_grad)
    values = ([1.0, -2.0, 3.0, 0.5], [-1.0, -2.0, -3.0, 0.5], [1.0, -2.0, 3.0, 0.5], [4.0, 2.0, -0.5, 0.5])
    for v in values:
        x, xe = torch.tensor(v, requires_grad=True), torch.tensor(v, requires_grad=True)
        got, want = jf(x), masked_with_grad(xe)
        assert_same(got, want)
        got.backward()
        want.backward()
        torch.testing.assert_close(x.grad, xe.grad)
    assert minijit.cache_info(jf).entries == 1  # the counts of True are sizes the trace computes


def nonzero_unique_and_views(x):
    rows = torch.nonzero(x > 0).view(-1) + 1
    values, counts = torch.unique(x.round(), return_counts=True)
    return rows, values * counts, x.nonzero(as_tuple=True)[0]


def test_nonzero_and_unique() -> None:
    calls = [(torch.tensor(v),) for v in ([1.2, -2.0, 3.0, 1.0], [0.0, 2.0, 2.2, 0.0], [1.2, -2.0, 3.0, 1.0])]
    _run_both(nonzero_unique_and_views, calls)
    _run_both(nonzero_unique_and_views, calls, cache="symbolic values")


def where_one_argument(x, w):
    rows, cols = torch.where(x > 0)  # eager: nonzero(as_tuple=True), a data-dependent size
    routed = torch.where(w.sum(-1) > 0)[0]
    return x[rows, cols] * 2, rows + cols, w[routed].sum(0)


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
def test_where_with_one_argument(cache: str) -> None:
    torch.manual_seed(0)
    calls = [(torch.randn(3, 4), torch.randn(5, 2)) for _ in range(3)] + [(torch.randn(2, 6), torch.randn(7, 2))]
    _run_both(where_one_argument, calls, cache=cache)


class KeepConfident(nn.Module):
    """Scores rows, keeps those above a threshold (a mask), and averages them; no row kept is an early exit."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(3, 1)

    def forward(self, x):
        keep = self.score(x).squeeze(-1) > 0
        if not keep.any():
            return x.new_zeros(3)
        return x[keep].mean(0)


def test_module_with_a_mask_and_an_early_exit() -> None:
    torch.manual_seed(0)
    eager = KeepConfident()
    jitted = minijit.jit(KeepConfident())
    jitted.load_state_dict(eager.state_dict())
    none_kept = -100 * eager.score.weight.detach().sign().expand(6, 3)  # every score negative: the early exit
    for x in (torch.randn(6, 3), none_kept, torch.randn(6, 3) * 2, none_kept.clone()):
        with torch.no_grad():
            assert_same(jitted(x), eager(x))


# -- x.item() as a size or an index inside an op: one entry where the trace computes with it, else one per value
# (a size the ops compute with as it is, `torch.zeros(n.item())`, is a size the trace knows: one entry; so are
# slice bounds, which the trace clamps itself, and int indices: tests/semantics/test_item_slices.py)

@pytest.mark.parametrize(("fn", "entries"), [
    pytest.param(lambda x, n: x[: n.item()] * 2, 1, id="slice"),
    pytest.param(lambda x, n: torch.zeros(n.item()) + x[0], 1, id="zeros"),
    pytest.param(lambda x, n: x.view(n.item(), -1).sum(0), 3, id="view"),
    pytest.param(lambda x, n: x.narrow(0, 1, n.item()), 1, id="narrow"),
    pytest.param(lambda x, n: x[: 2].repeat(n.item()), 3, id="repeat"),
    pytest.param(lambda x, n: x[n.item()] + x[-n.item()], 1, id="index"),
    pytest.param(lambda x, n: x.reshape(-1, n.item()) @ torch.ones(n.item()), 3, id="reshape"),
])
def test_item_as_a_size_or_an_index(fn, entries) -> None:
    jf = _run_both(fn, [(torch.arange(12.0), torch.tensor(v)) for v in (3, 4, 3, 6)])
    assert minijit.cache_info(jf).entries == entries


def test_a_value_the_executors_compute_differently_is_a_clear_error() -> None:
    # The capture reads values with the torch executor; an executor whose sum differs makes the compiled
    # trace see another value on the very inputs it was traced for: an error naming the value, not a loop.
    off_by_one = OperatorExecutor("off_by_one_sum", version="0")
    off_by_one.register_implementation(torch.sum, lambda x, *args, **kwargs: torch.sum(x, *args, **kwargs) + 1)
    jf = minijit.jit(lambda x: x * 2 if x.sum() > 0.5 else x, executors=[off_by_one])
    with pytest.raises(ValueGuardError, match=r"bool\(t\d+\) is True at .* when the compiled trace runs, but it was False"):
        jf(torch.zeros(2))


def mask_slice_and_branch(x, n):
    return x[x > n].sum() + (x[: n.item()].sum() if x.sum() > 10 else 0)


def test_symbolic_sizes_with_values_read() -> None:
    calls = [(torch.arange(float(size)), torch.tensor(v)) for size, v in ((12, 3), (24, 4), (12, 3), (36, 6), (24, 4))]
    jf = _run_both(mask_slice_and_branch, calls, cache="symbolic values")
    assert minijit.cache_info(jf).hits >= 2  # (24, 4) again reuses its entry
