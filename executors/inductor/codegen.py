"""A region as a plain Python function of torch calls, with canonical names so equal regions share it.

The members of a region are prim-level bound symbols. Each becomes one call of the
torch executor's implementation of its prim (`prims_add(i0, 1)`); inputs are named
`i0, i1, ...` in order of first use and values `v0, v1, ...` in order of definition,
so two regions that do the same thing on different proxies print the same source:
that source (plus the inputs' metadata) is the key of the compiled-region cache.
"""

from __future__ import annotations

import itertools
import linecache
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.extend import BoundSymbol, Proxy, Region, TensorProxy, get_executor


class NotFusible(Exception):
    """The region holds a value that cannot be written into the generated source."""


@dataclass
class RegionSource:
    """The generated function of a region: its source, the globals it needs, and how outputs map."""

    source: str
    globals: dict[str, Any]
    # Per region output: the index of the region input it is (a tensor written in place and
    # passed through unchanged), or None when the compiled function returns it.
    passthrough: list[int | None]
    n_returned: int
    # The inputs the region writes into, directly or through a view of them made in the region.
    written: list[int]
    # The values (proxy names) returned views are views of, inputs not counted.
    view_bases: list[str] = field(default_factory=list)
    # Lines that tell torch.compile which dims of the tensor inputs are static (see `static_marks`).
    static_marks: list[str] = field(default_factory=list)


def literal(x: Any) -> str:
    """Python source for a constant argument; raises NotFusible for values without a faithful literal."""
    if x is None or isinstance(x, bool | int | str):
        return repr(x)
    if isinstance(x, float):
        return repr(x) if math.isfinite(x) else f"float({str(x)!r})"
    if isinstance(x, complex):
        return f"complex({literal(x.real)}, {literal(x.imag)})"
    if isinstance(x, torch.dtype | torch.memory_format | torch.layout):
        return str(x)  # `torch.float32`, `torch.contiguous_format`, `torch.strided`
    if isinstance(x, torch.device):
        return f"torch.device({str(x)!r})"
    if isinstance(x, tuple):
        items = ", ".join(literal(i) for i in x)
        return f"({items},)" if len(x) == 1 else f"({items})"
    if isinstance(x, list):
        return "[" + ", ".join(literal(i) for i in x) + "]"
    raise NotFusible(f"no literal for {type(x).__name__} {x!r}")


def writable(bsym: BoundSymbol) -> bool:
    """Whether every argument of `bsym` that is not a proxy has a literal: one member without one would make its
    whole region not fusible (`region_source` raises), so such a member is left out of regions instead."""
    def ok(x: Any) -> bool:
        if isinstance(x, Proxy):
            return True
        if isinstance(x, tuple | list):
            return all(ok(i) for i in x)
        try:
            literal(x)
        except NotFusible:
            return False
        return True
    return all(ok(x) for x in bsym.args) and all(ok(x) for x in bsym.kwargs.values())


class _Writer:
    """Renames proxies canonically while the region's calls are written out."""

    def __init__(self, region: Region):
        self.names: dict[str, str] = {p.name: f"i{k}" for k, p in enumerate(region.inputs)}
        self.count = 0

    def value(self, x: Any) -> str:
        if isinstance(x, Proxy):
            if x.name not in self.names:
                raise NotFusible(f"{x.name} is read before the region defines it")
            return self.names[x.name]
        if isinstance(x, tuple | list):
            items = [self.value(i) for i in x]
            if isinstance(x, list):
                return "[" + ", ".join(items) + "]"
            return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
        if isinstance(x, dict):
            raise NotFusible("dict argument")
        return literal(x)

    def target(self, out: Any) -> str:
        if isinstance(out, Proxy):
            name = f"v{self.count}"
            self.count += 1
            self.names[out.name] = name
            return name
        if out is None or type(out) in (int, float, bool):  # (a size the trace keeps constant, of `shape`)
            return "_"
        if isinstance(out, tuple | list):
            parts = [self.target(o) for o in out]
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        raise NotFusible(f"output {out!r}")


def _implementation(bsym: BoundSymbol) -> Callable[..., Any]:
    impl = get_executor("torch").implementations.get(bsym.sym)
    if impl is None or impl.fn is None:
        raise NotFusible(f"the torch executor has no implementation of {bsym.sym.id}")
    return impl.fn


