"""The bound on a jitted function's cache entries: the least recently used entry goes first.

A function called with ever new shapes under cache="constant values" (or new values of a Python
number it specialises on) traces an entry per call. Without a bound the entries, and the memory their
traces hold, grow without end. `EntryLimit` keeps the entries in the order they were last used and
names the ones to drop once there are more than `max_entries`; the runtime removes them from its
table, and a call that needs one again traces it again. The order changes only when the call's entry
is not the last call's (`JitFunction._remember`), so a loop calling one entry costs nothing here.

Why evict rather than run eagerly past the limit (torch.compile's recompile limit falls back to eager
for the frame): every call stays compiled and behaves the same (effects, errors), and the entries a
workload keeps using stay cached; the cost of a thrashing working set is one trace per call, which the
warning names with its remedy (`cache="symbolic values"`: one entry for all sizes, or a larger limit).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from itertools import islice
from typing import Any

# The default bound. An entry holds its traces (one per pass) and compiled code: about 0.1-0.5 MB for a
# small function, megabytes for a model, so a few hundred entries stay a small part of a process; and
# no workload that reuses its shapes has hundreds of them live at once (a model with a few batch
# sizes and sequence lengths has tens), so only ever-new shapes meet the bound.
MAX_ENTRIES = 256


class EntryLimit:
    """The cache's entries by last use, oldest first, and how many were dropped for the bound.

    Every method holds the limit's own lock: the hit path marks an entry used outside the lock a miss
    takes, and an iterator over the order (`recent`) fails if another thread moves an entry while it
    is open."""

    def __init__(self, max_entries: int | None) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be at least 1 (or None for no bound), got {max_entries}")
        self.max_entries = max_entries
        # id(entry) -> (its cache key, the entry), the least recently used first.
        self._order: OrderedDict[int, tuple[Hashable, Any]] = OrderedDict()
        self.evictions = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._order)

    def add(self, key: Hashable, entry: Any) -> list[tuple[Hashable, Any]]:
        """Note a new entry under `key`, the most recently used; the (key, entry) pairs to drop for the bound."""
        with self._lock:
            self._order[id(entry)] = (key, entry)
            dropped: list[tuple[Hashable, Any]] = []
            while self.max_entries is not None and len(self._order) > self.max_entries:
                dropped.append(self._order.popitem(last=False)[1])
            self.evictions += len(dropped)
        return dropped

    def used(self, entry: Any) -> None:
        """Make `entry` the most recently used (an entry no longer held is left out)."""
        with self._lock:
            try:
                self._order.move_to_end(id(entry))
            except KeyError:
                pass

    def clear(self) -> None:
        """Forget every entry (the runtime dropped them all: cache="automatic" went symbolic)."""
        with self._lock:
            self._order.clear()

    def remove(self, entry: Any) -> None:
        """Forget `entry` (the runtime dropped it: rebound to new objects)."""
        with self._lock:
            self._order.pop(id(entry), None)

    def recent(self, count: int) -> list[Any]:
        """The `count` most recently used entries, the most recent first."""
        with self._lock:
            return [entry for _, entry in islice(reversed(self._order.values()), count)]
