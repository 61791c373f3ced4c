"""Errors as eager raises them, against eager: a user's `except` in traced code catches minijit's error where
eager's `except` catches torch's (and lets it through where eager does), the error escaping a jitted call is
an instance of eager's type, and an op inside `try` that raises only on some data (a Cholesky of a matrix that
is not positive-definite) takes eager's `except` branch on those calls, the other calls staying compiled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import MinijitError


def _outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """The result, or the exception instance."""
    try:
        return fn(*args)
    except Exception as e:  # the outcome compared is the exception itself
        return e


def _same_outcome(fn: Callable[..., Any], *args: Any) -> None:
    want, got = _outcome(fn, *args), _outcome(minijit.jit(fn), *args)
    if isinstance(want, Exception):
        assert isinstance(got, type(want)), (type(got), type(want))
        assert isinstance(got, MinijitError) or type(got) is type(want)
    else:
        assert not isinstance(got, Exception), got
        assert torch.equal(got, want)


def _view_t(x, kind):
    try:
        return x.t().view(-1)
    except kind:
        return x.t().reshape(-1) * 2


def _add(x, kind):
    try:
        return x + x[:2]
    except kind:
        return x.sum()


def _index(x, kind):
    try:
        return x[7] + 1
    except kind:
        return x[0]


def _select(x, kind):
    try:
        return x.select(1, -9)
    except kind:
        return x[:, 0]


def _dtype(x, kind):
    try:
        return torch.bitwise_and(x, x)  # eager refuses float tensors
    except kind:
        return x * 3


def _matmul(x, kind):
    try:
        return x @ x
    except kind:
        return x.sum(0)


def _cat_int(x, kind):
    try:
        return torch.cat([x, 1])
    except kind:
        return -x


CASES = [(_view_t, RuntimeError), (_add, RuntimeError), (_index, IndexError), (_select, IndexError),
         (_dtype, RuntimeError), (_matmul, RuntimeError), (_cat_int, TypeError)]


@pytest.mark.parametrize("fn,kind", CASES, ids=[f.__name__ for f, _ in CASES])
def test_caught_as_eager_type(fn, kind):
    x = torch.randn(3, 4)
    _same_outcome(lambda x: fn(x, kind), x)


@pytest.mark.parametrize("fn,kind", CASES, ids=[f.__name__ for f, _ in CASES])
def test_not_caught_by_another_type(fn, kind):
    other = ValueError if kind is not ValueError else KeyError
    _same_outcome(lambda x: fn(x, other), torch.randn(3, 4))


@pytest.mark.parametrize("fn,kind", CASES, ids=[f.__name__ for f, _ in CASES])
def test_escapes_as_eager_type(fn, kind):
    def no_handler(x):
        return fn(x, ZeroDivisionError)

    jf = minijit.jit(no_handler)
    with pytest.raises(kind) as eager:
        no_handler(torch.randn(3, 4))
    with pytest.raises(kind) as raised:
        jf(torch.randn(3, 4))
    # A compile-time refusal is a MinijitError (naming the line) of eager's type; a run-time one is torch's own.
    assert isinstance(raised.value, MinijitError | type(eager.value))
    if isinstance(raised.value, MinijitError):
        assert isinstance(raised.value, type(eager.value)) and "test_eager_errors.py" in str(raised.value)


def test_except_branch_traced_and_cached():
    def f(x):
        try:
            y = x.t().view(-1)
        except RuntimeError as e:
            y = x.t().reshape(-1) + len(type(e).__mro__) * 0
        return y.sin()

    jf = minijit.jit(f)
    for _ in range(3):
        x = torch.randn(2, 5)
        assert torch.equal(jf(x), f(x))
    assert minijit.cache_info(jf).misses == 1


# --- ops that raise at run time on some data, inside try ---------------------------------------------------


def _spd(n: int) -> torch.Tensor:
    m = torch.randn(n, n, dtype=torch.float64)
    return m @ m.T + n * torch.eye(n, dtype=torch.float64)


def _indefinite(n: int) -> torch.Tensor:
    return torch.randn(n, n, dtype=torch.float64) - 10 * torch.eye(n, dtype=torch.float64)


def _singular(n: int) -> torch.Tensor:
    m = torch.randn(n, n, dtype=torch.float64)
    m[-1] = m[0]
    return m * 0


def _cholesky_or_solve(a, b):
    try:
        factor = torch.linalg.cholesky(a)
        return torch.cholesky_solve(b, factor)
    except torch.linalg.LinAlgError:
        return torch.linalg.solve(a, b) + 1


def _inv_or_pinv(a, b):
    try:
        with torch.no_grad():
            inverse = torch.linalg.inv(a)
    except RuntimeError:
        inverse = torch.linalg.pinv(a)
    return inverse @ b


def _helper(a):
    try:
        return torch.linalg.cholesky(a), True
    except RuntimeError:
        return a.diag().diag_embed(), False


def _nested(a, b):
    factor, ok = _helper(a)  # the try is in a function the jitted one calls
    return (factor @ b) * (2 if ok else 3)


@pytest.mark.parametrize("fn", [_cholesky_or_solve, _inv_or_pinv, _nested], ids=lambda f: f.__name__)
def test_runtime_raise_takes_eager_except_branch(fn):
    torch.manual_seed(0)
    jf = minijit.jit(fn)
    bad = _singular if fn is _inv_or_pinv else _indefinite
    for make in (_spd, bad, _spd, bad, _spd):
        a, b = make(3), torch.randn(3, 2, dtype=torch.float64)
        assert torch.equal(jf(a, b), fn(a, b))
    info = minijit.cache_info(jf)
    assert info.misses == 1 and info.eager_calls == 2
    assert "ran eagerly" in str(info) and "try block" in info.eager_reasons[0]


def test_runtime_raise_with_grad_and_outside_state():
    log = []

    def f(a, w):
        log.append("called")
        try:
            return torch.linalg.cholesky(a * w).sum()
        except RuntimeError:
            return (a * w).sum() * 0.5

    jf = minijit.jit(f)
    for make in (_spd, _indefinite, _spd):
        a = make(3)
        w1 = torch.ones(3, dtype=torch.float64, requires_grad=True)
        w2 = w1.detach().clone().requires_grad_(True)
        got, want = jf(a, w1), f(a, w2)
        got.backward()
        want.backward()
        assert torch.equal(got, want) and torch.equal(w1.grad, w2.grad)
    assert log == ["called"] * 6


def test_runtime_raise_outside_try_is_torchs_error():
    jf = minijit.jit(lambda a: torch.linalg.cholesky(a))
    jf(_spd(3))
    with pytest.raises(torch.linalg.LinAlgError):
        jf(_indefinite(3))
    assert minijit.cache_info(jf).eager_calls == 0


def test_runtime_raise_after_writing_an_input_is_refused():
    def f(a, out):
        out.add_(1)
        try:
            return torch.linalg.cholesky(a)
        except RuntimeError:
            return a

    jf = minijit.jit(f)
    jf(_spd(3), torch.zeros(2))
    with pytest.raises(MinijitError, match="written into its inputs"):
        jf(_indefinite(3), torch.zeros(2))


def test_random_ops_before_the_raise_draw_as_eager():
    def f(a):
        noise = torch.rand(3, dtype=torch.float64)
        try:
            return torch.linalg.cholesky(a) + noise
        except RuntimeError:
            return a + noise + torch.rand(1, dtype=torch.float64)

    jf = minijit.jit(f)
    for make in (_spd, _indefinite, _indefinite):
        a = make(3)
        torch.manual_seed(7)
        want = f(a)
        state = torch.get_rng_state()
        torch.manual_seed(7)
        assert torch.equal(jf(a), want) and torch.equal(torch.get_rng_state(), state)


def test_with_and_finally_without_except_are_not_fallbacks():
    def f(a):
        try:
            with torch.no_grad():
                return torch.linalg.cholesky(a)
        finally:
            pass

    jf = minijit.jit(f)
    jf(_spd(3))
    assert jf.last_entry().capture.ops_in_try == []
    with pytest.raises(torch.linalg.LinAlgError):
        jf(_indefinite(3))
    assert minijit.cache_info(jf).eager_calls == 0


def test_eager_typed_error_pickles_and_keeps_its_types():
    import pickle

    def f(x):
        return x[9]

    with pytest.raises(IndexError) as raised:
        minijit.jit(f)(torch.randn(3))
    again = pickle.loads(pickle.dumps(raised.value))
    assert isinstance(again, IndexError) and isinstance(again, MinijitError) and str(again) == str(raised.value)


def test_caught_under_symbolic_values():
    def f(x):
        try:
            return x.t().view(-1)
        except RuntimeError:
            return x.t().reshape(-1)

    jf = minijit.jit(f, cache="symbolic values")
    for n in (3, 5, 7):
        x = torch.randn(2, n)
        assert torch.equal(jf(x), f(x))


MORE = {
    "opaque_solve": lambda x: torch.linalg.solve(x, torch.ones(5, 2)),
    "linear": lambda x: torch.nn.functional.linear(x, torch.ones(3, 7)),
    "cat": lambda x: torch.cat([x, torch.ones(2, 5)]),
    "reshape": lambda x: x.reshape(5),
    "sum_dim": lambda x: x.sum(dim=5),
    "transpose": lambda x: x.transpose(0, 4),
    "softmax_int": lambda x: torch.softmax(x.long(), 0),
    "matmul_dtypes": lambda x: x @ x.t().double(),
    "index_select_float": lambda x: torch.index_select(x, 0, torch.tensor([0.5])),
    "narrow": lambda x: x.narrow(0, 2, 5),
    "topk": lambda x: x.topk(10),
    "embedding": lambda x: torch.nn.functional.embedding(torch.tensor([1]), x),
}
_TYPES = (IndexError, ValueError, TypeError, NotImplementedError, RuntimeError)


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_ops_caught_by_eagers_class(name):
    op = MORE[name]

    def f(x):
        try:
            return op(x)
        except _TYPES as e:  # which class caught it is the result
            return torch.full((1,), float([isinstance(e, t) for t in _TYPES].index(True)))

    _same_outcome(f, torch.randn(3, 4))


def _write_into_leaf(w):
    w.add_(1)
    return w


def _overlapping_add(a):
    a.add_(a.t())
    return a


@pytest.mark.parametrize(("fn", "make"), [
    (_write_into_leaf, lambda: torch.randn(3, requires_grad=True)),
    (_overlapping_add, lambda: torch.randn(3, 3)),
    (lambda x: torch.randn(3, dtype=torch.int64) + x, lambda: torch.randn(3)),
    (lambda x: torch.rand(2, dtype=torch.bool) + x, lambda: torch.randn(2)),
    (lambda x: x.long().normal_(), lambda: torch.randn(2)),
], ids=["write into a leaf requiring grad", "overlapping add_", "randn int64", "rand bool", "normal_ on int64"])
def test_refusals_are_instances_of_eager_s_exception_type(fn, make):
    # Eager's refusal escapes a call as its own type (RuntimeError, NotImplementedError); minijit's stands for it.
    want, got = _outcome(fn, make()), _outcome(minijit.jit(fn), make())
    assert isinstance(want, Exception) and isinstance(got, MinijitError) and isinstance(got, type(want)), \
        (type(want), type(got))
