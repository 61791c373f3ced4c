"""torch.autocast around a jitted call: part of the cache key, and off while the compiled trace runs.

A trace records the casts that autocast made while it was captured
(`minijit.ops.autocast`), so a compiled trace must run with autocast off: with it on,
torch would cast again, or differently (an op the user ran under
`autocast(enabled=False)` would be cast after all). And since the casts depend on the
autocast state around the call, that state is part of the cache key.
"""

from __future__ import annotations

from typing import Any

import torch

any_autocast_enabled = torch._C._is_any_autocast_enabled
# A context turning autocast off, in which a trace runs (it holds its own casts).
no_autocast = torch._C._DisableAutocast
_DEVICE_TYPES = ("cpu", "cuda")


def autocast_state() -> tuple[Any, ...] | None:
    """What the traces of a call depend on of torch.autocast's state: None when it is off everywhere.

    Otherwise the autocast dtype of each device type where it is on, and whether casts are cached.
    """
    if not any_autocast_enabled():
        return None
    enabled = tuple((d, torch.get_autocast_dtype(d)) for d in _DEVICE_TYPES if torch.is_autocast_enabled(d))
    return (*enabled, torch.is_autocast_cache_enabled())
