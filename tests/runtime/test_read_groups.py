"""A guard's checks of values read from dicts, made once per change of the dict (minijit/runtime/read_groups.py):
every change between calls is still seen, as eager sees it, after hits that kept the dict's version."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch

import minijit
from minijit.runtime import read_groups

CONFIG: dict[str, Any] = {}
ORDER: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()


class Holder:
    """An object whose attributes a function reads (two of them objects, checked by identity)."""

    def __init__(self) -> None:
        self.weight = torch.randn(3)
        self.scale = 2.0
        self.act = torch.tanh
        self.norm = torch.sigmoid


def from_config(x: torch.Tensor) -> torch.Tensor:
    return CONFIG["act"](x * CONFIG["scale"]) + CONFIG["bias"]


def from_holder(x: torch.Tensor, h: Holder) -> torch.Tensor:
    return h.norm(h.act(x * h.scale) + h.weight)


def from_order(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x * t for t in ORDER.values()])


def _same(jitted: Any, fn: Any, *args: Any) -> None:
    torch.testing.assert_close(jitted(*args), fn(*args))


def test_a_config_dict_changed_after_hits_is_seen() -> None:
    CONFIG.clear()
    CONFIG.update(act=torch.tanh, scale=2.0, bias=torch.randn(3))
    jitted, x = minijit.jit(from_config), torch.randn(3)
    for _ in range(3):
        _same(jitted, from_config, x)
    assert ("_dict_version" in jitted.last_prologue()) == (read_groups.DICT_VERSIONS is not None)
    for change in (lambda: CONFIG.update(scale=3.0), lambda: CONFIG.update(act=torch.sigmoid),
                   lambda: CONFIG.update(bias=torch.randn(3)), lambda: CONFIG.update(scale=3)):
        change()
        for _ in range(2):
            _same(jitted, from_config, x)
    CONFIG.pop("bias")
    with pytest.raises(KeyError):
        jitted(x)


def test_an_objects_attributes_changed_after_hits_are_seen() -> None:
    h, x = Holder(), torch.randn(3)
    jitted = minijit.jit(from_holder)
    for _ in range(3):
        _same(jitted, from_holder, x, h)
    for change in (lambda: setattr(h, "act", torch.relu), lambda: setattr(h, "scale", -1.0),
                   lambda: setattr(h, "norm", torch.tanh), lambda: setattr(h, "weight", torch.randn(3)),
                   lambda: h.__dict__.update(scale=5.0)):
        change()
        for _ in range(2):
            _same(jitted, from_holder, x, h)
    del h.norm
    with pytest.raises(AttributeError):
        jitted(x, h)


def test_an_ordered_dict_reordered_after_hits_is_seen() -> None:
    # `move_to_end` changes an OrderedDict's order and not its version: its keys' order is checked one by one.
    ORDER.clear()
    ORDER.update(a=torch.tensor(1.0), b=torch.tensor(2.0), c=torch.tensor(3.0))
    jitted, x = minijit.jit(from_order), torch.randn(2)
    for _ in range(3):
        _same(jitted, from_order, x)
    ORDER.move_to_end("a")
    _same(jitted, from_order, x)


@pytest.mark.skipif(read_groups.DICT_VERSIONS is None,
                    reason="no dict versions read here (CPython's own are read on Python 3.11 only)")
def test_every_change_of_a_dict_or_an_instances_attributes_takes_a_new_version() -> None:
    version = read_groups.DICT_VERSIONS
    h = Holder()
    d = h.__dict__
    plain: dict[Any, Any] = {"a": 1}
    changes = [lambda: setattr(h, "scale", 3.0), lambda: setattr(h, "new", 1), lambda: delattr(h, "new"),
               lambda: d.update(scale=4.0), lambda: d.pop("scale"), lambda: d.setdefault("scale", 1.0),
               lambda: plain.__setitem__("a", 2), lambda: plain.__setitem__("b", 2), lambda: plain.pop("b"),
               lambda: plain.popitem(), lambda: plain.update(c=1), lambda: plain.clear(),
               lambda: plain.setdefault("d", 1)]
    seen = set()
    for change in changes:
        before = (version(d), version(plain))
        change()
        after = (version(d), version(plain))
        assert before != after
        seen.update(after)
    assert len(seen) > len(changes)  # (no version taken twice)
