"""Objects a jitted function reaches without taking them as arguments: a bound method's `self`, a
partial's arguments, class attributes, a config module, iterators, deques, OrderedDicts, returned inputs.
Each compared with eager over several calls, or refused with a MinijitError."""

from __future__ import annotations

import collections
import functools
import itertools
import types

import pytest
import torch

import minijit


class Scaler:
    def __init__(self) -> None:
        self.scale, self.w, self.calls = 2.0, torch.ones(2), 0

    def f(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.scale * self.w


def _changes(obj: Scaler) -> list:
    return [lambda: None, lambda: setattr(obj, "scale", 3.0), lambda: setattr(obj, "w", torch.full((2,), 5.0)),
            lambda: obj.w.mul_(2)]


def test_bound_method_reads_and_writes_self_like_eager() -> None:
    eager, traced = Scaler(), Scaler()
    jf = minijit.jit(traced.f)
    for change_eager, change_traced in zip(_changes(eager), _changes(traced)):
        change_eager()
        change_traced()
        torch.testing.assert_close(jf(torch.ones(2)), eager.f(torch.ones(2)))
    assert traced.calls == eager.calls


def test_partial_reads_its_bound_arguments_afresh() -> None:
    def g(x, st):
        return x * st["k"]

    state = {"k": 2.0}
    jg = minijit.jit(functools.partial(g, st=state))
    outs = []
    for k in (2.0, 3.0, 5.0):
        state["k"] = k
        outs.append(jg(torch.ones(1)))
    assert [o.item() for o in outs] == [g(torch.ones(1), {"k": k}).item() for k in (2.0, 3.0, 5.0)]


def test_class_attribute_counter_and_setting() -> None:
    class Counter:
        calls = 0
        scale = 2.0

    def f(x):
        Counter.calls += 1
        return x * Counter.calls * Counter.scale

    jf = minijit.jit(f)
    got = []
    for scale in (2.0, 2.0, 3.0):
        Counter.scale = scale
        got.append(jf(torch.ones(1)).item())
    want = [1 * 2.0, 2 * 2.0, 3 * 3.0]  # eager's values: calls counts 1, 2, 3
    assert got == want and Counter.calls == 3


def test_config_module_made_at_run_time_and_counter_on_type_of_self() -> None:
    cfg = types.ModuleType("settings")
    cfg.scale = 2.0

    class Counted(torch.nn.Module):
        calls = 0

        def forward(self, x):
            type(self).calls += 1
            return x * type(self).calls * cfg.scale

    jm = minijit.jit(Counted())
    got = []
    for scale in (2.0, 3.0, 3.0):
        cfg.scale = scale
        got.append(jm(torch.ones(1)).item())
    assert got == [1 * 2.0, 2 * 3.0, 3 * 3.0] and Counted.calls == 3  # eager's values


def test_outside_iterators_are_refused() -> None:
    it = iter([torch.ones(1), torch.ones(1)])
    count = itertools.count()
    with pytest.raises(minijit.UnsupportedSyntaxError, match="list_iterator it"):
        minijit.jit(lambda w: next(it) * w)(torch.ones(1))
    with pytest.raises(minijit.UnsupportedSyntaxError, match="count count"):
        minijit.jit(lambda w: w * sum(itertools.islice(count, 2)))(torch.ones(1))
    assert next(it) is not None and next(count) == 0  # nothing was advanced


def test_iterators_made_inside_are_fine() -> None:
    f = lambda w: w * next(iter([2.0, 3.0]))
    torch.testing.assert_close(minijit.jit(f)(torch.ones(1)), f(torch.ones(1)))


def test_appending_to_an_outside_deque() -> None:
    windows = [collections.deque(maxlen=2), collections.deque(maxlen=2)]

    def make(window):
        def f(x):
            loss = x.pow(2).mean()
            window.append(loss.detach())
            return loss
        return f

    eager, jf = make(windows[0]), minijit.jit(make(windows[1]))
    for i in range(3):
        x = torch.full((2,), float(i + 1))
        torch.testing.assert_close(jf(x), eager(x))
        assert [t.item() for t in windows[1]] == [t.item() for t in windows[0]]


def test_writing_into_outside_ordered_dict_and_dict_keys() -> None:
    od, feats, acc = collections.OrderedDict(a=1), {"h": torch.zeros(2)}, {"total": 0.0}

    def f(x):
        od["b"] = 2
        feats["h"] = x * 2
        loss = x.sum()
        acc["total"] += loss.item()
        return loss

    jf = minijit.jit(f)
    for i in range(3):
        jf(torch.full((2,), float(i)))
    assert list(od.items()) == [("a", 1), ("b", 2)]
    torch.testing.assert_close(feats["h"], torch.full((2,), 4.0))
    assert acc["total"] == sum(2.0 * i for i in range(3))


def test_formatting_a_value_known_only_at_run_time_is_refused() -> None:
    for f in (lambda x: str(x.sum().item()), lambda x: f"{x.sum().item():.3f}"):
        with pytest.raises(minijit.UnsupportedSyntaxError, match="only known when the trace runs"):
            minijit.jit(f)(torch.ones(2))


def test_returned_input_or_parameter_is_the_same_object() -> None:
    lin = torch.nn.Linear(2, 2)
    w = minijit.jit(lambda: lin.weight)()
    assert w is lin.weight and w.is_leaf
    x = torch.ones(2, requires_grad=True)
    same, doubled = minijit.jit(lambda t: (t, t * 2))(x)
    assert same is x
    torch.testing.assert_close(doubled, x * 2)


def test_assigning_grad_matches_eager_and_other_tensor_attributes_are_refused() -> None:
    lin, eager = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    minijit.jit(lambda: setattr(lin.weight, "grad", torch.ones_like(lin.weight) * 3))()
    setattr(eager.weight, "grad", torch.ones_like(eager.weight) * 3)
    torch.testing.assert_close(lin.weight.grad, eager.weight.grad)
    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"Parameter\.data"):
        minijit.jit(lambda: setattr(lin.bias, "data", torch.ones_like(lin.bias)))()
    assert not torch.equal(lin.bias, torch.ones_like(lin.bias))


