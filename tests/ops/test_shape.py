"""Shape, view and layout ops against eager torch, decomposed into prims and at the ltorch level."""

from __future__ import annotations

import warnings

import pytest
import torch

import minijit
from minijit.errors import MetaError, UnsupportedOpError
from minijit.ops import ltorch
from tests.ops.eager_check import DTYPES, check_against_eager, make, tt
from tests.oputil import trace_call

# (id, fn, input shapes): fn takes one tensor per shape.
CASES = [
    ("reshape_varargs", lambda x: x.reshape(2, -1), [(2, 3, 4)]),
    ("reshape_tuple", lambda x: tt.reshape(x, (-1, 4)), [(2, 3, 4)]),
    ("reshape_same", lambda x: x.reshape(x.shape), [(2, 3)]),
    ("reshape_to_0d", lambda x: x.reshape(()), [(1, 1)]),
    ("reshape_empty", lambda x: x.reshape(0, 5), [(2, 0, 5)]),
    ("view_varargs", lambda x: x.view(2, -1), [(2, 3, 4)]),
    ("view_tuple", lambda x: x.view((2, -1, 2)), [(2, 3, 4)]),
    ("view_as", lambda x, y: x.view_as(y), [(2, 6), (3, 4)]),
    ("view_after_contiguous", lambda x: x.transpose(0, 1).contiguous().view(-1, 2), [(2, 3, 2)]),
    ("view_as_after_contiguous", lambda x, y: x.t().contiguous().view_as(y), [(2, 6), (3, 4)]),
    ("reshape_as", lambda x, y: x.reshape_as(y), [(2, 6), (4, 3)]),
    ("flatten", lambda x: x.flatten(), [(2, 3, 4)]),
    ("flatten_range", lambda x: tt.flatten(x, 1, -2), [(2, 3, 4, 5)]),
    ("flatten_0d", lambda x: x.flatten(), [()]),
    ("ravel", lambda x: tt.ravel(x), [(2, 3)]),
    ("unflatten", lambda x: x.unflatten(1, (2, -1)), [(3, 6)]),
    ("squeeze_all", lambda x: x.squeeze(), [(1, 3, 1, 2)]),
    ("squeeze_dim", lambda x: tt.squeeze(x, -2), [(1, 3, 1, 2)]),
    ("squeeze_non1", lambda x: x.squeeze(1), [(1, 3, 1, 2)]),
    ("squeeze_dims", lambda x: tt.squeeze(x, (0, 1, 2)), [(1, 3, 1, 2)]),
    ("unsqueeze", lambda x: x.unsqueeze(1), [(2, 3)]),
    ("unsqueeze_neg", lambda x: tt.unsqueeze(x, -1), [(2, 3)]),
    ("unsqueeze_0d", lambda x: x.unsqueeze(0), [()]),
    ("expand", lambda x: x.expand(2, -1, 4), [(3, 1)]),
    ("expand_tuple", lambda x: x.expand((3, 4)), [(1, 4)]),
    ("expand_as", lambda x, y: x.expand_as(y), [(1, 3), (2, 3)]),
    ("broadcast_to", lambda x: tt.broadcast_to(x, (2, 3, 4)), [(3, 1)]),
    ("permute", lambda x: x.permute(2, 0, 1), [(2, 3, 4)]),
    ("permute_seq", lambda x: tt.permute(x, (1, 0, -1)), [(2, 3, 4)]),
    ("transpose", lambda x: x.transpose(0, -1), [(2, 3, 4)]),
    ("swapdims", lambda x: tt.swapdims(x, 0, 1), [(2, 3)]),
    ("t", lambda x: x.t(), [(2, 3)]),
    ("t_1d", lambda x: tt.t(x), [(3,)]),
    ("T", lambda x: x.T, [(2, 3)]),
    ("mT", lambda x: x.mT, [(4, 2, 3)]),
    ("movedim", lambda x: x.movedim(0, -1), [(2, 3, 4)]),
    ("movedim_seq", lambda x: tt.movedim(x, (0, 1), (2, 0)), [(2, 3, 4)]),
    ("contiguous", lambda x: x.t().contiguous(), [(2, 3)]),
    ("clone", lambda x: tt.clone(x), [(2, 3)]),
    ("detach", lambda x: x.detach(), [(2, 3)]),
    ("data", lambda x: x.data, [(2, 3)]),
    ("narrow", lambda x: x.narrow(1, 1, 2), [(2, 4)]),
    ("narrow_neg", lambda x: tt.narrow(x, 0, -2, 2), [(3, 4)]),
    ("select", lambda x: x.select(1, -1), [(2, 3, 4)]),
    ("unbind", lambda x: x.unbind(1), [(2, 3)]),
    ("split_int", lambda x: x.split(2), [(5, 3)]),
    ("split_list", lambda x: tt.split(x, [1, 0, 2], dim=1), [(2, 3)]),
    ("split_big", lambda x: x.split(10), [(4,)]),
    ("chunk", lambda x: x.chunk(3), [(5, 2)]),
    ("chunk_fewer", lambda x: tt.chunk(x, 4, 1), [(2, 6)]),
    ("chunk_empty", lambda x: x.chunk(2), [(0, 2)]),
    ("tensor_split_int", lambda x: x.tensor_split(3), [(7,)]),
    ("tensor_split_list", lambda x: tt.tensor_split(x, [1, 5, 3, 9], dim=0), [(7, 2)]),
    ("cat", lambda x, y: tt.cat([x, y], 1), [(2, 3), (2, 1)]),
    ("cat_neg_dim", lambda x, y: tt.cat((x, y, x), -1), [(2, 3), (2, 2)]),
    ("concat", lambda x, y: tt.concat([x, y]), [(2, 3), (1, 3)]),
    ("concatenate", lambda x, y: tt.concatenate([x, y]), [(2, 3), (1, 3)]),
    ("cat_legacy_empty", lambda x, y: tt.cat([x, y]), [(2, 3), (0,)]),
    ("stack", lambda x, y: tt.stack([x, y]), [(2, 3), (2, 3)]),
    ("stack_last", lambda x, y: tt.stack((x, y), dim=-1), [(2, 3), (2, 3)]),
    ("hstack", lambda x, y: tt.hstack([x, y]), [(2, 3), (2, 1)]),
    ("hstack_1d", lambda x, y: tt.hstack([x, y]), [(2,), (3,)]),
    ("vstack", lambda x, y: tt.vstack([x, y]), [(3,), (2, 3)]),
    ("flip", lambda x: x.flip(0), [(3, 4)]),
    ("flip_dims", lambda x: tt.flip(x, (0, -1)), [(3, 4, 2)]),
    ("flip_varargs", lambda x: x.flip(0, 1), [(3, 4)]),
    ("flip_none", lambda x: tt.flip(x, []), [(3,)]),
    ("fliplr", lambda x: tt.fliplr(x), [(3, 4)]),
    ("flipud", lambda x: tt.flipud(x), [(3, 4)]),
    ("roll", lambda x: x.roll(1, 0), [(4, 3)]),
    ("roll_multi", lambda x: tt.roll(x, (-1, 5), (0, 1)), [(4, 3)]),
    ("roll_flat", lambda x: tt.roll(x, 2), [(2, 3)]),
    ("roll_zero", lambda x: tt.roll(x, 3, 1), [(2, 3)]),
    ("repeat", lambda x: x.repeat(2, 3), [(2, 3)]),
    ("repeat_new_dims", lambda x: x.repeat(2, 1, 3), [(3,)]),
    ("repeat_ones", lambda x: x.repeat(1, 1), [(3,)]),
    ("repeat_zero", lambda x: x.repeat(0, 2), [(2, 3)]),
    ("tile", lambda x: tt.tile(x, (2,)), [(2, 3)]),
    ("tile_more", lambda x: x.tile(2, 1, 2), [(2, 3)]),
    ("tril", lambda x: x.tril(), [(3, 4)]),
    ("tril_offset", lambda x: tt.tril(x, -1), [(2, 4, 3)]),
    ("triu", lambda x: tt.triu(x), [(4, 3)]),
    ("triu_offset", lambda x: x.triu(2), [(3, 5)]),
    ("diagonal", lambda x: x.diagonal(), [(3, 4)]),
    ("diagonal_offset", lambda x: tt.diagonal(x, 1), [(3, 4)]),
    ("diagonal_neg_offset", lambda x: tt.diagonal(x, -2, 0, 2), [(4, 2, 3)]),
    ("diagonal_dims", lambda x: x.diagonal(0, -1, 0), [(3, 2, 4)]),
    ("diagonal_empty", lambda x: x.diagonal(5), [(3, 4)]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("fn", "shapes"), [pytest.param(fn, shapes, id=name) for name, fn, shapes in CASES])
def test_shape_op_matches_eager(fn, shapes, dtype):
    args = [make(s, dtype, seed=i) for i, s in enumerate(shapes)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # x.T on n-d tensors
        check_against_eager(fn, *args)


@pytest.mark.parametrize(("fn", "shapes"), [
    pytest.param(lambda x, y: tt.cat([x, y]), [(2, 3), (1, 3)], id="cat"),
    pytest.param(lambda x, y: tt.stack([x, y], 1), [(2, 3), (2, 3)], id="stack"),
])
@pytest.mark.parametrize(("dtype_a", "dtype_b"), [(torch.int64, torch.float32), (torch.bool, torch.int64),
                                                  (torch.bfloat16, torch.float64)])
def test_join_promotes_like_eager(fn, shapes, dtype_a, dtype_b):
    check_against_eager(fn, make(shapes[0], dtype_a), make(shapes[1], dtype_b, seed=1))


def test_detach_output_does_not_require_grad():
    trace = trace_call(lambda x: (x.detach(), x.data), torch.ones(2, requires_grad=True))
    assert trace.args[0].requires_grad
    assert [t.requires_grad for t in trace.output] == [False, False]


def test_no_op_views_record_nothing():
    trace = trace_call(lambda x: x.contiguous().reshape(2, 3).view(-1, 3).squeeze(1).permute(0, 1), torch.ones(2, 3))
    assert trace.bound_symbols == []
    assert trace.output is trace.args[0]


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: x.clone(), id="clone"),
    pytest.param(lambda x: x.repeat(1, 1), id="repeat"),
    pytest.param(lambda x: x.flip([]), id="flip"),
    pytest.param(lambda x: x.roll(0, 0), id="roll"),
])
def test_copying_ops_never_return_their_input(fn):
    trace = trace_call(fn, torch.ones(2, 3))
    assert trace.output is not trace.args[0]
    check_against_eager(lambda x: fn(x).add_(1), torch.ones(2, 3))


