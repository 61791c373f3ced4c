"""The trace verifier: the rules every trace keeps, checked after every pass when asked.

`check_trace(trace)` raises `TraceInvariantError`, naming the trace, the bound symbol
(its printed line) and the rule, when

- **defined before use**: a bound symbol (or a subsymbol, within its parent) reads a
  proxy that is neither a trace input nor an output of something before it, or one
  that a `del` released;
- **unique names**: two different proxies are defined under one name (the printed
  source tells proxies apart by name only);
- **outputs defined**: the trace returns a proxy it does not define;
- **meta re-runs**: re-running a bound symbol's meta function on its arguments fails,
  or gives outputs whose shape, dtype or device differ from the recorded ones (a pass
  that builds bound symbols without running metas got one wrong);
- **one copy per input** and **reads before the copy** (docs/design.md, invariant 1), on
  traces after functionalization: at most one copy onto any input's storage (aliased
  inputs and views of inputs count as that storage, as the symbols' effects say), and
  no read of an input's old value after something wrote into its storage;
- **copies settled** (docs/design.md, invariants 1 and 2), `check_copies`, on a trace
  whose writes the passes have settled (after `write copies in place` and `reuse
  buffers`): at most one copy per input storage, no read of a value (an input's old
  value, or an intermediate updated in place) after a write into its memory
  overwrote it, and every write into an input's memory ending with a copy into it.
  It raises `CopyToOutError`.

Invariant 1 is checked here and nowhere else, all rules asking the trace's one memory
model (minijit/transforms/memory.py, `memory_model`). One environment switch,
`MINIJIT_CHECK_TRACES`, says how much runs (`check_level`): unset (the default), only
`copies settled`, on every compile's settled traces (compiles stay as fast); `1`, every
rule after every pass of the pipeline (the test suite sets it); `0`, none.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from minijit import environment
from minijit.errors import CopyToOutError, TraceInvariantError, where
from minijit.ir import BoundSymbol, Proxy, TensorProxy, Trace, tracing, tree_flatten, tree_iter
from minijit.ir.context import recording_constraints, replaying_captured
from minijit.ir.printing import Constants
from minijit.ir.proxies import number_value
from minijit.transforms.grad import PYTHON_DEL
from minijit.transforms.memory import memory_model, read_proxies

__all__ = ["INVARIANTS_OF_RULE", "CheckLevel", "TraceChecker", "check_copies", "check_level", "check_trace",
           "checking_traces"]


class CheckLevel(enum.Enum):
    """How much of the verifier the pipeline runs (`MINIJIT_CHECK_TRACES`)."""

    OFF = "0"  # nothing
    SETTLED = ""  # `copies settled` on the traces whose writes the passes settled (the default)
    EVERY_PASS = "1"  # every rule, on the trace of every pass, `copies settled` on the settled traces too


def check_level() -> CheckLevel:
    """The level `MINIJIT_CHECK_TRACES` asks for: unset or empty, `SETTLED`; `0`, `OFF`; `1`, `EVERY_PASS`
    (anything else is an `EnvironmentVariableError`, `minijit.environment`)."""
    value = environment.check_traces()
    return CheckLevel.SETTLED if value == "" else CheckLevel.OFF if value == "0" else CheckLevel.EVERY_PASS


def checking_traces() -> bool:
    """Whether `MINIJIT_CHECK_TRACES` asks the pipeline to verify the trace after every pass."""
    return check_level() is CheckLevel.EVERY_PASS


def check_trace(trace: Trace, *, functional: bool | None = None) -> None:
    """Raise TraceInvariantError if `trace` breaks a rule (see the module docstring).

    `functional` says the trace comes after functionalization, where invariant 1
    holds; by default, every trace but a captured one.

    Example::

        trace, _ = functionalize(captured)
        check_trace(trace)  # raises if, say, two copies write into one input
    """
    TraceChecker().check(trace, functional=functional)


class TraceChecker:
    """Checks the traces of one compile, looking at each bound symbol's insides only once.

    Passes hand most bound symbols on unchanged, so what depends on a bound symbol alone
    (its meta re-run, what its decomposition reads and defines) is worked out the first
    time a trace of the compile holds it, and only matched against each trace after.
    """

    def __init__(self) -> None:
        self._facts: dict[int, _Facts] = {}
        self._meta_results: dict[Any, _MetaResult] = {}

    def check(self, trace: Trace, *, functional: bool | None = None) -> None:
        """Raise TraceInvariantError if `trace` breaks a rule (see the module docstring)."""
        if functional is None:
            functional = trace.pass_name != "capture"
        names = [p.name for p in trace.args]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            _fail(trace, None, "unique names", f"two inputs are named {twice}")
        self._check_definitions(trace)
        # Without a write, nothing can be copied twice or read after it (most traces).
        if functional and any(self._facts[id(b)].written for b in trace.bound_symbols):
            _check_copies_last(trace, lambda b: self._facts_of(trace, b))

    def _facts_of(self, trace: Trace, bsym: BoundSymbol) -> _Facts:
        facts = self._facts.get(id(bsym))
        if facts is None:
            facts = self._facts[id(bsym)] = _Facts.of(trace, bsym)
        return facts

    def _check_definitions(self, trace: Trace) -> None:
        """Defined before use, unique names, outputs defined; and each new bound symbol's meta re-run."""
        defined: dict[str, Proxy] = {p.name: p for p in trace.args}
        released: set[str] = set()  # the names a `del` dropped
        for bsym in trace.bound_symbols:
            facts = self._facts_of(trace, bsym)
            for p in facts.args:
                _check_read(trace, bsym, p, defined)
                if p.name in released:
                    _fail(trace, bsym, "defined before use", f"it reads {p.name}, which a `del` before it released")
            # What a decomposition reads from outside it must be defined before its parent (a `del`
            # does not count: the final trace's subsymbols, where the `del`s are, are comments).
            for sub, p in facts.outer_reads:
                _check_read(trace, sub, p, defined)
            for sub, o in facts.inner_defines:
                _check_new(trace, sub, o, defined)
            if not facts.meta_checked:
                _check_meta(trace, bsym, self._meta_results)
                facts.meta_checked = True
            if bsym.sym is PYTHON_DEL:
                released.update(p.name for p in bsym.args)
                continue
            for o in facts.defines:
                _check_new(trace, bsym, o, defined)
                defined[o.name] = o
        for p in tree_iter(trace.output):
            if isinstance(p, Proxy) and (defined.get(p.name) is not p or p.name in released):
                _fail(trace, None, "outputs defined", f"the trace returns {p.name}, which it does not define"
                      + (" under that name" if p.name in defined else ""))


