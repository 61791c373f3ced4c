"""Opaque torch ops (minijit/ops/opaque.py) against eager: values, effects, gradients and refusals.

Each function here calls torch ops that have no ltorch decomposition (or a call form
the decomposition declines); under `minijit.jit` each becomes one bound symbol, printed
as the torch call it is, whose metadata comes from torch's meta kernels, whose effects
come from the operators' schemas and whose gradient comes from torch's autograd.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import minijit
from minijit.errors import MinijitError
from minijit.ops.opaque import OPAQUE
from tests.oputil import assert_same_grads

F64 = torch.float64


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _well_conditioned(n, dtype=torch.float32):
    return _randn(n, n, dtype=dtype, seed=3) + 4 * torch.eye(n, dtype=dtype)


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _leaves(out):
    return [t for t in (out if isinstance(out, tuple | list) else [out])]


def _opaque_calls(jf):
    """The ids of the opaque bound symbols of the first (capture) trace."""
    return [b.sym.id for b in minijit.last_traces(jf)[0].bound_symbols if OPAQUE in b.sym.tags]


def _line_of(fn, text):
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# -- values and metadata -------------------------------------------------------------------------

def cummax_fields(x):
    r = torch.cummax(x, 1)
    return r.values * 2, r.indices


FORWARD = [
    ("logcumsumexp", lambda x: torch.logcumsumexp(x, 1), lambda: [_randn(3, 4)], "torch.logcumsumexp"),
    ("kron_promotes", lambda x, y: torch.kron(x, y), lambda: [_randn(2, 2), torch.arange(4).reshape(2, 2)],
     "torch.kron"),
    ("linalg_solve", lambda a, b: torch.linalg.solve(a, b), lambda: [_well_conditioned(3), _randn(3, 2)],
     "torch.linalg.solve"),
    ("cummax_named_tuple", cummax_fields, lambda: [_randn(3, 4)], "torch.cummax"),
    ("rfft_complex", lambda x: torch.fft.rfft(x).abs(), lambda: [_randn(8)], "torch.fft.rfft"),
    ("special_and_method", lambda x: torch.special.i1e(x) + x.frac(), lambda: [_randn(5)], "torch.special.i1e"),
    ("keyword_args", lambda x: torch.nan_to_num(x.log(), neginf=-7.0), lambda: [_randn(6)], "torch.nan_to_num"),
    # inplace=True, which ltorch.relu declines: opaque, then functionalized (so printed as its functional form).
    ("relu_inplace", lambda x: F.relu(x * 2, inplace=True) + 1, lambda: [_randn(2, 5)], None),
    ("nuclear_norm", lambda x: torch.norm(x, p="nuc"), lambda: [_randn(3, 4)], "torch.norm"),
    ("gather_int32", lambda x, i: x.gather(1, i) * 2, lambda: [_randn(3, 4), torch.tensor([[0, 3]] * 3).int()],
     None),
    ("two_ellipses", lambda x: x[..., ...] + 1, lambda: [_randn(2, 3)], "torch.Tensor.__getitem__"),
    # Tensor repeats, which ltorch declines; with output_size the shape is known.
    ("repeat_interleave_output_size", lambda x, r: torch.repeat_interleave(x, r, dim=0, output_size=6),
     lambda: [_randn(3, 2), torch.tensor([1, 2, 3])], "torch.repeat_interleave"),
]


@pytest.mark.parametrize(("fn", "make_args", "printed"), [pytest.param(*c[1:], id=c[0]) for c in FORWARD])
def test_opaque_op_matches_eager_and_prints_as_the_torch_call(fn, make_args, printed):
    args = make_args()
    jf = minijit.jit(fn)
    got, want = jf(*_clone(args)), fn(*_clone(args))
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        torch.testing.assert_close(g, w, equal_nan=True)
    if printed is not None:
        assert printed in _opaque_calls(jf)
        assert f"= {printed}(" in minijit.last_traces(jf)[-1].python()


# -- effects: writes, out=, views, randomness ----------------------------------------------------

def writes_input(x):
    x.logit_(eps=0.1)
    return x * 2


def writes_view_of_input(x):
    x[1:].renorm_(2, 0, 1.0)
    return x.sum()


def writes_out(a, o):
    r = torch.logcumsumexp(a, 0, out=o)
    return r + 1


def reads_view_after_base_write(x):
    v = x.unfold(0, 2, 1)
    x.mul_(2)
    return v.sum(-1)


def writes_through_view(x):
    x.unfold(0, 2, 2).mul_(3)
    return x + 0


def writes_intermediate(x):
    y = x.exp()
    y.logit_(eps=0.01)
    return y


EFFECTS = [
    ("inplace_input", writes_input, lambda: [torch.rand(4)]),
    ("inplace_view_of_input", writes_view_of_input, lambda: [_randn(3, 4)]),
    ("out", writes_out, lambda: [_randn(5), torch.empty(5)]),
    ("view_read_after_base_write", reads_view_after_base_write, lambda: [_randn(6)]),
    ("write_through_view", writes_through_view, lambda: [_randn(6)]),
    ("inplace_intermediate", writes_intermediate, lambda: [_randn(4)]),
]


@pytest.mark.parametrize(("fn", "make_args"), [pytest.param(*c[1:], id=c[0]) for c in EFFECTS])
def test_opaque_effects_match_eager_outputs_and_inputs(fn, make_args):
    args = make_args()
    got_args, want_args = _clone(args), _clone(args)
    jf = minijit.jit(fn)
    torch.testing.assert_close(jf(*got_args), fn(*want_args))
    for g, w in zip(got_args, want_args, strict=True):
        torch.testing.assert_close(g, w)
    assert _opaque_calls(jf), "expected an opaque torch op"


def adds_into_out(a, b, o):
    r = torch.add(a, b, out=o)
    return r * 2


@pytest.mark.parametrize("out", [torch.empty(4), torch.empty(4, dtype=torch.float64)], ids=["same", "wider"])
def test_out_given_to_a_decomposition_without_out_matches_eager(out):
    # ltorch.add has no out: its result is copied into out (cast into a wider dtype, as eager does).
    a, b = _randn(4), _randn(4, seed=1)
    got_out, want_out = out.clone(), out.clone()
    jf = minijit.jit(adds_into_out)
    torch.testing.assert_close(jf(a, b, got_out), adds_into_out(a, b, want_out))
    torch.testing.assert_close(got_out, want_out)
    assert not _opaque_calls(jf)


@pytest.mark.parametrize("out", [torch.empty(0), torch.empty(4, dtype=torch.int64)], ids=["resized", "narrower"])
def test_out_that_eager_resizes_or_cannot_cast_into_is_refused(out):
    # Declined by the decomposition; the torch op's meta run changes out's shape or rejects the dtype.
    with pytest.raises(MinijitError, match="out="):
        minijit.jit(adds_into_out)(_randn(4), _randn(4), out)


def test_effects_are_read_from_the_schema():
    jf = minijit.jit(writes_out)
    a, o = _randn(5), torch.empty(5)
    jf(a, o)
    trace = minijit.last_traces(jf)[0]
    (bsym,) = [b for b in trace.bound_symbols if OPAQUE in b.sym.tags]
    assert bsym.sym.effects.writes == ("out",) and bsym.written() == [trace.args[1]]

    jf = minijit.jit(reads_view_after_base_write)
    x = _randn(6)
    jf(x)
    trace = minijit.last_traces(jf)[0]
    unfold = next(b for b in trace.bound_symbols if b.sym.id == "torch.Tensor.unfold")
    assert unfold.viewed_argument(unfold.output) is trace.args[0]


def two_draws(rate):
    return torch.poisson(rate), torch.poisson(rate)


def test_random_opaque_op_draws_like_eager_and_is_never_merged():
    rate = torch.rand(6) * 5
    jf = minijit.jit(two_draws)
    torch.manual_seed(1)
    got = jf(rate)
    torch.manual_seed(1)
    want = two_draws(rate)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert not torch.equal(got[0], got[1])
    final = minijit.last_traces(jf)[-1]
    draws = [b for b in final.bound_symbols if b.sym.id == "torch.poisson"]
    assert len(draws) == 2 and draws[0].sym.effects.random


def adds_a_permutation(x):
    return x + torch.randperm(5)


def test_random_factory_without_traced_tensors_draws_on_every_call_like_eager():
    # Run at trace time, torch.randperm's result would be frozen into the trace as a constant.
    x = torch.zeros(5)
    jf = minijit.jit(adds_a_permutation)
    torch.manual_seed(3)
    got = [jf(x) for _ in range(3)]
    torch.manual_seed(3)
    want = [adds_a_permutation(x) for _ in range(3)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert "randperm(" in minijit.last_traces(jf)[-1].python()  # recorded (an ltorch op now), not a constant


def test_opaque_op_under_symbolic_values_matches_eager_for_new_sizes():
    fn = lambda x: torch.logcumsumexp(x, 0) * x.shape[0]
    jf = minijit.jit(fn, cache="symbolic values")
    for n in (4, 7, 4):
        x = _randn(n, 3, seed=n)
        torch.testing.assert_close(jf(x), fn(x))


# -- gradients: torch's own derivative on the saved inputs -----------------------------------------

def solve_by_keyword(a, b):
    return torch.linalg.solve(A=a, B=b)


def kron_self(x):
    return torch.kron(x, x)


def through_complex(x):
    # Complex values between opaque ops: torch's autograd differentiates them as eager does.
    return torch.view_as_real(torch.fft.rfft(x)) ** 2


def inplace_on_intermediate(x):
    y = torch.sigmoid(x) * 0.9 + 0.05
    y.logit_()
    return y * x


GRADS = [
    ("logcumsumexp", lambda x: torch.logcumsumexp(x, 1), lambda: [_randn(3, 4, dtype=F64)]),
    ("kron_two_inputs", lambda x, y: torch.kron(x, y), lambda: [_randn(2, 3, dtype=F64), _randn(2, 2, dtype=F64)]),
    ("kron_same_input_twice", kron_self, lambda: [_randn(2, 2, dtype=F64)]),
    ("solve_by_keyword", solve_by_keyword, lambda: [_well_conditioned(3, F64), _randn(3, 2, dtype=F64)]),
    ("cummax_values", lambda x: torch.cummax(x, 0).values, lambda: [_randn(5, 2, dtype=F64)]),
    ("through_complex", through_complex, lambda: [_randn(8, dtype=F64)]),
    ("pad_reflect", lambda x: F.pad(x, (2, 1), mode="reflect"), lambda: [_randn(1, 2, 5, dtype=F64)]),
    ("inplace_on_intermediate", inplace_on_intermediate, lambda: [_randn(4, dtype=F64)]),
    ("mixed_with_decomposed", lambda x: (torch.special.i1e(x) * x.exp()).sum(), lambda: [_randn(5, dtype=F64)]),
]


@pytest.mark.parametrize(("fn", "make_args"), [pytest.param(*c[1:], id=c[0]) for c in GRADS])
def test_opaque_gradients_equal_eager_autograd(fn, make_args):
    args = [a.requires_grad_() for a in make_args()]
    want, got = fn(*args), minijit.jit(fn)(*args)
    torch.testing.assert_close(got, want)
    cotangent = _randn(*want.shape, dtype=F64, seed=9) if want.ndim else torch.tensor(0.7, dtype=F64)
    want_g = torch.autograd.grad(want, args, cotangent, allow_unused=True)
    got_g = torch.autograd.grad(got, args, cotangent, allow_unused=True)
    assert_same_grads(want_g, got_g, args)


def rrelu_training(x):
    return F.rrelu(x, training=True) * 2


def test_random_opaque_op_gradient_replays_the_same_random_numbers():
    # The forward saves the generator's state before the op; the backward runs the op again from it.
    x = _randn(50, dtype=F64).requires_grad_()
    jf = minijit.jit(rrelu_training)
    torch.manual_seed(5)
    got = jf(x)
    torch.manual_seed(5)
    want = rrelu_training(x)
    torch.testing.assert_close(got, want)
    cotangent = _randn(50, dtype=F64, seed=2)
    assert_same_grads(torch.autograd.grad(want, x, cotangent), torch.autograd.grad(got, x, cotangent), [x])
    forward = minijit.last_traces(jf)[-1].python()
    assert forward.index("get_rng_state(") < forward.index("torch.rrelu(")


# -- data-dependent output shapes: sizes the trace computes (minijit/ops/unbacked.py), one trace for all -------

def uses_nonzero(x):
    return torch.nonzero(x > 0) + 1


def uses_unique(x):
    return torch.unique(x)


def uses_masked_select(x):
    return torch.masked_select(x, x > 0)


def uses_repeat_interleave(x, r):
    return torch.repeat_interleave(x, r)


@pytest.mark.parametrize(("fn", "args", "op"), [
    pytest.param(uses_nonzero, lambda s: [_randn(5, seed=s)], "torch.nonzero", id="nonzero"),
    pytest.param(uses_unique, lambda s: [_randn(5, seed=s).round()], "torch.unique", id="unique"),
    pytest.param(uses_masked_select, lambda s: [_randn(5, seed=s)], "torch.masked_select", id="masked_select"),
    pytest.param(uses_repeat_interleave, lambda s: [_randn(3), torch.tensor([1, 2, 3]) + s], "torch.repeat_interleave",
                 id="repeat_interleave"),
])
def test_data_dependent_output_shape_matches_eager_in_one_trace(fn, args, op):
    jf = minijit.jit(fn)
    for seed in (0, 1, 2, 3):  # a new shape is no new entry: the trace binds the size where the op made it
        call = args(seed)
        torch.testing.assert_close(jf(*call), fn(*call))
    captured = minijit.last_traces(jf)[0].python()
    assert "prims.check_value" not in captured and "prims.size(" in captured
    assert (minijit.cache_info(jf).entries, minijit.cache_info(jf).hits) == (1, 3)


def test_data_dependent_output_shape_into_out_is_refused_naming_op_and_line():
    def into_out(x):
        return torch.nonzero(x > 0, out=torch.empty(0, 1, dtype=torch.long))

    with pytest.raises(MinijitError) as info:
        minijit.jit(into_out)(_randn(5))
    message = str(info.value)
    assert "nonzero" in message and "depends on the" in message
    assert f"{os.path.basename(__file__)}:{_line_of(into_out, 'torch.nonzero')}" in message


def test_an_opaque_in_place_op_then_a_write_through_a_view_under_symbolic_sizes() -> None:
    """`x.fill_diagonal_(k)` (an opaque op whose sizes are specialised under symbolic sizes) then `x[::2].mul_(-1)`:
    its functional form's result has x's sizes, not constants equal to them only by the guard, so the write back
    through the strided view matches its region (it was refused: 'value f32[2, 2] does not match the region
    f32[i8, i1]'); values and the written argument as eager's."""
    def f(x, k):
        x.fill_diagonal_(k)
        x[::2].mul_(-1)
        return x.sum(0)

    jitted = minijit.jit(f, cache="symbolic values")
    for n, m in ((4, 2), (3, 3)):
        x = torch.randn(n, m)
        expected_x = x.clone()
        torch.testing.assert_close(jitted(x, 2), f(expected_x, 2))
        torch.testing.assert_close(x, expected_x)


@pytest.mark.parametrize("fn", [
    lambda x, o: torch.flip(x, [0], out=o),  # flip takes no out=
    lambda x, o: torch.where(x > 0, x, 0.0, out=o),  # where's out= overload wants a tensor `other`
    lambda x, o: torch.cat([x, x], out=x),  # out= overlapping an input
], ids=["flip_no_out", "where_number_other", "cat_into_input"])
def test_out_that_eager_refuses_raises_eager_type(fn):
    x, o = _randn(4), torch.empty(4)
    with pytest.raises(Exception) as eager:
        fn(x.clone(), o.clone())
    with pytest.raises(type(eager.value)) as got:
        minijit.jit(fn)(x.clone(), o.clone())
    assert isinstance(got.value, MinijitError)
