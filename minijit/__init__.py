"""minijit: a small trace-based JIT compiler for PyTorch.

Example::

    import torch, minijit

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum()

    jf = minijit.jit(f)
    jf(torch.randn(4, 8), torch.randn(8, 3))
    print(minijit.last_traces(jf)[-1])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit import environment
from minijit.errors import (
    AliasError,
    DeviceError,
    EnvironmentVariableError,
    FrozenValueError,
    GuardError,
    MetaError,
    MinijitError,
    UnsupportedOpError,
    UnsupportedSyntaxError,
    ValueGuardError,
)
from minijit.ir import Trace
from minijit.runtime import CacheInfo, JitFunction
from minijit.runtime.entry_limit import MAX_ENTRIES
from minijit.runtime.fallback import TracingRaisedWarning
from minijit.runtime.jit import CacheLimitWarning, RetraceWarning
from minijit.runtime.module import JitModule
from minijit.runtime.show import show, show_diff

environment.check_all()  # a junk MINIJIT_* value is an error naming it now, not a ValueError deep in a call

__all__ = [
    "AliasError", "CacheInfo", "CacheLimitWarning", "DeviceError", "EnvironmentVariableError", "FrozenValueError",
    "GuardError", "MetaError", "MinijitError", "RetraceWarning", "TracingRaisedWarning", "UnsupportedOpError",
    "UnsupportedSyntaxError", "ValueGuardError", "cache_info", "jit", "last_backward_traces", "last_traces", "show",
    "show_diff",
]


def jit(fn: Callable[..., Any], *, executors: Sequence[Any] | None = None,
        cache: str = "automatic", warn_retraces_after: int | None = None,
        cuda_graphs: bool = False, max_entries: int | None = MAX_ENTRIES) -> JitFunction | JitModule:
    """Compile `fn` (a function or an `nn.Module`) on its first call with each new kind of input.

    Later calls with inputs like those reuse the compiled trace. For a module, its
    parameters and buffers are inputs of the trace, read on every call, and the result
    is an `nn.Module` (a `JitModule`) sharing the module's parameters, state_dict keys
    and hooks; hooks added or removed later are a new trace.

    `executors` is a priority list of executors or their names (the torch executor is
    always appended as the fallback; none given: `minijit.extend.get_default_executors()`, the
    torch executor, with Triton ahead of it where a CUDA device is present); `cache` is "automatic"
    (the default: constant sizes and numbers until a call misses only by those, its arguments' or those of
    tensors it reads from outside, then symbolic ones, as torch.compile's `dynamic=None`; `minijit.runtime.dynamic`),
    "constant values" (a trace per size and number), "symbolic values" (symbolic from the first call) or
    "no caching".
    With `warn_retraces_after=N` (or the environment variable MINIJIT_WARN_RETRACES=N)
    every trace after the first N warns with a `RetraceWarning` naming what changed.
    The cache holds at most `max_entries` entries (256 by default; None: no bound): past it, each
    new entry drops the least recently used one, with a `CacheLimitWarning` the first time, and
    `cache_info().evictions` counts them (minijit/runtime/entry_limit.py).
    With `cuda_graphs=True` each compiled forward, backward and computation on CUDA tensors
    is captured into a CUDA graph on its second call and replayed after that (one launch for
    all its kernels); calls that cannot be replayed run as usual, and `cache_info()` says why
    (minijit/runtime/cuda_graphs.py).

    Example::

        jf = minijit.jit(lambda a, b: a + b)
        jf(torch.ones(2), torch.ones(2))
    """
    if isinstance(fn, JitModule | JitFunction):
        fn = fn._orig_mod if isinstance(fn, JitModule) else fn.fn  # jitting again: new options, a new cache
    if isinstance(fn, torch.nn.Module):
        return JitModule(fn, executors, cache, warn_retraces_after, cuda_graphs, max_entries)
    return JitFunction(fn, executors, cache, warn_retraces_after, cuda_graphs, max_entries)


def _jit_function(jfn: JitFunction | JitModule) -> JitFunction:
    return jfn._minijit_function if isinstance(jfn, JitModule) else jfn


def last_traces(jfn: JitFunction | JitModule) -> list[Trace]:
    """The traces of the last call of `jfn`, one per pass, each headed by the pass name and time.

    Example::

        print(minijit.last_traces(jf)[-1])  # the final, executed trace
    """
    return _jit_function(jfn).last_traces()


def last_backward_traces(jfn: JitFunction | JitModule) -> list[Trace]:
    """The backward traces of the last call of `jfn`, one per pass; empty when it did not differentiate.

    A call differentiates when grad mode is on and an input requires grad; its
    backward runs when `loss.backward()` or `torch.autograd.grad` reaches it.

    Example::

        jf = minijit.jit(lambda x, w: (x @ w).sum())
        jf(torch.randn(4, 8), torch.randn(8, 3, requires_grad=True)).backward()
        print(minijit.last_backward_traces(jf)[-1])  # the executed backward trace
    """
    return _jit_function(jfn).last_backward_traces()


def cache_info(jfn: JitFunction | JitModule) -> CacheInfo:
    """Hits, misses, entries, and why each miss happened, in words.

    Example::

        print(minijit.cache_info(jf))   # ... miss 2: arg 'x': shape (8, 16) != (4, 16)
    """
    return _jit_function(jfn).cache_info()
