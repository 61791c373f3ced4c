"""Arguments the jitted function changes or consumes, against eager over several calls: a list or dict
argument mutated in place (append, item assignment, pop, update, del), and torch functions called on Python
numbers (`torch.div(7, 2, rounding_mode="trunc")`), which return tensors as in eager."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit


def _same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    elif isinstance(want, dict):
        assert type(got) is dict and list(got) == list(want)
        for k in want:
            _same(got[k], want[k])
    else:
        assert got == want and type(got) is type(want)


def _append(lst, x):
    lst.append(x * 2)
    lst.append(len(lst))
    return x + 1


def _setitem_pop(lst, x):
    lst[0] = lst[0] + x
    last = lst.pop()
    return last * 2


def _extend_insert_del(lst, x):
    lst.extend([x, x.sin()])
    lst.insert(0, "head")
    del lst[1]
    return lst[-1]


def _dict_update(d, x):
    d["y"] = d["a"] * x
    d.update(z=x.cos(), n=3)
    return d.pop("a") + 1


def _dict_setdefault_del(d, x):
    d.setdefault("count", 0)
    d["count"] += 1
    del d["b"]
    return x * d["count"]


def _nested(args, x):
    args["acc"].append(x.exp())  # a list inside a dict argument
    return x


def _keep_input(lst, x):
    lst.append(x)  # the caller's x itself, as in eager
    return lst[0] * 2


LISTS: list[tuple[Callable[..., Any], Callable[[], Any]]] = [
    (_append, lambda: [torch.ones(2)]),
    (_setitem_pop, lambda: [torch.ones(2), torch.zeros(2), torch.full((2,), 3.0)]),
    (_extend_insert_del, lambda: [torch.ones(2), 5]),
    (_dict_update, lambda: {"a": torch.ones(2), "keep": 1.5}),
    (_dict_setdefault_del, lambda: {"b": torch.zeros(2), "c": "text"}),
    (_nested, lambda: {"acc": [], "other": (1, 2)}),
    (_keep_input, lambda: [torch.ones(2)]),
]


@pytest.mark.parametrize("fn,make", LISTS, ids=[f.__name__ for f, _ in LISTS])
def test_mutated_argument_matches_eager(fn, make):
    jf = minijit.jit(fn)
    for call in range(3):
        x = torch.randn(2)
        mine, theirs = make(), make()
        before = copy.copy(mine)
        got, want = jf(mine, x), fn(theirs, x)
        _same(got, want)
        _same(mine, theirs)
        assert mine is not before
    if fn is _keep_input:
        mine = [torch.ones(2)]
        jf(mine, x)
        assert mine[-1] is x


def test_same_list_over_calls_grows_as_in_eager():
    def f(acc, x):
        acc.append(x + len(acc))
        return torch.stack(acc).sum(0)

    jf = minijit.jit(f)
    mine, theirs = [], []
    for _ in range(4):
        x = torch.randn(3)
        _same(jf(mine, x), f(theirs, x))
        _same(mine, theirs)


def test_mutated_argument_with_grad():
    def f(store, w):
        store.append(w * 2)
        return (w * 3).sum()

    jf = minijit.jit(f)
    for _ in range(3):
        w1 = torch.randn(3, requires_grad=True)
        w2 = w1.detach().clone().requires_grad_(True)
        s1, s2 = [], []
        out1, out2 = jf(s1, w1), f(s2, w2)
        _same(s1, s2)
        (out1 + s1[0].square().sum()).backward()  # through the result and the stored value
        (out2 + s2[0].square().sum()).backward()
        assert torch.equal(w1.grad, w2.grad)


def test_set_argument_mutated_as_in_eager():
    def f(s, x):
        s.add(len(s) + 1)
        s.discard(1)
        return x * len(s)

    jf = minijit.jit(f)
    for _ in range(3):
        x = torch.randn(2)
        mine, theirs = {1, 2}, {1, 2}
        _same(jf(mine, x), f(theirs, x))
        assert mine == theirs


def test_set_inside_a_list_argument_refused():
    def f(lst, x):
        lst[0].add(3)
        return x

    with pytest.raises(minijit.MinijitError, match="modified the set"):
        minijit.jit(f)([{1}], torch.ones(1))


NUMBER_CALLS = [
    lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    lambda a, b: torch.div(a, b, rounding_mode="floor"),
    lambda a, b: torch.div(a, b),
    lambda a, b: torch.true_divide(a, b),
    lambda a, b: torch.floor_divide(a, b),
    lambda a, b: torch.add(a, b, alpha=2),
    lambda a, b: torch.sub(a, b),
    lambda a, b: torch.mul(a, b) + torch.ones(2),
]


@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
@pytest.mark.parametrize("i", range(len(NUMBER_CALLS)))
def test_torch_function_on_python_numbers(i, cache):
    fn = NUMBER_CALLS[i]
    jf = minijit.jit(fn, cache=cache)
    for a, b in [(7, 2), (-7, 2), (7.5, 2), (True, 3), (9, -4)]:
        try:
            fn(a, b)
        except RuntimeError as refused:  # torch.sub(True, 3): eager's refusal, as eager's type
            with pytest.raises(type(refused)):
                jf(a, b)
            continue
        got = jf(a, b)
        _same(got, fn(a, b))
        got.add_(1)  # a fresh tensor each call: changing it changes no later result
        _same(jf(a, b), fn(a, b))


def test_torch_function_refusing_python_numbers_raises_eagers_type():
    def f(a):
        try:
            return torch.sin(a)
        except TypeError:
            return torch.zeros(1)

    _same(minijit.jit(f)(3.0), f(3.0))
    with pytest.raises(TypeError):
        minijit.jit(lambda a: torch.sin(a))(3.0)


# --- iterators passed in ----------------------------------------------------------------------------------


def _two_next(it, x):
    a = next(it)
    return a * x + next(it)


def _loop(it, x):
    total = x
    for t in it:
        total = total + t.sin()
    return total


def _next_default(it, x):
    return next(it, x) * 2  # runs past the end on the shortest input


ITERATORS = [(_two_next, lambda xs: iter(xs)), (_two_next, lambda xs: iter(tuple(xs))),
             (_loop, lambda xs: iter(xs)), (_next_default, lambda xs: iter(xs[:0] if len(xs) < 3 else xs))]


@pytest.mark.parametrize("fn,make", ITERATORS, ids=[f"{f.__name__}{i}" for i, (f, _) in enumerate(ITERATORS)])
def test_iterator_argument_advanced_as_in_eager(fn, make):
    jf = minijit.jit(fn)
    for n in (3, 3, 2, 4):
        xs = [torch.randn(2) for _ in range(n)]
        x = torch.randn(2)
        mine, theirs = make(xs), make(xs)
        _same(jf(mine, x), fn(theirs, x))
        _same(list(mine), list(theirs))  # what is left, as eager leaves it


def test_range_iterator_and_keyword():
    def f(x, *, steps):
        return x * next(steps) + next(steps)

    jf = minijit.jit(f)
    mine, theirs = iter(range(5)), iter(range(5))
    for _ in range(2):
        x = torch.randn(2)
        _same(jf(x, steps=mine), f(x, steps=theirs))
    assert list(mine) == list(theirs) == [4]


def test_iterator_of_numbers_that_change_each_call():
    # The numbers go symbolic on the second call (automatic dynamic), the iterator's position with them: the
    # count of items taken is still the trace's, not a symbolic number converted unguarded.
    def f(x, it):
        total = x + next(it)
        while (n := next(it)) < 6:  # how many items depends on their values
            total = total * n
        return total

    jf = minijit.jit(f)
    for start in (0, 1, 2, 3, 4):
        mine, theirs = iter(range(start, start + 9)), iter(range(start, start + 9))
        x = torch.randn(2)
        _same(jf(x, mine), f(x, theirs))
        assert list(mine) == list(theirs)


def test_generator_argument_refused_clearly():
    with pytest.raises(minijit.MinijitError, match="advancing the generator"):
        minijit.jit(_two_next)((t for t in [torch.ones(1)] * 3), torch.ones(1))


def test_iterator_returned_or_stored_is_refused():
    def returned(it):
        return next(it), it

    box = {}

    def stored(it):
        box["it"] = it  # a dict from outside the call
        return next(it)

    xs = [torch.ones(1), torch.zeros(1)]
    with pytest.raises(minijit.MinijitError, match="holds the iterator"):
        minijit.jit(returned)(iter(xs))
    with pytest.raises(minijit.MinijitError, match="holds the iterator"):
        minijit.jit(stored)(iter(xs))
