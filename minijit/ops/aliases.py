"""Torch's aliases: two names of one op (`torch.absolute` and `torch.abs`) resolve to one symbol.

PyTorch documents each alias ("Alias for :func:`torch.abs`"); `ALIASES` lists them, as
attribute paths under `torch`, alias first. `install()` (run once, when ltorch is
declared) makes every form of an alias stand for its op's symbol: the function, the
Tensor method of the same name and its in-place form (`torch.Tensor.arccos_` is
`arccos` in place, the same op as `acos_`), wherever one side of the pair has an
ltorch symbol and the other does not. A pair where neither has one runs as the
opaque torch op of the op's name (`canonical`), so both print and cache the same; so
does a Tensor method with no ltorch symbol and the torch function of its name.
tests/ops/test_aliases.py checks the list against torch's documented aliases and the
aliases of PyTorch's OpInfo database.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from minijit.ir import TENSOR_METHODS
from minijit.ops.registry import TORCH_TO_LTORCH

# (alias, op): attribute paths under `torch`. Only exact aliases: the same arguments with the same
# defaults (not `torch.pinverse` and `torch.linalg.pinv`, `torch.linalg.diagonal` and `torch.diagonal`,
# `F.softmax` and `torch.softmax`). Some name their arguments differently (`torch.det(input)`,
# `torch.linalg.det(A)`): a call by keyword that the op's symbol does not take runs as the alias itself.
ALIASES: tuple[tuple[str, str], ...] = (
    ("absolute", "abs"), ("arccos", "acos"), ("arccosh", "acosh"), ("arcsin", "asin"), ("arcsinh", "asinh"),
    ("arctan", "atan"), ("arctan2", "atan2"), ("arctanh", "atanh"), ("clip", "clamp"), ("concat", "cat"),
    ("concatenate", "cat"), ("divide", "div"), ("true_divide", "div"), ("fix", "trunc"), ("ger", "outer"),
    ("greater", "gt"), ("greater_equal", "ge"), ("less", "lt"), ("less_equal", "le"), ("not_equal", "ne"),
    ("moveaxis", "movedim"), ("swapaxes", "transpose"), ("swapdims", "transpose"), ("multiply", "mul"),
    ("negative", "neg"), ("subtract", "sub"), ("row_stack", "vstack"),
    ("det", "linalg.det"), ("inverse", "linalg.inv"), ("matrix_exp", "linalg.matrix_exp"),
    ("matrix_power", "linalg.matrix_power"), ("orgqr", "linalg.householder_product"),
    ("slogdet", "linalg.slogdet"), ("linalg.matmul", "matmul"),
    ("special.expit", "sigmoid"), ("special.erf", "erf"), ("special.erfc", "erfc"), ("special.erfinv", "erfinv"),
    ("special.exp2", "exp2"), ("special.expm1", "expm1"), ("special.log1p", "log1p"), ("special.round", "round"),
    ("special.digamma", "digamma"), ("special.psi", "digamma"), ("special.gammaln", "lgamma"),
    ("special.logsumexp", "logsumexp"), ("special.softmax", "softmax"), ("special.log_softmax", "log_softmax"),
    ("special.i0", "i0"), ("special.sinc", "sinc"), ("special.logit", "logit"), ("special.xlogy", "xlogy"),
    ("special.polygamma", "polygamma"), ("special.multigammaln", "mvlgamma"),
    ("special.gammainc", "igamma"), ("special.gammaincc", "igammac"),
    ("nn.functional.tanh", "tanh"), ("nn.functional.sigmoid", "sigmoid"),
    # torch's forms of these take one more trailing argument (a cuDNN switch), which F's do not
    ("layer_norm", "nn.functional.layer_norm"), ("group_norm", "nn.functional.group_norm"),
    ("rms_norm", "nn.functional.rms_norm"),
)

# alias callable -> the op's callable, for pairs that run as opaque torch ops
_CANONICAL: dict[Any, Any] = {}


def resolve(path: str) -> Any:
    """The object at attribute path `path` under `torch` (`"nn.functional.relu"`), or None where there is none."""
    value: Any = torch
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _forms(alias: str, op: str) -> list[tuple[Any, Any, str, str]]:
    """(alias callable, op callable, alias method name, op method name) for each form both names have."""
    forms = [(resolve(alias), resolve(op), "", "")]
    if "." not in alias and "." not in op:  # torch's in-place functions (`torch.arccos_`)
        forms.append((resolve(f"{alias}_"), resolve(f"{op}_"), "", ""))
    a_name, o_name = alias.rsplit(".", 1)[-1], op.rsplit(".", 1)[-1]
    for suffix in ("", "_"):
        a, o = f"{a_name}{suffix}", f"{o_name}{suffix}"
        forms.append((getattr(torch.Tensor, a, None), getattr(torch.Tensor, o, None), a, o))
    return [f for f in forms if f[0] is not None and f[1] is not None and f[0] is not f[1]]


def install() -> None:
    """Map every form of each alias to its op's ltorch symbol (or its op's callable, for opaque ops)."""
    for alias, op in ALIASES:
        for a, o, a_method, o_method in _forms(alias, op):
            sym = TORCH_TO_LTORCH.get(o)
            if sym is None:
                sym = TORCH_TO_LTORCH.get(a)
                if sym is not None:  # only the alias is declared: the op's name stands for it too
                    TORCH_TO_LTORCH[o] = sym
                    if o_method and o_method not in TENSOR_METHODS:
                        TENSOR_METHODS[o_method] = sym
                    continue
                _CANONICAL[a] = o
                continue
            TORCH_TO_LTORCH[a] = sym
            if a_method:
                TENSOR_METHODS[a_method] = sym


def canonical(fn: Any) -> Any:
    """The callable an opaque call of `fn` records: its op's, where `fn` is an alias, else `fn`.

    A Tensor method of ATen's (`torch.Tensor.logcumsumexp`) is the same op as the torch
    function of its name, where torch has one: both are bindings of one ATen operator,
    whose method form passes the tensor as the first argument.
    """
    try:
        fn = _CANONICAL.get(fn, fn)
    except TypeError:  # unhashable
        return fn
    if type(fn) is types.MethodDescriptorType and fn.__objclass__ is torch._C.TensorBase:
        function = getattr(torch._C._VariableFunctions, fn.__name__, None)
        if function is not None and getattr(torch, fn.__name__, None) is function:
            return _CANONICAL.get(function, function)
    return fn
