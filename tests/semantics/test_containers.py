"""Containers in and out of a jitted call: rebuilt exactly, afresh on every call, never holding a proxy."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple

import pytest
import torch
import torch.utils._pytree as torch_pytree

import minijit
from minijit.ir.containers import contains_proxy
from tests.semantics.util import assert_same_as_eager


@dataclasses.dataclass
class Output:
    value: torch.Tensor
    aux: torch.Tensor
    note: str = "ok"


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    b: int


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


class AttrDict(dict):
    """A dict subclass that also keeps attributes, like Hugging Face's ModelOutput."""


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    weight: float = 1.0


class Registered:
    """A user type registered with torch.utils._pytree."""

    def __init__(self, tensors: list[torch.Tensor], tag: str):
        self.tensors = tensors
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Registered) and self.tag == other.tag
                and all(torch.equal(a, b) for a, b in zip(self.tensors, other.tensors)))


torch_pytree.register_pytree_node(
    Registered, lambda r: (r.tensors, r.tag), lambda values, tag: Registered(list(values), tag))


def _stateless(step: Any) -> Any:
    return lambda: (step, lambda: None)


def _x(i: int) -> tuple[torch.Tensor]:
    return (torch.randn(3, 4) + i,)


RESULTS = {
    "dataclass": lambda x: Output(x.sin(), x.sum(dim=0)),
    "frozen dataclass": lambda x: Frozen(x * 2, 7),
    "named tuple": lambda x: Pair(x.cos(), x + 1),
    "OrderedDict": lambda x: collections.OrderedDict(b=x.exp(), a=x.relu()),
    "defaultdict": lambda x: collections.defaultdict(list, {"k": [x, x * 3]}),
    "dict subclass with attributes": lambda x: _attr_dict(x),
    "dict with non-str keys": lambda x: {0: x + 1, (1, "t"): [x.tanh(), {"deep": x.abs()}]},
    "pytree-registered type": lambda x: Registered([x.neg(), x.square()], "r"),
    "nested containers": lambda x: (Output(x, x.t().contiguous()), [Pair(x, x * 0.5)], {"d": Frozen(x.mean(), 1)}),
}


def _attr_dict(x: torch.Tensor) -> AttrDict:
    out = AttrDict(logits=x * 2)
    out.loss = x.mean()
    return out


@pytest.mark.parametrize("name", list(RESULTS))
def test_result_container_is_rebuilt_each_call(name):
    jitted = assert_same_as_eager(_stateless(RESULTS[name]), _x)
    first = jitted(torch.ones(3, 4))
    second = jitted(torch.ones(3, 4))
    assert first is not second and not contains_proxy(first)


def test_results_are_fresh_objects():
    jitted = minijit.jit(lambda x: Output(x * 2, x + 1))
    first = jitted(torch.ones(2))
    first.value.add_(100)  # the user mutates a result ...
    first.note = "changed"
    second = jitted(torch.ones(2))  # ... which must not leak into the next call
    torch.testing.assert_close(second.value, torch.full((2,), 2.0))
    assert second.note == "ok"


def test_hugging_face_model_output_is_rebuilt():
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")

    def step(x):
        return modeling_outputs.CausalLMOutput(loss=x.sum(), logits=x * 2)

    jitted = assert_same_as_eager(_stateless(step), _x)
    out = jitted(torch.ones(3, 4))
    assert out["logits"] is out.logits and out.to_tuple()[0] is out.loss


ARGUMENTS = {
    "dataclass": (lambda b: b.x * b.weight + b.y, lambda i: (Batch(torch.randn(3), torch.randn(3), 2.0),)),
    "named tuple": (lambda p: p.first @ p.second, lambda i: (Pair(torch.randn(2, 3), torch.randn(3, 2)),)),
    "OrderedDict": (lambda d: d["a"] - d["b"], lambda i: (collections.OrderedDict(a=torch.randn(2), b=torch.randn(2)),)),
    "dict subclass": (lambda d: d["a"] * 3, lambda i: (AttrDict(a=torch.randn(4)),)),
    "pytree-registered type": (lambda r: r.tensors[0] + r.tensors[1], lambda i: (Registered([torch.randn(2)] * 2, "t"),)),
}


@pytest.mark.parametrize("name", list(ARGUMENTS))
def test_argument_container_is_flattened(name):
    step, inputs = ARGUMENTS[name]
    jitted = assert_same_as_eager(_stateless(step), inputs)
    assert minijit.cache_info(jitted).misses == 1  # same structure and values: one trace


def test_a_changed_field_of_a_dataclass_argument_retraces():
    jitted = minijit.jit(lambda b: b.x * b.weight)
    x = torch.randn(3)
    for w in (1.0, 2.0, 3.0):
        torch.testing.assert_close(jitted(Batch(x, x, w)), x * w)
    assert "b.weight" in str(minijit.cache_info(jitted))


def test_mutating_a_dataclass_argument_is_refused():
    def step(b):
        b.x = b.x * 2
        return b.y

    with pytest.raises(minijit.UnsupportedSyntaxError, match="modified the Batch passed as argument 'b'"):
        minijit.jit(step)(Batch(torch.randn(2), torch.randn(2)))


class Holder:
    def __init__(self, t):
        self.t = t


class Layer:
    """A plain object holding tensors, created by the function (like transformers' DynamicLayer)."""

    def __init__(self, keys, values):
        self.keys, self.values, self.ready = keys, values, True


class Cache:
    """Plain objects in a list in a plain object, created by the function (like transformers' DynamicCache)."""

    def __init__(self, config):
        self.config = config  # an object from outside: kept as it is
        self.layers = []

    def update(self, k, v):
        self.layers.append(Layer(k, v))


class Config:
    depth = 2


def _cache_step(x, config):
    cache = Cache(config)
    for i in range(config.depth):
        cache.update(x * i, x.exp() + i)
    return Output(x.sum(), cache.layers[-1].keys), cache


def test_objects_the_function_creates_are_rebuilt_each_call():
    config = Config()
    jitted = minijit.jit(_cache_step)
    results = [jitted(torch.randn(3, 2), config) for _ in range(2)]
    assert results[0][1] is not results[1][1] and minijit.cache_info(jitted).hits == 1
    for x in (torch.randn(3, 2), torch.randn(3, 2)):
        (out, cache), (want_out, want_cache) = jitted(x, config), _cache_step(x, config)
        assert type(cache) is Cache and cache.config is config and not contains_proxy(cache)
        torch.testing.assert_close(out.aux, want_out.aux)
        assert [type(layer) for layer in cache.layers] == [Layer, Layer]
        for got, want in zip(cache.layers, want_cache.layers):
            torch.testing.assert_close((got.keys, got.values), (want.keys, want.values))
            assert got.ready is True
    assert results[0][1].layers[0] is not results[1][1].layers[0]


def test_a_proxy_in_an_object_minijit_cannot_rebuild_is_refused():
    class CopiesItself(Holder):
        def __copy__(self):  # a copy protocol of its own: minijit does not guess how to rebuild it
            return CopiesItself(self.t)

    with pytest.raises(minijit.MinijitError, match="holds a traced tensor inside a CopiesItself"):
        minijit.jit(lambda x: CopiesItself(x * 2))(torch.randn(2))


def test_a_created_object_in_a_cycle_with_a_tensor_is_refused():
    def step(x):
        h = Holder(x * 2)
        h.me = h
        return h

    with pytest.raises(minijit.MinijitError, match="holds a traced tensor inside a Holder"):
        minijit.jit(step)(torch.randn(2))
