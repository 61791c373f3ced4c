"""The one lock every compile and every change to a cache of compiled entries runs under.

Calls that hit a cache entry never take it: they read the cache as it is (a dict of lists, which
CPython reads safely while another thread changes them) and run a compiled trace, which keeps no
state between calls. A miss takes it, looks again (another thread may have compiled the entry
meanwhile: then the call is a hit, and one trace serves both) and compiles while holding it, so
concurrent first calls with one signature trace once.

One lock for the process rather than one per jitted function: a compile changes state that is not
its function's own while it runs (a write into an object from outside is made for the traced code
to see and undone when the capture ends; the interpreter raises the recursion limit, which is the
process's), so two compiles at once, of any functions, could undo each other's writes. CPython runs
the compile's Python one thread at a time anyway, so a second lock would not make compiles faster,
and one lock cannot be taken in two orders by two threads. It is re-entrant: a compile may call a
jitted function that compiles in turn, on the same thread.
"""

from __future__ import annotations

import threading

COMPILE_LOCK = threading.RLock()

__all__ = ["COMPILE_LOCK"]
