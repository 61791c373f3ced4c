"""Objects passed in, written and returned (a key/value cache): as eager leaves them, and one trace for new ones.

A plain object given to a jitted function is read afresh on each call (its tensors are trace
inputs), what the function writes into it is replayed after each call with that call's values
(a tensor attribute replaced, a list of layers growing, `index_copy_` into a preallocated buffer),
and returning it returns the object itself. A new object of the same class, in the same state,
reuses the trace (`cache_info(...).rebound`); one in another state, another module in its place,
or a changed object the function also reaches another way is a re-trace, never a wrong result.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
from torch import nn

import minijit


class Layer:
    """One layer of a growing cache: keys assigned anew on each update (as transformers' DynamicLayer)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None

    def update(self, k: torch.Tensor) -> torch.Tensor:
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=1)
        return self.keys


class GrowingCache:
    """Layers created on first use, appended to a list."""

    def __init__(self) -> None:
        self.layers: list[Layer] = []

    def update(self, i: int, k: torch.Tensor) -> torch.Tensor:
        while len(self.layers) <= i:
            self.layers.append(Layer())
        return self.layers[i].update(k)


class StaticBuffers:
    """Preallocated buffers written with `index_copy_` at the call's positions (as transformers' StaticLayer)."""

    def __init__(self, batch: int, length: int, width: int) -> None:
        self.keys = torch.zeros(batch, length, width)
        self.filled = torch.zeros((), dtype=torch.long)

    def update(self, positions: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(1, positions, k)
        self.filled.add_(k.shape[1])
        return self.keys


def attend(x: torch.Tensor, cache: GrowingCache) -> tuple[torch.Tensor, GrowingCache]:
    """Two layers of a toy attention over everything cached so far; returns the cache it was given."""
    for i in range(2):
        keys = cache.update(i, x * (i + 1))
        x = torch.softmax(x @ keys.transpose(1, 2), dim=-1) @ keys
    return x, cache


def attend_static(x: torch.Tensor, positions: torch.Tensor, cache: StaticBuffers) -> tuple[torch.Tensor, Any]:
    keys = cache.update(positions, x)
    return torch.softmax(x @ keys.transpose(1, 2), dim=-1) @ keys, cache


def _state(cache: Any) -> list[torch.Tensor]:
    if isinstance(cache, GrowingCache):
        return [layer.keys for layer in cache.layers]
    return [cache.keys, cache.filled]


def _steps(fn: Any, cache: Any, inputs: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    outs = []
    for args in inputs:
        out, returned = fn(*args, cache)
        assert returned is cache  # the very object, as eager returns it
        outs.append(out)
    return outs


def _generation(steps: int, seed: int) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3 if i == 0 else 1, 4, generator=g),) for i in range(steps)]


def test_growing_cache_matches_eager_and_new_caches_reuse_the_traces() -> None:
    jitted = minijit.jit(attend, cache="symbolic values")
    for generation in range(3):
        inputs = _generation(5, seed=generation)
        want_cache, have_cache = GrowingCache(), GrowingCache()
        want = _steps(attend, want_cache, inputs)
        have = _steps(jitted, have_cache, inputs)
        for h, w in zip(have, want, strict=True):
            torch.testing.assert_close(h, w)
        assert len(have_cache.layers) == len(want_cache.layers) == 2
        for h, w in zip(_state(have_cache), _state(want_cache), strict=True):
            torch.testing.assert_close(h, w)
    info = minijit.cache_info(jitted)
    # The first step (no layers yet) and the later steps (the keys grow) each trace once, for all generations.
    assert info.misses == 2, str(info)
    assert info.rebound == 4 and info.hits == 15 - 2 - 4, str(info)


