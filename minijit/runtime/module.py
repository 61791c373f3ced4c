"""Jitting an `nn.Module`: parameters and buffers become trace inputs, read afresh on every call.

The module's forward is traced with its parameters and buffers standing for proxies (named
after their paths, `fc1_weight`): the module keeps its own tensors, and the capture maps each
to its proxy where traced code uses it, so the trace never bakes in their values (updating
weights never re-traces) and other threads never see a proxy in the module. Every call
fetches them by walking the module tree from the root, and with them the tree's *state*:
which module object sits at each path, each module's `training` flag, and the ids of every
forward/backward hook (on each module and the global ones). The state is part of the cache
key, so `model.eval()`, a replaced submodule or a hook added or removed anywhere is a new
trace, explained in `cache_info`.

Hooks are Python: torch's `Module._call_impl` runs them and the interpreter traces it like
any layer code. Full backward hooks and backward pre-hooks run at the hooked module's boundary in
the backward (identity ops whose VJPs call them: `minijit/frontend/module_hooks.py`); the older
non-full backward hooks see the last autograd node of the module's forward, which a trace does not
have: they are refused while grad mode is on.

`JitModule`, the wrapper `minijit.jit(module)` returns, is itself an `nn.Module` whose
every module method acts on the wrapped module.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.modules.module as torch_module

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.outside import OutsideView
from minijit.runtime import distributed
from minijit.runtime.checks import Check, tensor_checks
from minijit.runtime.entry_limit import MAX_ENTRIES

# The hook dicts `Module._call_impl` consults, per module and globally, and what to call them.
_HOOK_KINDS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
               "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}
_GLOBAL_HOOKS = {f"_global{name}": f"global {kind}" for name, kind in _HOOK_KINDS.items()}
_GLOBAL_LABEL = "torch.nn.modules.module"


class ModuleForward:
    """The function minijit traces for a module: `(params, state, *args, **kwargs) -> module(*args, **kwargs)`.

    `params` are the module's parameters and buffers in `slots` order; `state` the
    `ModuleState` of its tree (submodules, training flags, hooks). Both are passed in
    so that the cache key covers them.
    """

    def __init__(self, module: torch.nn.Module, previous: ModuleForward | None = None):
        self.module = module
        self.__name__ = type(module).__name__.lower() + "_forward"
        self.__qualname__ = f"{type(module).__qualname__}.forward"
        # (path, owner module path, kind, name) per distinct tensor; tied weights appear once.
        self.slots = _slots(module)
        self.param_names = [path.replace(".", "_") for path, *_ in self.slots]
        # Lazy modules (nn.LazyLinear) have no shapes until their first call materialises them.
        self.uninitialized = any(torch.nn.parameter.is_lazy(getattr(module.get_submodule(owner), kind)[name])
                                 for _, owner, kind, name in self.slots)
        self.module_paths = [p for p, _ in module.named_modules()]
        # The states seen, interned. Taking stock again after a change that left the parameters and
        # module paths as they were (a submodule swapped for its jitted self) keeps the cache entries.
        same_layout = previous is not None and (previous.slots, previous.module_paths) == (self.slots, self.module_paths)
        self._states: dict[tuple[Any, ...], ModuleState] = previous._states if same_layout else {}
        self.fetch = _compile_fetch(module, self.slots, self.module_paths, self._states)
        forward_params = list(inspect.signature(module.forward).parameters.values())
        lead = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in ("params", "state")]
        self.__signature__ = inspect.Signature(lead + forward_params)

    def __call__(self, params: tuple[Any, ...], state: ModuleState, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def run_eagerly(self, params: tuple[Any, ...], state: ModuleState, *args: Any, **kwargs: Any) -> Any:
        """The module's own call, not traced (a call whose compiled trace raised inside a user's `try`)."""
        return self.module(*args, **kwargs)

    def tracing_view(self, values: tuple[Any, ...]) -> OutsideView:
        """How the capture sees the module: `values` (proxies) for its parameters and buffers, backward
        hooks refused or, without grad, hidden, torch.distributed's root hooks left to run around the call.

        Nothing of the module or of torch's global hook dicts is changed: other threads may be calling
        the module (or a compiled trace of it) meanwhile. The capture maps each real tensor to its proxy
        wherever traced code reads or uses it, and reads the hidden hook dicts in their place.
        """
        tensors = {}
        for (_, owner_path, kind, name), value in zip(self.slots, values, strict=True):
            tensor = getattr(self.module.get_submodule(owner_path), kind)[name]
            tensors[id(tensor)] = (tensor, value)
        shown: dict[tuple[int, str], Any] = {}
        _hide_backward_hooks(shown, vars(torch_module), "_global", "every module (a global hook)")
        for path, owner in self.module.named_modules():
            _hide_backward_hooks(shown, owner, "", f"{type(owner).__name__} at {_label(path)}")
            if path:
                shown.update(distributed.refusing_inner_eager_hooks(owner, path))
            else:  # torch.distributed's hooks on the root run around the compiled call (JitModule.__call__)
                shown.update(distributed.without_root_eager_hooks(owner, f"{type(owner).__name__} (the jitted module)"))
        keyed, whole = _covered_by_state(self.module, shown)
        return OutsideView(tensors, shown, keyed, whole)

    def state_checks(self, name: str, subject: str, value: Any, symbolic: bool) -> list[Check] | None:
        """The checks on the `params` and `state` arguments, named by path (None for the other arguments)."""
        if name == "params":
            checks = [Check("self", "length", subject, (type(value), len(value)),
                            explain=functools.partial(_slots_changed, self))]
            for i, ((path, *_), tensor) in enumerate(zip(self.slots, value, strict=True)):
                checks += [dataclasses.replace(c, explain=functools.partial(_unless_slots_changed, self, c))
                           for c in tensor_checks(f"self.{path}", f"{subject}[{i}]", tensor, symbolic)]
            return checks
        if name == "state":  # interned: the key holds it by identity
            return [Check("self", "object", subject, (type(value), id(value)),
                          explain=functools.partial(_state_changed, value))]
        return None


def _slots(module: torch.nn.Module) -> list[tuple[str, str, str, str]]:
    """(path, owner module path, kind, name) of each distinct parameter and buffer; tied weights appear once."""
    slots = []
    seen: set[int] = set()
    for kind in ("_parameters", "_buffers"):  # parameters first, as named_parameters() lists them
        for owner_path, owner in module.named_modules(remove_duplicate=False):
            for name, tensor in getattr(owner, kind).items():
                if tensor is None or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                path = f"{owner_path}.{name}" if owner_path else name
                slots.append((path, owner_path, kind, name))
    return slots


def _slots_changed(forward: ModuleForward, now: Any, expected: Any) -> str:
    """Which parameters and buffers the module has gained or lost since `forward` took stock, in words."""
    paths = [path for path, *_ in forward.slots]
    current = [path for path, *_ in _slots(forward.module)]
    reasons = []
    for path in paths:
        if path not in current:
            owner, _, name = path.rpartition(".")
            try:
                gone = "set to None" if getattr(forward.module.get_submodule(owner), name) is None else "removed"
            except AttributeError:
                gone = "removed"
            reasons.append(f"self.{path}: {gone}")
    reasons += [f"self.{path}: added" for path in current if path not in paths]
    if reasons:
        return "parameters and buffers changed: " + "; ".join(reasons)
    return f"self: length {len(now)} != {expected[1]}" if isinstance(now, tuple) else "self: parameters changed"


def _unless_slots_changed(forward: ModuleForward, check: Check, now: Any, expected: Any) -> str:
    """A parameter's own check in words; nothing where the set of parameters changed (said once, by its length)."""
    if [path for path, *_ in forward.slots] != [path for path, *_ in _slots(forward.module)]:
        return ""
    return dataclasses.replace(check, explain=None).words(now)


