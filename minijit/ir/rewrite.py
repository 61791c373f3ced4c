"""Rewriting a trace: one substitution of proxies, keyed by proxy identity, and the walks built on it.

A proxy *is* its object: two proxies are the same value exactly when they are the same
Python object. Its `name` is only how the printed source spells it (chosen once, when
the proxy is made or becomes a trace input; the trace verifier checks that one name
stands for one object). So a substitution is keyed by object identity, never by name,
and no pass renames a proxy to make it stand for another: it substitutes the other.
The keys are `id()`s with the proxy kept alongside (proxies are not usable as dict keys
themselves: `NumberProxy` hashes and compares by value, recording cache constraints).

The pieces, smallest first:

- `ProxyMap`: old proxy -> new value; applied to nested containers (`env(tree)`) and
  to bound symbols (`env.bsym(b)`: arguments, outputs and subsymbols);
- `replay_bsym`: record a bound symbol again, on substituted arguments, into the trace
  being recorded (its meta runs again), and map its old outputs to the new ones;
- `replay`: the same for a whole trace, on given inputs (inlining one trace into another);
- `expand`: the bound symbols a function records in place of one bound symbol, computing
  its very outputs (an executor's execution transform);
- `record`: the bound symbols a function records, in a scratch trace sharing a trace's
  names (not yet part of any trace: the caller places them);
- `rewrite`: the pass skeleton: walk a trace's bound symbols through a rule that keeps a
  bound symbol or returns its replacements, substituting as it goes; gives a new trace;
- `Edits`: the skeleton for a pass that decides by position (after an analysis indexed by
  position, or walking the trace backwards): replace a bound symbol by several (none: drop
  it), insert before or after one; applied once, giving a new trace.

A pass edits a trace only through these: it never assigns into, splices or deletes from
`bound_symbols` (tests/ir/test_rewrite_skeleton.py reads the passes and names any that does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from minijit.errors import MinijitError, where
from minijit.ir.context import current_trace, replaying_captured, tracing
from minijit.ir.proxies import Proxy
from minijit.ir.pytree import tree_flatten, tree_map
from minijit.ir.symbol import BoundSymbol, SourceLocation, Symbol
from minijit.ir.trace import Trace

__all__ = ["Edits", "ProxyMap", "Rule", "expand", "record", "replay", "replay_bsym", "rewrite"]


class ProxyMap:
    """A substitution: proxies (by object identity) -> the values standing for them.

    Example::

        env = ProxyMap()
        env[t0] = t5                    # later reads of t0 read t5
        env((t0, [x, {"k": t0}]))       # (t5, [x, {"k": t5}])
        env.bsym(b)                     # b with t0 replaced in its args, outputs and subsymbols
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Proxy, Any]] = {}

    def __setitem__(self, old: Proxy, new: Any) -> None:
        self._entries[id(old)] = (old, new)

    def __getitem__(self, old: Proxy) -> Any:
        return self._entries[id(old)][1]

    def __contains__(self, old: Any) -> bool:
        return id(old) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, old: Any, default: Any = None) -> Any:
        """What stands for `old`, or `default` where nothing does."""
        entry = self._entries.get(id(old))
        return default if entry is None else entry[1]

    def bind(self, old: Any, new: Any, *, keep: Iterable[Proxy] = ()) -> None:
        """Map each proxy leaf of `old` to the leaf of `new` at its position (same structure, leaf for leaf).

        Leaves equal to their counterpart, and the proxies in `keep`, are left unmapped.
        """
        kept = {id(p) for p in keep}
        for o, n in zip(tree_flatten(old), tree_flatten(new), strict=True):
            if isinstance(o, Proxy) and o is not n and id(o) not in kept:
                self[o] = n

    def value(self, x: Any) -> Any:
        """What stands for the leaf `x` (x itself where nothing does)."""
        if isinstance(x, Proxy):
            entry = self._entries.get(id(x))
            if entry is not None:
                return entry[1]
        return x

    def __call__(self, tree: Any) -> Any:
        """`tree` (nested tuples, lists, dicts, slices) with every mapped proxy substituted."""
        return tree_map(self.value, tree) if self._entries else tree

    def bsym(self, bsym: BoundSymbol) -> BoundSymbol:
        """`bsym` with mapped proxies substituted in its arguments, outputs and subsymbols (itself if none is)."""
        if not self._entries:
            return bsym
        args, kwargs, output = self((bsym.args, bsym.kwargs, bsym.output))
        subsymbols = tuple(self.bsym(s) for s in bsym.subsymbols)
        if (_same_leaves((args, kwargs, output), (bsym.args, bsym.kwargs, bsym.output))
                and all(a is b for a, b in zip(subsymbols, bsym.subsymbols))):
            return bsym
        return bsym.replace(args=args, kwargs=kwargs, output=output, subsymbols=subsymbols)