def test_lazy_module_first_call_is_eager_then_traced() -> None:
    eager = torch.nn.Sequential(torch.nn.LazyLinear(3), torch.nn.ReLU())
    jm = minijit.jit(torch.nn.Sequential(torch.nn.LazyLinear(3), torch.nn.ReLU()))
    for i in range(3):
        x = torch.randn(2, 5)
        torch.manual_seed(i)  # the first call initialises the weights from the generator
        want = eager(x)
        torch.manual_seed(i)
        torch.testing.assert_close(jm(x), want)
    assert minijit.cache_info(jm).hits == 1


def test_python_attribute_set_on_an_outside_tensor_is_set_again_on_every_call() -> None:
    # The tensor is found afresh through its source on each call, as eager would find it.
    def run(fn):
        box = types.SimpleNamespace(t=torch.zeros(2))

        def f(x):
            box.t.note = x.shape[0]
            return x + 1

        fn = fn(f)
        fn(torch.ones(3))
        del box.t.note
        fn(torch.ones(3))
        replayed = box.t.note
        box.t = torch.zeros(4)
        fn(torch.ones(5))
        return replayed, box.t.note

    assert run(minijit.jit) == run(lambda f: f)


class _MappedConfig:
    """A config whose class reads every attribute through its own `__getattribute__` (as transformers' configs do,
    mapping old names to new): a guard reads its attributes from the instance dict, skipping that method."""

    aliases = {"width": "hidden"}

    def __init__(self, hidden: int, mode: str) -> None:
        self.hidden, self.mode, self.calls = hidden, mode, 0

    def __getattribute__(self, key: str) -> object:
        key = object.__getattribute__(self, "aliases").get(key, key)
        return object.__getattribute__(self, key)


class _WithConfig:
    def __init__(self, config: _MappedConfig) -> None:
        self.config = config

    def f(self, x: torch.Tensor) -> torch.Tensor:
        y = x[: self.config.width] * 2 if self.config.mode == "double" else x[: self.config.width] + 1
        return y * self.config.hidden


def test_a_config_with_its_own_getattribute_is_guarded_on_every_attribute_it_read() -> None:
    """Each change of a value the trace read (through the alias too) gives eager's result on the next call; a new
    config object with the same values serves from the cache with its own values."""
    eager, traced = _WithConfig(_MappedConfig(3, "double")), _WithConfig(_MappedConfig(3, "double"))
    jf = minijit.jit(traced.f)
    x = torch.arange(8.0)
    changes = [lambda o: None, lambda o: setattr(o.config, "hidden", 5), lambda o: setattr(o.config, "mode", "add"),
               lambda o: setattr(o, "config", _MappedConfig(4, "add")), lambda o: o.config.__dict__.pop("mode"),
               lambda o: setattr(o.config, "mode", "double")]
    for change in changes:
        change(eager)
        change(traced)
        try:
            want = eager.f(x)
        except AttributeError:
            with pytest.raises(AttributeError):
                jf(x)
            continue
        torch.testing.assert_close(jf(x), want, rtol=0, atol=0)
    assert "_own_dict(" in jf.last_prologue()  # the guard read the instance dict directly