def _state_changed(before: ModuleState, now: Any, expected: Any) -> str:
    """How the module tree's state differs from `before`, in words (`self.fc1: forward hook added`)."""
    if not isinstance(now, ModuleState):
        return f"self: module state {type(now).__name__} != ModuleState"
    reasons = []
    # The tree may have grown or shrunk (a submodule wrapped, removed): compare path by path.
    modules, old_modules = dict(zip(now.paths[1:], now.modules)), dict(zip(before.paths[1:], before.modules))
    for path in [*old_modules, *(p for p in modules if p not in old_modules)]:
        module, was = modules.get(path), old_modules.get(path)
        if path not in modules:
            reasons.append(f"self.{path}: submodule {type(was).__name__} removed")
        elif path not in old_modules:
            reasons.append(f"self.{path}: submodule {type(module).__name__} added")
        elif module is not was:
            reasons.append(f"self.{path}: module {type(module).__name__} at {id(module):#x} != "
                           f"{type(was).__name__} at {id(was):#x}")
    flags = dict(zip(before.paths, before.training))
    for path, training in zip(now.paths, now.training):
        if path in flags and training != flags[path]:
            reasons.append(f"{_label(path)}.training: value {training} (bool) != {flags[path]} (bool)")
    old = {(label, kind): ids for label, kind, ids in before.hooks or ()}
    new = {(label, kind): ids for label, kind, ids in now.hooks or ()}
    for label, kind in [*new, *(k for k in old if k not in new)]:
        ids, old_ids = new.get((label, kind), ()), old.get((label, kind), ())
        if ids != old_ids:
            reasons.append(_hooks_changed(label, kind, ids, old_ids))
    return "; ".join(reasons) or "self: module state changed"


