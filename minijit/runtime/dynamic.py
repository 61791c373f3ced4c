"""Automatic dynamic sizes: the default cache mode, "automatic", as torch.compile's `dynamic=None`.

A jitted function starts by tracing with constant sizes and numbers ("constant values"): the fastest
trace for a function that is always called alike. When a call misses only because a size, or a Python
int or float among its arguments, differs from those of a call it already traced (the two calls have the
same key once sizes and numbers are left out), the function switches to "symbolic values" for good: that
call is traced again with its sizes and numbers symbolic, and the one entry serves all their values (each
constraint the trace relied on checked by its guard). `cache_info().dynamic` says when and why. The entries
traced before the switch still serve the calls they match (`JitFunction._call_kept_constant`): a generation's
prompt, traced with constant sizes, is not traced again for the next generation.

A trace with symbolic sizes may be refused where one with constant sizes is not (an op whose output
size minijit cannot follow): the function then stays with constant values, and `cache_info().dynamic`
says that too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minijit.errors import MinijitError
from minijit.runtime.cache_key import cache_key

# The sizes-free keys of constant traces kept (a call matching a forgotten one traces constant once more).
MAX_KEYS = 256


@dataclass
class AutomaticDynamic:
    """The state of one jitted function's automatic mode: the sizes-free keys of the calls it traced with
    constant values, and whether (and why) it switched."""

    # cache_key(..., symbolic=True) of each call traced with constant values (the last MAX_KEYS, oldest first:
    # a key holding an argument object's id is new on every call that passes a new object)
    keys: dict[tuple[Any, ...], None] = field(default_factory=dict)
    switched: bool = False
    # The decisions, in words, for cache_info
    decisions: list[str] = field(default_factory=list)
    # Set when a symbolic trace was refused: the function keeps constant values from then on.
    refused: bool = False

    def traced_constant(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Note a call traced with constant values."""
        if not self.switched and not self.refused:
            self.keys[_sizes_free_key(args, kwargs)] = None
            if len(self.keys) > MAX_KEYS:
                del self.keys[next(iter(self.keys))]

    def should_switch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this missing call differs from a traced one only in sizes and numbers."""
        return not self.switched and not self.refused and _sizes_free_key(args, kwargs) in self.keys

    def switch(self, reason: str) -> None:
        """Note the switch to symbolic values, for `reason` (the miss explained)."""
        self.switched = True
        self.decisions.append(f"sizes and numbers made symbolic: {reason}")

    def undo(self) -> None:
        """Take the last switch back (the call's code raised while traced: it is run eagerly, nothing is traced)."""
        self.switched = False
        self.decisions.pop()

    def refuse(self, error: MinijitError) -> None:
        """Note that the symbolic trace was refused: back to constant values, for good."""
        self.switched, self.refused = False, True
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self.decisions.append(f"kept constant values: the trace with symbolic sizes was refused ({first})")


def _sizes_free_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    try:
        return cache_key(args, kwargs, symbolic=True)
    except TypeError:  # an unhashable part: never the same
        return (object(),)
