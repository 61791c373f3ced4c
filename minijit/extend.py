"""The executor plugin API: the only part of minijit that executors import.

An executor runs symbols. An `OperatorExecutor` has an implementation per symbol it
claims, each with an optional checker that can refuse a particular call (by dtype,
say); it can also declare new operators (a custom kernel as a symbol of its own).
A `FusionExecutor` instead claims the prims it can fuse and turns each region of
consecutive fusible bound symbols into one callable (see `minijit.transforms.fusion`).
The claiming pass asks the executors in priority order, for each bound symbol,
whether they run it; where none does, it asks again for the symbol's decomposition;
the torch executor comes last and runs everything.

Executors are found by name: the built-in ones (`torch`, `triton`, `nvfuser`), the
ones registered with `register_executor`, and third-party plugins declared in the
`minijit.executors` entry-point group of an installed package::

    [project.entry-points."minijit.executors"]
    myex = "my_package.my_module:ex"

Example::

    from minijit.extend import OperatorExecutor, register_executor
    import torch

    ex = OperatorExecutor("myex")
    ex.register_implementation(torch.nn.functional.gelu, my_fast_gelu,
                               checker=lambda a, approximate="none": a.dtype == torch.float32)
    register_executor(ex)
    jf = minijit.jit(fn, executors=["myex"])
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import MinijitError
from minijit.ir import (
    BoundSymbol,
    Effects,
    NumberProxy,
    Proxy,
    Symbol,
    Tag,
    TensorProxy,
    Trace,
    check_table,
    current_trace,
    tracing,
)
from minijit.ops import cuda_attention, prims
from minijit.ops.aten_prims import aten_prim_implementations
from minijit.ops.eager_facts import FOREACH_MUL_ROUNDS_NUMBER_FIRST, eager_implementations
from minijit.ops.opaque import OPAQUE
from minijit.ops.registry import ALL_LTORCH, ltorch_symbol_for
from minijit.transforms.fusion import Region
from minijit.transforms.vjp import VjpRule, add_rule
from minijit.transforms.vjp.registry import check_rule_signature

__all__ = [
    "FOREACH_MUL_ROUNDS_NUMBER_FIRST", "OPAQUE", "BoundSymbol", "Effects", "Executor", "ExecutorUnavailableError",
    "FusionExecutor", "Implementation", "MinijitError", "NumberProxy", "OperatorExecutor", "Proxy", "Region", "Symbol",
    "Tag", "TensorProxy",
    "add_default_executor", "aten_prim_implementations", "check_table", "cuda_attention", "get_default_executors",
    "get_executor", "ltorch_eager_implementations", "prims", "register_executor", "remove_default_executor",
    "resolve_executors", "resolve_symbol",
]


class ExecutorUnavailableError(MinijitError):
    """An executor the user asked for cannot run in this process (missing package, no GPU)."""


def ltorch_eager_implementations() -> dict[Symbol, Callable[..., Any]]:
    """ltorch op -> the torch callable that runs it with the op's own signature."""
    return eager_implementations()


@dataclass
class Implementation:
    """How an executor runs one symbol.

    `fn` takes the bound symbol's arguments. `execution_transform`, if given, takes
    them too but is traced instead: the symbols it calls (e.g. operators of this
    executor) replace the bound symbol and are claimed in turn. `grad_transform`
    is the executor's own VJP rule for the symbol, as a `(forward, backward)` pair
    (see `OperatorExecutor.register_implementation`).
    """

    fn: Callable[..., Any] | None
    checker: Callable[..., bool] | None = None
    execution_transform: Callable[..., Any] | None = None
    grad_transform: tuple[Callable[..., Any], Callable[..., Any]] | None = None