def test_view_ops_declare_the_view_effect():
    for name in ("reshape", "view", "transpose", "permute", "squeeze", "unsqueeze", "expand", "split", "getitem",
                 "narrow", "select", "unbind", "detach", "diagonal", "movedim", "T", "mT"):
        assert ltorch.__dict__[name].effects.views == 0, name
    for name in ("cat", "stack", "clone", "flip", "roll", "repeat", "tril"):
        assert ltorch.__dict__[name].effects.views is None, name


@pytest.mark.parametrize(("fn", "shape", "error", "match"), [
    pytest.param(lambda x: x.reshape(4, -1), (2, 3), MetaError, "invalid for input of size 6", id="reshape_bad"),
    pytest.param(lambda x: x.view(-1, -1), (2, 3), MetaError, "only one dimension can be inferred", id="view_two_minus1"),
    pytest.param(lambda x: x.view(5), (2, 3), MetaError, "ltorch.view", id="view_bad"),
    pytest.param(lambda x: x.expand(3, 4), (2, 4), MetaError, "ltorch.expand", id="expand_bad"),
    pytest.param(lambda x: x.expand(-1, 4), (4,), MetaError, "new leading dim", id="expand_new_minus1"),
    pytest.param(lambda x: x.split([1, 1]), (3,), MetaError, "sum to", id="split_bad"),
    pytest.param(lambda x: x.narrow(0, 2, 3), (3,), MetaError, "ltorch.narrow", id="narrow_bad"),
    pytest.param(lambda x: x.select(0, 3), (3,), MetaError, "out of bounds", id="select_bad"),
    pytest.param(lambda x: tt.cat([x, x.t()]), (2, 3), MetaError, "must match", id="cat_bad"),
    pytest.param(lambda x: x.repeat(2), (2, 3), MetaError, "ltorch.repeat", id="repeat_bad"),
    pytest.param(lambda x: x.tril(), (3,), MetaError, "ltorch.tril", id="tril_1d"),
    pytest.param(lambda x: x.permute(0, 0), (2, 2), MetaError, "permutation", id="permute_bad"),
])
def test_errors_like_eager(fn, shape, error, match):
    x = make(shape)
    if error is not UnsupportedOpError:
        with pytest.raises(Exception):  # eager refuses it too
            fn(x.clone())
    with pytest.raises(error, match=match):
        trace_call(fn, x)


