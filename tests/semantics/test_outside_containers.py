"""Containers from outside the call, read whole: against eager over several calls, the containers changing between them.

A list, dict or deque that lives outside the call (a global, a closure variable, a module attribute,
a mutable default argument) may gain, lose or replace elements between calls, by the caller or by the
call itself. However the traced code reads it — passed whole to an op, summed or reduced by native
code, unpacked, iterated, indexed, `len()`-ed — every call must see its current contents, as eager
does. Each case builds its state twice (eager and jitted), calls both `CALLS` times with a changing
input, changes the state the same way after each call, and compares results and state.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from tests.semantics.util import assert_same

CALLS = 4
# A case: make() -> (fn, state, change(state, i)); `state` is what the test compares after each call.
Case = Callable[[], tuple[Callable[..., Any], Any, Callable[[Any, int], None]]]


def _value(i: int, scale: float = 1.0) -> torch.Tensor:
    return torch.arange(3.0) * scale + i


def _grow(lst: Any, i: int) -> None:
    lst.append(_value(i, 10.0))


def _replace_first(lst: Any, i: int) -> None:
    lst[0] = _value(i, 7.0)


def _nothing(state: Any, i: int) -> None:
    pass


def _with_list(body: Callable[[list[torch.Tensor]], Callable[..., Any]], change: Callable[[Any, int], None]) -> Case:
    def make() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
        xs = [torch.ones(3), torch.full((3,), 2.0)]
        return body(xs), xs, change
    return make


CASES: dict[str, Case] = {
    # Passed whole to an op.
    "cat of a list that grows": _with_list(lambda xs: lambda x: torch.cat(xs) + x.sum(), _grow),
    "stack of a list whose item is replaced": _with_list(lambda xs: lambda x: torch.stack(xs).sum(0) * x, _replace_first),
    "stack of a list that grows": _with_list(lambda xs: lambda x: torch.stack(xs, dim=1) @ torch.ones(len(xs)) + x,
                                             _grow),
    "a list inside a list given to cat": _with_list(lambda xs: lambda x: torch.cat([x, *xs]), _grow),
    "tuple() of the list": _with_list(lambda xs: lambda x: torch.cat(tuple(xs)) * 2 + x[0], _grow),
    # Computed on by native code.
    "sum() of the list": _with_list(lambda xs: lambda x: sum(xs) + x, _replace_first),
    "functools.reduce(torch.add)": _with_list(lambda xs: lambda x: functools.reduce(torch.add, xs) - x, _replace_first),
    "functools.reduce(operator.mul)": _with_list(lambda xs: lambda x: functools.reduce(operator.mul, xs, x),
                                                _replace_first),
    "itertools.accumulate": _with_list(lambda xs: lambda x: list(itertools.accumulate(xs))[-1] + x, _replace_first),
    "map(torch.sin) summed": _with_list(lambda xs: lambda x: sum(map(torch.sin, xs)) * x, _replace_first),
    "map(operator.mul) in a loop": _with_list(
        lambda xs: lambda x: torch.stack([y for y in map(operator.mul, xs, xs)]).sum(0) + x, _replace_first),
    "abs() of an item": _with_list(lambda xs: lambda x: abs(xs[0] - 3) + x, _replace_first),
    "pow() of an item": _with_list(lambda xs: lambda x: pow(xs[0], 2) + x, _replace_first),
    # Unpacked, indexed, measured.
    "unpacked": _with_list(lambda xs: lambda x: (lambda a, b: a * x + b)(*xs), _replace_first),
    "last item of a list that grows": _with_list(lambda xs: lambda x: xs[-1] * x, _grow),
    "len() of a list that grows": _with_list(lambda xs: lambda x: x * len(xs), _grow),
    "a window of a list that grows": _with_list(lambda xs: lambda x: torch.stack(xs[-2:]).mean(0) + x, _grow),
    "iterated": _with_list(lambda xs: lambda x: torch.stack([t * 2 for t in xs]).sum(0) + x, _grow),
}


def _deque_case(body: Callable[[collections.deque[torch.Tensor]], Callable[..., Any]]) -> Case:
    def make() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
        dq: collections.deque[torch.Tensor] = collections.deque([torch.ones(3)], maxlen=2)
        return body(dq), dq, _grow  # full from the second call on: its length stops changing
    return make


CASES["sum() of a bounded deque"] = _deque_case(lambda dq: lambda x: sum(dq) + x)
CASES["stack of a bounded deque"] = _deque_case(lambda dq: lambda x: torch.stack(list(dq)).sum(0) * x)


def _dict_case(body: Callable[[dict[str, torch.Tensor]], Callable[..., Any]]) -> Case:
    def make() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
        d = {"a": torch.ones(3)}

        def change(state: dict[str, torch.Tensor], i: int) -> None:
            state[f"k{i}"] = _value(i)
            state["a"] = _value(i, 3.0)
        return body(d), d, change
    return make


CASES["stack of a dict's values"] = _dict_case(lambda d: lambda x: torch.stack(list(d.values())).sum(0) + x)
CASES["sum() of a dict's values"] = _dict_case(lambda d: lambda x: sum(d.values()) * x)
CASES["a dict passed as **kwargs"] = _dict_case(lambda d: lambda x: (lambda **kw: sum(kw.values()))(**d) + x)


def _nested_case() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    rows = [[torch.ones(3)], [torch.full((3,), 2.0)]]
    return (lambda x: torch.cat([torch.cat(r) for r in rows]) + x.sum()), rows, lambda s, i: s[0].append(_value(i))


def _list_in_dict_case() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    d = {"hist": [torch.ones(3)]}
    return (lambda x: torch.stack(d["hist"]).sum(0) + x), d, lambda s, i: s["hist"].append(_value(i))


class _Buffered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.memory = [torch.zeros(3)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.stack(self.memory).sum(0)


def _module_attribute_case() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    torch.manual_seed(0)
    m = _Buffered()
    return m, m.memory, _grow


CASES["a list of lists whose inner list grows"] = _nested_case
CASES["a list in a dict that grows"] = _list_in_dict_case
CASES["a module's list attribute that grows"] = _module_attribute_case


# The call itself changes the container, then reads it whole.
def _appends_to_a_global() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    namespace = {"torch": torch, "HISTORY": [torch.tensor(1.0)]}  # each case's own module globals
    exec("def f(x):\n    HISTORY.append(x.sum())\n    return torch.stack(HISTORY).sum()\n", namespace)
    return namespace["f"], namespace["HISTORY"], _nothing


def _appends_to_a_default_list() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    def f(x: torch.Tensor, acc: list[torch.Tensor] = []) -> torch.Tensor:
        acc.append(x * 2)
        return torch.cat(acc) + len(acc)
    return f, f.__defaults__, _nothing


def _extends_a_closure_list() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    xs = [torch.ones(3)]

    def f(x: torch.Tensor) -> torch.Tensor:
        xs.extend([x, x * 2])
        return torch.stack(xs).sum(0)
    return f, xs, _nothing


def _pops_then_stacks() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    xs = [torch.full((3,), float(k)) for k in range(8)]

    def f(x: torch.Tensor) -> torch.Tensor:
        last = xs.pop()
        return torch.stack(xs).sum(0) + last * x
    return f, xs, _nothing


def _sets_default_dict_items() -> tuple[Callable[..., Any], Any, Callable[[Any, int], None]]:
    def f(x: torch.Tensor, memo: dict[int, torch.Tensor] = {}) -> torch.Tensor:
        memo[len(memo)] = x + 1
        return sum(memo.values())
    return f, f.__defaults__, _nothing


CASES["appended to a global, then stacked"] = _appends_to_a_global
CASES["a mutable default list appended to, then cat"] = _appends_to_a_default_list
CASES["a closure list extended, then stacked"] = _extends_a_closure_list
CASES["popped, then stacked"] = _pops_then_stacks
CASES["a mutable default dict set, then summed"] = _sets_default_dict_items


def _comparable(state: Any) -> Any:
    return list(state) if isinstance(state, collections.deque) else state


@pytest.mark.parametrize("name", list(CASES))
def test_container_from_outside_matches_eager(name: str) -> None:
    eager_fn, eager_state, change = CASES[name]()
    jit_fn, jit_state, _ = CASES[name]()
    jitted = minijit.jit(jit_fn)
    for i in range(CALLS):
        x = _value(i, 0.5)
        want = eager_fn(x)
        got = jitted(x)
        assert_same(got, want, f"call {i}: result")
        assert_same(_comparable(jit_state), _comparable(eager_state), f"call {i}: state")
        change(eager_state, i)
        change(jit_state, i)


def test_replacing_an_item_reuses_the_trace() -> None:
    """A list read whole keeps its trace while its length stays (the items are inputs, read on every call)."""
    xs = [torch.ones(3), torch.full((3,), 2.0)]
    jf = minijit.jit(lambda x: torch.stack(xs).sum(0) + sum(xs) * x)
    for i in range(3):
        torch.testing.assert_close(jf(_value(i)), torch.stack(xs).sum(0) + sum(xs) * _value(i))
        _replace_first(xs, i)
    assert minijit.cache_info(jf).misses == 1


def test_gradients_flow_to_tensors_in_an_outside_list() -> None:
    """Leaves that require grad in a global list, summed natively: the jitted call's gradients are eager's."""
    def make() -> tuple[list[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
        ws = [torch.randn(3, generator=torch.Generator().manual_seed(k), requires_grad=True) for k in range(3)]
        return ws, lambda x: (sum(ws) * x).pow(2).sum() + functools.reduce(torch.mul, ws).sum()

    eager_ws, eager_fn = make()
    jit_ws, jit_fn = make()
    jitted = minijit.jit(jit_fn)
    for i in range(3):
        x = _value(i, 0.1)
        eager_fn(x).backward()
        jitted(x).backward()
        for k, (got, want) in enumerate(zip(jit_ws, eager_ws, strict=True)):
            torch.testing.assert_close(got.grad, want.grad, msg=lambda m, k=k: f"call {i}, ws[{k}].grad: {m}")


def test_a_list_changed_after_an_op_read_it() -> None:
    """The op sees the list as it was when called, not as the code left it (the trace keeps its own copy)."""
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        earlier = x * 2
        xs = [x]
        first = torch.stack(xs)
        xs.append(x * 3)
        second = torch.cat(xs)
        xs[0] = earlier
        return first, second, torch.stack(xs)

    jf = minijit.jit(f)
    for i in range(3):
        assert_same(jf(_value(i)), f(_value(i)), f"call {i}")


def test_a_symbolic_number_pushed_into_an_outside_heap_is_refused_as_a_number_not_a_tensor() -> None:
    # heapq runs natively: the push cannot be replayed on later calls, so it is refused, and the error says what
    # was stored (eager's heap holds the ints pushed).
    import heapq

    heap: list[int] = []

    def push(x: torch.Tensor, k: int) -> torch.Tensor:
        heapq.heappush(heap, k)
        return x * k

    jf = minijit.jit(push, cache="symbolic values")
    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"a symbolic number \(k, .*heappush"):
        jf(torch.ones(2), 3)
    assert heap == []  # the refused trace's push was undone


def test_native_code_that_changes_an_outside_list_or_dict_lands_on_every_call_as_in_eager() -> None:
    # heapq and bisect change the list they are given in C: no traced opcode logs the write. It is replayed as the
    # list's new contents (every element was guarded as they read it: a list that differs next time misses).
    import bisect
    import heapq

    def make(heap: list[int], ordered: list[int], counts: dict[str, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        def step(x: torch.Tensor) -> torch.Tensor:  # the containers are the closure's: from outside the call
            heapq.heappush(heap, 3)
            bisect.insort(ordered, 5)
            dict.update(counts, n=len(heap))
            return x + len(ordered)

        return step

    eager_state: list[Any] = [[], [1, 9], {}]
    jitted_state: list[Any] = [[], [1, 9], {}]
    step, jf = make(*eager_state), minijit.jit(make(*jitted_state))
    for _ in range(4):
        torch.testing.assert_close(jf(torch.ones(2)), step(torch.ones(2)))
        assert jitted_state == eager_state, (jitted_state, eager_state)