class Executor:
    """Base class of executors: a name, whether it can run in this process, and what it runs.

    The claiming and grad passes ask every executor the same questions, answered here for
    an executor that runs nothing: `fuses_regions` (a `FusionExecutor` says True),
    `implementation_for` (an `OperatorExecutor` answers per call) and `grad_rule_for`.
    """

    # Whether this executor claims regions (`FusionExecutor`: `claims`, `fusible`, `fuse`)
    # rather than single calls (`implementation_for`).
    fuses_regions = False

    def __init__(self, name: str, version: str | None = None):
        if not name.isidentifier():
            raise ValueError(f"an executor name must be an identifier, got {name!r}")
        self.name = name
        self.version = version
        # The name final traces call this executor's functions through (`torchex.add`);
        # distinct from `name` so that the torch executor does not shadow the torch module
        # (a name that ends in "ex" already, `my_ex`, is its own namespace).
        self.namespace = name if name.endswith("ex") else f"{name}ex"

    def unavailable_reason(self) -> str | None:
        """Why this executor cannot run here (missing package, no GPU), or None if it can."""
        return None

    def default_device(self) -> str | None:
        """The device type ("cuda") where this executor is one of `jit`'s defaults once a device of that type is
        present (and it is available), or None: used only when named or added (`add_default_executor`)."""
        return None

    def implementation_for(self, bsym: BoundSymbol) -> Implementation | None:
        """The implementation that runs this call, or None if the executor does not claim it by itself."""
        return None

    def grad_rule_for(self, bsym: BoundSymbol) -> VjpRule | None:
        """The executor's own VJP rule for this call it claims, or None: the symbol's rule (`minijit.transforms.vjp`)."""
        return None

    def produce_into(self, producer: BoundSymbol, out: TensorProxy) -> BoundSymbol | None:
        """A version of `producer` (a bound symbol this executor runs) that writes its result into `out`'s memory.

        Called only where the copy_to_out_ analysis found it safe (docs/design.md, invariant 2);
        `producer` may read `out` itself but no other view of it. None: keep the real copy.
        """
        return None

    def allocates_output(self, bsym: BoundSymbol) -> bool:
        """Whether running `bsym` (a bound symbol this executor runs) always returns a new tensor of its own.

        True lets the buffer-reuse pass compute a later op into that tensor once nothing
        reads it any more. False (the default) where the result may share memory with
        anything else: an argument, a constant, a tensor cached by the executor.
        """
        return False

    def group_key(self, bsym: BoundSymbol, writes_first_argument: bool) -> Hashable | None:
        """The kind of multi-tensor call `bsym` (a bound symbol this executor runs) may join, or None (the default).

        Independent calls with equal keys are gathered into one call, made by `grouped`
        (minijit.transforms.grouping). `writes_first_argument`: `bsym` writes its result into its
        first argument's tensor (`out=` that tensor), as torch.optim's foreach code does.
        """
        return None

    def grouped(self, bsyms: Sequence[BoundSymbol], key: Hashable) -> BoundSymbol:
        """One bound symbol doing what `bsyms` (calls whose `group_key` is `key`) do, in order; its output is the
        tuple of theirs."""
        raise NotImplementedError(f"{self.name} groups no calls")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def resolve_symbol(sym_or_fn: Any) -> Symbol:
    """The minijit symbol for a symbol, a torch callable, or an ltorch op name."""
    if isinstance(sym_or_fn, Symbol):
        return sym_or_fn
    if isinstance(sym_or_fn, str) and sym_or_fn in ALL_LTORCH:
        return ALL_LTORCH[sym_or_fn]
    sym = ltorch_symbol_for(sym_or_fn)
    if sym is None:
        raise MinijitError(f"{sym_or_fn!r} is not a minijit symbol nor a torch callable minijit knows")
    return sym


def _meta_like(sym: Symbol) -> Callable[..., Any]:
    """A prim-style meta that gives the outputs `sym` would give, without recording its decomposition."""
    if sym.is_prim:
        return sym.meta

    def meta(*args: Any, **kwargs: Any) -> Any:
        # Share the enclosing trace's names so the outputs never clash with its proxies.
        outer = current_trace()
        scratch = Trace("meta", _names=outer.names if outer is not None else None,
                        _layouts=outer.layouts if outer is not None else None)
        with tracing(scratch):
            return sym.meta(*args, **kwargs)

    return meta


