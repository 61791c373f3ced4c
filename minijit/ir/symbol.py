"""Symbols (ops) and bound symbols (one call of an op in a trace)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from minijit.errors import MinijitError
from minijit.ir.context import current_trace
from minijit.ir.printing import Constants, output_source, to_source
from minijit.ir.proxies import Proxy, TensorProxy
from minijit.ir.pytree import tree_iter


@dataclass(frozen=True)
class SourceLocation:
    """Where in the user's code a bound symbol came from."""

    filename: str
    lineno: int
    text: str = ""

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}" + (f" ({self.text.strip()})" if self.text else "")

    def comment(self) -> str:
        """The form printed above a bound symbol: `# file:line  source text`."""
        return f"# {self.filename}:{self.lineno}" + (f"  {self.text.strip()}" if self.text else "")


class Symbol:
    """An op. Calling it while a trace records appends a `BoundSymbol` and returns its outputs.

    `meta` computes the outputs: for a prim (`is_prim`) it only infers their metadata;
    for a composite op it is the decomposition, whose own calls become the bound
    symbol's subsymbols. `fn` is the executable implementation, set on the symbols
    that executors put into final traces. `namespace` is the name the printed trace
    calls it through (`prims.add`, `ltorch.linear`, `torchex.add`).
    """

    def __init__(
        self,
        name: str,
        meta: Callable[..., Any] | None,
        *,
        namespace: str,
        is_prim: bool = False,
        tags: frozenset[str] = frozenset(),
        fn: Callable[..., Any] | None = None,
    ):
        self.name = name
        self.namespace = namespace
        self.meta = meta
        self.is_prim = is_prim
        self.tags = frozenset(tags)
        self.fn = fn
        self.id = f"{namespace}.{name}"
        # A VJP rule of this symbol alone (symbols made for one call, such as a traced custom
        # autograd.Function); others find theirs by id in minijit.transforms.vjp.
        self.vjp: Any = None

    def __repr__(self) -> str:
        return f"<Symbol {self.id}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = current_trace()
        if trace is None:
            if self.fn is not None:
                return self.fn(*args, **kwargs)
            raise MinijitError(f"{self.id} can only be called while tracing")
        return trace.record(self, args, kwargs)

    def bind(self, *args: Any, output: Any, subsymbols: tuple[BoundSymbol, ...] = (),
             source: SourceLocation | None = None, **kwargs: Any) -> BoundSymbol:
        """A bound symbol for this op without running its meta (for passes that rewrite traces)."""
        return BoundSymbol(self, args, kwargs, output, tuple(subsymbols), source)


@dataclass
class BoundSymbol:
    """One call of a symbol in a trace: `output = sym(*args, **kwargs)`."""

    sym: Symbol
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    subsymbols: tuple[BoundSymbol, ...] = ()
    source: SourceLocation | None = None
    # Extra text printed after the call (e.g. which executor claimed it).
    note: str = field(default="", compare=False)

    def replace(self, **changes: Any) -> BoundSymbol:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def proxy_args(self) -> Iterator[Proxy]:
        """The proxies among the arguments, in order (with repeats)."""
        for x in tree_iter((self.args, self.kwargs)):
            if isinstance(x, Proxy):
                yield x

    def proxy_outputs(self) -> Iterator[Proxy]:
        """The proxies among the outputs, in order."""
        for x in tree_iter(self.output):
            if isinstance(x, Proxy):
                yield x

    def call_source(self, constants: Constants) -> str:
        """`namespace.name(args...)` for this bound symbol."""
        parts = [to_source(a, constants) for a in self.args]
        parts += [f"{k}={to_source(v, constants)}" for k, v in self.kwargs.items()]
        return f"{self.sym.namespace}.{self.sym.name}({', '.join(parts)})"

    def python_lines(self, constants: Constants, indent: str, comment_out: bool = False,
                     subsymbol_depth: int = 1) -> list[str]:
        """The printed form: the call, a type comment, and subsymbols as indented comments."""
        lhs = output_source(self.output)
        call = self.call_source(constants)
        line = f"{lhs} = {call}" if lhs else call
        types = [f"{p.name}: {p.type_string()}" for p in self.proxy_outputs() if isinstance(p, TensorProxy)]
        trailer = "  # " + ", ".join(types) if types else ""
        if self.note:
            trailer = (trailer or "  #") + f"  [{self.note}]"
        prefix = "# " if comment_out else ""
        lines = [f"{indent}{prefix}{line}{trailer}"]
        if subsymbol_depth > 0:
            for sub in self.subsymbols:
                lines += sub.python_lines(constants, indent + "  ", True, subsymbol_depth - 1)
        return lines