def _same_leaves(a: Any, b: Any) -> bool:
    return all(x is y for x, y in zip(tree_flatten(a), tree_flatten(b), strict=True))


def replay_bsym(bsym: BoundSymbol, env: ProxyMap | Callable[[Any], Any], *, sym: Symbol | None = None,
                reuse_unchanged: bool = False) -> Any:
    """Record `bsym` again into the trace being recorded, on its arguments as `env` maps them; return the outputs.

    `sym` records another symbol in its place (same arguments, same outputs' structure).
    `env` is a `ProxyMap`, which then maps `bsym`'s old outputs to the new ones, or a
    function of one leaf giving its current value (the caller keeps its own state).
    With `reuse_unchanged`, a bound symbol none of whose arguments changed is appended
    as it is (its meta does not run again) and keeps its outputs.
    """
    value = env.value if isinstance(env, ProxyMap) else env
    args, kwargs = tree_map(value, (bsym.args, bsym.kwargs))
    if reuse_unchanged and _same_leaves((args, kwargs), (bsym.args, bsym.kwargs)):
        trace = current_trace()
        assert trace is not None, "replay_bsym records into the current trace"
        trace.bound_symbols.append(bsym)
        return bsym.output
    with replaying_captured():
        result = (sym or bsym.sym)(*args, **kwargs)
    if isinstance(env, ProxyMap):
        env.bind(bsym.output, result)
    return result


def replay(trace: Trace, inputs: Sequence[Any], output: Any = None) -> Any:
    """Record `trace`'s bound symbols again into the current trace, on `inputs` for its args.

    Returns the values of `output` (default: the trace's output) among the new ones.
    Each bound symbol is recorded with its own source location, so a replayed
    function still names the user's lines.
    """
    env = ProxyMap()
    env.bind(list(trace.args), list(inputs))
    target = current_trace()
    assert target is not None, "replay records into the current trace"
    saved_source = target.source
    try:
        for bsym in trace.bound_symbols:
            target.source = bsym.source or saved_source
            replay_bsym(bsym, env)
    finally:
        target.source = saved_source
    return env(trace.output if output is None else output)


def expand(bsym: BoundSymbol, fn: Callable[..., Any], within: Trace, *, what: str) -> list[BoundSymbol]:
    """The bound symbols that `fn(*bsym.args, **bsym.kwargs)` records, computing `bsym`'s own outputs.

    Each fresh proxy `fn` returns is substituted by `bsym`'s output at its position, so
    later bound symbols, which read those outputs, need no change. `within` is the trace
    being rewritten (the fresh proxies take names unused in it); `what` names `fn` in errors.
    """
    out, recorded = record(within, fn, bsym.args, bsym.kwargs, source=bsym.source)
    new = [x for x in tree_flatten(out) if isinstance(x, Proxy)]
    old = [x for x in tree_flatten(bsym.output) if isinstance(x, Proxy)]
    if len(new) != len(old):
        raise MinijitError(f"{what} of {bsym.sym.id} returned {len(new)} proxies, expected {len(old)}"
                           f"{where(bsym.source)}")
    inputs = {id(p) for p in bsym.proxy_args()}
    env = ProxyMap()
    for n, o in zip(new, old):
        if n is o:
            continue
        if id(n) in inputs:
            raise MinijitError(f"{what} of {bsym.sym.id} returns its input {n.name}; return a computed value"
                               f"{where(bsym.source)}")
        env[n] = o
    return [env.bsym(b) for b in recorded]


def record(within: Trace, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
           *, source: SourceLocation | None = None) -> tuple[Any, list[BoundSymbol]]:
    """What `fn(*args, **kwargs)` returns, and the bound symbols it records, in order.

    They are recorded into a scratch trace sharing `within`'s names (fresh proxies never
    clash with its own), at the source location `source`; the caller places them
    (a rule's replacement, `Edits.insert_before`, ...).
    """
    scratch = within.derive([], pass_name="record")
    scratch.source = source
    with tracing(scratch):
        out = fn(*args, **(kwargs or {}))
    return out, scratch.bound_symbols


