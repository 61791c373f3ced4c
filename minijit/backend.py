"""`torch.compile(model, backend="minijit")`: Dynamo captures the graphs, minijit compiles each one.

Dynamo runs the model's Python, splits it into FX graphs where it must (data-dependent
control flow, unsupported calls, FSDP2's and other hooks marked to run eagerly) and hands
each graph to a backend. This backend jits the graph's generated `forward` — plain Python
calling torch functions — with `minijit.jit`, so every piece goes through minijit's
pipeline and executors (and its autograd: the backward of a piece is minijit's backward).
Dynamo's example inputs (real or fake tensors, symbolic sizes) are not traced with: each
piece traces on its first real call, and a new kind of input is a new trace of that piece,
as for any jitted function (they only say whether Dynamo made sizes dynamic). Parameters
come in as graph inputs (torch 2.13's Dynamo inlines `nn.Module`s) or as attributes of the
graph module, read afresh on every call. Subgraphs Dynamo keeps under a higher-order op
(`checkpoint`'s, `wrap`'s) are traced in place (`minijit.frontend.lookasides`).

The backend is registered under the name "minijit" through the `torch_dynamo_backends`
entry point of this package. `Backend(executors=[...])` makes one with other options, to
pass as `backend=` directly.

Example::

    cmodel = torch.compile(model, backend="minijit")
    cmodel(x).sum().backward()
    for traces in minijit.backend.last_traces():   # one list per piece, in compile order
        print(traces[-1])
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.ir import Trace
from minijit.runtime.jit import CacheInfo, JitFunction

__all__ = ["Backend", "cache_info", "last_backward_traces", "last_traces", "minijit_backend", "pieces"]


class Backend:
    """A torch.compile backend that compiles each FX graph Dynamo captures with `minijit.jit`.

    `executors` and `cache` are `minijit.jit`'s options; by default a graph whose sizes Dynamo
    made dynamic (it takes `SymInt` inputs) is jitted with `cache="symbolic values"`, any other
    with "constant values". The pieces compiled so far stay reachable (`pieces()`) for as long
    as Dynamo keeps them.

    Example::

        backend = minijit.backend.Backend(executors=["triton"])
        cmodel = torch.compile(model, backend=backend)
        cmodel(x)
        print(backend.last_traces()[0][-1])
    """

    def __init__(self, *, executors: Sequence[Any] | None = None, cache: str | None = None):
        self.executors = None if executors is None else list(executors)
        self.cache = cache
        self._pieces: list[weakref.ref[JitFunction]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """Dynamo's entry: the callable that runs `gm` (called with the graph's inputs, positionally)."""
        realize = getattr(gm, "real_recompile", None)  # a lazily generated forward: generate it now
        if realize is not None:
            realize()
        cache = self.cache
        if cache is None:  # sizes Dynamo made dynamic (SymInt inputs) stay symbolic: one trace for every size
            cache = "symbolic values" if any(isinstance(x, torch.SymInt) for x in example_inputs) else "constant values"
        jitted = JitFunction(gm.forward, self.executors, cache)
        self._pieces = [ref for ref in self._pieces if ref() is not None]
        self._pieces.append(weakref.ref(jitted))
        return jitted

    def pieces(self) -> list[JitFunction]:
        """The jitted pieces Dynamo still holds, in the order it compiled them."""
        return [jf for ref in self._pieces if (jf := ref()) is not None]

    def last_traces(self) -> list[list[Trace]]:
        """For each piece that has run, the traces of its last call, one per pass (the last is the one executed)."""
        return [jf.last_traces() for jf in self.pieces() if jf._last is not None]

    def last_backward_traces(self) -> list[list[Trace]]:
        """For each piece that has run, the backward traces of its last call (empty when it did not differentiate)."""
        return [jf.last_backward_traces() for jf in self.pieces() if jf._last is not None]

    def cache_info(self) -> list[CacheInfo]:
        """Each piece's cache: hits, misses, and why each miss happened."""
        return [jf.cache_info() for jf in self.pieces()]

    def reset(self) -> None:
        """Forget the pieces compiled so far (Dynamo's own cache is `torch._dynamo.reset()`)."""
        self._pieces.clear()


minijit_backend = Backend()
"""The backend `torch.compile(..., backend="minijit")` uses."""


def pieces() -> list[JitFunction]:
    """The pieces `backend="minijit"` compiled and Dynamo still holds, in compile order."""
    return minijit_backend.pieces()


def last_traces() -> list[list[Trace]]:
    """The traces of the last call of each piece `backend="minijit"` compiled, one list per piece.

    Example::

        torch.compile(model, backend="minijit")(x)
        print(minijit.backend.last_traces()[-1][-1])   # the last piece's executed trace
    """
    return minijit_backend.last_traces()


def last_backward_traces() -> list[list[Trace]]:
    """The backward traces of the last call of each piece `backend="minijit"` compiled."""
    return minijit_backend.last_backward_traces()


def cache_info() -> list[CacheInfo]:
    """The cache of each piece `backend="minijit"` compiled."""
    return minijit_backend.cache_info()
