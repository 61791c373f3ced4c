"""Jitting an `nn.Module`: parameters and buffers become trace inputs, read afresh on every call.

The module's forward is traced with its parameters and buffers swapped for proxies (named
after their paths, `fc1_weight`), so the trace never bakes in their values: updating
weights never re-traces. Every call fetches them by walking the module tree from the
root, so a replaced parameter or submodule is seen, and their metadata and every
module's `training` flag are part of the cache key: `model.eval()` is a new trace.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.ir import Proxy


class ModuleForward:
    """The function minijit traces for a module: `(params, flags, *args, **kwargs) -> module(*args, **kwargs)`.

    `params` are the module's parameters and buffers in `paths` order; `flags` the
    `training` flags of its submodules. Both are passed in so that the cache key covers them.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.__name__ = type(module).__name__.lower() + "_forward"
        self.__qualname__ = f"{type(module).__qualname__}.forward"
        # (path, owner module path, kind, name) per distinct tensor; tied weights appear once.
        self.slots: list[tuple[str, str, str, str]] = []
        seen: set[int] = set()
        for kind in ("_parameters", "_buffers"):  # parameters first, as named_parameters() lists them
            for owner_path, owner in module.named_modules(remove_duplicate=False):
                for name, tensor in getattr(owner, kind).items():
                    if tensor is None or id(tensor) in seen:
                        continue
                    seen.add(id(tensor))
                    path = f"{owner_path}.{name}" if owner_path else name
                    self.slots.append((path, owner_path, kind, name))
        self.param_names = [path.replace(".", "_") for path, *_ in self.slots]
        self.module_paths = [p for p, _ in module.named_modules()]
        self.fetch = _compile_fetch(self.slots, self.module_paths)
        forward_params = list(inspect.signature(module.forward).parameters.values())
        lead = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in ("params", "flags")]
        self.__signature__ = inspect.Signature(lead + forward_params)

    def __call__(self, params: tuple[Any, ...], flags: tuple[bool, ...], *args: Any, **kwargs: Any) -> Any:
        with self.swapped_in(params):
            return self.module(*args, **kwargs)

    @contextmanager
    def swapped_in(self, values: tuple[Any, ...]) -> Iterator[None]:
        """Put `values` (proxies, while tracing) in place of the parameters and buffers, then restore them."""
        replacement = {}
        for (_, owner_path, kind, name), value in zip(self.slots, values, strict=True):
            original = getattr(self.module.get_submodule(owner_path), kind)[name]
            replacement[id(original)] = value
        saved: list[tuple[dict[str, Any], str, Any]] = []
        attributes = [(owner, _snapshot(owner)) for owner in self.module.modules()]
        try:
            for owner in self.module.modules():
                if owner._forward_hooks or owner._forward_pre_hooks or owner._backward_hooks:
                    raise UnsupportedSyntaxError(
                        f"{type(owner).__name__} has forward or backward hooks, which minijit does not run; "
                        "remove them before jitting the module"
                    )
                for kind in ("_parameters", "_buffers"):
                    tensors = getattr(owner, kind)
                    for name, tensor in tensors.items():
                        if tensor is not None and id(tensor) in replacement:
                            saved.append((tensors, name, tensor))
                            tensors[name] = replacement[id(tensor)]
            yield
        finally:
            for tensors, name, tensor in saved:
                tensors[name] = tensor
            for owner, before in attributes:
                _drop_traced_state(owner, before)


def _snapshot(owner: torch.nn.Module) -> dict[str, tuple[Any, Any]]:
    """Each attribute of `owner`: (the value, a shallow copy of its contents if it is a list or dict)."""
    return {name: (value, _contents(value)) for name, value in vars(owner).items()}


def _contents(value: Any) -> Any:
    return list(value) if type(value) is list else dict(value) if type(value) is dict else None


