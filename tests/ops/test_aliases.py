"""Torch's aliases resolve to their op's symbol (minijit/ops/aliases.py), checked against torch's own lists."""

from __future__ import annotations

import re

import pytest
import torch

import minijit
from minijit.ops.aliases import ALIASES, canonical
from minijit.ops.registry import ltorch_symbol_for
from tests.ops.opinfo_util import _op_db

# Documented aliases that are not exact (other defaults or overloads): each runs as its own op.
NOT_EXACT = {
    "torch.pinverse": "rcond defaults to 1e-15, torch.linalg.pinv's to None",
    "torch.linalg.diagonal": "dim1/dim2 default to -2/-1, torch.diagonal's to 0/1",
    "torch.trapz": "has a dx= overload torch.trapezoid spells differently",
    "torch.softmax": "torch.softmax(x, dim, dtype) and F.softmax(x, dim, _stacklevel, dtype) differ in positions",
    "torch.Tensor.softmax": "as torch.softmax",
    "torch.Tensor.adjoint": "a method where Tensor.mH is a property",
    "torch.linalg.matrix_rank": "the docstring's alias note is about the atol/rtol arguments, not the op",
    "torch.linalg.pinv": "as torch.pinverse",
    "torch.maximum": "torch.max also has reduction overloads; torch.maximum is only its binary form",
    "torch.minimum": "as torch.maximum",
    "torch.adjoint": "a function where Tensor.mH is a property",
}


def resolved(fn):
    """What a call of `fn` on proxies records: its ltorch symbol, else the opaque op's callable."""
    sym = ltorch_symbol_for(fn)
    return sym if sym is not None else ("opaque", canonical(fn))


def _documented_aliases():
    """(alias path, op path) for each torch callable whose docstring says it is an alias."""
    pattern = re.compile(r"[Aa]lias (?:for|of) :(?:func|meth):`(torch\.)?([\w.]+)`")
    namespaces = {"torch": torch, "torch.special": torch.special, "torch.linalg": torch.linalg,
                  "torch.fft": torch.fft, "torch.nn.functional": torch.nn.functional, "torch.Tensor": torch.Tensor}
    found = []
    for prefix, ns in namespaces.items():
        for name in dir(ns):
            fn = getattr(ns, name, None)
            doc = getattr(fn, "__doc__", None)
            if name.startswith("_") or not callable(fn) or not isinstance(doc, str):
                continue
            match = pattern.search(doc)
            if match:
                method = prefix == "torch.Tensor" and not match.group(1)
                found.append((f"{prefix}.{name}", f"torch.{'Tensor.' if method else ''}{match.group(2)}"))
    return found


def _resolve(path):
    value = torch
    for part in path.split(".")[1:]:
        value = getattr(value, part, None)
    return value


@pytest.mark.parametrize(("alias", "op"), _documented_aliases(), ids=lambda x: x)
def test_documented_alias_resolves_to_its_ops_symbol(alias, op):
    if alias in NOT_EXACT:
        pytest.skip(NOT_EXACT[alias])
    a, o = _resolve(alias), _resolve(op)
    assert a is not None and o is not None
    assert resolved(a) == resolved(o), f"{alias} -> {resolved(a)}, {op} -> {resolved(o)}"


def _opinfo_aliases():
    cases = []
    for (name, variant), info in _op_db().items():
        for alias in info.aliases:
            for kind in ("op", "method_variant", "inplace_variant"):
                fn, target = getattr(alias, kind), getattr(info, kind if kind != "op" else "op")
                if fn is not None and target is not None:
                    cases.append(pytest.param(fn, target, id=f"{name}.{variant}:{alias.name}:{kind}"))
    return cases


@pytest.mark.parametrize(("alias", "op"), _opinfo_aliases())
def test_opinfo_alias_resolves_to_its_ops_symbol(alias, op):
    name = f"torch.{getattr(alias, '__name__', '')}"
    if getattr(op, "__name__", "") == "softmax" and alias is torch.nn.functional.softmax:
        pytest.skip(NOT_EXACT["torch.softmax"])
    if name in NOT_EXACT:
        pytest.skip(NOT_EXACT[name])
    assert resolved(alias) == resolved(op)


def test_alias_pairs_name_existing_callables():
    for alias, op in ALIASES:
        assert _resolve(f"torch.{alias}") is not None and _resolve(f"torch.{op}") is not None, (alias, op)


def uses_aliases(x, y):
    a = torch.absolute(x) + torch.special.expit(y) + x.arccos().nan_to_num()
    b = torch.det(x) + torch.linalg.det(x) + torch.special.i0(x).sum()
    x.clip_(min=0)
    return a, b, torch.ger(x[0], y[0])


def test_aliases_run_like_eager_and_print_as_their_op():
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    jf = minijit.jit(uses_aliases)
    xe = x.clone()
    for got, want in zip(jf(x, y), uses_aliases(xe, y)):
        torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(x, xe)
    names = [b.sym.id for b in minijit.last_traces(jf)[0].bound_symbols]
    assert names.count("torch.linalg.det") == 2 and "torch.outer" in names and names.count("torch.i0") == 1
    assert {"ltorch.abs", "ltorch.sigmoid", "ltorch.acos", "ltorch.clamp_"} <= set(names), names