class OperatorExecutor(Executor):
    """An executor that runs individual symbols with its own implementations.

    Example::

        ex = OperatorExecutor("mykernels", version="0.1")
        fused_rms = ex.register_operator("fused_rms_norm", like=my_reference_rms_norm, fn=my_kernel)
        ex.register_implementation(torch.nn.functional.gelu, my_gelu)
    """

    def __init__(self, name: str, version: str | None = None):
        super().__init__(name, version)
        self.implementations: dict[Symbol, Implementation] = {}
        self._impl_symbols: dict[Symbol, Symbol] = {}
        self.operators: dict[str, Symbol] = {}
        # symbol -> this executor's VJP rule for the calls it claims (`grad_transform=`).
        self._grad_rules: dict[Symbol, VjpRule] = {}

    def register_implementation(self, sym_or_fn: Any, fn: Callable[..., Any] | None = None, *,
                                checker: Callable[..., bool] | None = None,
                                execution_transform: Callable[..., Any] | None = None,
                                grad_transform: tuple[Callable[..., Any], Callable[..., Any]] | None = None) -> None:
        """Claim a symbol (or the symbol a torch callable stands for) with `fn`.

        `checker(*args, **kwargs)` runs on proxies when a trace is compiled and may
        refuse a call; the claiming pass then tries the next executor or the
        symbol's decomposition. Instead of `fn`, an `execution_transform` with the
        symbol's signature may rewrite the call into other symbols (typically this
        executor's operators), which are claimed in turn.

        A claimed op trains with the symbol's own VJP rule, unless a
        `grad_transform=(forward, backward)` is given (as for `register_operator`):
        then, for the calls this executor claims (its checker accepts them and no
        executor before it claims them), the grad pass uses that pair instead. The
        symbol's rule stays what other executors get.

        Example::

            ex.register_implementation(torch.nn.functional.gelu, my_gelu,
                                       checker=lambda a, approximate="none": a.dtype == torch.float32)
        """
        if fn is None and execution_transform is None:
            raise ValueError("register_implementation needs fn or execution_transform")
        sym = resolve_symbol(sym_or_fn)
        if grad_transform is not None:
            forward, backward = grad_transform
            rule = VjpRule(sym, forward, backward)
            check_rule_signature(rule, f"the grad_transform of executor {self.name}")
            self._grad_rules[sym] = rule
        else:
            self._grad_rules.pop(sym, None)
        self.implementations[sym] = Implementation(fn, checker, execution_transform, grad_transform)
        self._impl_symbols.pop(sym, None)

    def register_operator(self, name: str, *, like: Any = None, meta: Callable[..., Any] | None = None,
                          fn: Callable[..., Any],
                          grad_transform: tuple[Callable[..., Any], Callable[..., Any]] | None = None) -> Symbol:
        """Create a new symbol `name` that this executor runs with `fn`.

        Its outputs come from `meta` (a function of proxies returning proxies) or, with
        `like=`, from an existing symbol, torch callable or plain function written with
        minijit-traceable ops, whose result metadata is reused. Call the returned symbol
        in a function traced by minijit to use it (outside tracing it runs `fn`).

        `grad_transform=(forward, backward)` makes the operator differentiable: it is
        registered as the operator's VJP rule with the grad transform
        (`minijit.transforms.vjp`). `forward(*args)` calls the operator and returns
        `(outputs, residuals)`; `backward(residuals, *cotangents)` returns one gradient
        (or None) per positional argument; both are written with minijit symbols
        (other operators of the executor included).

        Example::

            rms = ex.register_operator("rms_norm_kernel", like=reference_rms_norm, fn=triton_rms_norm)
        """
        if (like is None) == (meta is None):
            raise ValueError("register_operator needs exactly one of like= and meta=")
        if meta is None:
            if isinstance(like, Symbol):
                meta = _meta_like(like)
            else:
                sym_like = ltorch_symbol_for(like)
                meta = _meta_like(sym_like) if sym_like is not None else _meta_like(Symbol(name, like, namespace="like"))
        sym = Symbol(name, meta, namespace=self.namespace, is_prim=True, fn=fn)
        self.implementations[sym] = Implementation(fn, grad_transform=grad_transform)
        self.operators[name] = sym
        if grad_transform is not None:
            # The operator is a symbol of its own: its rule is the symbol's, for every executor.
            add_rule(VjpRule(sym, *grad_transform), f"the grad_transform of executor {self.name}")
        return sym

    def implementation_for(self, bsym: BoundSymbol) -> Implementation | None:
        """The implementation that runs this call, or None if the executor does not claim it."""
        impl = self.implementations.get(bsym.sym)
        if impl is None:
            return None
        if impl.checker is not None and not impl.checker(*bsym.args, **bsym.kwargs):
            return None
        return impl

    def grad_rule_for(self, bsym: BoundSymbol) -> VjpRule | None:
        """The `grad_transform` given with this call's implementation, as a VJP rule; None: the symbol's own rule."""
        return self._grad_rules.get(bsym.sym)

    def executable_symbol(self, sym: Symbol) -> Symbol:
        """The symbol printed in final traces for `sym` run by this executor (`<name>.<op>`)."""
        exe = self._impl_symbols.get(sym)
        if exe is None:
            impl = self.implementations[sym]
            # A prim and an ltorch op may share a name (transpose, reshape) and a trace both;
            # the printed trace calls them through one namespace, so the prim gets a prefix.
            name = f"prims_{sym.name}" if sym.namespace == "prims" and sym.name in ALL_LTORCH else sym.name
            if isinstance(impl.fn, Symbol) and self.operators.get(impl.fn.name) is impl.fn:
                name = impl.fn.name  # an operator of this executor runs it: the trace shows the operator
            exe = Symbol(name, sym.meta, namespace=self.namespace, is_prim=True, tags=sym.tags, fn=impl.fn,
                         effects=sym.effects)
            self._impl_symbols[sym] = exe
        return exe