def _drop_traced_state(owner: torch.nn.Module, before: dict[str, tuple[Any, Any]]) -> None:
    """Undo attribute writes that torch's own code made while tracing and that left proxies in the module.

    Such writes are caches of the proxied parameters (nn.RNNBase keeps `_flat_weights`, and weak
    references to them); left in place they would leak proxies to later eager calls (DESIGN.md,
    invariant 8). User code cannot make them: attribute writes to the module are refused while tracing.
    """
    for name, value in list(vars(owner).items()):
        if not _holds_proxy(value):
            continue
        old = before.get(name)
        if old is None:
            delattr(owner, name)
        elif old[0] is value and type(value) is list:
            value[:] = old[1]
        elif old[0] is value and type(value) is dict:
            value.clear()
            value.update(old[1])
        else:
            object.__setattr__(owner, name, old[0])


def _holds_proxy(value: Any, depth: int = 2) -> bool:
    """Whether value is a proxy, a weak reference to one, or a list, tuple or dict holding those."""
    if isinstance(value, Proxy):
        return True
    if isinstance(value, weakref.ref):
        return isinstance(value(), Proxy)
    if depth and type(value) in (list, tuple):
        return any(_holds_proxy(v, depth - 1) for v in value)
    if depth and type(value) is dict:
        return any(_holds_proxy(v, depth - 1) for v in value.values())
    return False


def _compile_fetch(slots: list[tuple[str, str, str, str]], module_paths: list[str]) -> Any:
    """One function of the root module returning (tensors, training flags), walking paths afresh."""
    lines = ["def fetch(m):"]
    var = {"": "m"}
    for i, path in enumerate(p for p in module_paths if p):
        parent, _, child = path.rpartition(".")
        var[path] = f"m{i}"
        lines.append(f"    m{i} = {var[parent]}._modules[{child!r}]")
    tensors = ", ".join(f"{var[owner]}.{kind}[{name!r}]" for _, owner, kind, name in slots)
    flags = ", ".join(f"{var[p]}.training" for p in module_paths)
    lines.append(f"    return ({tensors}{',' if slots else ''}), ({flags}{',' if module_paths else ''})")
    env: dict[str, Any] = {}
    exec(compile("\n".join(lines) + "\n", "<minijit module fetch>", "exec"), env)
    return env["fetch"]


_JIT_QUERIES = {"last_traces", "last_backward_traces", "last_prologue", "cache_info"}


class JitModule:
    """A jitted `nn.Module`: calling it runs the compiled forward; everything else is the module's.

    `parameters()`, `state_dict()`, `to()`, attribute access and assignment pass through to
    the wrapped module; `train()` and `eval()` return the wrapper.

    Example::

        jmodel = minijit.jit(model)
        out = jmodel(x)
        jmodel.eval()   # a new trace on the next call
    """

    def __init__(self, module: torch.nn.Module, jit_function: Any, forward: ModuleForward):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_jit", jit_function)
        object.__setattr__(self, "_forward", forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = self._forward
        try:
            params, flags = forward.fetch(self._module)
        except (KeyError, AttributeError):
            # The module tree changed shape (a submodule or parameter removed): take stock again.
            forward = ModuleForward(self._module)
            object.__setattr__(self, "_forward", forward)
            self._jit.fn = forward
            params, flags = forward.fetch(self._module)
        return self._jit(params, flags, *args, **kwargs)

    def train(self, mode: bool = True) -> JitModule:
        """Set training mode on the wrapped module; returns the wrapper."""
        self._module.train(mode)
        return self

    def eval(self) -> JitModule:
        """Set evaluation mode on the wrapped module; returns the wrapper."""
        self._module.eval()
        return self

    def __getattr__(self, name: str) -> Any:
        # minijit's own queries (last_traces, cache_info, ...) answer for the jitted forward.
        if name in _JIT_QUERIES:
            return getattr(self._jit, name)
        return getattr(self._module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._module, name, value)

    def __repr__(self) -> str:
        return f"minijit.jit({self._module!r})"
