"""Symbols (ops) and bound symbols (one call of an op in a trace)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from minijit.errors import MinijitError
from minijit.ir.context import current_trace
from minijit.ir.printing import Constants, output_source, to_source
from minijit.ir.proxies import Proxy, TensorProxy
from minijit.ir.pytree import tree_flatten


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


# An argument of a call: a positional argument's index, or a keyword argument's name.
ArgRef = int | str

# The values of `Effects.view_layouts`.
VIEWS_ANY_LAYOUT = "any layout"
VIEWS_IF_SPLITS = "if it only splits dimensions"
VIEWS_IF_BASIC_KEY = "for a basic key"


@dataclass(frozen=True)
class Effects:
    """What a symbol does besides computing new tensors from its arguments' values.

    Declared once, on the symbol; every pass that must respect an effect asks the
    bound symbol (`BoundSymbol.written`, `BoundSymbol.viewed_argument`, ...).

    - `writes`: the arguments written in place (every tensor in each); an `out=`
      argument is one of them where the symbol writes it (`Effects(writes=("out",))`).
    - `copies`: the write stores argument 0's value and nothing else (`copy_`,
      `copy_to_out_`): the written tensor then holds that value.
    - `views`: the argument whose memory the tensor outputs share (a view op); a
      tuple gives one entry (or None) per flattened output. With `may_copy`, the
      outputs are views where eager can make one, else copies (`reshape`, `x[idx]`);
      with `same_if_unchanged`, they are not views but the argument itself where
      nothing changes, else new tensors (`x.to(device)`).
    - `random`: draws from, seeds or reads torch's default generator (so a new
      value on each call, and later draws depend on it): never merged with another
      call, never dropped, never reordered with another random call, never
      recomputed in place of being saved.
    - `data_dependent`: the output's shape depends on the input's values: its sizes
      are computed by the trace (minijit/ops/unbacked.py) or checked by it.
    - `external`: changes state outside the trace's tensors (a seed, a Python
      object): never removed, never reordered.
    - `raises`: raises for some values of its number arguments (`n / m` with m 0,
      `math.floor(nan)`): kept where nothing uses its result, as eager raises there.

    Facts of a view (with `views`):

    - `reorders`: the output holds all of the viewed tensor's elements, only
      reshaped, reordered or broadcast (no slicing), so whether it is contiguous
      does not change with the sizes (`transpose`, `reshape`, `expand`).
    - `view_layouts`: for which layouts of the viewed tensor eager returns a view:
      `VIEWS_ANY_LAYOUT` (all: `Tensor.view` raises where it cannot),
      `VIEWS_IF_SPLITS` (where the new shape only splits dimensions, else a copy:
      `reshape`), `VIEWS_IF_BASIC_KEY` (for a key without tensors, else a gather:
      `x[idx]`); None where eager has to be asked.

    Facts of a write (with `writes`, or of the op `out=` calls):

    - `moves_values`: it moves values without computing (`Tensor.copy_`): eager's
      overlap check treats it as a copy, as it does `copies`.
    - `refuses_overlap`: eager refuses any overlap of the written tensor with an
      operand, the same elements included (`index_copy_`, `scatter_`, `cat(out=)`).
    - `reads_scalar_first`: a 0-d tensor operand is read as a number before the
      write (`x.fill_(x[0])`), so it cannot clash with it.

    Facts of an `out=` argument:

    - `unread`: the arguments whose values the op does not read, only the memory it
      writes into (`out=` of `copy_to_out_`, of an executor's `out=` form, of a torch
      op called with `out=` and of its functional form): not reads of the call
      (`minijit.transforms.memory.read_proxies`).
    - `result_into`: the argument an executor's `out=` form of a functional op writes
      its result into, which the op's meta does not take: the meta computes the
      result, which must fit that argument (`minijit.transforms.verify`).
    """

    writes: tuple[ArgRef, ...] = ()
    copies: bool = False
    views: ArgRef | tuple[ArgRef | None, ...] | None = None
    may_copy: bool = False
    same_if_unchanged: bool = False
    random: bool = False
    data_dependent: bool = False
    external: bool = False
    raises: bool = False
    reorders: bool = False
    view_layouts: str | None = None
    moves_values: bool = False
    refuses_overlap: bool = False
    reads_scalar_first: bool = False
    unread: tuple[ArgRef, ...] = ()
    result_into: ArgRef | None = None

    def __post_init__(self) -> None:
        if (self.reorders or self.view_layouts is not None) and (self.views is None or self.same_if_unchanged):
            raise ValueError("Effects: `reorders` and `view_layouts` are facts of a view (`views=`)")
        if self.view_layouts not in (None, VIEWS_ANY_LAYOUT, VIEWS_IF_SPLITS, VIEWS_IF_BASIC_KEY):
            raise ValueError(f"Effects: unknown view_layouts {self.view_layouts!r}")

    @property
    def has_side_effects(self) -> bool:
        """Whether running it matters beyond its outputs (so no pass may drop it)."""
        return bool(self.writes) or self.external or self.random


NO_EFFECTS = Effects()


class Tag:
    """Facts about an op that are not effects, set in `Symbol.tags` where the op is declared.

    Passes ask `Tag.X in bsym.sym.tags`, never the op's name; a table a pass keeps per
    symbol is keyed by the `Symbol` and checked, when it is built, to cover every
    symbol with the fact it needs (`check_table`).
    """

    OPAQUE = "opaque"  # a torch op without a decomposition, run as the torch call it is
    CHEAP = "cheap"  # a prim costing one pass over memory: recomputed in the backward rather than saved
    STOPS_GRADIENT = "stops gradient"  # its outputs are cut from autograd by definition (`detach`)
    CAST = "cast"  # only converts argument 0's dtype (`convert_element_type`)
    LAYOUT_STRICT = "layout strict"  # a view that raises on layouts it cannot view (`Tensor.view`)
    MASKED_FILL = "masked fill"  # writes argument 2 into argument 0 where the mask, argument 1, is True
    INDEXED_WRITE = "indexed write"  # `a[key] = value` with torch's indexing semantics: (a, key, value)
    METADATA = "metadata"  # reads only its tensor's metadata (sizes), never its values: no wait for a device
    # Its outputs are views eager refuses in-place writes into while grad is on: they come out of a custom autograd
    # Function (the identity at a hooked module's boundary, eager's BackwardHookFunction).
    FUNCTION_VIEW = "function view"
    # Its result depends on where its tensor arguments' elements sit in memory (`as_strided`): the passes and
    # executors keep those tensors, and all they were computed from, laid out as eager lays them out
    # (`minijit.transforms.memory.layout_read`).
    READS_LAYOUT = "reads layout"
    # It checks a value the trace read from a tensor (`prims.check_value`): a failing check sends the call to
    # another entry, so the checks recorded so far need not run again while tracing (`minijit.runtime.values`).
    VALUE_CHECK = "value check"
    # An elementwise prim: each fusion executor lowers it or says why not (`executors/triton/codegen.py` NOT_FUSED).
    ELEMENTWISE = "elementwise"
    # A custom `torch.autograd.Function`, differentiated by its own backward: eager autograd cannot differentiate a
    # recompute of its forward (`minijit.runtime.double_backward`).
    CUSTOM_FUNCTION = "custom function"


def check_table(table: dict[Symbol, Any], symbols: Iterable[Symbol], needs: Callable[[Symbol], bool],
                what: str) -> None:
    """Raise a MinijitError naming each symbol among `symbols` for which `needs` holds but `table` has no entry.

    `what` says what the table holds, for the message ("a scatter rule").
    """
    missing = [s.id for s in symbols if needs(s) and s not in table]
    if missing:
        raise MinijitError(f"no {what} for {', '.join(sorted(missing))}: declare one beside the others")


class Symbol:
    """An op. Calling it while a trace records appends a `BoundSymbol` and returns its outputs.

    `meta` computes the outputs: for a prim (`is_prim`) it only infers their metadata;
    for a composite op it is the decomposition, whose own calls become the bound
    symbol's subsymbols. `fn` is the executable implementation, set on the symbols
    that executors put into final traces. `namespace` is the name the printed trace
    calls it through (`prims.add`, `ltorch.linear`, `torchex.add`). `effects` says
    what it does besides computing its outputs (writes, views, randomness); `tags`
    the other facts passes ask about it (`Tag`).
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
        effects: Effects = NO_EFFECTS,
    ):
        self.name = name
        self.namespace = namespace
        self.meta = meta
        self.is_prim = is_prim
        self.tags = frozenset(tags)
        self.effects = effects
        self.fn = fn
        self.id = f"{namespace}.{name}"

    def __repr__(self) -> str:
        return f"<Symbol {self.id}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = current_trace()
        if trace is None:
            if self.fn is not None:
                return self.fn(*args, **kwargs)
            held = next((a for a in (*args, *kwargs.values()) if isinstance(a, Proxy)), None)
            if held is None:
                raise MinijitError(f"{self.id} can only be called while tracing")
            raise MinijitError(
                f"{self.id} was given {held!r}, a value of a trace that is not being made in this thread: a "
                "value minijit traces reached code outside its trace (another thread reading an object that traced "
                "code wrote into while minijit was tracing it, or a value kept from inside a trace). Read shared "
                "objects the jitted function writes into only between its calls")
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
    # For a copy_ that writes an op's result into the op's `out=` tensor (`torch.add(a, b, out=c)`): the op
    # and the tensors it read (eager refuses an `out=` that partly overlaps them; transforms/overlap.py).
    out_of: tuple[Symbol, tuple[Proxy, ...]] | None = field(default=None, compare=False)

    def replace(self, **changes: Any) -> BoundSymbol:
        """A copy with some fields changed."""
        return replace(self, **changes)

    # A bound symbol's arguments and outputs are not changed once it is made (a pass makes a new one, with
    # `replace`), so their proxies are found once: every pass and analysis asks for them, millions of times
    # in the test suite. The tuples live in the instance's __dict__, which `replace` does not carry over.
    def proxy_args(self) -> tuple[Proxy, ...]:
        """The proxies among the arguments, in order (with repeats)."""
        found = self.__dict__.get("_proxy_args")
        if found is None:
            found = self.__dict__["_proxy_args"] = tuple(
                x for x in tree_flatten((self.args, self.kwargs)) if isinstance(x, Proxy))
        return found

    def proxy_outputs(self) -> tuple[Proxy, ...]:
        """The proxies among the outputs, in order."""
        found = self.__dict__.get("_proxy_outputs")
        if found is None:
            found = self.__dict__["_proxy_outputs"] = tuple(x for x in tree_flatten(self.output) if isinstance(x, Proxy))
        return found

    # -- effects (declared on the symbol, resolved on this call's arguments) -----------
    def argument(self, ref: ArgRef) -> Any:
        """The positional (int) or keyword (str) argument `ref`, or None where the call has none."""
        if type(ref) is int:
            return self.args[ref] if ref < len(self.args) else None
        return self.kwargs.get(ref)

    def written(self) -> list[TensorProxy]:
        """The tensors this call writes into, in order, each once.

        The symbol's declared `writes`, and, for a composite that declares none, the
        arguments its decomposition writes into.
        """
        refs = self.sym.effects.writes
        if not refs and (self.sym.is_prim or not self.subsymbols):
            return []
        found: dict[int, TensorProxy] = {}
        for ref in refs:
            for x in tree_flatten(self.argument(ref)):
                if isinstance(x, TensorProxy):
                    found.setdefault(id(x), x)
        if not refs and not self.sym.is_prim and self.subsymbols:
            mine = {id(p) for p in self.proxy_args()}
            for sub in self.subsymbols:
                for x in sub.written():
                    if id(x) in mine:
                        found.setdefault(id(x), x)
        return list(found.values())

    def is_random(self) -> bool:
        """Whether this call draws from, seeds or reads torch's generator: its symbol's declared `random`, or,
        for a composite, a random call in its decomposition (`torch.lstm` with dropout)."""
        return self.sym.effects.random or any(s.is_random() for s in self.subsymbols)

    def copied_value(self) -> Any:
        """For a copy (`Effects.copies`): the value the written tensor receives, else None."""
        return self.args[0] if self.sym.effects.copies else None

    def viewed_argument(self, out: Proxy) -> Any:
        """The argument whose view the output `out` is (per the symbol's `views`), or None."""
        effects = self.sym.effects
        views = effects.views
        if views is None or effects.same_if_unchanged or not isinstance(out, TensorProxy):
            return None
        if type(views) is tuple:
            outs = tree_flatten(self.output)
            position = next((i for i, o in enumerate(outs) if o is out), None)
            if position is None or position >= len(views) or views[position] is None:
                return None
            views = views[position]
        return self.argument(views)

    def is_view(self) -> bool:
        """Whether this call's outputs are views of an argument (its symbol declares `views`), which writes
        through them update; an op that returns its argument only where nothing changes is none."""
        effects = self.sym.effects
        return effects.views is not None and not effects.same_if_unchanged

    def viewed_tensor(self) -> TensorProxy | None:
        """The tensor this call views (the first that an output views, per its symbol's `views`), or None."""
        for out in tree_flatten(self.output):
            arg = self.viewed_argument(out)
            if isinstance(arg, TensorProxy):
                return arg
        return None

    def may_alias_input(self) -> bool:
        """Whether an output of this call may share memory with one of its tensor arguments at run time:
        a view (`is_view`), or an op that returns its argument where nothing changes, when nothing does."""
        effects = self.sym.effects
        if effects.views is None:
            return False
        if self.is_view():
            return True
        ins = [a for a in tree_flatten(self.argument(effects.views)) if isinstance(a, TensorProxy)]
        outs = [o for o in self.proxy_outputs() if isinstance(o, TensorProxy)]
        return bool(ins and outs) and (ins[0].dtype, ins[0].device) == (outs[0].dtype, outs[0].device)

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