def test_static_buffers_written_in_place_as_eager() -> None:
    jitted = minijit.jit(attend_static)
    for generation in range(2):
        g = torch.Generator().manual_seed(generation)
        inputs = [(torch.randn(2, 1, 4, generator=g), torch.tensor([i])) for i in range(4)]
        want_cache, have_cache = StaticBuffers(2, 4, 4), StaticBuffers(2, 4, 4)
        have_keys = have_cache.keys
        want = _steps(attend_static, want_cache, inputs)
        have = _steps(jitted, have_cache, inputs)
        for h, w in zip(have, want, strict=True):
            torch.testing.assert_close(h, w)
        assert have_cache.keys is have_keys  # written in place, as eager
        for h, w in zip(_state(have_cache), _state(want_cache), strict=True):
            torch.testing.assert_close(h, w)
    info = minijit.cache_info(jitted)
    assert (info.misses, info.rebound, info.hits) == (1, 1, 6), str(info)


def test_new_object_in_another_state_is_a_retrace() -> None:
    """A new cache whose guarded state differs (a layer already there) re-traces instead of reusing."""
    jitted = minijit.jit(attend, cache="symbolic values")
    x = torch.randn(2, 1, 4)
    _steps(jitted, GrowingCache(), [(x,)])
    warm_want, warm_have = GrowingCache(), GrowingCache()
    warm_want.update(0, x)
    warm_have.update(0, x.clone())
    want = _steps(attend, warm_want, [(x,)])
    have = _steps(jitted, warm_have, [(x,)])
    torch.testing.assert_close(have[0], want[0])
    info = minijit.cache_info(jitted)
    assert info.misses == 2 and info.rebound == 0, str(info)


