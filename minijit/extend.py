"""The executor plugin API: the only part of minijit that executors import.

An executor runs symbols. An `OperatorExecutor` has an implementation per symbol it
claims, each with an optional checker that can refuse a particular call (by dtype,
say). The claiming pass asks the executors in priority order, for each bound
symbol, whether they run it; where none does, it asks again for the symbol's
decomposition; the torch executor comes last and runs everything.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minijit.errors import MinijitError
from minijit.ir import BoundSymbol, Symbol, TensorProxy
from minijit.ops import prims
from minijit.ops.registry import ALL_LTORCH, EAGER_IMPLS, ltorch_symbol_for

__all__ = [
    "Executor", "Implementation", "OperatorExecutor", "Symbol", "TensorProxy", "get_default_executors",
    "get_executor", "ltorch_eager_implementations", "prims", "register_executor", "resolve_executors",
    "resolve_symbol",
]


def ltorch_eager_implementations() -> dict[str, Callable[..., Any]]:
    """ltorch op name -> the torch callable that runs it with the op's own signature."""
    return dict(EAGER_IMPLS)


@dataclass
class Implementation:
    """How an executor runs one symbol: `fn` takes the bound symbol's arguments."""

    fn: Callable[..., Any]
    checker: Callable[..., bool] | None = None


class Executor:
    """Base class of executors: a name, and whether it can run in this process."""

    def __init__(self, name: str, version: str | None = None):
        if not name.isidentifier():
            raise ValueError(f"an executor name must be an identifier, got {name!r}")
        self.name = name
        self.version = version
        # The name final traces call this executor's functions through (`torchex.add`);
        # distinct from `name` so that the torch executor does not shadow the torch module.
        self.namespace = f"{name}ex"

    def unavailable_reason(self) -> str | None:
        """Why this executor cannot run here (missing package, no GPU), or None if it can."""
        return None

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


class OperatorExecutor(Executor):
    """An executor that runs individual symbols with its own implementations."""

    def __init__(self, name: str, version: str | None = None):
        super().__init__(name, version)
        self.implementations: dict[str, Implementation] = {}
        self._impl_symbols: dict[str, Symbol] = {}

    def register_implementation(self, sym_or_fn: Any, fn: Callable[..., Any],
                                checker: Callable[..., bool] | None = None) -> None:
        """Claim a symbol (or the symbol a torch callable stands for) with `fn`.

        `checker(*args, **kwargs)` runs on proxies when a trace is compiled and may
        refuse a call; the claiming pass then tries the next executor or the
        symbol's decomposition.
        """
        sym = resolve_symbol(sym_or_fn)
        self.implementations[sym.id] = Implementation(fn, checker)
        self._impl_symbols.pop(sym.id, None)

    def register_operator(self, name: str, *, meta: Callable[..., Any], fn: Callable[..., Any]) -> Symbol:
        """Create a new symbol `name` (outputs from `meta`) that this executor runs with `fn`.

        Call the returned symbol in a function traced by minijit to use it.
        """
        sym = Symbol(name, meta, namespace=self.namespace, is_prim=True)
        self.implementations[sym.id] = Implementation(fn)
        return sym

    def implementation_for(self, bsym: BoundSymbol) -> Implementation | None:
        """The implementation that runs this call, or None if the executor does not claim it."""
        impl = self.implementations.get(bsym.sym.id)
        if impl is None:
            return None
        if impl.checker is not None and not impl.checker(*bsym.args, **bsym.kwargs):
            return None
        return impl

    def executable_symbol(self, sym: Symbol) -> Symbol:
        """The symbol printed in final traces for `sym` run by this executor (`<name>.<op>`)."""
        exe = self._impl_symbols.get(sym.id)
        if exe is None:
            impl = self.implementations[sym.id]
            # A prim and an ltorch op may share a name (transpose, reshape) and a trace both;
            # the printed trace calls them through one namespace, so the prim gets a prefix.
            name = f"prims_{sym.name}" if sym.namespace == "prims" and sym.name in ALL_LTORCH else sym.name
            exe = Symbol(name, sym.meta, namespace=self.namespace, is_prim=True, tags=sym.tags, fn=impl.fn)
            self._impl_symbols[sym.id] = exe
        return exe


_REGISTRY: dict[str, Executor] = {}
_DEFAULTS: list[str] = []


def register_executor(executor: Executor, *, default: bool = False) -> Executor:
    """Make `executor` known by name (and, with default=True, used by `jit` unless told otherwise)."""
    _REGISTRY[executor.name] = executor
    if default and executor.name not in _DEFAULTS:
        _DEFAULTS.append(executor.name)
    return executor


def get_executor(name: str) -> Executor:
    """The registered executor called `name`."""
    _load_builtin_executors()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MinijitError(f"no executor named {name!r}; known: {sorted(_REGISTRY)}") from None


def get_default_executors() -> list[Executor]:
    """The executors `jit` uses when given none, in priority order (torch last)."""
    _load_builtin_executors()
    return [_REGISTRY[n] for n in _DEFAULTS]


def resolve_executors(executors: list[Executor | str] | None) -> list[Executor]:
    """Executors by name or object, with the torch executor appended as the fallback."""
    if executors is None:
        chosen = get_default_executors()
    else:
        chosen = [get_executor(e) if isinstance(e, str) else e for e in executors]
    for ex in chosen:
        reason = ex.unavailable_reason()
        if reason is not None:
            raise MinijitError(f"executor {ex.name!r} cannot run here: {reason}")
    torch_ex = get_executor("torch")
    return [e for e in chosen if e is not torch_ex] + [torch_ex]


def _load_builtin_executors() -> None:
    # The built-in executors live in the `executors` package, which imports this module;
    # importing them lazily here keeps the layers pointing one way.
    if "torch" not in _REGISTRY:
        importlib.import_module("executors.torch")
