"""Cache keys: everything about a call's arguments that a trace specialises on, as one hashable.

In "constant values" mode a trace is specialised on each tensor's shape, dtype,
device and requires_grad, and on the type and value of every Python number,
string and None among the arguments; in every mode, on grad mode and on the
autocast state (one C call when autocast is off, as it usually is). The key is
built in one pass over the arguments and looked up in a dict: a cache hit costs
one hash (DESIGN.md, lessons).
"""

from __future__ import annotations

from typing import Any

import torch

from minijit.ir.containers import flatten, is_container
from minijit.runtime.autocast import any_autocast_enabled, autocast_state

Tensor = torch.Tensor


def _leaf_key(x: Any, out: list[Any], symbolic: bool) -> None:
    t = type(x)
    if t is Tensor or isinstance(x, Tensor):
        if symbolic:
            # Sizes are checked by the entries' guards; the key keeps only the rank.
            out += (x.ndim, x.dtype, x.device, x.requires_grad)
        else:
            # Must equal what the per-arity key functions below build for a plain tensor.
            out += (x.shape, x.dtype, x.device, x.requires_grad)
    elif t is tuple or t is list:
        out.append(t)
        out.append(len(x))
        for v in x:
            _leaf_key(v, out, symbolic)
    elif t is dict:
        out.append(t)
        for k, v in x.items():
            out.append(k)
            _leaf_key(v, out, symbolic)
    elif symbolic and (t is int or t is float):
        out.append(t)
    elif t is int or t is float or t is bool or t is str or x is None or t is complex:
        out.append(t)
        out.append(x)
    elif t is torch.dtype or t is torch.device:
        out.append(x)
    elif t is slice:  # unhashable before Python 3.12
        out += (t, x.start, x.stop, x.step)
    elif is_container(x):
        # A dataclass, named tuple, dict subclass or pytree type: its structure and constants, then its tensors.
        spec, leaves = flatten(x, _is_input_leaf_symbolic if symbolic else _is_tensor)
        out.append(spec.key())
        for leaf in leaves:
            _leaf_key(leaf, out, symbolic)
    else:
        # Any other object is specialised on by identity; the interpreter guards what it reads from it.
        out.append(t)
        out.append(id(x))


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _is_input_leaf_symbolic(x: Any) -> bool:
    return isinstance(x, Tensor) or type(x) is int or type(x) is float


def cache_key(args: tuple[Any, ...], kwargs: dict[str, Any], symbolic: bool = False) -> tuple[Any, ...]:
    """The hashable key of a call: tensor metadata and Python values, in argument order.

    With `symbolic`, sizes above 1 and the values of Python ints and floats are left out:
    the entries under such a key are told apart by their guards.
    """
    out: list[Any] = [torch.is_grad_enabled(), any_autocast_enabled() and autocast_state()]
    for a in args:
        _leaf_key(a, out, symbolic)
    if kwargs:
        for k, v in kwargs.items():
            out.append(k)
            _leaf_key(v, out, symbolic)
    return tuple(out)


def _make_positional_tensor_key(arity: int, symbolic: bool = False) -> Any:
    """Compile a key function for `arity` plain tensors passed positionally (None for anything else).

    Straight-line code with no loop is about a third faster than the general key, and this
    runs on every call. It builds the same key as `cache_key` for such calls.
    """
    params = ", ".join(f"a{i}" for i in range(arity))
    checks = " or ".join(f"type(a{i}) is not Tensor" for i in range(arity)) or "False"
    size = "ndim" if symbolic else "shape"
    parts = "".join(f"a{i}.{size}, a{i}.dtype, a{i}.device, a{i}.requires_grad, " for i in range(arity))
    source = (
        f"def key({params}):\n"
        f"    if {checks}:\n"
        f"        return None\n"
        f"    return (is_grad_enabled(), any_autocast_enabled() and autocast_state(), {parts})\n"
    )
    env: dict[str, Any] = {"Tensor": Tensor, "is_grad_enabled": torch.is_grad_enabled,
                           "any_autocast_enabled": any_autocast_enabled, "autocast_state": autocast_state}
    exec(compile(source, f"<minijit cache key, {arity} tensors>", "exec"), env)
    return env["key"]


# Key functions for calls with 0 to 15 positional tensors, by arity, for each cache mode.
POSITIONAL_TENSOR_KEYS = [_make_positional_tensor_key(n) for n in range(16)]
POSITIONAL_TENSOR_SYMBOLIC_KEYS = [_make_positional_tensor_key(n, symbolic=True) for n in range(16)]
