"""`JitModule`, the wrapper `minijit.jit(module)` returns: itself an `nn.Module` whose every module method acts
on the wrapped module, and whose call runs the module's forward jitted (`minijit.runtime.module_forward`: the
parameters and buffers become trace inputs, read afresh on every call, and the tree's state is part of the key).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.runtime import distributed
from minijit.runtime.entry_limit import MAX_ENTRIES
from minijit.runtime.jit import JitFunction
from minijit.runtime.module_forward import ModuleForward, ModuleWrapper

_JIT_QUERIES = {"last_traces", "last_backward_traces", "last_prologue", "last_epilogue", "cache_info"}


class JitModule(ModuleWrapper):
    """A jitted `nn.Module`: calling it runs the compiled forward; every other module method is the module's.

    It is an `nn.Module` with no state of its own: `parameters()`, `state_dict()` (same keys
    as the module's), `load_state_dict`, `named_modules()`, hooks and attribute reads and
    writes all act on the wrapped module (`_orig_mod`); `to()`, `cuda()`, `half()`, `train()`,
    `eval()`, `requires_grad_()`, `apply()` and the like act on it and return the wrapper.
    `copy.deepcopy` gives an independent jitted module; pickling saves the module and the
    jit options.

    Example::

        jmodel = minijit.jit(model)
        out = jmodel(x)
        jmodel.eval()   # a new trace on the next call
        opt = torch.optim.SGD(jmodel.parameters(), lr=0.1)   # the model's own parameters
    """

    def __init__(self, module: torch.nn.Module, executors: Any = None, cache: str = "automatic",
                 warn_retraces_after: int | None = None, cuda_graphs: bool = False, max_entries: int | None = MAX_ENTRIES):
        # No nn.Module.__init__: the wrapper keeps no parameters, submodules, hooks or flags of its own.

        object.__setattr__(self, "_orig_mod", module)
        attribute = distributed.wrapped_attribute(module)
        if attribute is not None:
            # A wrapper like DDP: its forward runs eagerly, around its module jitted (minijit.runtime.distributed).
            options = {"executors": executors, "cache": cache, "warn_retraces_after": warn_retraces_after,
                       "cuda_graphs": cuda_graphs, "max_entries": max_entries}
            self._set_wrapped(attribute, getattr(module, attribute), options)
            return
        forward = ModuleForward(module)
        object.__setattr__(self, "_minijit_forward", forward)
        object.__setattr__(self, "_minijit_function", JitFunction(forward, executors, cache, warn_retraces_after,
                                                                          cuda_graphs, max_entries))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        namespace = self.__dict__
        if "_minijit_wrapped" in namespace:
            attribute, inner = self._jitted_wrapped_module()
            return distributed.call_through_wrapper(self._orig_mod, attribute, inner, args, kwargs)
        if self._minijit_forward.uninitialized:
            with self._minijit_function._compile_lock:  # one thread makes the parameters; the others wait
                if self._minijit_forward.uninitialized:
                    # A lazy module's first call runs eagerly (it creates the parameters); later calls are traced.
                    out = self._orig_mod(*args, **kwargs)
                    self._take_stock(None)
                    return out
        module = namespace["_orig_mod"].__dict__
        if module["_forward_pre_hooks"] or module["_forward_hooks"]:
            pre, post = distributed.eager_hooks(self._orig_mod)
            if pre or post:  # FSDP2's hooks: all-gather before the parameters are fetched, reshard after
                args, kwargs = distributed.run_pre_hooks(self._orig_mod, pre, args, kwargs)
                output = self._call_compiled(args, kwargs)
                return distributed.run_post_hooks(self._orig_mod, post, args, kwargs, output)
        return self._call_compiled(args, kwargs)

    def _take_stock(self, previous: ModuleForward | None) -> ModuleForward:
        """A new `ModuleForward` of the module as it is now, which the jitted function traces from now on."""
        forward = ModuleForward(self._orig_mod, previous=previous)
        object.__setattr__(self, "_minijit_forward", forward)
        self._minijit_function.fn = forward
        return forward

    def _set_wrapped(self, attribute: str, found: torch.nn.Module, options: dict[str, Any]) -> None:
        """Jit `found`, the module a wrapper like DDP holds as `attribute` (one jitted already is used as it is)."""
        inner = found if isinstance(found, JitModule) else JitModule(found, **options)
        object.__setattr__(self, "_minijit_wrapped", (attribute, found, inner))
        object.__setattr__(self, "_minijit_forward", inner._minijit_forward)
        object.__setattr__(self, "_minijit_function", inner._minijit_function)

    def _jitted_wrapped_module(self) -> tuple[str, JitModule]:
        """(attribute, the jitted module) of a wrapper like DDP; jitted afresh if the wrapper holds another module."""
        attribute, found, inner = self.__dict__["_minijit_wrapped"]
        if getattr(self._orig_mod, attribute) is not found:
            self._set_wrapped(attribute, getattr(self._orig_mod, attribute), inner._minijit_function.options())
            attribute, _, inner = self.__dict__["_minijit_wrapped"]
        return attribute, inner

    def _call_compiled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The compiled forward (hooks from torch.distributed aside: `__call__` runs those)."""
        try:
            params, state = self._minijit_forward.fetch(self._orig_mod)
        except (KeyError, AttributeError):
            # The module tree changed shape (a submodule or parameter added, removed or replaced by a
            # jitted one): take stock again, unless another thread has done so while this one waited.
            with self._minijit_function._compile_lock:
                try:
                    params, state = self._minijit_forward.fetch(self._orig_mod)
                except (KeyError, AttributeError):
                    params, state = self._take_stock(self._minijit_forward).fetch(self._orig_mod)
        # Straight to the general call path: the positional-tensors fast path never applies
        # (the state is not a tensor, parameters are Parameter objects).
        return self._minijit_function._call_general((params, state, *args), kwargs)

    forward = _call_impl = _wrapped_call_impl = __call__

    def minijit_traced_callable(self) -> torch.nn.Module:
        """What code traced by minijit (a parent module's forward) calls in place of this jitted module: the module,
        traced inline. Its attributes too are read and written there (`minijit_traced_object`), so that they are
        guarded as the module's; the parent's tree itself is left as it is."""
        return self._orig_mod

    minijit_traced_object = minijit_traced_callable

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Refused: a module is either jitted by minijit or compiled by torch.compile, not both."""
        raise UnsupportedSyntaxError(
            f"{type(self._orig_mod).__name__} is jitted by minijit; torch.compile it instead of jitting it, not both")

    def __reduce__(self) -> tuple[Any, ...]:
        # What is saved is the module and the jit options; the cache is rebuilt on the first calls.
        return (_restore_jit_module, (self._orig_mod, self._minijit_function.options()))

    def __getattr__(self, name: str) -> Any:
        # Reached only when normal lookup fails: everything but the wrapper's own three attributes is the
        # module's. Dunders are not forwarded (copy and pickle probe them), nor anything while
        # half-built (no `_orig_mod` yet, as during unpickling).
        module = self.__dict__.get("_orig_mod")
        if module is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        if name in _JIT_QUERIES:
            # minijit's own queries (last_traces, cache_info, ...) answer for the jitted forward.
            return getattr(self._minijit_function, name)
        return getattr(module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "__class__":  # fully_shard makes the wrapper itself an FSDPModule
            object.__setattr__(self, name, value)
            return
        setattr(self._orig_mod, name, value)

    def named_modules(self, memo: set[torch.nn.Module] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.nn.Module]]:
        """The wrapped module's `named_modules()`; where FSDP2 was applied to this wrapper, the wrapper itself
        stands in for the wrapped module (FSDP2 finds its state by the module object it was given)."""
        module = self._orig_mod
        stand_in = self if distributed.has_composable_state(self) else module
        for name, found in module.named_modules(memo, prefix, remove_duplicate):
            yield name, stand_in if found is module else found

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._orig_mod)) | _JIT_QUERIES)

    # Python looks these up on the type, past __getattr__: a jitted Sequential/ModuleList indexes,
    # iterates and tests as the module does (and refuses as it does, when the module is no container).
    def __len__(self) -> int:
        return len(self._orig_mod)

    def __bool__(self) -> bool:
        return bool(self._orig_mod)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._orig_mod)

    def __contains__(self, item: Any) -> bool:
        return item in self._orig_mod

    def __getitem__(self, key: Any) -> Any:
        return self._orig_mod[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._orig_mod[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._orig_mod[key]

    def __repr__(self) -> str:
        return f"minijit.jit({self._orig_mod!r})"


def _restore_jit_module(module: torch.nn.Module, options: dict[str, Any]) -> JitModule:
    """Unpickling (and deep copy): jit the module again with the same options."""
    return JitModule(module, **options)


def _delegate(name: str) -> Callable[..., Any]:
    """`JitModule.<name>`: `nn.Module.<name>` run on the wrapped module; a result that is the module
    itself (`to()`, `train()`, `apply()`, ...) is the wrapper instead."""
    method = getattr(torch.nn.Module, name)

    @functools.wraps(method)
    def delegated(self: JitModule, *args: Any, **kwargs: Any) -> Any:
        module = self._orig_mod
        result = getattr(module, name)(*args, **kwargs)
        return self if result is module else result

    return delegated


# Every other method of nn.Module, public or private (torch calls `_apply`, `_load_from_state_dict`,
# `_named_members` on children), acts on the wrapped module, so that overrides in its class apply.
_NOT_DELEGATED = {"__init__", "__call__", "forward", "_call_impl", "_wrapped_call_impl", "_slow_forward", "compile",
                  "named_modules",
                  "__getattr__", "__setattr__", "__delattr__", "__dir__", "__repr__", "__getstate__", "__setstate__"}
for _name, _value in vars(torch.nn.Module).items():
    if inspect.isfunction(_value) and _name not in _NOT_DELEGATED:
        setattr(JitModule, _name, _delegate(_name))
