"""Objects overriding `__torch_function__` under minijit.jit: dispatched as eager dispatches them, or refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minijit

F64 = torch.float64


def _unwrap(x):
    if isinstance(x, list | tuple):
        return type(x)(_unwrap(a) for a in x)
    return x.t if isinstance(x, Logged | Quantity) else x


class Logged:
    """A tensor-like wrapper that logs every torch function called on it."""

    log: list[str] = []

    def __init__(self, t):
        self.t = t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.log.append(func.__name__)
        out = func(*_unwrap(args), **{k: _unwrap(v) for k, v in (kwargs or {}).items()})
        return Logged(out) if isinstance(out, torch.Tensor) else out


class Quantity:
    """A tensor carrying a unit: sums need equal units, products multiply them."""

    def __init__(self, t, unit):
        self.t, self.unit = t, unit

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        units = [a.unit for a in args if isinstance(a, Quantity)]
        if func in (torch.add, torch.Tensor.add, torch.sub, torch.Tensor.sub):
            if len(set(units)) != 1:
                raise ValueError(f"cannot add {units[0]} and {units[-1]}")
            unit = units[0]
        elif func in (torch.mul, torch.Tensor.mul):
            unit = "*".join(units)
        else:
            return NotImplemented
        return Quantity(func(*_unwrap(args), **(kwargs or {})), unit)


class PlainSubclass(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl


class WrappingSubclass(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs)


def logging_fn(x, w):
    a = torch.add(Logged(x), w)
    b = torch.mul(a, 2) - x          # a Logged minus a tensor: Tensor.__rsub__, as in eager
    c = F.relu(b) @ w.unsqueeze(1)   # F.relu asks has_torch_function_unary (torch's Python)
    d = torch.cat([c, Logged(x[:1, :1])])
    return (w * d).t.sum(dim=0), type(d).__name__


def test_a_logging_wrapper_dispatches_and_logs_as_in_eager() -> None:
    x, w = torch.randn(3, 3, dtype=F64), torch.randn(3, dtype=F64)
    we, wj = w.clone().requires_grad_(), w.clone().requires_grad_()
    jf = minijit.jit(logging_fn)
    for _ in range(2):  # a trace, then a cache hit: the log is replayed
        Logged.log.clear()
        want = logging_fn(x, we)
        eager_log = list(Logged.log)
        Logged.log.clear()
        have = jf(x, wj)
        assert Logged.log == eager_log
        assert have[1] == want[1]
        torch.testing.assert_close(have[0], want[0])
        want[0].sum().backward()
        have[0].sum().backward()
        torch.testing.assert_close(wj.grad, we.grad)
    assert minijit.cache_info(jf).hits == 1


def test_a_unit_carrying_wrapper_keeps_its_units_and_errors() -> None:
    def f(x, y):
        q = torch.mul(Quantity(x, "m"), Quantity(y, "s"))
        return torch.add(q, Quantity(x * y, "m*s"))

    def bad(x, y):
        return torch.add(Quantity(x, "m"), Quantity(y, "s"))

    def unknown(x):
        return torch.sin(Quantity(x, "m"))

    x, y = torch.randn(4), torch.randn(4)
    want, have = f(x, y), minijit.jit(f)(x, y)
    assert type(have) is Quantity and have.unit == want.unit
    torch.testing.assert_close(have.t, want.t)
    for fn, args, error in ((bad, (x, y), ValueError), (unknown, (x,), TypeError)):
        with pytest.raises(error) as eager:
            fn(*args)
        with pytest.raises(error) as jitted:
            minijit.jit(fn)(*args)
        assert str(eager.value).split(":")[0] in str(jitted.value)


def test_a_subclass_disabling_torch_function_runs_as_a_plain_tensor() -> None:
    def f(x):
        y = x * 2 + 1
        return y.sum(), type(y).__name__

    x = torch.randn(3).as_subclass(PlainSubclass)
    want, have = f(x), minijit.jit(f)(x)
    torch.testing.assert_close(have[0], want[0])
    assert have[1] == want[1] and type(have[0]) is type(want[0])


def test_a_subclass_input_overriding_torch_function_is_refused() -> None:
    x = torch.randn(3).as_subclass(WrappingSubclass)
    with pytest.raises(minijit.MinijitError, match="the argument x is a WrappingSubclass, a Tensor subclass with "
                                                  "__torch_function__"):
        minijit.jit(lambda x: x * 2)(x)
