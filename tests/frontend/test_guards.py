"""Guards: what the interpreter records as read, and the compiled check flipping when a value changes."""

from __future__ import annotations

import types

import pytest
import torch

from minijit.frontend import build_guard, interpret
from minijit.frontend.guards import GuardEntry
from minijit.ir import TensorProxy, Trace, tracing

SOURCE = '''
import torch

SCALE = 2
NAMES = ["a", "b"]
MODE = "fast"

def helper(x):
    return x * SCALE

def f(x):
    if MODE == "fast" and len(NAMES) == 2:
        return torch.tanh(helper(x))
    return x

def make_closure(k):
    def g(x):
        return x * k
    def set_k(v):
        nonlocal k
        k = v
    return g, set_k

def reads_module(x):
    return x * cfg.FACTOR

class Config:
    mode = "train"

    def __init__(self):
        self.scale = 2.0
        self.inner = Inner()

class Inner:
    def __init__(self):
        self.bias = 1

CONFIG = Config()

def reads_attributes(x):
    if CONFIG.mode == "train" and Config.mode == "train":
        return x * CONFIG.scale + CONFIG.inner.bias
    return x

def reads_local_object(x):
    c = Config()
    return x * c.scale
'''


def _module():
    namespace: dict = {"__name__": "user_module"}
    exec(compile(SOURCE, "user_module.py", "exec"), namespace)
    return namespace


def _guards_of(fn, *args):
    trace, entries = Trace(), []
    with tracing(trace):
        proxies = [TensorProxy((2,), torch.float32, torch.device("cpu")) for _ in args]
        interpret(fn, tuple(proxies), {}, guards=entries)
    return entries


def test_records_globals_builtins_not_proxies():
    g = _module()
    entries = _guards_of(g["f"], "x")
    recorded = {(e.kind, e.name) for e in entries}
    assert {("global", "MODE"), ("global", "NAMES"), ("global", "SCALE"), ("global", "helper"), ("global", "torch"),
            ("builtin", "len")} <= recorded
    assert all(isinstance(e, GuardEntry) and not isinstance(e.value, TensorProxy) for e in entries)
    assert "SCALE" in str(next(e for e in entries if e.name == "SCALE"))


@pytest.mark.parametrize("change", [
    lambda g: g.__setitem__("SCALE", 3),
    lambda g: g.__setitem__("SCALE", 2.0),  # equal, but another type
    lambda g: g.__setitem__("SCALE", True),
    lambda g: g.__setitem__("MODE", "slow"),
    lambda g: g["NAMES"].append("c"),  # mutated in place
    lambda g: g.__setitem__("helper", lambda x: x),
    lambda g: g.__setitem__("torch", types.SimpleNamespace()),
    lambda g: g.__setitem__("len", lambda x: 2),  # a global now shadows the builtin
    lambda g: g.__delitem__("SCALE"),
])
def test_guard_flips_when_a_read_value_changes(change):
    g = _module()
    check = build_guard(_guards_of(g["f"], "x"))
    assert check is not None and check() is True
    change(g)
    assert check() is False


def test_guard_holds_for_equal_rebinding():
    g = _module()
    check = build_guard(_guards_of(g["f"], "x"))
    g["SCALE"] = 1 + 1
    g["NAMES"] = ["a", "b"]
    g["unrelated"] = 5
    assert check() is True


def test_closure_cells_are_guarded():
    g = _module()
    fn, set_k = g["make_closure"](3)
    entries = _guards_of(fn, "x")
    assert [(e.kind, e.name, e.value) for e in entries] == [("cell", "k", 3)]
    check = build_guard(entries)
    assert check()
    set_k(4)
    assert not check()
    set_k(3)
    assert check()


def test_user_module_attributes_are_guarded():
    g = _module()
    cfg = types.ModuleType("cfg")
    cfg.__file__ = "/nonexistent/user/cfg.py"
    cfg.FACTOR = 5
    g["cfg"] = cfg
    check = build_guard(_guards_of(g["reads_module"], "x"))
    assert check()
    cfg.FACTOR = 6
    assert not check()


def test_cells_created_while_interpreting_are_not_guarded():
    def outer(x):
        k = 2

        def inner():
            return x * k
        return inner()

    entries = _guards_of(outer, "x")
    assert not [e for e in entries if e.kind == "cell"]


def test_no_entries_no_guard():
    assert build_guard([]) is None


@pytest.mark.parametrize("change", [
    lambda g: setattr(g["CONFIG"], "scale", 3.0),
    lambda g: setattr(g["CONFIG"].inner, "bias", 2),
    lambda g: setattr(g["CONFIG"], "inner", g["Inner"]()),
    lambda g: setattr(g["Config"], "mode", "eval"),  # class attribute, read through the instance and the class
    lambda g: setattr(g["CONFIG"], "mode", "eval"),  # the instance now shadows the class attribute
])
def test_attributes_of_guarded_objects_are_guarded(change):
    g = _module()
    entries = _guards_of(g["reads_attributes"], "x")
    assert {("attribute", "scale"), ("attribute", "bias"), ("attribute", "mode")} <= {(e.kind, e.name) for e in entries}
    check = build_guard(entries)
    assert check()
    change(g)
    assert not check()


def test_attributes_of_objects_created_while_tracing_are_not_guarded():
    g = _module()
    entries = _guards_of(g["reads_local_object"], "x")
    assert not [e for e in entries if e.kind == "attribute"]