@dataclass
class _Facts:
    """What the rules need to know about one bound symbol, whatever trace holds it."""

    bsym: BoundSymbol  # kept alive, so that its id stays its own
    args: list[Proxy]
    defines: list[Proxy]  # its outputs that are new proxies
    outer_reads: list[tuple[BoundSymbol, Proxy]]  # (subsymbol, proxy) its decomposition reads from outside it
    inner_defines: list[tuple[BoundSymbol, Proxy]]  # (subsymbol, proxy) its decomposition defines
    reads: list[Proxy]  # what it reads (not its `Effects.unread`: an `out=`, which it writes)
    written: list[TensorProxy]  # what it writes into (a fusion region: what its members write into)
    meta_checked: bool = False

    @classmethod
    def of(cls, trace: Trace, bsym: BoundSymbol) -> _Facts:
        outer: list[tuple[BoundSymbol, Proxy]] = []
        inner: list[tuple[BoundSymbol, Proxy]] = []
        _walk_decomposition(trace, bsym.subsymbols, {}, outer, inner)
        # The parent's outputs, which its decomposition computes, are defined by the parent.
        mine = {id(o) for o in bsym.proxy_outputs()}
        return cls(bsym, list(bsym.proxy_args()), _new_outputs(bsym), outer,
                   [(sub, o) for sub, o in inner if id(o) not in mine], list(read_proxies(bsym)), bsym.written())


