"""`x[key]` and the index ops (index_select, gather, masked_fill, scatter_add, ...) against eager torch."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import MetaError, UnsupportedOpError
from tests.ops.eager_check import DTYPES, check_against_eager, make, tt
from tests.oputil import trace_call

S = slice(None)
# Index tensors used by the keys: i (a vector with a negative entry), j (a 2-d index), z (0-d).
I_VALUES, J_VALUES, Z_VALUE = [0, -1, 2, 1], [[1, 0], [-2, 2]], 1

# (id, key built from the index tensors), applied to a tensor of shape (3, 4, 5).
KEYS = [
    ("int", lambda i, j, z: 1),
    ("neg_int", lambda i, j, z: -1),
    ("int_int", lambda i, j, z: (2, -4)),
    ("all_ints", lambda i, j, z: (0, 1, 2)),
    ("slice", lambda i, j, z: slice(1, 3)),
    ("slice_step", lambda i, j, z: (S, slice(None, None, 2))),
    ("slice_neg_bounds", lambda i, j, z: (slice(-2, None), slice(-100, -1, 3))),
    ("slice_out_of_range", lambda i, j, z: (slice(1, 100), slice(7, 9))),
    ("slice_empty", lambda i, j, z: slice(2, 1)),
    ("none", lambda i, j, z: None),
    ("none_mid", lambda i, j, z: (S, None, 1)),
    ("nones", lambda i, j, z: (None, 0, None, S, None)),
    ("ellipsis", lambda i, j, z: ...),
    ("ellipsis_int", lambda i, j, z: (..., 1)),
    ("int_ellipsis", lambda i, j, z: (0, ..., None)),
    ("empty_tuple", lambda i, j, z: ()),
    ("true", lambda i, j, z: (True, 1)),
    ("false", lambda i, j, z: False),
    ("tensor", lambda i, j, z: i),
    ("tensor_dim1", lambda i, j, z: (S, i)),
    ("tensor_2d", lambda i, j, z: (S, S, j)),
    ("tensor_0d", lambda i, j, z: (S, z)),
    ("tensor_with_slice", lambda i, j, z: (slice(0, 2), i, slice(1, 4))),
    ("two_tensors_adjacent", lambda i, j, z: (S, j, j)),
    ("two_tensors_first", lambda i, j, z: (j, i[:2, None])),
    ("two_tensors_apart", lambda i, j, z: (j, S, j)),
    ("tensors_around_int", lambda i, j, z: (i[:2], 0, i[:2])),
    ("tensors_around_none", lambda i, j, z: (i[:3], None, i[:3])),
    ("tensors_ellipsis", lambda i, j, z: (j, ..., i[:2, None])),
    ("three_tensors", lambda i, j, z: (i[:3], z, i[1:])),
    ("list", lambda i, j, z: [0, 2]),
    ("list_unordered", lambda i, j, z: (S, [3, 0, 3])),
    ("list_in_tuple", lambda i, j, z: ([2, 1], S, [-1, 0])),
]


def _index_tensors(dtype=torch.int64):
    return torch.tensor(I_VALUES, dtype=dtype), torch.tensor(J_VALUES, dtype=dtype), torch.tensor(Z_VALUE, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("key", [pytest.param(k, id=name) for name, k in KEYS])
def test_getitem_matches_eager(key, dtype):
    x = make((3, 4, 5), dtype)
    check_against_eager(lambda x, i, j, z: x[key(i, j, z)], x, *_index_tensors())


def test_getitem_int32_index_and_0d_tensor():
    check_against_eager(lambda x, i, j, z: x[:, j, i[2:]], make((3, 4, 5)), *_index_tensors(torch.int32))
    check_against_eager(lambda x: x[...], make(()))
    check_against_eager(lambda x: x[None, ..., None], make(()))


@pytest.mark.parametrize(("key", "symbol"), [
    pytest.param(lambda i: (slice(1), None, ..., -1), "getitem", id="basic"),
    pytest.param(lambda i: (0, i), "index", id="tensor"),
    pytest.param(lambda i: (i[0], None), "getitem", id="tensor_0d"),
    pytest.param(lambda i: [1, 0], "index", id="list"),
])
def test_basic_keys_are_views_and_advanced_keys_copies(key, symbol):
    trace = trace_call(lambda x, i: x[key(i)], make((3, 4)), torch.tensor([1]))
    bsym = trace.bound_symbols[-1]
    assert bsym.sym.name == symbol
    assert (bsym.sym.effects.views is not None) == (symbol == "getitem")


def test_getitem_of_basic_key_is_a_view_proxy():
    trace = trace_call(lambda x: x[:, 1:3, None], torch.ones(2, 4))
    assert [b.sym.name for b in trace.bound_symbols] == ["getitem"]
    assert [b.sym.name for b in trace.bound_symbols[0].subsymbols] == ["slice", "reshape"]


@pytest.mark.parametrize(("key", "error", "match"), [
    pytest.param(lambda x, m: x[m], UnsupportedOpError, "torch.where", id="bool_mask"),
    pytest.param(lambda x, m: x[m[0]], UnsupportedOpError, "torch.where", id="bool_mask_1d"),
    pytest.param(lambda x, m: x[m.ne(m)], UnsupportedOpError, "boolean mask", id="computed_mask"),
    pytest.param(lambda x, m: x[0, m[0]], UnsupportedOpError, "boolean mask", id="mask_in_tuple"),
    pytest.param(lambda x, m: x[[True, False, True]], UnsupportedOpError, "boolean mask", id="bool_list"),
    pytest.param(lambda x, m: x[3], MetaError, "out of bounds", id="int_out_of_range"),
    pytest.param(lambda x, m: x[0, 0, 0], MetaError, "too many indices", id="too_many"),
    pytest.param(lambda x, m: x[::-1], MetaError, "step", id="negative_step"),
    pytest.param(lambda x, m: x[x], MetaError, "integer or bool", id="float_index"),
])
def test_getitem_errors(key, error, match):
    x, m = make((3, 4)), make((3, 4), torch.bool)
    with pytest.raises(error, match=match):
        trace_call(key, x, m)


def test_getitem_uint8_mask_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="boolean mask"):
        trace_call(lambda x, m: x[m], make((3,)), torch.tensor([1, 0, 1], dtype=torch.uint8))


def _idx(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


# (id, fn, args builder(dtype), dtypes, exact)
ALL = DTYPES
NUMERIC = (torch.float32, torch.float64, torch.bfloat16, torch.int64)
INDEX_OPS = [
    ("index_select", lambda x, i: tt.index_select(x, 1, i), lambda d: (make((3, 4), d), _idx([3, 0, 0])), ALL),
    ("index_select_method_0d", lambda x, i: x.index_select(-1, i), lambda d: (make((3, 4), d), _idx(2)), ALL),
    ("index_select_int32", lambda x, i: x.index_select(0, i), lambda d: (make((3, 4), d), _idx([2, 1], torch.int32)), ALL),
    ("take", lambda x, i: tt.take(x, i), lambda d: (make((3, 4), d), _idx([[0, -1], [5, 11]])), ALL),
    ("gather", lambda x, i: tt.gather(x, 1, i), lambda d: (make((3, 4), d), _idx([[0, 3], [1, 1], [2, 0]])), ALL),
    ("gather_smaller", lambda x, i: x.gather(0, i), lambda d: (make((3, 4), d), _idx([[2, 0, 1]])), ALL),
    ("take_along_dim", lambda x, i: tt.take_along_dim(x, i, 1), lambda d: (make((3, 4), d), _idx([[0], [3], [1]])), ALL),
    ("take_along_dim_bcast", lambda x, i: x.take_along_dim(i, dim=0),
     lambda d: (make((3, 1, 4), d), _idx([[[0, 2]], [[1, 1]]]).transpose(1, 2)), ALL),
    ("take_along_dim_flat", lambda x, i: tt.take_along_dim(x, i), lambda d: (make((3, 4), d), _idx([11, 0, 5])), ALL),
    ("masked_fill", lambda x, m: tt.masked_fill(x, m, 1), lambda d: (make((3, 4), d), make((3, 4), torch.bool, 1)), ALL),
    ("masked_fill_float_value", lambda x, m: x.masked_fill(m, 2.5), lambda d: (make((3, 4), d), make((4,), torch.bool, 1)),
     ALL),
    ("masked_fill_bcast_input", lambda x, m: tt.masked_fill(x, m, -1), lambda d: (make((4,), d), make((3, 4), torch.bool)),
     NUMERIC),
    ("masked_fill_tensor_value", lambda x, m, v: x.masked_fill(m, v),
     lambda d: (make((3, 4), d), make((3, 1), torch.bool, 1), make((), torch.float64, 2)), ALL),
    ("scatter_add", lambda x, i, s: tt.scatter_add(x, 0, i, s),
     lambda d: (make((3, 4), d), _idx([[0, 1, 2, 0], [2, 2, 0, 1]]), make((2, 4), d, 1)), NUMERIC),
    ("scatter_add_small", lambda x, i, s: x.scatter_add(1, i, s),
     lambda d: (make((3, 4), d), _idx([[3], [0]]), make((2, 3), d, 1)), NUMERIC),
    ("index_add", lambda x, i, s: tt.index_add(x, 1, i, s),
     lambda d: (make((3, 4), d), _idx([3, 0]), make((3, 2), d, 1)), NUMERIC),
    ("index_add_alpha", lambda x, i, s: x.index_add(0, i, s, alpha=2),
     lambda d: (make((3, 4), d), _idx([2, 0]), make((2, 4), d, 1)), NUMERIC),
    ("index_copy", lambda x, i, s: tt.index_copy(x, 0, i, s),
     lambda d: (make((3, 4), d), _idx([2, 0]), make((2, 4), d, 1)), ALL),
    ("index_copy_method", lambda x, i, s: x.index_copy(-1, i, s),
     lambda d: (make((3, 4), d), _idx([1, 3, 0]), make((3, 3), d, 1)), ALL),
    ("scatter", lambda x, i, s: tt.scatter(x, 0, i, s),
     lambda d: (make((3, 4), d), _idx([[0, 2, 1], [2, 0, 0]]), make((2, 4), d, 1)), ALL),
    ("scatter_value", lambda x, i: x.scatter(1, i, 2), lambda d: (make((3, 4), d), _idx([[3, 0], [1, 2]])), ALL),
    ("scatter_value_kw", lambda x, i: tt.scatter(x, -1, i, value=-1), lambda d: (make((2, 4), d), _idx([[3], [1]])), ALL),
    ("index_put", lambda x, i, j, v: tt.index_put(x, (i, j), v),
     lambda d: (make((3, 4), d), _idx([0, 2, -1]), _idx([1, 1, 3]), make((3,), d, 1)), ALL),
    ("index_put_accumulate", lambda x, i, v: x.index_put((i,), v, accumulate=True),
     lambda d: (make((3, 4), d), _idx([0, 2, 0]), make((4,), d, 1)), NUMERIC),
    ("index_put_mask", lambda x, m, v: x.index_put((m,), v), lambda d: (make((3, 4), d), make((3, 4), torch.bool, 1),
                                                                        make((), d, 2)), ALL),
    ("index_put_mask_accumulate", lambda x, m, v: x.index_put((m,), v, True),
     lambda d: (make((3, 4), d), make((3,), torch.bool, 1), make((4,), d, 2)), NUMERIC),
    ("index_fill", lambda x, i: tt.index_fill(x, 1, i, 3), lambda d: (make((3, 4), d), _idx([1, -1])), ALL),
    ("index_fill_tensor", lambda x, i, v: x.index_fill(0, i, v),
     lambda d: (make((3, 4), d), _idx([2]), make((), d, 3)), ALL),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("fn", "make_args", "dtypes"), [pytest.param(fn, a, ds, id=n) for n, fn, a, ds in INDEX_OPS])
def test_index_op_matches_eager(fn, make_args, dtypes, dtype):
    if dtype not in dtypes:
        pytest.skip(f"eager torch does not support {dtype} here")
    check_against_eager(fn, *make_args(dtype))


@pytest.mark.parametrize(("fn", "args", "match"), [
    pytest.param(lambda x, i, s: x.index_copy(0, i, s), (make((3, 4)), _idx([0]), make((1, 4), torch.float64)),
                 "same dtype", id="index_copy_dtype"),
    pytest.param(lambda x, i, s: x.index_add(0, i, s), (make((3, 4)), _idx([0]), make((1, 3))), "source of shape",
                 id="index_add_shape"),
    pytest.param(lambda x, m: x.masked_fill(m, 0), (make((3, 4)), make((3, 4), torch.int64)), "boolean masks",
                 id="masked_fill_int_mask"),
    pytest.param(lambda x, m: x.masked_fill(m, m), (make((3,)), make((3,), torch.bool)), "0-dimensional",
                 id="masked_fill_value_dims"),
    pytest.param(lambda x, i: x.gather(0, i), (make((3, 4)), _idx([0, 1])), "same number of dims", id="gather_ndim"),
    pytest.param(lambda x, i: x.gather(0, i), (make((3, 4)), _idx([[0, 1, 0, 0, 0]])), "exceeds", id="gather_size"),
    pytest.param(lambda x, i, v: x.index_put((i,), v), (make((3, 4)), _idx([0]), make((4,), torch.float64)),
                 "dtypes match", id="index_put_dtype"),
    pytest.param(lambda x, i, s: x.scatter(0, i, s), (make((3, 4)), _idx([[0]]), make((1, 1), torch.float64)),
                 "dtype", id="scatter_dtype"),
    pytest.param(lambda x, i, s: x.scatter_add(0, i, s), (make((3, 4)), _idx([[0]]), make((1, 1), torch.float64)),
                 "dtype", id="scatter_add_dtype"),
])
def test_index_op_errors_like_eager(fn, args, match):
    with pytest.raises(Exception):  # eager refuses it too
        fn(*args)
    with pytest.raises(MetaError, match=match):
        trace_call(fn, *args)


class _Tensor:
    """A placeholder in a random key for the k-th index tensor argument."""

    def __init__(self, k):
        self.k = k


def _random_key(rng, shape):
    """A random key for a tensor of `shape`, and the index tensors it uses."""
    tensors, items, dim, ellipsis = [], [], 0, False
    for _ in range(rng.randint(0, len(shape) + 1)):
        size = shape[dim] if dim < len(shape) else 1
        r = rng.random()
        if r < 0.25:
            item = rng.randint(-size, size - 1)
        elif r < 0.55:
            item = slice(rng.choice([None, rng.randint(-size - 2, size + 2)]),
                         rng.choice([None, rng.randint(-size - 2, size + 2)]), rng.choice([None, 1, 2, 3]))
        elif r < 0.62:
            item = None
        elif r < 0.68 and not ellipsis:
            item, ellipsis = ..., True
        else:
            tensors.append(torch.randint(-size, size, rng.choice([(2,), (3,), (1,), (2, 1), ()]),
                                         generator=torch.Generator().manual_seed(rng.randint(0, 1000))))
            item = _Tensor(len(tensors) - 1)
        items.append(item)
        dim += item is not None and item is not ...
    return items, tensors


def _key(items, tensors):
    return tuple(tensors[it.k] if isinstance(it, _Tensor) else it for it in items)


def _assign_key(items):
    def fn(x, v, *tensors):
        x[_key(items, tensors)] = v
        return x
    return fn


def test_random_keys_match_eager():
    import random

    rng = random.Random(0)
    checked = 0
    while checked < 60:
        shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 4)))
        x = make(shape)
        items, tensors = _random_key(rng, shape)
        try:
            result = x[_key(items, tensors)]
        except IndexError:
            continue  # eager refuses the key (an index out of range)
        checked += 1
        check_against_eager(lambda x, *ts: x[_key(items, ts)], x, *tensors)
        positions = torch.arange(x.numel()).reshape(shape)[_key(items, tensors)]
        if positions.unique().numel() == positions.numel():  # repeated positions: eager is order-dependent
            check_against_eager(_assign_key(items), x, make(tuple(result.shape), seed=1), *tensors)


def test_list_index_holding_a_symbolic_int_matches_eager() -> None:
    """`x[[0, n]]` with n a symbolic number (an argument that changed): the list becomes an index tensor whose
    element is computed at run time (torch.tensor of the list saw the proxy and the call ran eagerly), with eager's
    values, negative indices and IndexError out of range, and the writes `x[[n]] = v` too."""
    def f(x, n):
        y = x.clone()
        y[[n, 1]] += 10
        return x[[0, n]], x[..., [n, 1, n]], y

    jitted = minijit.jit(f, cache="symbolic values")
    x = torch.arange(20.0).reshape(4, 5)
    for n in (2, 3, -1, -4):
        for actual, expected in zip(jitted(x, n), f(x, n), strict=True):
            torch.testing.assert_close(actual, expected)
    for n in (4, -5):
        with pytest.raises(IndexError):
            jitted(x, n)
    info = jitted.cache_info()
    assert info.misses == 1 and info.eager_calls == 0, info


def test_a_float_slice_bound_raises_eagers_type_error() -> None:
    """`x[:n]` with n a float (plain, or a number made symbolic that is a float on a later call): eager's TypeError,
    which the user's `except TypeError` catches, not a MinijitError of minijit's limitations."""
    def f(x, n):
        try:
            return x[:n]
        except TypeError:
            return x * 2

    jitted = minijit.jit(f)
    x = torch.arange(4.0)
    for n in (2, 3, 2.5, 1, 1.0):
        torch.testing.assert_close(jitted(x, n), f(x, n))
