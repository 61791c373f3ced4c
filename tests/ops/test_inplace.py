"""In-place ops and `x[key] = value` against eager torch: results and the values left in the mutated inputs."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import MetaError, UnsupportedOpError
from minijit.ops import prims
from minijit.ops.ltorch.inplace import METADATA_INPLACE
from minijit.ops.registry import ALL_LTORCH
from tests.ops.eager_check import DTYPES, check_against_eager, make
from tests.ops.test_indexing import KEYS, _index_tensors
from tests.oputil import trace_call

# Keys whose index tensors repeat a position: assigning different values there is order-dependent in eager.
_REPEATS = {"list_unordered"}


def _setitem(key, value_of):
    def fn(x, i, j, z, v):
        x[key(i, j, z)] = value_of(v)
        return x
    return fn


def _assign(x, key, value):
    x[key] = value
    return x


def _value(kind, result_shape, dtype):
    if kind == "scalar":
        return 2.5 if dtype.is_floating_point else True if dtype == torch.bool else 3
    if kind == "full":
        return make(tuple(result_shape), dtype, seed=5)
    if kind == "broadcast":  # the last dim only, with an extra leading size-1 dim torch strips
        return make((1, 1, *result_shape[-1:]), dtype, seed=6)
    return make((), torch.float64, seed=7)  # "0d_other_dtype": cast like copy_


def _eager_refuses(key, x, idx, value):
    try:
        _setitem(key, lambda v: v)(x.clone(), *idx, value)
    except RuntimeError:
        return True
    return False


@pytest.mark.parametrize("kind", ["scalar", "full", "broadcast", "0d_other_dtype"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("key", [pytest.param(k, id=name) for name, k in KEYS])
def test_setitem_matches_eager(key, dtype, kind, request):
    if kind != "scalar" and request.node.callspec.id.split("-")[0] in _REPEATS:
        pytest.skip("repeated index positions: eager's result is order-dependent")
    x = make((3, 4, 5), dtype)
    idx = _index_tensors()
    value = _value(kind, x[key(*idx)].shape, dtype)
    if kind == "0d_other_dtype" and _eager_refuses(key, x, idx, value):
        with pytest.raises(MetaError, match="setitem: index put requires the source and destination dtypes match"):
            trace_call(_setitem(key, lambda v: v), x, *idx, value)
        return
    if isinstance(value, torch.Tensor):
        check_against_eager(_setitem(key, lambda v: v), x, *idx, value)
    else:
        check_against_eager(_setitem(key, lambda v: value), x, *idx, torch.zeros(()))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("key", [pytest.param(k, id=n) for n, k in KEYS if n in ("int", "slice_step", "none_mid",
                                                                                 "ellipsis_int", "two_tensors_apart")])
def test_setitem_dtypes(key, dtype):
    x = make((3, 4, 5), dtype)
    idx = _index_tensors()
    check_against_eager(_setitem(key, lambda v: v), x, *idx, make(tuple(x[key(*idx)].shape), dtype, seed=3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("fn", "value_shape"), [
    pytest.param(lambda x, m, v: _assign(x, m, 0), (), id="scalar"),
    pytest.param(lambda x, m, v: _assign(x, m, v), (), id="0d"),
    pytest.param(lambda x, m, v: _assign(x, (m[:, 1],), v), (4,), id="rows_in_tuple"),
    pytest.param(lambda x, m, v: _assign(x, m[:, 0], v), (1, 4), id="prefix_mask"),
    pytest.param(lambda x, m, v: _assign(x, m[:, 0], v), (1, 1, 1), id="prefix_mask_leading_ones"),
])
def test_setitem_bool_mask_matches_eager(fn, value_shape, dtype):
    check_against_eager(fn, make((3, 4), dtype), make((3, 4), torch.bool, seed=1), make(value_shape, dtype, seed=2))


def test_setitem_mask_with_values_tensor_runs_like_eager():
    # x[mask] = values: the number of values depends on the mask's data, so ltorch declines; the
    # call runs as one opaque torch op, and so gives eager's values, or eager's error.
    fn = lambda x, m, v: _assign(x, m, v)
    x, m = make((3,)), torch.tensor([True, False, True])
    check = minijit.jit(fn)
    torch.testing.assert_close(check(x.clone(), m, make((2,), seed=1)), fn(x.clone(), m, make((2,), seed=1)))
    with pytest.raises(RuntimeError, match="shape mismatch") as eager:
        fn(x.clone(), m, make((3,)))
    with pytest.raises(RuntimeError, match="shape mismatch") as jitted:
        check(x.clone(), m, make((3,)))
    assert str(jitted.value) == str(eager.value)


def test_setitem_uint8_mask_is_refused_like_eager():
    fn = lambda x, m: _assign(x, m, -1.0)
    x, m = make((3,)), torch.tensor([1, 0, 1], dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="boolean masks"):
        fn(x.clone(), m)
    with pytest.raises(MetaError, match="setitem: only supports boolean masks"):
        trace_call(fn, x, m)


def test_setitem_is_one_inplace_symbol():
    def fn(x, v):
        x[1:, None, 0] = v
        return x

    trace = trace_call(fn, make((3, 4)), make((2, 1)))
    (bsym,) = trace.bound_symbols
    assert bsym.sym.name == "setitem" and bsym.written() == [trace.args[0]]
    assert bsym.output is trace.args[0]
    assert [s.sym.name for s in bsym.subsymbols].count("copy_") == 1
    assert bsym.subsymbols[-1].sym is prims.copy_


@pytest.mark.parametrize(("key", "one_dim"), [
    pytest.param(lambda i: (slice(None), None, 2), True, id="int"),
    pytest.param(lambda i: (..., slice(1, None, 2)), True, id="slice"),
    pytest.param(lambda i: (slice(None), i), True, id="tensor"),
    pytest.param(lambda i: (0, slice(1, 3)), False, id="two_dims"),
])
def test_setitem_on_one_dim_is_one_index_copy(key, one_dim):
    def fn(x, i, v):
        x[key(i)] = v
        return x

    x, i, v = make((3, 4)), torch.tensor([3, 0]), make((1,))
    trace = trace_call(fn, x, i, v)
    (bsym,) = trace.bound_symbols
    (index_copy,) = [s for s in bsym.subsymbols if s.sym is prims.index_copy]
    assert (index_copy.args[0] is trace.args[0]) == one_dim  # along the dim of x, not into x flattened
    check_against_eager(fn, x, i, v)


@pytest.mark.parametrize("key", [
    pytest.param(lambda i: slice(1, 3), id="slice"),
    pytest.param(lambda i: (0, slice(None, None, 2)), id="int_slice"),
    pytest.param(lambda i: i, id="tensor"),
])
def test_augmented_assignment_through_key(key):
    def fn(x, i, v):
        x[key(i)] += v
        x[key(i)] *= 2
        return x

    check_against_eager(fn, make((4, 5)), torch.tensor([3, 0]), make((1,), seed=1))


# (id, fn, args builder(dtype), dtypes): fn mutates its first argument.
ALL = DTYPES
FLOATS = (torch.float32, torch.float64, torch.bfloat16)
NUMERIC = (*FLOATS, torch.int64)


def _idx(values):
    return torch.tensor(values)


INPLACE_OPS = [
    ("add_", lambda x, y: x.add_(y), lambda d: (make((3, 4), d), make((4,), d, 1)), NUMERIC),
    ("add_alpha_", lambda x, y: x.add_(y, alpha=2), lambda d: (make((3, 4), d), make((3, 4), d, 1)), NUMERIC),
    ("iadd", lambda x, y: x.__iadd__(y), lambda d: (make((3, 4), d), make((), d, 1)), NUMERIC),
    ("sub_scalar", lambda x: x.sub_(1), lambda d: (make((3, 4), d),), NUMERIC),
    ("mul_", lambda x, y: x.mul_(y), lambda d: (make((3, 4), d), make((3, 1), d, 1)), ALL),
    ("mul_int_by_bool", lambda x, y: x.mul_(y), lambda d: (make((3, 4), d), make((4,), torch.bool, 1)), NUMERIC),
    ("div_", lambda x, y: x.div_(y), lambda d: (make((3, 4), d), make((4,), d, 1).abs() + 1), FLOATS),
    ("clamp_", lambda x: x.clamp_(-1, 2), lambda d: (make((3, 4), d),), NUMERIC),
    ("clip_", lambda x: x.clip_(min=0), lambda d: (make((3, 4), d),), NUMERIC),
    ("lerp_", lambda x, y: x.lerp_(y, 0.25), lambda d: (make((3, 4), d), make((3, 4), d, 1)), FLOATS),
    ("addcdiv_", lambda x, y, z: x.addcdiv_(y, z, value=0.5),
     lambda d: (make((3, 4), d), make((3, 4), d, 1), make((4,), d, 2).abs() + 1), FLOATS),
    ("addcmul_", lambda x, y, z: x.addcmul_(y, z, value=2), lambda d: (make((3, 4), d), make((3, 4), d, 1), make((4,), d, 2)),
     NUMERIC),
    ("neg_", lambda x: x.neg_(), lambda d: (make((3, 4), d),), NUMERIC),
    ("exp_", lambda x: x.exp_(), lambda d: (make((3, 4), d),), FLOATS),
    ("tan_", lambda x: x.tan_(), lambda d: (make((3, 4), d),), FLOATS),
    ("eq_", lambda x, y: x.eq_(y), lambda d: (make((3, 4), d), make((3, 4), d)), ALL),
    ("logical_and_", lambda x, y: x.logical_and_(y), lambda d: (make((3, 4), d), make((3, 4), d, 1)), ALL),
    ("bitwise_not_", lambda x: x.bitwise_not_(), lambda d: (make((3, 4), d),), (torch.int64, torch.bool)),
    ("zero_", lambda x: x.zero_(), lambda d: (make((3, 4), d),), ALL),
    ("fill_", lambda x: x.fill_(3), lambda d: (make((3, 4), d),), ALL),
    ("fill_tensor", lambda x, v: x.fill_(v), lambda d: (make((3, 4), d), make((), torch.float64, 1)), ALL),
    ("copy_", lambda x, y: x.copy_(y), lambda d: (make((3, 4), d), make((4,), torch.float64, 1)), ALL),
    ("tril_", lambda x: x.tril_(), lambda d: (make((3, 4), d),), ALL),
    ("triu_", lambda x: x.triu_(1), lambda d: (make((3, 4), d),), ALL),
    ("index_copy_", lambda x, i, s: x.index_copy_(1, i, s), lambda d: (make((3, 4), d), _idx([3, 0]), make((3, 2), d, 1)),
     ALL),
    ("index_add_", lambda x, i, s: x.index_add_(0, i, s), lambda d: (make((3, 4), d), _idx([2, 2]), make((2, 4), d, 1)),
     NUMERIC),
    ("index_fill_", lambda x, i: x.index_fill_(1, i, -2), lambda d: (make((3, 4), d), _idx([0, 2])), ALL),
    ("masked_fill_", lambda x, m: x.masked_fill_(m, 1.5), lambda d: (make((3, 4), d), make((4,), torch.bool, 1)), ALL),
    ("masked_fill_tensor_", lambda x, m, v: x.masked_fill_(m, v),
     lambda d: (make((3, 4), d), make((3, 4), torch.bool, 1), make((), d, 2)), ALL),
    ("scatter_add_", lambda x, i, s: x.scatter_add_(1, i, s),
     lambda d: (make((3, 4), d), _idx([[0, 0, 3], [1, 2, 1]]), make((2, 3), d, 1)), NUMERIC),
    ("scatter_", lambda x, i, s: x.scatter_(1, i, s),
     lambda d: (make((3, 4), d), _idx([[0, 3], [1, 2]]), make((2, 3), d, 1)), ALL),
    ("index_put_", lambda x, i, v: x.index_put_((i,), v, accumulate=True),
     lambda d: (make((3, 4), d), _idx([1, 1]), make((4,), d, 1)), NUMERIC),
    ("chain", lambda x, y: x.mul_(2).add_(y).clamp_(max=3), lambda d: (make((3, 4), d), make((3, 4), d, 1)), NUMERIC),
    ("clone_then_mutate", lambda x: (x.clone().add_(1), x), lambda d: (make((3, 4), d),), NUMERIC),
    ("both_inputs", lambda x, y: (x.add_(y), y.mul_(x)), lambda d: (make((3, 4), d), make((3, 4), d, 1)), NUMERIC),
    ("read_after_write", lambda x, y: x.add_(y) * y + x, lambda d: (make((3, 4), d), make((3, 4), d, 1)), NUMERIC),
    # Writes through views of an input; before functionalization these rely on eager views sharing memory.
    ("through_getitem", lambda x: x[1].mul_(0), lambda d: (make((3, 4), d),), NUMERIC),
    ("through_transpose", lambda x: (x.t().sub_(1), x), lambda d: (make((3, 4), d),), NUMERIC),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("fn", "make_args", "dtypes"), [pytest.param(f, a, ds, id=n) for n, f, a, ds in INPLACE_OPS])
def test_inplace_op_matches_eager(fn, make_args, dtypes, dtype):
    if dtype not in dtypes:
        pytest.skip(f"not an op eager torch runs in place on {dtype}")
    check_against_eager(fn, *make_args(dtype), exact=dtype not in FLOATS)


@pytest.mark.parametrize(("fn", "args", "error", "match"), [
    pytest.param(lambda x: x.add_(1.5), (make((3,), torch.int64),), MetaError, "add_: result type .* can't be cast",
                 id="int_add_float"),
    pytest.param(lambda x, y: x.mul_(y), (make((3,), torch.int64), make((3,))), MetaError, "mul_: result type",
                 id="int_mul_float_tensor"),
    pytest.param(lambda x: x.div_(2), (make((3,), torch.int64),), MetaError, "div_: result type", id="int_true_div"),
    pytest.param(lambda x, y: x.eq_(y).logical_not_().add_(y), (make((3,), torch.bool), make((3,))), MetaError,
                 "add_: result type", id="bool_add_float"),
    pytest.param(lambda x, y: x.add_(y), (make((3,)), make((2, 3))), MetaError, "add_: a value of shape", id="add_bcast"),
    pytest.param(lambda x, m: x.masked_fill_(m, 0), (make((3,)), make((2, 3), torch.bool)), MetaError, "masked_fill_",
                 id="masked_fill_bcast"),
    pytest.param(lambda x, y: x.copy_(y), (make((3,)), make((2,))), MetaError, "copy_", id="copy_shape"),
    pytest.param(lambda x, y: x.fill_(y), (make((3,)), make((3,))), MetaError, "0-dimensional", id="fill_shape"),
    pytest.param(lambda x, i, s: x.index_copy_(0, i, s), (make((3,)), _idx([0]), make((1,), torch.float64)), MetaError,
                 "same dtype", id="index_copy_dtype"),
    pytest.param(lambda x, v: _assign(x, slice(0, 2), v), (make((3, 4)), make((3, 4))), MetaError,
                 "setitem: shape mismatch", id="setitem_shape"),
    pytest.param(lambda x: x.unsqueeze_(0), (make((3,)),), UnsupportedOpError, "unsqueeze_", id="unsqueeze_"),
    pytest.param(lambda x: x.t_(), (make((3, 2)),), UnsupportedOpError, "t_", id="t_"),
])
def test_inplace_errors(fn, args, error, match):
    if error is MetaError:
        with pytest.raises(RuntimeError):  # eager refuses it too
            fn(*(a.clone() for a in args))
    with pytest.raises(error, match=match):
        trace_call(fn, *args)


def _unary_inplace_names():
    x = torch.full((2,), 0.5)
    names = []
    for name, sym in sorted(ALL_LTORCH.items()):
        if not name.endswith("_") or not sym.effects.writes or name[:-1] in (*METADATA_INPLACE, "requires_grad"):
            continue
        try:
            getattr(x.clone(), name)()
        except (TypeError, RuntimeError, AttributeError):
            continue  # needs more arguments, or is not a value-writing op
        names.append(name)
    return names


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", _unary_inplace_names())
def test_every_unary_inplace_variant_matches_eager(name, dtype):
    x = torch.linspace(0.1, 0.9, 6, dtype=dtype).reshape(2, 3)  # inside every unary op's domain
    check_against_eager(lambda x: getattr(x, name)(), x, exact=False)


def test_requires_grad_that_changes_nothing_is_a_no_op():
    """transformers' enable_input_require_grads hook: requires_grad_(True) on a result that requires grad already."""
    import minijit

    def f(ids, weight):
        out = torch.nn.functional.embedding(ids, weight)
        out.requires_grad_(True)
        return out.tanh().sum()

    ids, weight = torch.tensor([[0, 2], [1, 1]]), torch.randn(3, 4, requires_grad=True)
    want = torch.autograd.grad(f(ids, weight), weight)
    have = torch.autograd.grad(minijit.jit(f)(ids, weight), weight)
    torch.testing.assert_close(have, want)


@pytest.mark.parametrize(("fn", "match"), [
    (lambda x, w: x.requires_grad_().sum(), "turning requires_grad on"),
    (lambda x, w: (x @ w).requires_grad_(False).sum(), "turning requires_grad off"),
])
def test_requires_grad_that_changes_the_flag_is_refused(fn, match):
    import minijit

    with pytest.raises(minijit.UnsupportedOpError, match=match):
        minijit.jit(fn)(torch.randn(2, 3), torch.randn(3, 3, requires_grad=True))