class Scaler:
    """Holds a module; the function reads the module's attributes."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer


def scale(x: torch.Tensor, holder: Scaler) -> torch.Tensor:
    return holder.layer(x)


def test_another_module_in_a_new_object_is_a_retrace() -> None:
    torch.manual_seed(0)
    jitted = minijit.jit(scale)
    x = torch.randn(3, 4)
    torch.testing.assert_close(jitted(x, Scaler(nn.LeakyReLU(0.1))), nn.LeakyReLU(0.1)(x))
    torch.testing.assert_close(jitted(x, Scaler(nn.LeakyReLU(0.5))), nn.LeakyReLU(0.5)(x))
    info = minijit.cache_info(jitted)
    assert info.misses == 2 and info.rebound == 0, str(info)


class Model:
    """A bound method reading its own settings, given state that refers to the same settings object."""

    def __init__(self) -> None:
        self.settings = {"scale": 2.0}

    def step(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        return x * self.settings["scale"] + state.settings["scale"]


class State:
    def __init__(self, settings: dict[str, float]) -> None:
        self.settings = settings


def test_object_the_function_also_reaches_through_self_is_not_moved() -> None:
    model = Model()
    jitted = minijit.jit(model.step)
    x = torch.randn(3)
    torch.testing.assert_close(jitted(x, State(model.settings)), model.step(x, State(model.settings)))
    other = State({"scale": 2.0})  # equal values, another object
    torch.testing.assert_close(jitted(x, other), model.step(x, other))
    model.settings["scale"] = 5.0  # the model's own settings change: the function must see it
    torch.testing.assert_close(jitted(x, other), model.step(x, other))


def test_deep_copied_cache_reuses_the_trace() -> None:
    """A copy of a cache (as beam search reorders or a user forks a generation) is a new object in the same state."""
    jitted = minijit.jit(attend, cache="symbolic values")
    prompt, step = torch.randn(2, 3, 4), torch.randn(2, 1, 4)
    cache = GrowingCache()
    jitted(prompt, cache)
    jitted(step, cache)
    fork_have = copy.deepcopy(cache)
    fork_want = copy.deepcopy(cache)
    have, _ = jitted(step, fork_have)
    want, _ = attend(step, fork_want)
    torch.testing.assert_close(have, want)
    for h, w in zip(_state(fork_have), _state(fork_want), strict=True):
        torch.testing.assert_close(h, w)
    assert minijit.cache_info(jitted).rebound == 1, str(minijit.cache_info(jitted))


SETTINGS = {"scale": 2.0}


def shift(x: torch.Tensor, state: Any) -> torch.Tensor:
    return x * SETTINGS["scale"] + state.settings["scale"]


def test_object_the_function_also_reaches_through_a_global_is_not_moved() -> None:
    jitted = minijit.jit(shift)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(jitted(x, State(SETTINGS)), shift(x, State(SETTINGS)))
        other = State({"scale": 2.0})
        torch.testing.assert_close(jitted(x, other), shift(x, other))
        SETTINGS["scale"] = 5.0  # the global changes: the function must see it
        torch.testing.assert_close(jitted(x, other), shift(x, other))
    finally:
        SETTINGS["scale"] = 2.0


class Settings:
    def __init__(self, scale: float) -> None:
        self.scale = scale


OPTIONS = Settings(2.0)


def shift_by_options(x: torch.Tensor, state: Any) -> torch.Tensor:
    return x * OPTIONS.scale + state.settings.scale


def test_object_of_a_global_shared_with_the_argument_is_not_moved() -> None:
    jitted = minijit.jit(shift_by_options)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(jitted(x, State(OPTIONS)), shift_by_options(x, State(OPTIONS)))
        other = State(Settings(2.0))
        torch.testing.assert_close(jitted(x, other), shift_by_options(x, other))
        OPTIONS.scale = 5.0  # the global's attribute changes: the function must see it
        torch.testing.assert_close(jitted(x, other), shift_by_options(x, other))
    finally:
        OPTIONS.scale = 2.0


def test_an_entry_rebound_to_new_objects_compiles_no_new_prologue() -> None:
    """A new generation's cache reuses the traces (rebound) and the compiled prologue code: its checks name the
    new object's id through the prologue's own values, so the source is the one already compiled."""
    from minijit.runtime.checks import compiled_code

    jitted = minijit.jit(attend, cache="symbolic values")
    compiled = []
    for generation in range(3):
        inputs = _generation(4, seed=generation)
        want_cache, have_cache = GrowingCache(), GrowingCache()
        for h, w in zip(_steps(jitted, have_cache, inputs), _steps(attend, want_cache, inputs), strict=True):
            torch.testing.assert_close(h, w)
        compiled.append(compiled_code.cache_info().misses)
    assert minijit.cache_info(jitted).rebound == 4
    assert compiled[0] == compiled[1] == compiled[2]  # the later generations' rebinds compiled nothing


def test_a_rebound_entry_keeps_nothing_of_the_old_objects_and_reuses_the_checks_of_the_rest() -> None:
    """The rebound prologue starts from the old one's: the checks of what the function reads besides the cache stay
    as they were built, while each object of the old cache is replaced by its partner or dropped, never kept alive
    (its tensors would leak)."""
    import gc
    import weakref

    from minijit.frontend import guards as frontend_guards

    class Options:
        scale, shift = 2.0, 1.0

    options = Options()

    def attend_scaled(x: torch.Tensor, cache: GrowingCache) -> tuple[torch.Tensor, GrowingCache]:
        return attend(x * options.scale + options.shift, cache)

    jitted = minijit.jit(attend_scaled, cache="symbolic values")
    first = GrowingCache()
    inputs = _generation(3, seed=0)
    _steps(jitted, first, inputs)
    gone = [weakref.ref(first), *(weakref.ref(layer) for layer in first.layers)]
    built = []
    original = frontend_guards.guard_expression
    try:
        frontend_guards.guard_expression = lambda *a: built.append(a[2]) or original(*a)
        import minijit.runtime.checks as checks
        checks.guard_expression = frontend_guards.guard_expression
        for generation in (1, 2):
            have_cache, want_cache = GrowingCache(), GrowingCache()
            inputs = _generation(3, seed=generation)
            for h, w in zip(_steps(jitted, have_cache, inputs), _steps(attend_scaled, want_cache, inputs), strict=True):
                torch.testing.assert_close(h, w)
    finally:
        frontend_guards.guard_expression = checks.guard_expression = original
    info = minijit.cache_info(jitted)
    assert info.rebound == 4 and info.misses == 2, str(info)
    # Only the reads of the cache were built again, not those of the options.
    assert built and all(g.namespace is not options for g in built), [g.name for g in built]
    del first, inputs
    gc.collect()
    assert [r() for r in gone] == [None] * len(gone)


def test_the_tables_a_rebind_carries_are_those_made_afresh() -> None:
    """Each rebind replaces the old cache's objects in the prologue's environment through a table of the names bound
    to each object, and visits the guard's entries through a table of those that read each object, both carried
    from one rebind to the next (made once per entry): after many generations, they name every object of the cache
    where the environment binds it and the entries that read it, as tables made afresh do."""
    from minijit.runtime import rebind as rebinding

    jitted = minijit.jit(attend, cache="symbolic values")
    for generation in range(4):
        inputs = _generation(3, seed=generation)
        have_cache, want_cache = GrowingCache(), GrowingCache()
        for h, w in zip(_steps(jitted, have_cache, inputs), _steps(attend, want_cache, inputs), strict=True):
            torch.testing.assert_close(h, w)
    assert minijit.cache_info(jitted).rebound == 6
    entries = [e for held in jitted._entries.values() for e in held]
    carried = [(e.prologue.env_refs, e.prologue.guard_refs) for e in entries]
    assert all(names is not None and guards is not None for names, guards in carried)  # (carried, not made again)
    held = [have_cache, vars(have_cache), have_cache.layers, *have_cache.layers, *map(vars, have_cache.layers)]
    for entry, (names, guards) in zip(entries, carried, strict=True):
        env = entry.prologue.env
        entry.prologue.env_refs = entry.prologue.guard_refs = None
        fresh = rebinding._env_refs(entry.prologue)
        assert any(id(x) in fresh for x in held)  # (the last generation's objects, which the entries were moved to)
        # (names whose objects changed since are not the objects': the prologue's own functions, copies of values)
        now = {i: {n for n in bound if n in env and id(env[n]) == i} for i, bound in names.items()}
        assert [now.get(id(x), set()) for x in held] == [set(fresh.get(id(x), ())) for x in held]
        # The positions of the guard's entries that read each object: all of them (and the entries that compare a
        # value read with a copy of it, as the empty list of layers of a new cache, at the partner of the value).
        assert guards[0] is entry.capture.guards
        fresh_guards = rebinding._guard_refs(entry)
        assert any(id(x) in fresh_guards for x in held)  # (the guard's entries read the last generation's objects)
        assert all(set(guards[1].get(id(x), ())) >= set(fresh_guards.get(id(x), ())) for x in held)
        extra = {i for x in held for i in guards[1].get(id(x), ())} - {
            i for x in held for i in fresh_guards.get(id(x), ())}
        assert all(entry.capture.guards[i].value == [] for i in extra), extra


class Holder:
    """An object holding a callable: a closure, a function with defaults, or a partial."""

    def __init__(self, f: Any) -> None:
        self.f = f


def _closure(scale: float, add: bool) -> Any:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * scale if add else x - scale
    return f


def _with_default(k: int) -> Any:
    def f(x: torch.Tensor, k: int = k) -> torch.Tensor:
        return x + k
    return f


@pytest.mark.parametrize("make", [
    lambda i: _closure(2.0 + i, i % 2 == 0),  # one code, other closure cells
    lambda i: _with_default(i),  # one code, other defaults
    lambda i: functools.partial(torch.add, other=i),  # a partial: its state is not in its __dict__
    lambda i: [lambda x: x * 2, lambda x: x + 100][i % 2],  # other code
], ids=["closure", "defaults", "partial", "code"])
def test_a_new_object_holding_another_callable_runs_that_callable(make: Any) -> None:
    """An object passed anew whose function differs in its closure, defaults or code, or whose partial binds other
    arguments, is not a rebind of the old entry: the trace assumed those of the old callable (once a silent wrong
    answer: the first callable's result for every later one)."""
    def call(holder: Holder, x: torch.Tensor) -> torch.Tensor:
        return holder.f(x)

    jitted, x = minijit.jit(call), torch.ones(3)
    holders = [Holder(make(i)) for i in range(4)]
    for holder in holders:
        torch.testing.assert_close(jitted(holder, x), call(holder, x))


def _optimizer(seed: int, scheduled: bool) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    torch.manual_seed(seed)
    params = [torch.randn(4, 4, requires_grad=True) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(4, 4)
    opt = torch.optim.AdamW(params, lr=1e-2)
    if scheduled:  # wraps opt.step in a closure holding a weakref to opt
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    return opt, params


@pytest.mark.parametrize("scheduled", [False, True], ids=["plain", "lr-scheduler"])
def test_a_new_optimizer_keeps_its_state_under_its_own_parameters(scheduled: bool) -> None:
    """A second optimizer of the same kind reuses the trace (rebound), and its state is keyed by its own parameters,
    as eager's (once keyed by the first optimizer's: a silent wrong answer on its next step)."""
    def step(opt: torch.optim.Optimizer) -> None:
        opt.step()

    jitted, first = minijit.jit(step), _optimizer(0, scheduled)[0]
    with torch.no_grad():  # (as a training loop calls it: a step under grad mode has a backward part, never rebound)
        jitted(first)
    (opt, params), (eager_opt, eager_params) = _optimizer(1, scheduled), _optimizer(1, scheduled)
    for _ in range(3):
        with torch.no_grad():
            jitted(opt)
            step(eager_opt)
        assert [id(p) for p in opt.state] == [id(p) for p in params]
        for p, q in zip(params, eager_params, strict=True):
            torch.testing.assert_close(p, q)
            torch.testing.assert_close(opt.state[p]["exp_avg_sq"], eager_opt.state[q]["exp_avg_sq"])
    assert minijit.cache_info(jitted).rebound == 1, str(minijit.cache_info(jitted))


class Slot:
    def __init__(self) -> None:
        self.t = torch.zeros(3)


class Two:
    def __init__(self, a: Slot, b: Slot) -> None:
        self.a, self.b = a, b


@pytest.mark.parametrize("first_shared", [False, True], ids=["distinct-then-one", "one-then-distinct"])
def test_a_new_object_sharing_differently_is_not_a_rebind(first_shared: bool) -> None:
    """The trace wrote into `p.a` and then read `p.b`: two objects, or one. A new argument whose two places hold
    one object where the old held two (or two where it held one) reads what eager reads (once the value from
    before the write: a silent wrong answer)."""
    def write_then_read(p: Two, x: torch.Tensor) -> torch.Tensor:
        p.a.t = x * 2
        return p.b.t + 1

    def make(shared: bool) -> Two:
        a = Slot()
        return Two(a, a if shared else Slot())

    jitted, x, held = minijit.jit(write_then_read), torch.ones(3), []
    for shared in (first_shared, not first_shared, not first_shared):
        mine, eagers = make(shared), make(shared)
        held += [mine, eagers]
        torch.testing.assert_close(jitted(mine, x), write_then_read(eagers, x))
        torch.testing.assert_close(mine.a.t, eagers.a.t)
    assert minijit.cache_info(jitted).rebound == 1, str(minijit.cache_info(jitted))


def test_a_new_optimizer_with_state_already_matches_eager() -> None:
    """An optimizer stepped once (eagerly) before its first jitted step: its state's keys are its own parameters,
    compared by identity in the keys' guard of an entry traced on another optimizer in the same state."""
    def step(opt: torch.optim.Optimizer) -> None:
        opt.step()

    jitted, held = minijit.jit(step), []
    for seed in range(3):
        (opt, params), (eager_opt, eager_params) = _optimizer(seed, False), _optimizer(seed, False)
        held += [opt, eager_opt]
        with torch.no_grad():
            step(opt)
            step(eager_opt)
            for _ in range(2):
                jitted(opt)
                step(eager_opt)
        for p, q in zip(params, eager_params, strict=True):
            torch.testing.assert_close(p, q)
            torch.testing.assert_close(opt.state[p]["exp_avg"], eager_opt.state[q]["exp_avg"])
        assert [id(p) for p in opt.state] == [id(p) for p in params]


class Keyed:
    """An object used as a dict key, read through while iterating over the dict."""

    def __init__(self, n: int, t: torch.Tensor) -> None:
        self.n, self.t = n, t


class Table:
    def __init__(self, key: Keyed, linked: bool) -> None:
        self.by_key = {key: 1.0}
        if linked:  # the key also held as an attribute: a new table's key is paired with the old one's
            self.key = key


def weigh_by_keys(table: Table, x: torch.Tensor) -> torch.Tensor:
    for k in table.by_key:
        x = x * k.n + k.t
    return x


@pytest.mark.parametrize("linked", [False, True], ids=["key-only", "key-also-an-attribute"])
def test_an_object_met_as_a_key_is_read_afresh(linked: bool) -> None:
    """Eager reads `k.n` and `k.t` of each key on every call. The keys were guarded by identity only, their
    attributes not at all: a changed `k.n` on the same table, or a new table (rebound) with other keys' values,
    got the first call's numbers and tensor (a silent wrong answer)."""
    jitted, x = minijit.jit(weigh_by_keys), torch.ones(3)

    def tables(n: int) -> tuple[Table, Table]:
        return tuple(Table(Keyed(n, torch.full((3,), float(n))), linked) for _ in range(2))

    mine, eagers = tables(2)
    torch.testing.assert_close(jitted(mine, x), weigh_by_keys(eagers, x))
    for k in (*mine.by_key, *eagers.by_key):
        k.n, k.t = 5, torch.zeros(3)
    torch.testing.assert_close(jitted(mine, x), weigh_by_keys(eagers, x))
    for n in (3, 4):
        mine, eagers = tables(n)
        torch.testing.assert_close(jitted(mine, x), weigh_by_keys(eagers, x))
    if linked:
        assert minijit.cache_info(jitted).rebound >= 1, str(minijit.cache_info(jitted))


class Items:
    def __init__(self, n: int) -> None:
        self.items = [torch.full((2,), float(i)) for i in range(n)]


def shift_and_return_items(holder: Items, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return x + 1, holder.items


def test_a_returned_list_of_an_object_holds_what_it_holds_now() -> None:
    """Eager returns the object's list as it is at the call. The result was rebuilt from the items seen while
    tracing, unguarded: after an append (or for a new object with more items, rebound) minijit returned the old
    number of items (a silent wrong answer)."""
    jitted, x = minijit.jit(shift_and_return_items), torch.ones(2)
    holder = Items(2)
    for step in range(2):
        have, want = jitted(holder, x), shift_and_return_items(holder, x)
        assert len(have[1]) == len(want[1]) and all(h is w for h, w in zip(have[1], want[1], strict=True))
        holder.items.append(torch.full((2,), 9.0 + step))
    for n in (2, 4):
        fresh = Items(n)
        have, want = jitted(fresh, x), shift_and_return_items(fresh, x)
        assert len(have[1]) == len(want[1]) and all(h is w for h, w in zip(have[1], want[1], strict=True))


class TensorKeyed:
    """A dict keyed by a tensor the object also holds deeper down (where the trace does not find its source)."""

    def __init__(self, seed: int) -> None:
        t = torch.full((2,), float(seed))
        self.nested = ((t,),)
        self.by_tensor = {t: torch.ones(2)}


def weigh_by_tensor_keys(holder: TensorKeyed) -> torch.Tensor:
    acc = torch.zeros(2)
    for k, v in holder.by_tensor.items():
        acc = acc + k * v
    return acc


def test_a_tensor_key_the_trace_holds_as_a_constant_is_not_moved() -> None:
    """The trace holds the first object's key tensor as a constant. A rebind to a new object paired that key with
    the new one's but kept the constant (the first object's key: a silent wrong answer; before, the rebind raised
    comparing the keys). A constant of the old argument cannot move: the call is a miss, then a trace."""
    jitted = minijit.jit(weigh_by_tensor_keys)
    for seed in range(3):
        torch.testing.assert_close(jitted(TensorKeyed(seed)), weigh_by_tensor_keys(TensorKeyed(seed)))


def insert_and_return_items(holder: Items, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    holder.items.insert(0, x * 2)
    return x + 1, holder.items


def test_a_list_written_then_returned_holds_its_old_items_where_they_were() -> None:
    """Eager returns the object's list with the new item first and the old ones, the very tensors, after it. A
    returned old item was read from where it is after the trace's own insert (`items[1]` for the first), though
    the call reads it before replaying the insert: the wrong tensor, or an IndexError past the end."""
    jitted, x = minijit.jit(insert_and_return_items), torch.ones(2)
    for n in (1, 2, 2):
        mine, eagers = Items(n), Items(n)
        have, want = jitted(mine, x), insert_and_return_items(eagers, x)
        assert len(have[1]) == len(want[1]) == len(mine.items) == n + 1
        for h, w, m in zip(have[1], want[1], mine.items, strict=True):
            torch.testing.assert_close(h, w)
            assert h is m


def _plus_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1


class Scaled:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.fn = _plus_one


def store_a_closure(holder: Scaled, x: torch.Tensor) -> torch.Tensor:
    holder.fn = lambda t: t * holder.scale
    return x + 1


def test_a_function_the_trace_made_over_the_old_object_is_not_kept_by_a_rebind() -> None:
    """Eager stores a new lambda closing over the object it was given. The trace stores the lambda it made, whose
    cell holds the first object; a rebind to a new object (once the first no longer held that lambda) stored it
    into the new one: calling it read the first object's scale (a silent wrong answer)."""
    jitted, x = minijit.jit(store_a_closure), torch.ones(2)
    first = Scaled(2.0)
    jitted(first, x)
    first.fn = _plus_one  # the first object lets go of the lambda
    for scale in (3.0, 4.0):
        mine, eagers = Scaled(scale), Scaled(scale)
        torch.testing.assert_close(jitted(mine, x), store_a_closure(eagers, x))
        torch.testing.assert_close(mine.fn(x), eagers.fn(x))


def test_a_rebound_entry_writes_into_the_list_its_call_passed() -> None:
    """An entry whose trace appends to a list argument, rebound to a new object: the moved entry still finds the
    call's list (its call plan kept that its effects write into the arguments; it lost that, and the call raised)."""
    class Box:
        def __init__(self, scale: float) -> None:
            self.scale = scale

    def f(box: Box, out: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out.append(x * box.scale)
        return x + 1

    jitted = minijit.jit(f)
    x = torch.randn(3)
    for _ in range(3):
        have, want = [], []
        torch.testing.assert_close(jitted(Box(2.0), have, x), f(Box(2.0), want, x))
        assert len(have) == len(want) == 1
        torch.testing.assert_close(have[0], want[0])
    assert minijit.cache_info(jitted).rebound == 2, str(minijit.cache_info(jitted))


def _recipe_uses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The checks a rebind made from its recipe (`rebind._Recipe`: the old prologue's words reused), as made."""
    from minijit.runtime import rebind as rebinding

    made: list[Any] = []
    original = rebinding.moved_read_check
    monkeypatch.setattr(rebinding, "moved_read_check", lambda *a: made.append(a[1]) or original(*a))
    return made


def _same_as_eager(jitted: Any, have_cache: Any, want_cache: Any, inputs: list[Any]) -> None:
    """The jitted steps of `inputs` on `have_cache` equal eager's on `want_cache`, and so do the caches after."""
    for h, w in zip(_steps(jitted, have_cache, inputs), _steps(attend, want_cache, inputs), strict=True):
        torch.testing.assert_close(h, w)
    for h, w in zip(_state(have_cache), _state(want_cache), strict=True):
        torch.testing.assert_close(h, w)


def test_later_rebinds_follow_the_recipe_and_match_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second and later rebinds of an entry to a new cache of the same make reuse the words the first one
    checked (its recipe): every generation equals eager, each is two rebinds, and the recipe's checks read the
    generation's own objects."""
    made = _recipe_uses(monkeypatch)
    jitted = minijit.jit(attend, cache="symbolic values")
    for generation in range(6):
        inputs = _generation(4, seed=generation)
        have_cache, want_cache = GrowingCache(), GrowingCache()
        _same_as_eager(jitted, have_cache, want_cache, inputs)
        if generation >= 3:  # (the first rebind of each entry, in generation 1, makes its recipe)
            mine = {id(x) for x in (have_cache, vars(have_cache), have_cache.layers)}
            assert any(id(g.namespace) in mine or id(g.shadow) in mine for g in made), "no check of this cache"
        made.clear()
    info = minijit.cache_info(jitted)
    assert info.misses == 2 and info.rebound == 10 and info.decisions["rebind"] == 10, str(info)


class OtherLayer(Layer):
    """A layer of another type, holding the same state."""


def _other_count(cache: GrowingCache) -> None:
    cache.layers.append(Layer())


def _shared_layer(cache: GrowingCache) -> None:
    cache.layers[1] = cache.layers[0]


def _other_type(cache: GrowingCache) -> None:
    cache.layers[1].__class__ = OtherLayer


@pytest.mark.parametrize("change", [_other_count, _shared_layer, _other_type], ids=["count", "shared", "type"])
def test_a_cache_of_another_make_is_no_recipe_rebind(change: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After rebinds that made recipes, a new cache of another make before its decoding step (a third layer, one
    layer object at two places, a layer of another type) is not moved by the recipe: a miss, or a rebind whose
    every check was made again, equal to eager; the next cache of the usual make is a recipe rebind again."""
    made = _recipe_uses(monkeypatch)
    jitted = minijit.jit(attend, cache="symbolic values")
    for generation in range(3):
        inputs = _generation(3, seed=generation)
        _same_as_eager(jitted, GrowingCache(), GrowingCache(), inputs)
    inputs = _generation(3, seed=7)
    have_cache, want_cache = GrowingCache(), GrowingCache()
    _same_as_eager(jitted, have_cache, want_cache, inputs[:1])
    change(have_cache)
    change(want_cache)
    made.clear()
    info = minijit.cache_info(jitted)  # (the same object, updated: its counts are copied)
    misses, rebound = info.misses, info.rebound
    _same_as_eager(jitted, have_cache, want_cache, inputs[1:])
    assert info.misses > misses or (info.rebound > rebound and not made), str(info)
    rebinds = info.decisions["rebind"]
    inputs = _generation(3, seed=8)
    _same_as_eager(jitted, GrowingCache(), GrowingCache(), inputs)
    assert minijit.cache_info(jitted).decisions["rebind"] > rebinds


@pytest.mark.parametrize("same_value", [False, True], ids=["other-value", "same-value"])
def test_a_value_read_at_a_key_naming_the_object_is_read_at_the_new_one(same_value: bool) -> None:
    """The trace read `table[(obj, 0)]`: a tuple key naming the argument object. A new object of the same kind reads
    the value at its own key, as eager does (the guard entry was left with the old object's key, the table's entry
    for it still held: the old value, silently)."""
    class Obj:
        pass

    table: dict[tuple[Any, int], float] = {}

    def f(obj: Obj, x: torch.Tensor) -> torch.Tensor:
        return x * table[(obj, 0)]

    jitted = minijit.jit(f)
    x = torch.randn(3)
    for i in range(3):
        obj = Obj()
        table[(obj, 0)] = 2.0 if same_value else 2.0 + i
        torch.testing.assert_close(jitted(obj, x), f(obj, x))


class Options:
    """An object holding a dict of settings that the function asks for membership, then reads."""

    def __init__(self, **settings: Any) -> None:
        self.settings = dict(settings)


def scaled_by_option(x: torch.Tensor, options: Options) -> torch.Tensor:
    if "scale" in options.settings:
        return x * options.settings["scale"]
    return x - 1


@pytest.mark.parametrize("scale", [torch.tensor(3.0), 3.0])
def test_a_new_object_without_the_key_its_entry_read_is_no_hit(scale: Any) -> None:
    # The guard reads `settings["scale"]` and leaves out `"scale" in settings`, which that read implies; moved to a new
    # object whose dict lacks the key, the read fails: a miss, as eager takes the other branch.
    jitted = minijit.jit(scaled_by_option)
    x = torch.randn(3)
    torch.testing.assert_close(jitted(x, Options(scale=scale)), scaled_by_option(x, Options(scale=scale)))
    torch.testing.assert_close(jitted(x, Options(scale=scale)), scaled_by_option(x, Options(scale=scale)))
    assert minijit.cache_info(jitted).rebound == 1
    torch.testing.assert_close(jitted(x, Options()), scaled_by_option(x, Options()))
    torch.testing.assert_close(jitted(x, Options(scale=scale)), scaled_by_option(x, Options(scale=scale)))
    info = minijit.cache_info(jitted)
    assert info.misses == 2 and info.rebound == 2, str(info)
