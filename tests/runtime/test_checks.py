"""One list of checks per cache entry: the printed prologue is the code that runs, the fast key, the general
check and the cache agree on every call, and a miss names the first check that failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.runtime.arguments import flat_inputs
from minijit.runtime.cache_key import POSITIONAL_TENSOR_KEYS, POSITIONAL_TENSOR_SYMBOLIC_KEYS, cache_key

MODES = ("constant values", "symbolic values")
SCALE = 2.0
BIAS = torch.ones(3)


def _scaled(x, y, k):
    return x * k + y * SCALE


def _with_global_tensor(x, y):
    return x @ y + BIAS


def _in_place(a, b):
    a.mul_(2)
    return a + b


def _r(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


_SHARED = torch.randn(3, 3)
# (function, the first call's arguments, then variants: a name, the arguments, what to change around the call)
CASES: list[tuple[Callable[..., Any], tuple[Any, ...], list[tuple[str, Callable[[], tuple[Any, ...]], str | None]]]] = [
    (_scaled, (_r(3, 4), _r(3, 4), 2.0), [
        ("same", lambda: (_r(3, 4), _r(3, 4), 2.0), None),
        ("other size", lambda: (_r(5, 4), _r(5, 4), 2.0), None),
        ("size one", lambda: (_r(1, 4), _r(3, 4), 2.0), None),
        ("other rank", lambda: (_r(3, 4, 1), _r(3, 4, 1), 2.0), None),
        ("other dtype", lambda: (_r(3, 4, dtype=torch.float64), _r(3, 4), 2.0), None),
        ("requires grad", lambda: (_r(3, 4, grad=True), _r(3, 4), 2.0), None),
        ("other number", lambda: (_r(3, 4), _r(3, 4), 3.0), None),
        ("int number", lambda: (_r(3, 4), _r(3, 4), 2), None),
        ("global changed", lambda: (_r(3, 4), _r(3, 4), 2.0), "SCALE"),
    ]),
    (_with_global_tensor, (_r(2, 3), _r(3, 3)), [
        ("same", lambda: (_r(2, 3), _r(3, 3)), None),
        ("other size", lambda: (_r(4, 3), _r(3, 3)), None),
        ("captured tensor resized", lambda: (_r(2, 3), _r(3, 3)), "BIAS"),
    ]),
    (_in_place, (_r(3, 3), _r(3, 3)), [
        ("same", lambda: (_r(3, 3), _r(3, 3)), None),
        ("aliased", lambda: (_SHARED, _SHARED), None),
        ("other size", lambda: (_r(4, 4), _r(4, 4)), None),
    ]),
]


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments cloned, aliasing kept (the same tensor twice stays one tensor)."""
    seen: dict[int, Any] = {}
    return tuple(seen.setdefault(id(a), a.detach().clone().requires_grad_(a.requires_grad))
                 if isinstance(a, torch.Tensor) else a for a in args)


def _final_trace(jf: Any) -> str:
    return minijit.last_traces(jf)[-1].python()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=[fn.__name__ for fn, _, _ in CASES])
def test_key_general_check_cache_and_retracing_agree(mode: str, case: int) -> None:
    global SCALE, BIAS
    fn, first, variants = CASES[case]
    symbolic = mode == "symbolic values"
    fast_keys = POSITIONAL_TENSOR_SYMBOLIC_KEYS if symbolic else POSITIONAL_TENSOR_KEYS
    for name, make, change in variants:
        jf = minijit.jit(fn, cache=mode)
        first_args = _clone(first)
        jf(*first_args)
        entry = jf._last
        traced = _final_trace(jf)
        prologue = entry.prologue
        # The key holds exactly what the entry's keyed checks expect.
        keyed = tuple(v for c in prologue.checks if c.keyed for v in c.key_values())
        assert cache_key(first_args, {}, symbolic) == keyed
        saved = SCALE, BIAS
        try:
            if change == "SCALE":
                SCALE = 5.0
            elif change == "BIAS":
                BIAS = torch.ones(1)
            args = make()
            same_key = cache_key(args, {}, symbolic) == cache_key(first_args, {}, symbolic)
            assert prologue.check_call(*args) == same_key, name
            if all(type(a) is torch.Tensor for a in args):
                assert (fast_keys[len(args)](*args) == fast_keys[len(args)](*first_args)) == same_key, name
            holds = prologue.holds(args, {}, flat_inputs(args, {}, symbolic))
            hits = minijit.cache_info(jf).hits
            got = jf(*_clone(args))
            torch.testing.assert_close(got, fn(*_clone(args)))
            assert (minijit.cache_info(jf).hits == hits + 1) == holds, name
            fresh = minijit.jit(fn, cache=mode)
            fresh(*_clone(args))
            if holds:  # no wrong hit: re-tracing this call gives the trace the entry holds
                assert _final_trace(fresh) == traced, name
            elif name != "same":
                # every variant here changes something a trace depends on
                assert minijit.cache_info(jf).miss_reasons[-1] != "a guard failed", name
        finally:
            SCALE, BIAS = saved
        if name == "same":
            assert holds


def test_the_printed_prologue_is_the_source_that_runs() -> None:
    jf = minijit.jit(_scaled, cache="symbolic values")
    jf(_r(3, 4), _r(3, 4), 2.0)
    printed = jf.last_prologue()
    code = compile(printed, "<printed prologue>", "exec")  # valid Python
    compiled = {c.co_name: c for c in code.co_consts if hasattr(c, "co_code")}
    entry = jf._last
    assert entry.guard is not None and entry.guard.__minijit_source__ == printed
    assert compiled["guard"].co_code == entry.guard.__code__.co_code
    assert compiled["check_call"].co_code == entry.prologue.check_call.__code__.co_code
    assert "assert" not in printed and "<the" not in printed