class FusionExecutor(Executor):
    """An executor that fuses regions of consecutive bound symbols into one callable each.

    A subclass says which calls it can fuse (`fusible`), may refuse to grow a region
    (`can_join`), and turns a region into a callable (`fuse`). The claiming pass gives
    it every prim it finds fusible, and every composite symbol whose whole
    decomposition is fusible (as that decomposition); the fusion pass then groups
    them into regions (`minijit.transforms.fusion.partition`), each printed as one
    bound symbol `(t4, t7) = tritonex.fusion_0(t1, t2)` with its members as comments.

    Example::

        class MyFuser(FusionExecutor):
            def fusible(self, bsym):
                return bsym.sym in (prims.add, prims.mul)

            def fuse(self, region):
                return my_compile(region)   # a callable: region inputs -> region outputs
    """

    fuses_regions = True
    # Whether regions may absorb `copy_to_out_` (writing the copied value straight into the
    # target inside the region, where the executor's own analysis finds it safe). With False,
    # copies stay outside regions, for the copy_to_out_ analysis pass to decide.
    fuse_copies_to_out = True
    # Random prims (`Effects.random`: draw from, seed or read torch's generator) stay with the
    # torch executor, which makes eager's draws in trace order. An executor whose kernels draw
    # in their own way may claim them by saying how here, in words; the sentence then appears
    # on each of its regions that holds one, in the printed trace.
    random_draws: str | None = None
    # Whether numbers that code computes from 0-dim tensors stay tensors where the library offers that, as under
    # torch.compile (torch.optim's step count: `_get_value`, `_stack_if_compiling`), so that the arithmetic on them
    # joins a region instead of splitting it at an `item()`. Their rounding is then float32's, as torch.compile's,
    # where eager computes in float64.
    numbers_stay_tensors = False

    def fusible(self, bsym: BoundSymbol) -> bool:
        """Whether this executor can run this (prim-level) call inside a fused region."""
        return False

    def can_join(self, members: Sequence[BoundSymbol], bsym: BoundSymbol) -> bool:
        """Whether the fusible `bsym` may join the region made of `members` (default: always)."""
        return True

    def fuse(self, region: Region) -> Callable[..., Any] | None:
        """A callable running `region` (inputs -> outputs, a tuple), or None to decline the region."""
        raise NotImplementedError

    def claims(self, bsym: BoundSymbol) -> bool:
        """Whether this executor fuses `bsym`: a fusible prim, or a composite whose leaves all are.

        Never a random one, unless the executor says how it draws (`random_draws`).
        """
        if bsym.sym.effects.random and self.random_draws is None:
            return False
        if self.fusible(bsym):
            return True
        return bool(bsym.subsymbols) and all(self.claims(s) for s in bsym.subsymbols)


# -- registry --------------------------------------------------------------------------

_REGISTRY: dict[str, Executor] = {}
_DEFAULTS: list[str] = []
_BUILTIN_MODULES = {"torch": "executors.torch", "triton": "executors.triton", "nvfuser": "executors.nvfuser",
                    "inductor": "executors.inductor"}
# Built-in executors asked, once per process, whether they are defaults on a device present here (Triton fuses by
# default on CUDA, as torch.compile's Inductor and Thunder's nvFuser do): only where CUDA is present are they imported.
_DEVICE_DEFAULT_CANDIDATES = ("triton",)
_device_defaults_added = False
_WARNED: set[str] = set()
_entry_points_loaded = False


def register_executor(executor: Executor, *, default: bool = False) -> Executor:
    """Make `executor` known by name (and, with default=True, used by `jit` unless told otherwise).

    Example::

        register_executor(OperatorExecutor("myex"))
    """
    _REGISTRY[executor.name] = executor
    if default and executor.name not in _DEFAULTS:
        _DEFAULTS.append(executor.name)
    return executor


def add_default_executor(executor: Executor | str, *, first: bool = True) -> None:
    """Use `executor` in every `jit` that names no executors (ahead of the others, unless first=False).

    Example::

        add_default_executor("triton")
    """
    _add_device_defaults()  # (first: the user's change applies to them)
    ex = get_executor(executor) if isinstance(executor, str) else register_executor(executor)
    if ex.name in _DEFAULTS:
        _DEFAULTS.remove(ex.name)
    if first:
        _DEFAULTS.insert(0, ex.name)
    else:
        _DEFAULTS.append(ex.name)


