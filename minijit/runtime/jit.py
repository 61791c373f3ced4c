"""`jit`: the callable that looks up a compiled trace for each call, compiling on a miss."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.extend import Executor, resolve_executors
from minijit.ir import Trace, tree_iter
from minijit.runtime.cache_key import cache_key
from minijit.runtime.pipeline import CompiledEntry, compile_for

CACHE_MODES = ("constant values", "no caching")


@dataclass
class CacheInfo:
    """What the cache of a jitted function holds and how it has been used."""

    hits: int = 0
    misses: int = 0
    entries: int = 0
    miss_reasons: list[str] = field(default_factory=list)


class JitFunction:
    """A jitted function: call it like the original."""

    def __init__(self, fn: Callable[..., Any], executors: Sequence[Executor | str] | None, cache: str):
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
        self.fn = fn
        self.executors = resolve_executors(list(executors) if executors is not None else None)
        self.cache_mode = cache
        self._entries: dict[tuple[Any, ...], CompiledEntry] = {}
        self._info = CacheInfo()
        self._last: CompiledEntry | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = cache_key(args, kwargs)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._miss(key, args, kwargs)
        else:
            self._info.hits += 1
        self._last = entry
        if entry.direct_call:
            return entry.computation(*args)
        return entry.computation(*[x for x in tree_iter((args, kwargs)) if isinstance(x, torch.Tensor)])

    def _miss(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompiledEntry:
        self._info.misses += 1
        entry = compile_for(self.fn, args, kwargs, self.executors)
        if self.cache_mode != "no caching":
            self._entries[key] = entry
            self._info.entries = len(self._entries)
        return entry

    def last_traces(self) -> list[Trace]:
        """The traces of the last call, one per pass."""
        if self._last is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last.traces

    def last_backward_traces(self) -> list[Trace]:
        """The backward traces of the last call, one per pass (empty when it did not differentiate)."""
        if self._last is None:
            raise RuntimeError("the jitted function has not been called yet")
        return self._last.backward_traces

    def cache_info(self) -> CacheInfo:
        """Hits, misses and entries of this function's cache."""
        return self._info