def _new_outputs(bsym: BoundSymbol) -> list[Proxy]:
    args = {id(p) for p in bsym.proxy_args()}
    # An in-place op of a captured trace hands back the tensor it wrote: not a new definition.
    return [o for o in bsym.proxy_outputs() if id(o) not in args]


def _walk_decomposition(trace: Trace, subsymbols: Sequence[BoundSymbol], local: dict[str, Proxy],
                        outer: list[tuple[BoundSymbol, Proxy]], inner: list[tuple[BoundSymbol, Proxy]]) -> None:
    """Check the reads and definitions inside a decomposition; collect what it reads from outside and defines."""
    for sub in subsymbols:
        for p in sub.proxy_args():
            if p.name in local:
                _check_read(trace, sub, p, local)
            else:
                outer.append((sub, p))
        _walk_decomposition(trace, sub.subsymbols, dict(local), outer, [])
        for o in _new_outputs(sub):
            _check_new(trace, sub, o, local)
            local[o.name] = o
            inner.append((sub, o))


def _check_new(trace: Trace, bsym: BoundSymbol, o: Proxy, defined: dict[str, Proxy]) -> None:
    known = defined.get(o.name)
    if known is not None and known is not o:
        _fail(trace, bsym, "unique names", f"{o.name} is defined again (it is defined earlier)")


def _check_read(trace: Trace, bsym: BoundSymbol, p: Proxy, defined: dict[str, Proxy]) -> None:
    known = defined.get(p.name)
    if known is None:
        _fail(trace, bsym, "defined before use", f"it reads {p.name}, which nothing before it defines")
    if known is not p and _metadata(known) != _metadata(p):
        _fail(trace, bsym, "unique names", f"it reads a {p.type_string()} named {p.name}, but {p.name} is "
              f"defined as a {known.type_string()}")


def _metadata(p: Proxy) -> tuple[Any, ...]:
    if isinstance(p, TensorProxy):
        return (tuple(number_value(s) for s in p.shape), p.dtype, p.device)
    return (type(p),)


# -- meta re-runs --------------------------------------------------------------------------
# A meta's result as the rule compares it: each output leaf's metadata (None for a non-tensor).
_MetaResult = tuple[list[Any], str]


def _check_meta(trace: Trace, bsym: BoundSymbol, results: dict[Any, _MetaResult]) -> None:
    """Re-run `bsym`'s meta on its arguments and compare the outputs' metadata with the recorded ones.

    `results` keeps the results of earlier re-runs of the same meta on the same arguments (an
    executor's symbol carries the meta of the symbol it claimed), which are not run again.
    """
    sym = bsym.sym
    # Not re-run: what has no meta (a fusion region: an executor's callable over members that
    # were checked in earlier traces; a `del`), and what changes state outside the trace.
    if sym.meta is None or sym.effects.external:
        return
    kwargs = bsym.kwargs
    into = sym.effects.result_into
    out_arg = kwargs.get(into) if type(into) is str else None
    if out_arg is not None:
        # `out=` added by an executor (write_copies_in_place, reuse_buffers) to a functional op:
        # the meta computes the result, which must fit the buffer it is written into.
        kwargs = {k: v for k, v in kwargs.items() if k != into}
    key = _call_key(sym.meta, bsym.args, kwargs)
    result = results.get(key) if key is not None else None
    if result is None:
        result = _rerun(trace, bsym, kwargs)
        if key is not None:
            results[key] = result
    again, described = result
    recorded = tree_flatten(bsym.output)
    if out_arg is not None:
        recorded, again = [*recorded, out_arg], [*again, *again[:1]]
    if len(recorded) != len(again) or any(isinstance(r, TensorProxy) != (a is not None) for r, a in zip(recorded, again)):
        _fail(trace, bsym, "meta re-runs", f"its meta returns {described}, the trace records {_describe(bsym.output)}")
    for r, a in zip(recorded, again):
        if a is not None and _metadata(r) != a:
            _fail(trace, bsym, "meta re-runs", f"its meta gives {_type_string(a)} where the trace records "
                  f"{r.name}: {r.type_string()}")


