"""Cache keys: everything about a call's arguments that a trace specialises on, as one hashable.

In "constant values" mode a trace is specialised on each tensor's shape, dtype,
device and requires_grad, and on the type and value of every Python number,
string and None among the arguments; in every mode, on grad mode and on the
autocast state (one C call when autocast is off, as it usually is). The key is
built in one pass over the arguments and looked up in a dict: a cache hit costs
one hash (docs/design.md, lessons). What goes into it is the list of checks of
`minijit.runtime.checks`: the key holds exactly the values its keyed checks expect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minijit.runtime.autocast import any_autocast_enabled, autocast_state
from minijit.runtime.checks import AUTOCAST, GRAD_MODE, Check, tensor_checks, torch_tensor_check, walk

Tensor = torch.Tensor


def cache_key(args: tuple[Any, ...], kwargs: dict[str, Any], symbolic: bool = False,
              memo: KeyMemo | None = None) -> tuple[Any, ...]:
    """The hashable key of a call: tensor metadata and Python values, in argument order.

    With `symbolic`, sizes above 1 and the values of Python ints and floats are left out:
    the entries under such a key are told apart by their guards. `memo`: the jitted function's,
    which keeps the part of a long tuple of tensors (a jitted module's parameters) from call to call.
    """
    out: list[Any] = [torch.is_grad_enabled(), any_autocast_enabled() and autocast_state()]
    for position, a in enumerate(args):
        if memo is not None and type(a) is tuple and len(a) >= KeyMemo.FROM:
            out += memo.part(position, a, symbolic)
        else:
            walk(a, out, symbolic)
    if kwargs:
        for k, v in kwargs.items():
            out.append(k)
            walk(v, out, symbolic)
    return tuple(out)


class KeyMemo:
    """The parts of a call's key made of long tuples of tensors (a jitted module's parameters, fetched anew on each
    call), kept from the call before at each argument position: reused while the tensors have the same metadata,
    checked at once in C (`exact_tensor_check`'s check, which implies the key's metadata), where walking them costs
    ~0.7 µs a tensor on every call. Any other change (a tensor of another size, dtype or type) walks them again."""

    FROM = 8  # (a shorter tuple costs less to walk than to check)

    def __init__(self) -> None:
        # position -> (symbolic, length, the check, the key's part); each replaced whole (threads read it unlocked)
        self._last: dict[int, tuple[bool, int, Callable[..., bool], tuple[Any, ...]]] = {}

    def part(self, position: int, values: tuple[Any, ...], symbolic: bool) -> tuple[Any, ...]:
        """What `walk` adds to a key for the tuple `values`, the argument at `position`."""
        last = self._last.get(position)
        if last is not None and last[0] is symbolic and last[1] == len(values) and last[2](*values):
            return last[3]
        found: list[Any] = []
        walk(values, found, symbolic)
        part = tuple(found)
        # (Plain tensors and parameters only: a subclass may read its metadata in Python, apart from what C checks.)
        check = torch_tensor_check(values) if all(type(v) in _PLAIN for v in values) else None
        if check is not None:
            self._last[position] = (symbolic, len(values), check, part)
        return part


_PLAIN = (Tensor, torch.nn.Parameter)


def _read(check: Check) -> str:
    """Python source for the value the key holds for `check` (the aspects a plain tensor call has)."""
    if check.aspect in ("grad mode", "autocast"):
        return check.subject
    return f"{check.subject}.{'ndim' if check.aspect == 'rank' else check.aspect}"


def _make_positional_tensor_key(arity: int, symbolic: bool = False) -> Any:
    """Compile a key function for `arity` plain tensors passed positionally (None for anything else).

    Straight-line code with no loop is about a third faster than the general key, and this
    runs on every call. Its items are the reads of the checks `call_checks` makes for such a
    call (grad mode, autocast, then each tensor's), so it builds the same key as `cache_key`.
    """
    example = torch.empty(())
    checks = [Check("", "grad mode", GRAD_MODE, None), Check("", "autocast", AUTOCAST, None)]
    for i in range(arity):
        checks += tensor_checks(f"a{i}", f"a{i}", example, symbolic)
    params = ", ".join(f"a{i}" for i in range(arity))
    kinds = " or ".join(f"type(a{i}) is not Tensor" for i in range(arity)) or "False"
    source = (
        f"def key({params}):\n"
        f"    if {kinds}:\n"
        f"        return None\n"
        f"    return ({', '.join(_read(c) for c in checks)},)\n"
    )
    env: dict[str, Any] = {"Tensor": Tensor, "is_grad_enabled": torch.is_grad_enabled,
                           "any_autocast_enabled": any_autocast_enabled, "autocast_state": autocast_state}
    exec(compile(source, f"<minijit cache key, {arity} tensors>", "exec"), env)
    key = env["key"]
    key.__minijit_source__ = source
    return key


def exact_tensor_check(args: tuple[Any, ...]) -> Callable[..., bool] | None:
    """`torch_tensor_check` of `args`, a call's plain tensors (None where they are not all plain tensors): a call
    it accepts has the cache key of `args` (grad mode apart, which the caller checks; `args` must come from a call
    made with autocast off), so the hit path tries it before computing a key."""
    if not 0 < len(args) < 16 or any(type(a) is not Tensor for a in args):
        return None
    return torch_tensor_check(args)


# Key functions for calls with 0 to 15 positional tensors, by arity, for each cache mode.
POSITIONAL_TENSOR_KEYS = [_make_positional_tensor_key(n) for n in range(16)]
POSITIONAL_TENSOR_SYMBOLIC_KEYS = [_make_positional_tensor_key(n, symbolic=True) for n in range(16)]