def region_source(region: Region, contiguous: frozenset[int] = frozenset(),
                  contiguous_bases: frozenset[str] = frozenset(), probe: bool = False) -> RegionSource:
    """The region as `def region(i0, ...): ...; return (...)`, a function of torch calls; the returned values at
    the positions `contiguous` (among those returned) as `.contiguous()`, unless a view or the base of a returned
    one, and the bases of returned views named in `contiguous_bases` made `.contiguous()` where computed.
    `probe`: the bases of returned views (`view_bases`) are returned too, after the region's outputs."""
    writer = _Writer(region)
    input_index = {p.name: k for k, p in enumerate(region.inputs)}
    env: dict[str, Any] = {"torch": torch}
    roots = dict(input_index)
    written: set[int] = set()
    # The value each view made in the region views (followed to the root): eager returns a view and its base
    # sharing memory, and `.contiguous()` on either copies it where the layout differs on a later call (a
    # transposed input), so a write into the one misses the other.
    bases = _view_bases(region)
    view_bases = list(dict.fromkeys(b for p in region.outputs if (b := bases.get(p.name)) is not None
                                    and b not in input_index))
    lines = [f"def region({', '.join(f'i{k}' for k in range(len(region.inputs)))}):"]
    for bsym in region.members:
        fn_name = bsym.sym.id.replace(".", "_")
        env[fn_name] = _implementation(bsym)
        args = [writer.value(a) for a in bsym.args]
        args += [f"{k}={writer.value(v)}" for k, v in bsym.kwargs.items()]
        call = f"{fn_name}({', '.join(args)})"
        # Inductor lays out a value its views are taken from its own way (a cat after an empty cache: transposed
        # as its input) and a returned view then has other strides than eager's; made contiguous where eager's is,
        # the views come out as eager's.
        if isinstance(bsym.output, Proxy) and bsym.output.name in contiguous_bases:
            call += ".contiguous()"
        lines.append(f"    {writer.target(bsym.output)} = {call}")
        _track_writes(bsym, roots, written)
    passthrough: list[int | None] = []
    returned: list[str] = []
    aliased = {n for p in region.outputs if (n := bases.get(p.name)) is not None} | bases.keys()
    for p in region.outputs:
        # A tensor written in place keeps its input's name: hand back the caller's tensor itself
        # instead of returning an alias out of the compiled graph.
        if p.name in input_index and isinstance(p, TensorProxy):
            passthrough.append(input_index[p.name])
        else:
            passthrough.append(None)
            name = writer.value(p)
            made_contiguous = len(returned) in contiguous and p.name not in aliased
            returned.append(f"{name}.contiguous()" if made_contiguous else name)
    n_returned = len(returned)
    if probe:
        returned += [writer.names[b] for b in view_bases]
    ret = ", ".join(returned)
    lines.append(f"    return ({ret},)" if len(returned) == 1 else f"    return ({ret})")
    return RegionSource("\n".join(lines) + "\n", env, passthrough, n_returned, sorted(written), view_bases,
                        static_marks(region))


def static_marks(region: Region) -> list[str]:
    """`torch._dynamo.mark_static` calls for the dims of the region's tensor inputs that the trace holds constant.

    A region with symbolic sizes or numbers is compiled with `dynamic=True`, under which torch.compile makes every
    dim symbolic: Inductor's kernels over symbolic sizes are slower (an AdamW step over 8 x 256² parameters: 589
    against 410 µs a call). Marked static inside the compiled function, where marking specializes the graph rather
    than the caller's tensor, only the sizes the trace keeps symbolic stay so, as under torch.compile's automatic
    dynamic shapes, and a float input is still not specialized."""
    marks = []
    for k, p in enumerate(region.inputs):
        if not isinstance(p, TensorProxy) or not p.shape:
            continue
        static = [d for d, n in enumerate(p.shape) if type(n) is int]
        if len(static) == len(p.shape):
            marks.append(f"    torch._dynamo.mark_static(i{k})")
        else:  # (one call per dim: inside a compiled function, mark_static takes one index, not a list)
            marks += [f"    torch._dynamo.mark_static(i{k}, {d})" for d in static]
    return marks


def _view_bases(region: Region) -> dict[str, str]:
    """For each view a region's member makes, the value it views (a view of a view: the first one's base)."""
    bases: dict[str, str] = {}
    for bsym in region.members:
        if bsym.sym.effects.views is None:
            continue
        for p in bsym.proxy_outputs():
            viewed = bsym.viewed_argument(p) if bsym.is_view() else bsym.args[0]
            if isinstance(viewed, Proxy):
                bases[p.name] = bases.get(viewed.name, viewed.name)
    return bases


def _track_writes(bsym: BoundSymbol, roots: dict[str, int], written: set[int]) -> None:
    """Follow views of inputs (`roots`: proxy name -> input index) and note the inputs copies write into."""
    if bsym.sym.effects.copies:
        for dst in bsym.written():
            if dst.name in roots:
                written.add(roots[dst.name])
        return
    for p in bsym.proxy_outputs():
        viewed = bsym.viewed_argument(p)
        if isinstance(viewed, Proxy) and viewed.name in roots:
            roots[p.name] = roots[viewed.name]


_made = itertools.count()


def make_function(src: RegionSource, marked: bool = False) -> Callable[..., Any]:
    """The generated function itself: a fresh function and code object, so torch.compile caches it on its own;
    `marked`: with the region's `static_marks` first, for torch.compile with `dynamic=True` (run uncompiled, they
    would mark the caller's tensors).

    Its source is registered with `linecache` under a file name of its own, so tracebacks
    show it and `inspect.getsourcefile` finds it: where it finds none, torch.compile (2.11)
    runs the function inside one wrapper frame shared by every compiled function, and
    after 8 regions that frame hits Dynamo's recompile limit (a hard failure under fullgraph).
    """
    filename = f"<minijit inductor region {next(_made)}>"
    source = src.source
    if marked and src.static_marks:
        head, body = source.split("\n", 1)
        source = "\n".join([head, *src.static_marks, body])
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = dict(src.globals)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["region"]
