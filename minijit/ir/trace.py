"""The trace: inputs, a list of bound symbols, outputs; printable as Python that runs."""

from __future__ import annotations

import keyword
import types
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from minijit.ir.capture_state import CaptureState
from minijit.ir.context import tracing
from minijit.ir.layouts import LayoutTable
from minijit.ir.printing import Constants, to_source
from minijit.ir.proxies import NumberProxy, Proxy, TensorProxy
from minijit.ir.pytree import tree_iter, tree_map
from minijit.ir.symbol import BoundSymbol, SourceLocation, Symbol

_A = TypeVar("_A")

# Names the printed source uses for its own purposes; proxies never take them.
_RESERVED = {"torch", "prims", "ltorch", "opaque", "float", "complex", "slice", "_"} | set(keyword.kwlist)


def _same(x: Any) -> Any:
    return x


def _holds_mutable_container(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when a list or dict is among the arguments (looking into tuples, lists and dicts)."""
    stack: list[Any] = [*args, *kwargs.values()]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is list or t is dict:
            return True
        if t is tuple:
            stack.extend(x)
    return False


class _Names:
    """The set of names used by a family of traces (a trace and those derived from it)."""

    def __init__(self) -> None:
        self.used: set[str] = set(_RESERVED)
        self.counters: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        n = self.counters.get(prefix, 0)
        while f"{prefix}{n}" in self.used:
            n += 1
        self.counters[prefix] = n + 1
        name = f"{prefix}{n}"
        self.used.add(name)
        return name

    def claim(self, wanted: str) -> str:
        """`wanted` if it is a free identifier, else a numbered variant of it."""
        if not wanted.isidentifier() or wanted.startswith("_c"):
            wanted = "a"
        if wanted not in self.used:
            self.used.add(wanted)
            return wanted
        return self.fresh(wanted + "_")


class Trace:
    """A recorded program: `args` in, `bound_symbols` in order, `output` out.

    `python()` prints it as a Python function; `python_callable()` compiles exactly
    that source. Passes build new traces with `derive`, which shares the name
    registry so proxies created by a pass never clash with existing ones. The analyses
    of a trace (its memory model, view graph, producers) are cached on it (`analysis`).

    Example::

        t = Trace()
        with tracing(t):
            x = t.add_input(TensorProxy((2,), torch.float32, torch.device("cpu")), "x")
            ...
        print(t)
    """

    def __init__(self, fn_name: str = "computation", *, _names: _Names | None = None,
                 _layouts: LayoutTable | None = None):
        self.fn_name = fn_name
        self.args: list[Proxy] = []
        self.output: Any = None
        self.bound_symbols: list[BoundSymbol] = []
        self.names = _names if _names is not None else _Names()
        # The eager layouts known for the tensors (minijit/ir/layouts.py): shared, like the names, with the
        # traces made from this one.
        self.layouts = _layouts if _layouts is not None else LayoutTable()
        self.source: SourceLocation | None = None
        self.pass_name = "capture"
        self.elapsed_ms = 0.0
        # Groups of input names that are one memory (the same tensor passed twice): a write into
        # one is a write into all. Part of the trace's signature, so derived traces keep it.
        self.input_alias_groups: list[list[str]] = []
        # A comment printed above the `return` (how the runtime rebuilds the result); kept by `derive`.
        self.output_note = ""
        # What the capture keeps while it records the user's code (minijit/ir/capture_state.py): set by the
        # capture for its duration, None otherwise; `derive` does not copy it.
        self.capture: CaptureState | None = None
        self._scopes: list[list[BoundSymbol]] = [self.bound_symbols]
        # kind -> (what the trace was when the analysis was built, the analysis): see `analysis`.
        self._analyses: dict[Hashable, tuple[_Content, Any]] = {}

    # -- analyses -------------------------------------------------------------
    def analysis(self, kind: Hashable, build: Callable[[Trace], _A]) -> _A:
        """The analysis `kind` of this trace: `build(self)`, built on the first question and kept on the trace.

        Kept as long as the trace is what it was when built: an edit (a bound symbol appended, the list or the
        output replaced, an input added or renamed, the input aliasing changed) makes the next question build
        it afresh, so no pass has to drop a stale analysis by hand. A trace made by `derive` starts with its
        parent's where it holds the same objects (`_inherit_analyses`), else with none. An analysis is read-only
        to whoever gets it.
        """
        found = self._analyses.get(kind)
        if found is not None and found[0].describes(self):
            return found[1]
        content = _Content(self)
        result = build(self)
        self._analyses[kind] = (content, result)
        return result

    # -- building -------------------------------------------------------------
    def new_name(self, prefix: str) -> str:
        """A fresh, unused name starting with `prefix`."""
        return self.names.fresh(prefix)

    @property
    def capture_tensor(self) -> Callable[[torch.Tensor], Proxy] | None:
        """The capture's hook turning a real torch.Tensor met among an op's arguments into a proxy (None when
        the trace is not being captured, or the capture turned it off: `CaptureState.capture_tensor`)."""
        return self.capture.capture_tensor if self.capture is not None else None

    @property
    def recording_user_call(self) -> bool:
        """True while recording a call the user's code made (not one inside an op's decomposition)."""
        return self.capture is not None and self.capture.captures_user_code and len(self._scopes) == 1

    @property
    def in_user_op(self) -> bool:
        """True inside the decomposition of an op the user's code called (not of an op nested in another)."""
        return self.capture is not None and self.capture.captures_user_code and len(self._scopes) == 2

    @contextmanager
    def recording_at_top_level(self) -> Iterator[None]:
        """Record at the top level inside the block, even inside an op's decomposition: what is recorded
        then comes before that op (a check of a value its decomposition read)."""
        self._scopes.append(self.bound_symbols)
        try:
            yield
        finally:
            self._scopes.pop()

    def add_input(self, proxy: Proxy, wanted_name: str | None = None) -> Proxy:
        """Append `proxy` to the inputs, renaming it to `wanted_name` (or a variant) if given."""
        if wanted_name is not None:
            self.names.used.discard(proxy.name)
            proxy.name = self.names.claim(wanted_name)
        self.args.append(proxy)
        return proxy

    def record(self, sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `sym`'s meta (its decomposition, for composite ops) and append the bound symbol."""
        state = self.capture
        if (state is not None and state.capture_tensor is not None
                and any(isinstance(x, torch.Tensor) for x in tree_iter((args, kwargs)))):
            capture = state.capture_tensor
            args, kwargs = tree_map(lambda x: capture(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
        elif _holds_mutable_container(args, kwargs):
            # The bound symbol keeps its own copy of a list or dict argument: the user's code may change the
            # list it passed after the call (`torch.stack(xs); xs.append(y)`), and so does undoing the
            # capture's writes into containers from outside the call.
            args, kwargs = tree_map(_same, (args, kwargs))
        if sym.is_prim:
            output = sym.meta(*args, **kwargs)
            subsymbols: list[BoundSymbol] = []
            if state is not None and isinstance(output, NumberProxy) and output.seen and not kwargs:
                # Arithmetic on values the capture saw: computed once (CaptureState.seen_numbers).
                key = (sym.id, *(a.name if isinstance(a, Proxy) else (type(a), a) for a in args))
                if (known := state.seen_numbers.get(key)) is not None:
                    return known
                state.seen_numbers[key] = output
        else:
            subsymbols = []
            self._scopes.append(subsymbols)
            try:
                output = sym.meta(*args, **kwargs)
            finally:
                self._scopes.pop()
            # A composite op that computed nothing and hands back one of its inputs
            # (x.contiguous(), x.to(x.dtype)) is not worth a line in the trace.
            if not subsymbols and _is_passthrough(output, args, kwargs):
                return output
        if state is not None and not torch.is_grad_enabled():
            # Computed under torch.no_grad() inside the traced function: the grad pass treats
            # these values as constants, as eager autograd would.
            given = {id(a) for a in tree_iter((args, kwargs)) if isinstance(a, Proxy)}
            for p in tree_iter(output):
                if isinstance(p, Proxy):
                    (state.written_without_grad if id(p) in given else state.recorded_without_grad).add(p.name)
                if isinstance(p, TensorProxy) and id(p) not in given and _new_memory(sym, subsymbols):
                    # As eager's results under no_grad, read by code that asks (a view keeps its base's flag).
                    p.requires_grad = False
        bsym = BoundSymbol(sym, args, kwargs, output, tuple(subsymbols), self.source)
        if state is not None and (state.number_tensors or state.unbacked_session is not None):
            state.forget_numbers(bsym)
        if state is not None and not torch.is_grad_enabled():
            # An op that writes its arguments and returns nothing (torch._fused_adam_) names what it wrote.
            state.written_without_grad.update(p.name for p in bsym.written())
        if (sym.is_prim and len(self._scopes) > 1 and not sym.effects.random
                and any(isinstance(x, NumberProxy) for x in tree_iter(output))):
            # Arithmetic on symbolic sizes goes to the top level even inside a decomposition:
            # later ops may use the size, also when an executor runs the decomposed op whole.
            self._scopes[0].append(bsym)
        else:
            self._scopes[-1].append(bsym)
        if (state is not None and state.try_probe is not None and len(self._scopes) == 1
                and (where := state.try_probe()) is not None):
            state.ops_in_try.append((sym.id, where))
        return output

    def known_number(self, x: Any) -> Any:
        """The number (an int or a symbolic one) that the 0-dim integer tensor `x` holds where the trace knows it
        without reading data, while capturing (a tensor folded from Python numbers, or one of the capture's
        `number_tensors`); else None."""
        state = self.capture
        if state is None:
            return None
        if isinstance(x, Proxy):
            known = state.number_tensors.get(id(x))
            return known[1] if known is not None and known[0] is x else None
        folded = state.folded_constants.get(id(x)) if isinstance(x, torch.Tensor) else None
        if (folded is not None and folded.ndim == 0
                and not (folded.dtype.is_floating_point or folded.dtype.is_complex or folded.dtype == torch.bool)):
            return int(folded)
        return None

    def nested(self, name: str) -> Trace:
        """A trace recorded inside this one's capture (a custom Function's forward or backward, a vmap sample): the
        names, layouts and source line are this one's; its capture state is its own (what it records without grad,
        its casts), with only this one's tensor hook and role."""
        sub = Trace(name, _names=self.names, _layouts=self.layouts)
        sub.capture = CaptureState(capture_tensor=self.capture_tensor,
                                   captures_user_code=self.capture is not None and self.capture.captures_user_code)
        sub.source = self.source
        return sub

    def derive(self, bound_symbols: Iterable[BoundSymbol], *, pass_name: str,
               output: Any = None, args: list[Proxy] | None = None) -> Trace:
        """A new trace with the same inputs, names, input aliasing and output note, the given bound symbols, and `output`."""
        t = Trace(self.fn_name, _names=self.names, _layouts=self.layouts)
        t.args = list(self.args if args is None else args)
        t.output = self.output if output is None else output
        t.bound_symbols = list(bound_symbols)
        t._scopes = [t.bound_symbols]
        t.pass_name = pass_name
        t.input_alias_groups = [list(g) for g in self.input_alias_groups]
        t.output_note = self.output_note
        t._inherit_analyses(self)
        return t

    def _inherit_analyses(self, parent: Trace) -> None:
        """Take `parent`'s analyses where this trace holds what it holds (a pass that changed nothing): they
        answer for this trace as well, so no walk is done twice."""
        content = _Content(self)
        kept = [(kind, result) for kind, (was, result) in parent._analyses.items() if was.same(content)]
        self._analyses.update((kind, (content, result)) for kind, result in kept)

    def free_proxies(self) -> list[Proxy]:
        """Proxies the trace reads that it neither takes as input nor computes, in the order first read.

        What decompositions (subsymbols) read counts too: an executor may run them instead
        of their parent (a symbolic size that only `prims.reshape` inside an op reads).
        """
        defined = {p.name for p in self.args}
        free: dict[str, Proxy] = {}

        def visit(bsyms: Iterable[BoundSymbol]) -> None:
            for bsym in bsyms:
                for p in bsym.proxy_args():
                    if p.name not in defined:
                        free.setdefault(p.name, p)
                visit(bsym.subsymbols)
                defined.update(p.name for p in bsym.proxy_outputs())

        visit(self.bound_symbols)
        for p in tree_iter(self.output):
            if isinstance(p, Proxy) and p.name not in defined:
                free.setdefault(p.name, p)
        return list(free.values())

    # -- printing and running -------------------------------------------------
    def python_and_constants(self, subsymbol_depth: int = 1) -> tuple[str, dict[str, Any]]:
        """The trace's source, and the constants it refers to by name."""
        constants = Constants()
        params = ", ".join(p.name for p in self.args)
        lines = [f"def {self.fn_name}({params}):"]
        last_source: SourceLocation | None = None
        for bsym in self.bound_symbols:
            if bsym.source is not None and bsym.source != last_source:
                lines.append("  " + bsym.source.comment())
                last_source = bsym.source
            lines += bsym.python_lines(constants, "  ", subsymbol_depth=subsymbol_depth)
        if self.output_note:
            lines.append(f"  # {self.output_note}")
        lines.append(f"  return {to_source(self.output, constants)}")
        return "\n".join(lines) + "\n", constants.values

    def python(self, subsymbol_depth: int = 1) -> str:
        """The trace as Python source: a function of the inputs that returns the outputs."""
        return self.python_and_constants(subsymbol_depth)[0]

    def python_ctx(self) -> dict[str, Any]:
        """The global names the printed source needs, for symbols that carry implementations."""
        ctx: dict[str, Any] = {"torch": torch}
        namespaces: dict[str, dict[str, Callable[..., Any]]] = {}
        for bsym in self.bound_symbols:
            # Symbols printed as `torch.<path>` (opaque torch ops) are found through the torch module.
            if bsym.sym.fn is not None and bsym.sym.namespace != "torch":
                namespaces.setdefault(bsym.sym.namespace, {})[bsym.sym.name] = bsym.sym.fn
        for ns, fns in namespaces.items():
            ctx[ns] = types.SimpleNamespace(**fns)
        return ctx

    def python_callable(self, ctx: dict[str, Any] | None = None) -> Callable[..., Any]:
        """Compile the printed source into a function; `ctx` adds or overrides global names."""
        source, constants = self.python_and_constants(subsymbol_depth=0)
        env = self.python_ctx()
        env.update(constants)
        if ctx:
            env.update(ctx)
        filename = f"<minijit trace {self.fn_name}:{self.pass_name}>"
        exec(compile(source, filename, "exec"), env)
        fn = env[self.fn_name]
        fn.__minijit_source__ = source
        return fn

    def __str__(self) -> str:
        header = f"# {self.pass_name} ({self.elapsed_ms:.2f} ms)\n"
        return header + self.python()

    def __repr__(self) -> str:
        return f"<Trace {self.fn_name}:{self.pass_name}, {len(self.bound_symbols)} bound symbols>"


class _Content:
    """What a trace's analyses are a function of, as it was when one was built: its bound symbols (the list and
    its length: passes append, never replace in place), its output, its inputs with their names, and its input
    aliasing. The objects are held, so none of them can be freed and another take its place."""

    __slots__ = ("aliasing", "args", "bound_symbols", "count", "names", "output")

    def __init__(self, trace: Trace):
        self.bound_symbols, self.count = trace.bound_symbols, len(trace.bound_symbols)
        self.output = trace.output
        self.args, self.names = tuple(trace.args), tuple(p.name for p in trace.args)
        self.aliasing = tuple(tuple(g) for g in trace.input_alias_groups)

    def describes(self, trace: Trace) -> bool:
        """Whether `trace` is still what it was."""
        return (self.bound_symbols is trace.bound_symbols and self.count == len(trace.bound_symbols)
                and self.output is trace.output and len(self.args) == len(trace.args)
                and all(a is b for a, b in zip(self.args, trace.args))
                and self.names == tuple(p.name for p in trace.args)
                and self.aliasing == tuple(tuple(g) for g in trace.input_alias_groups))

    def same(self, other: _Content) -> bool:
        """Whether `other` (another trace's, or this one's now) holds the same objects in the same order."""
        return (self.count == other.count and self.output is other.output and self.names == other.names
                and self.aliasing == other.aliasing and len(self.args) == len(other.args)
                and all(a is b for a, b in zip(self.args, other.args))
                and all(a is b for a, b in zip(self.bound_symbols, other.bound_symbols)))


def _is_passthrough(output: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    outs = [x for x in tree_iter(output) if isinstance(x, Proxy)]
    if not outs:
        return False
    ins = {id(x) for x in tree_iter((args, kwargs)) if isinstance(x, Proxy)}
    return all(id(x) in ins for x in outs)


def _new_memory(sym: Symbol, subsymbols: Sequence[BoundSymbol]) -> bool:
    """Whether `sym`'s results (other than its arguments) are new tensors, not views: not a view op, one that
    returns new tensors where it does not return its argument (`x.to(dtype)`), or one that may copy and whose
    decomposition did (`x.t().contiguous()`). (A prim that may view is taken for a view: `reshape`.)"""
    effects = sym.effects
    if effects.views is None or effects.same_if_unchanged:
        return True
    return effects.may_copy and any(_new_memory(b.sym, b.subsymbols) for b in subsymbols)


__all__ = ["Trace", "tracing"]
