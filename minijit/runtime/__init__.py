"""Runtime: compiling traces into callables, the cache, and running traces."""

from minijit.runtime.execute import trace_callable
from minijit.runtime.jit import CacheInfo, JitFunction

__all__ = ["CacheInfo", "JitFunction", "trace_callable"]