def remove_default_executor(executor: Executor | str) -> None:
    """Stop using `executor` in `jit` calls that name no executors (a default on a device present too: Triton on
    CUDA)."""
    _add_device_defaults()
    name = executor if isinstance(executor, str) else executor.name
    if name in _DEFAULTS:
        _DEFAULTS.remove(name)


def get_executor(name: str) -> Executor:
    """The executor called `name`: registered, built in, or from the `minijit.executors` entry points.

    Example::

        get_executor("torch")
    """
    _load_builtin_executors()
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _REGISTRY:
        _load_entry_points(only=name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MinijitError(f"no executor named {name!r}; known: {sorted({*_REGISTRY, *_BUILTIN_MODULES})} (third-party executors "
                           "register with minijit.extend.register_executor or the 'minijit.executors' "
                           "entry-point group)") from None


def get_default_executors() -> list[Executor]:
    """The executors `jit` uses when given none, in priority order (torch last): the registered defaults, and
    ahead of them the built-in ones whose `default_device()` is present here (Triton where CUDA is)."""
    _load_builtin_executors()
    _load_entry_points()
    _add_device_defaults()
    return [_REGISTRY[n] for n in _DEFAULTS]


def _add_device_defaults() -> None:
    """Once per process: put ahead of the defaults each built-in executor of `_DEVICE_DEFAULT_CANDIDATES` that is a
    default on CUDA (`Executor.default_device`), where a CUDA device is present and the executor is available."""
    global _device_defaults_added
    if _device_defaults_added:
        return
    _device_defaults_added = True
    if not torch.cuda.is_available():  # (asked first: on a machine without CUDA nothing more is imported)
        return
    for name in reversed(_DEVICE_DEFAULT_CANDIDATES):
        ex = get_executor(name)
        if name not in _DEFAULTS and ex.default_device() == "cuda" and ex.unavailable_reason() is None:
            _DEFAULTS.insert(0, name)


def resolve_executors(executors: Sequence[Executor | str] | None) -> list[Executor]:
    """Executors by name or object, with the torch executor appended as the fallback.

    An executor the user named that cannot run here is an `ExecutorUnavailableError`
    naming it and the reason; an unavailable default executor is left out with a
    warning (once per process).
    """
    if executors is None:
        chosen = []
        for ex in get_default_executors():
            reason = ex.unavailable_reason()
            if reason is None:
                chosen.append(ex)
            elif ex.name not in _WARNED:
                _WARNED.add(ex.name)
                warnings.warn(f"minijit: the default executor {ex.name!r} is unavailable and is skipped: {reason}",
                              stacklevel=3)
    else:
        chosen = [get_executor(e) if isinstance(e, str) else e for e in executors]
        for ex in chosen:
            if not isinstance(ex, Executor):
                raise MinijitError(f"executors must be Executor objects or names, got {ex!r}")
            reason = ex.unavailable_reason()
            if reason is not None:
                raise ExecutorUnavailableError(f"executor {ex.name!r} cannot run here: {reason}")
    torch_ex = get_executor("torch")
    return [e for e in chosen if e is not torch_ex] + [torch_ex]


def _load_builtin_executors() -> None:
    # The built-in executors live in the `executors` package, which imports this module;
    # importing them lazily here keeps the layers pointing one way. Only the torch executor
    # is a built-in default; the others (not defaults) are imported when asked for by name
    # (get_executor), which keeps their import out of every default `jit` (tens of ms).
    if "torch" not in _REGISTRY:
        importlib.import_module(_BUILTIN_MODULES["torch"])


def _load_entry_points(only: str | None = None) -> None:
    """Load third-party executors from the `minijit.executors` entry-point group."""
    global _entry_points_loaded
    if _entry_points_loaded and only is None:
        return
    for ep in importlib.metadata.entry_points(group="minijit.executors"):
        if (only is not None and ep.name != only) or ep.name in _REGISTRY:
            continue
        try:
            ex = ep.load()
        except Exception as e:  # a broken plugin must not break minijit
            warnings.warn(f"minijit: could not load the executor plugin {ep.name!r} ({ep.value}): {e!r}",
                          stacklevel=3)
            continue
        if isinstance(ex, Executor) and ex.name not in _REGISTRY:
            register_executor(ex)
    if only is None:
        _entry_points_loaded = True