def test_a_module_prologue_compiles_and_checks_its_state() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    jm = minijit.jit(model)
    x = torch.randn(2, 4)
    jm(x)
    printed = jm.last_prologue()
    compile(printed, "<printed prologue>", "exec")
    model.eval()
    torch.testing.assert_close(jm(x), model(x))
    assert minijit.cache_info(jm).miss_reasons[1].startswith("self.training: value False (bool) != True (bool)")


@pytest.mark.parametrize("mode", MODES)
def test_the_explanation_names_the_first_failing_check(mode: str) -> None:
    jf = minijit.jit(_scaled, cache=mode)
    jf(_r(3, 4), _r(3, 4), 2.0)
    # Both the dtype and requires_grad of x, and y's dtype, changed: x's dtype comes first in the list.
    jf(_r(3, 4, dtype=torch.float64, grad=True), _r(3, 4, dtype=torch.float64), 2.0)
    reasons = minijit.cache_info(jf).miss_reasons[1].split("; ")
    assert reasons[0] == "arg 'x': dtype float64 != float32"
    assert reasons[1:] == ["arg 'x': requires_grad True != False", "arg 'y': dtype float64 != float32"]


def test_a_constraint_that_is_a_disjunction_is_checked_whole_among_the_others() -> None:
    # The guard joins its tests with `and`: a constraint `A or B` must not let a call that fails another
    # constraint through (`C and A or B` is `(C and A) or B`).
    from minijit.runtime.checks import Prologue, guard_checks

    env: dict[str, Any] = {}
    checks = guard_checks(["x.shape[0] == 2", "(x.shape[1] == 1) or (x.shape[1] >= 2)"], [], [], None, ["x"], env)
    prologue = Prologue("disjunction", ["x"], (), checks, ["x"], [], env)
    assert prologue.guard(torch.ones(2, 3)) is True
    assert prologue.guard(torch.ones(5, 3)) is False


_TABLE = torch.arange(12.0)


def _sliced_by_a_parameter_named_like_a_shape(x, x_shape):
    if x_shape > 2:
        return x[:x_shape] * 2
    return x[:x_shape] + 1


def _sliced_by_a_parameter_named_like_a_captured_shape(x, n, _TABLE_shape):
    return x[:n] * _TABLE[:_TABLE_shape].sum()


@pytest.mark.parametrize("fn", [_sliced_by_a_parameter_named_like_a_shape,
                                _sliced_by_a_parameter_named_like_a_captured_shape])
@pytest.mark.parametrize("mode", ["automatic", "symbolic values"])
def test_a_parameter_named_like_the_guards_shape_local_is_its_own_value(fn: Callable[..., Any], mode: str) -> None:
    """The guard reads each tensor's sizes once into a local (`x_shape = x.shape`, and so for a tensor read from
    outside): a parameter of that name (`x_shape`, `_TABLE_shape`) keeps its own value in the guard's tests, and
    the entry traced with symbolic values serves the later calls."""
    jf = minijit.jit(fn, cache=mode)
    x = torch.arange(10.0)
    for n, m in ((5, 3), (3, 4), (7, 5), (4, 6), (6, 7)):
        torch.testing.assert_close(jf(x, n, m) if fn.__code__.co_argcount == 3 else jf(x, n),
                                   fn(x, n, m) if fn.__code__.co_argcount == 3 else fn(x, n), rtol=0, atol=0)
    assert minijit.cache_info(jf).misses <= 2


class _Holder:
    pass


_HOLDER = _Holder()


def _reads_an_attribute_named_like_the_guards_local(y):
    return y * _HOLDER._x * _HOLDER.k


def test_a_tensor_read_from_outside_named_like_the_guards_read_local_keeps_its_entry():
    """A guard's test reads a value into a local to check its type, then its value; a tensor read from outside is
    fetched into a local named after its attribute (`_x`). The two must not share a name: the read of `k` replaced
    the tensor, the tensor's check failed, and every call traced again ("a guard failed")."""
    _HOLDER._x, _HOLDER.k = torch.ones(3), 2
    jf = minijit.jit(_reads_an_attribute_named_like_the_guards_local)
    for k in (2, 2, 2, 3, 3):
        _HOLDER.k = k
        y = torch.randn(3)
        torch.testing.assert_close(jf(y), _reads_an_attribute_named_like_the_guards_local(y), rtol=0, atol=0)
    assert minijit.cache_info(jf).misses <= 2


SETTINGS: dict[str, Any] = {}


def scaled_if_set(x):
    if "scale" in SETTINGS:
        return x * SETTINGS["scale"]
    return x + 1


def test_a_membership_test_implied_by_the_item_read_is_left_out_and_its_removal_still_misses() -> None:
    # `"scale" in SETTINGS` then `SETTINGS["scale"]`: the guard's read of the item, finding that object, implies the
    # membership; the key gone, that read fails too (a miss, traced again, as eager sees the key gone).
    scale = torch.tensor(3.0)
    SETTINGS["scale"] = scale
    jf = minijit.jit(scaled_if_set)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), scaled_if_set(x))
    prologue = jf.last_prologue()
    assert "'scale' in _ns" not in prologue and "'scale'" in prologue, prologue
    SETTINGS.pop("scale")
    torch.testing.assert_close(jf(x), scaled_if_set(x))
    assert minijit.cache_info(jf).misses == 2
    SETTINGS["scale"] = 2.0  # another value under the key: a number, checked by its value
    torch.testing.assert_close(jf(x), scaled_if_set(x))