def _hooks_changed(label: str, kind: str, ids: tuple[int, ...], old_ids: tuple[int, ...]) -> str:
    """`self.fc1: forward hook added`, for a module's hooks of one kind (handle ids now and before)."""
    changes = []
    for count, what in ((sum(i not in old_ids for i in ids), "added"), (sum(i not in ids for i in old_ids), "removed")):
        if count:
            changes.append(f"{kind} {what}" if count == 1 else f"{count} {kind}s {what}")
    return f"{label}: {', '.join(changes) or kind + 's reordered'}"


class ModuleState:
    """What a call specialises on about the module tree: the submodule at each path, each module's
    `training` flag, and the hooks `Module._call_impl` will run, as (label, kind, handle ids).

    Interned by the fetch (equal states are one object), so the cache key holds it by identity.
    """

    __slots__ = ("hooks", "modules", "paths", "training")

    def __init__(self, paths: tuple[str, ...], modules: tuple[torch.nn.Module, ...], training: tuple[bool, ...],
                 hooks: tuple[tuple[str, str, tuple[int, ...]], ...] | None):
        self.paths = paths  # of every module, the root's ("") first: `modules` are those of paths[1:]
        self.modules = modules
        self.training = training
        self.hooks = hooks

    def __repr__(self) -> str:
        return f"ModuleState(training={self.training}, hooks={self.hooks})"


# Hook dicts keyed by the same handle ids as those in _HOOK_KINDS (a hook's flags, fixed at registration).
_HOOK_FLAGS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def _covered_by_state(root: torch.nn.Module, shown: dict[tuple[int, str], Any]
                      ) -> tuple[list[tuple[Any, Any]], list[Any]]:
    """The (holder, key) slots and the containers whose contents `ModuleState` fixes, as the tree is now
    and as the capture sees it (a hook dict in `shown` in place of the module's own)."""
    slots: list[tuple[Any, Any]] = []
    containers: list[Any] = []
    globals_ = vars(torch_module)
    for name in _GLOBAL_HOOKS:
        slots.append((globals_, name))
        containers.append(shown.get((id(globals_), name), globals_[name]))
    for module in root.modules():
        namespace = vars(module)
        slots.append((module, "training"))
        # nn.Module.__getattr__ looks these up in the instance dict: torch never rebinds them, and the
        # fetch reads the tensors and submodules in them afresh on every call.
        slots += [(namespace, name) for name in ("_parameters", "_buffers", "_modules")]
        # The tensors the fetch reads (a missing one makes it take stock again); a None stays guarded.
        for kind in ("_parameters", "_buffers"):
            tensors = namespace[kind]
            slots += [(tensors, name) for name, tensor in tensors.items() if tensor is not None]
        slots += [(module._modules, child) for child in module._modules]
        for name in (*_HOOK_KINDS, *_HOOK_FLAGS):
            if name in namespace:
                slots.append((module, name))
                containers.append(shown.get((id(module), name), namespace[name]))
    return slots, containers


def _label(path: str) -> str:
    return f"self.{path}" if path else "self"


def _hide_backward_hooks(shown: dict[tuple[int, str], Any], holder: Any, prefix: str, owner: str) -> None:
    """Refuse the (non-full) backward hooks of `holder` (a module, or the global hooks' namespace) while grad mode
    is on; without grad no backward hook runs, so the capture reads empty dicts in their place (added to `shown`).
    Full backward hooks and backward pre-hooks run at the module's boundary in the backward
    (`minijit/frontend/module_hooks.py`)."""
    namespace = holder if isinstance(holder, dict) else vars(holder)
    for name in (f"{prefix}_backward_pre_hooks", f"{prefix}_backward_hooks"):
        hooks = namespace.get(name)
        if not hooks:
            continue
        full = name.endswith("pre_hooks") or namespace.get(f"{prefix}_is_full_backward_hook")
        if torch.is_grad_enabled() and full:
            continue
        if torch.is_grad_enabled():
            hook = next(iter(hooks.values()))
            raise UnsupportedSyntaxError(
                f"{owner} has a backward hook ({_registration(namespace, prefix, name)}: "
                f"{getattr(hook, '__qualname__', repr(hook))}), which minijit cannot run: a non-full backward hook "
                "sees the gradients of the last autograd node of the module's forward, which a trace does not "
                "have. Register it with register_full_backward_hook, call the jitted module under torch.no_grad(), "
                "or leave this module un-jitted"
            )
        shown[(id(holder), name)] = OrderedDict()