def reads_a_dtype_view(x):
    v = x.view(torch.int32)
    x.mul_(2)  # v sees the new bits, as in eager
    return v + 1


def writes_through_a_dtype_view(x):
    x.view(torch.int32).add_(1)
    return x


def test_view_as_another_dtype_matches_eager_and_refuses_writes_through_it():
    # `view(dtype)` is an opaque torch op (ltorch has no bit reinterpretation), a view like any other.
    x = make((2, 3))
    torch.testing.assert_close(minijit.jit(reads_a_dtype_view)(x.clone()), reads_a_dtype_view(x.clone()),
                               rtol=0, atol=0)
    with pytest.raises(UnsupportedOpError, match="reinterprets the base's memory"):
        minijit.jit(writes_through_a_dtype_view)(x.clone())


def _assign_rows(x):
    x[1:, 0] = 5.0
    return x


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: x.reshape(-1), id="reshape"),
    pytest.param(lambda x: x.view(x.shape[0], -1).t(), id="view"),
    pytest.param(lambda x: x[1:, None, ::2], id="getitem_slices"),
    pytest.param(lambda x: x[-1].unsqueeze(0).expand(2, -1), id="getitem_int"),
    pytest.param(lambda x: x.flip(0).tril().narrow(1, 1, 2), id="flip_tril_narrow"),
    pytest.param(lambda x: x.repeat(2, 1).flatten(), id="repeat"),
    pytest.param(_assign_rows, id="setitem"),
])
def test_symbolic_sizes_reuse_one_trace(fn):
    jf = minijit.jit(fn, cache="symbolic values")
    for shape in [(4, 6), (6, 8), (5, 7)]:
        x = torch.arange(float(shape[0] * shape[1])).reshape(shape)
        torch.testing.assert_close(jf(x.clone()), fn(x.clone()), rtol=0, atol=0)
    assert minijit.cache_info(jf).misses == 1


def test_broadcast_shapes_of_symbolic_sizes_matches_eager() -> None:
    """torch.broadcast_shapes of shapes with symbolic sizes (torch's own, run on the proxies, raised 'unexpected
    keyword argument device'; under "automatic" the function then stayed constant): eager's sizes, and eager's
    RuntimeError, which the user's `except` catches, where they do not broadcast."""
    def f(x, y):
        try:
            shape = torch.broadcast_shapes(x.shape, y.shape, (1,))
        except RuntimeError:
            return x.sum()
        return x.expand(shape) + y

    jitted = minijit.jit(f, cache="symbolic values")
    for a, b in (((1, 3), (2, 3)), ((2, 3), (3, 3)), ((4, 3), (1, 3)), ((1, 3), (4, 3))):
        x, y = torch.randn(a), torch.randn(b)
        torch.testing.assert_close(jitted(x, y), f(x, y))