# A rewrite rule: given a bound symbol (its arguments already substituted) and the substitution,
# None keeps the bound symbol; a sequence of bound symbols replaces it (empty: drops it). A rule
# that replaces or drops a bound symbol maps its outputs (`env[old] = new`) where later ones read them.
Rule = Callable[[BoundSymbol, ProxyMap], Sequence[BoundSymbol] | None]


def rewrite(trace: Trace, rule: Rule, *, pass_name: str, env: ProxyMap | None = None) -> Trace:
    """A new trace: each bound symbol of `trace`, substituted through `env`, kept or replaced as `rule` says.

    The output is substituted too. `env` (default: empty) may start with substitutions
    of the inputs. The input trace is left as it was.

    Example::

        def drop_double_negation(bsym, env):      # neg(neg(x)) -> x
            ...
            env[bsym.output] = x
            return ()

        simpler = rewrite(trace, drop_double_negation, pass_name="no double negation")
    """
    env = ProxyMap() if env is None else env
    bound_symbols: list[BoundSymbol] = []
    for bsym in trace.bound_symbols:
        bsym = env.bsym(bsym)
        replacement = rule(bsym, env)
        if replacement is None:
            bound_symbols.append(bsym)
        else:
            bound_symbols.extend(replacement)
    return trace.derive(bound_symbols, pass_name=pass_name, output=env(trace.output))


class Edits:
    """Changes to a trace's bound symbols by their positions in it, applied at once by `apply`.

    For a pass that decides by position (an analysis indexed by position, a walk backwards):
    each bound symbol may be replaced by several (none: dropped), and bound symbols inserted
    right before or after it. The trace is left as it was. Example::

        edits = Edits(trace)
        edits.replace(3, in_place)                   # the 4th bound symbol -> one writing into its input
        edits.insert_after(5, [release])             # a bound symbol after the 6th
        new = edits.apply(pass_name="my pass")
    """

    __slots__ = ("_after", "_before", "_replaced", "trace")

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._replaced: dict[int, tuple[BoundSymbol, ...]] = {}
        self._before: dict[int, list[BoundSymbol]] = {}
        self._after: dict[int, list[BoundSymbol]] = {}

    def __getitem__(self, i: int) -> BoundSymbol:
        """The bound symbol at position `i` as edited so far (the last of its replacements; the original if dropped)."""
        replaced = self._replaced.get(i)
        return replaced[-1] if replaced else self.trace.bound_symbols[i]

    def replace(self, i: int, *bsyms: BoundSymbol) -> None:
        """Put `bsyms` in place of the bound symbol at position `i` (a later call for `i` wins)."""
        self._replaced[i] = bsyms

    def drop(self, i: int) -> None:
        """Leave out the bound symbol at position `i`."""
        self._replaced[i] = ()

    def insert_before(self, i: int, bsyms: Iterable[BoundSymbol]) -> None:
        """Put `bsyms` right before position `i` (after those inserted there earlier); `i` may be the length."""
        self._before.setdefault(i, []).extend(bsyms)

    def insert_after(self, i: int, bsyms: Iterable[BoundSymbol]) -> None:
        """Put `bsyms` right after position `i` (after those inserted there earlier)."""
        self._after.setdefault(i, []).extend(bsyms)

    def __bool__(self) -> bool:
        return bool(self._replaced or self._before or self._after)

    def bound_symbols(self) -> list[BoundSymbol]:
        """The edited list of bound symbols."""
        if not self:
            return list(self.trace.bound_symbols)
        out: list[BoundSymbol] = []
        for i, bsym in enumerate(self.trace.bound_symbols):
            out.extend(self._before.get(i, ()))
            replaced = self._replaced.get(i)
            if replaced is None:
                out.append(bsym)
            else:
                out.extend(replaced)
            out.extend(self._after.get(i, ()))
        out.extend(self._before.get(len(self.trace.bound_symbols), ()))
        return out

    def apply(self, *, pass_name: str, output: Any = None, args: list[Proxy] | None = None) -> Trace:
        """A new trace (`Trace.derive`): the edited bound symbols, with `output` and `args` where given."""
        return self.trace.derive(self.bound_symbols(), pass_name=pass_name, output=output, args=args)