def _rerun(trace: Trace, bsym: BoundSymbol, kwargs: dict[str, Any]) -> _MetaResult:
    scratch = Trace(f"{trace.fn_name}_meta_check", _layouts=trace.layouts)  # the metas see the layouts the capture did
    scratch.source = bsym.source
    try:
        # The meta decides on the traced values as the capture did; what it records goes nowhere.
        with tracing(scratch), recording_constraints(), replaying_captured():
            rerun = bsym.sym.meta(*bsym.args, **kwargs)
    except Exception as e:  # any failure of the meta is the finding
        _fail(trace, bsym, "meta re-runs", f"its meta raised {type(e).__name__}: {e}")
    leaves = [_metadata(x) if isinstance(x, TensorProxy) else None for x in tree_flatten(rerun)]
    return leaves, _describe(rerun)


def _call_key(meta: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A key equal for two calls of `meta` on the same arguments (proxies by identity), or None."""
    leaves = tuple(id(x) if isinstance(x, Proxy) else (type(x), x) for x in tree_flatten((args, kwargs)))
    key = (meta, len(args), tuple(kwargs), leaves)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _type_string(metadata: tuple[Any, ...]) -> str:
    shape, dtype, device = metadata
    return TensorProxy(shape, dtype, device, name="_").type_string()


def _describe(value: Any) -> str:
    leaves = tree_flatten(value)
    return "(" + ", ".join(x.type_string() if isinstance(x, Proxy) else type(x).__name__ for x in leaves) + ")"


# -- invariant 1: copies last -------------------------------------------------------------------
def _executed(bsyms: Sequence[BoundSymbol]) -> Iterator[BoundSymbol]:
    """The bound symbols in the order they run: a fusion region's members in its place."""
    for bsym in bsyms:
        if bsym.sym.meta is None and bsym.subsymbols:
            yield from bsym.subsymbols
        else:
            yield bsym


def _executed_order(trace: Trace) -> list[BoundSymbol]:
    """`trace`'s bound symbols in the order they run (`_executed`): the walk of its executed memory model."""
    return list(_executed(trace.bound_symbols))


def _check_copies_last(trace: Trace, facts_of: Callable[[BoundSymbol], _Facts]) -> None:
    """docs/design.md, invariant 1: one copy per input storage; the old value is read only before a write."""
    bsyms = _executed_order(trace)
    memory = memory_model(trace, order=_executed_order)
    copied: dict[str, BoundSymbol] = {}
    overwritten: dict[str, BoundSymbol] = {}
    for bsym in bsyms:
        if bsym.sym is PYTHON_DEL:
            continue
        facts = facts_of(bsym)
        for p in facts.reads:
            for r in memory.input_storages(p):
                if r in overwritten:
                    _fail(trace, bsym, "reads before the copy",
                          f"it reads {p.name}, the old value of input {r}, after "
                          f"`{_line(overwritten[r])}`{where(overwritten[r].source)} wrote into {r}")
        for target in facts.written:
            for r in memory.input_storages(target):
                overwritten.setdefault(r, bsym)
                if bsym.sym.effects.copies:
                    if r in copied:
                        _fail(trace, bsym, "one copy per input",
                              f"it copies into input {r} (through {target.name}), which "
                              f"`{_line(copied[r])}`{where(copied[r].source)} copied into already")
                    copied[r] = bsym
    for p in tree_iter(trace.output):
        for r in memory.input_storages(p) if isinstance(p, Proxy) else ():
            if r in overwritten:
                _fail(trace, None, "reads before the copy",
                      f"the trace returns {p.name}, the old value of input {r}, which "
                      f"`{_line(overwritten[r])}`{where(overwritten[r].source)} overwrote")


def check_copies(trace: Trace) -> None:
    """The rule 'copies settled': raise CopyToOutError if `trace` writes into memory in a way that breaks
    invariants 1 and 2 (docs/design.md).

    Follows which memory each proxy lives in (the trace's memory model: an input's, or a
    buffer an op allocated; views and `out=`/in-place results share their source's). Checked:
    at most one copy_to_out_ per input storage; no read of a value after a write into
    its memory overwrote it (an input's old value, or an intermediate updated in
    place); every write into an input's memory ends with a copy_to_out_ into it.
    """
    bsyms = trace.bound_symbols
    memory = memory_model(trace)
    problems: list[str] = []
    for i, bsym in enumerate(bsyms):
        for p in read_proxies(bsym):
            w = memory.overwritten_at(p)
            if w is not None and w < i:
                what = f"the old value of input {p.name}" if any(p is a for a in trace.args) else p.name
                problems.append(f"{_show(trace, bsym)} reads {what} after {_show(trace, bsyms[w])} overwrote "
                                "its memory")
    for p in tree_iter(trace.output):
        if isinstance(p, Proxy) and memory.overwritten_at(p) is not None:
            problems.append(f"the trace returns {p.name}, whose memory {_show(trace, bsyms[memory.overwritten_at(p)])}"
                            " overwrote")
    written = memory.written_inputs()
    for m in sorted((m for m in written if memory.copies_onto(m)), key=lambda m: memory.copies_onto(m)[0]):
        idx = memory.copies_onto(m)
        if len(idx) > 1:
            problems.append(f"input {m} is written by {len(idx)} copies: " + "; ".join(_show(trace, bsyms[i]) for i in idx))
    for m in written:
        if not memory.copies_onto(m):
            problems.append(f"{_show(trace, bsyms[memory.writers(m)[0]])} writes into input {m} without a "
                            "copy_to_out_ saying so")
    if problems:
        raise CopyToOutError(f"trace {trace.fn_name} ({trace.pass_name}) breaks the rule 'copies settled' "
                             f"(docs/design.md, {_numbered('copies settled')}), the copy_to_out_ rules:\n  "
                             + "\n  ".join(dict.fromkeys(problems)))


def _show(trace: Trace, bsym: BoundSymbol) -> str:
    return f"`{_line(bsym)}`{where(bsym.source)}"


# -- reporting ---------------------------------------------------------------------------------
def _line(bsym: BoundSymbol) -> str:
    return bsym.python_lines(Constants(), "", subsymbol_depth=0)[0].split("  #")[0]


# The rules that check numbered invariants of docs/design.md; the others keep a trace well formed.
INVARIANTS_OF_RULE: dict[str, tuple[int, ...]] = {
    "one copy per input": (1,), "reads before the copy": (1,), "copies settled": (1, 2)}


def _numbered(rule: str) -> str:
    """'invariant 1', 'invariants 1 and 2': the invariants `rule` checks."""
    numbers = [str(n) for n in INVARIANTS_OF_RULE[rule]]
    return f"invariant {numbers[0]}" if len(numbers) == 1 else f"invariants {', '.join(numbers[:-1])} and {numbers[-1]}"


def _fail(trace: Trace, bsym: BoundSymbol | None, rule: str, detail: str) -> None:
    at = f" at `{_line(bsym)}`{where(bsym.source)}" if bsym is not None else ""
    named = f"'{rule}' (docs/design.md, {_numbered(rule)})" if rule in INVARIANTS_OF_RULE else f"'{rule}'"
    raise TraceInvariantError(f"trace {trace.fn_name} ({trace.pass_name}) breaks the rule {named}{at}: {detail}")