def _registration(namespace: dict[str, Any], prefix: str, name: str) -> str:
    """The function that registered the hooks in `namespace[name]`, for messages."""
    where = "register_module_" if prefix else "register_"
    if name.endswith("pre_hooks"):
        return f"{where}full_backward_pre_hook"
    full = namespace.get(f"{prefix}_is_full_backward_hook")
    return f"{where}{'full_backward_hook' if full else 'backward_hook'}"


def _compile_fetch(root: torch.nn.Module, slots: list[tuple[str, str, str, str]], module_paths: list[str],
                   states: dict[tuple[Any, ...], ModuleState]) -> Callable[[torch.nn.Module], Any]:
    """One function of the root module returning (tensors, state), walking the paths afresh.

    It reads each module's `__dict__` once (module attribute reads go through `nn.Module`'s
    `__getattr__` hook and cost more). A path whose module is missing, or is no longer the
    plain or jitted module it was, raises KeyError: the caller then takes stock again.
    Hooks are looked at closely only when one of the hook dicts is non-empty.
    """
    lines = ["def fetch(m):", "    d = m.__dict__"]
    mods = {"": "m"}
    dicts = {"": "d"}
    for i, path in enumerate(p for p in module_paths if p):
        parent, _, child = path.rpartition(".")
        read = f"{dicts[parent]}['_modules'][{child!r}]"
        if isinstance(root.get_submodule(parent)._modules[child], JitModule):
            read += ".__dict__['_orig_mod']"
        mods[path], dicts[path] = f"m{i}", f"d{i}"
        lines += [f"    m{i} = {read}", f"    d{i} = m{i}.__dict__"]
    # The global hook dicts are bound once: torch adds to and removes from them, never rebinds them.
    any_hooks = [f"_g{i}" for i in range(len(_GLOBAL_HOOKS))]
    any_hooks += [f"{dicts[p]}[{name!r}]" for p in module_paths for name in _HOOK_KINDS]
    lines += [f"    if {' or '.join(any_hooks)}:",
              f"        hooks = _hooks({', '.join(dicts[p] for p in module_paths)})",
              "    else:",
              "        hooks = None"]
    modules = "".join(f"{mods[p]}, " for p in module_paths if p)
    training = "".join(f"{dicts[p]}['training'], " for p in module_paths)
    lines += [f"    key = ({modules}{training}hooks)",
              "    try:",
              "        state = _states[key]",
              "    except KeyError:",  # setdefault: two threads meeting a new state intern one object
              f"        state = _states.setdefault(key, _State(_paths, key[:{len(module_paths) - 1}], "
              f"key[{len(module_paths) - 1}:-1], hooks))"]
    lines += [f"    t{i} = {dicts[owner]}[{kind!r}][{name!r}]" for i, (_, owner, kind, name) in enumerate(slots)]
    if slots:  # a parameter or buffer set to None since: take stock again
        lines += [f"    if {' or '.join(f't{i} is None' for i in range(len(slots)))}:", "        raise KeyError('None')"]
    lines.append(f"    return ({''.join(f't{i}, ' for i in range(len(slots)))}), state")
    env: dict[str, Any] = {"_states": states, "_State": ModuleState, "_paths": tuple(module_paths),
                           "_hooks": functools.partial(_hook_ids, module_paths)}
    env.update({f"_g{i}": vars(torch_module)[name] for i, name in enumerate(_GLOBAL_HOOKS)})
    exec(compile("\n".join(lines) + "\n", "<minijit module fetch>", "exec"), env)
    return env["fetch"]


def _hook_ids(module_paths: list[str], *module_dicts: dict[str, Any]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """(label, hook kind, handle ids in call order) for every non-empty hook dict, the global ones first.

    Handle ids are never reused, so any hook added or removed changes these.
    """
    found = [(_GLOBAL_LABEL, kind, tuple(hooks)) for name, kind in _GLOBAL_HOOKS.items()
             if (hooks := vars(torch_module)[name])]
    for path, namespace in zip(module_paths, module_dicts, strict=True):
        found += [(_label(path), kind, tuple(hooks)) for name, kind in _HOOK_KINDS.items() if (hooks := namespace[name])]
    return tuple(found)


_JIT_QUERIES = {"last_traces", "last_backward_traces", "last_prologue", "last_epilogue", "cache_info"}


class JitModule(torch.nn.Module):
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
        # Imported here: minijit.runtime.jit imports the pipeline, which imports this file.
        from minijit.runtime.jit import JitFunction

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
