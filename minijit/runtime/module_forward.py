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
`minijit.runtime.module` wraps this in `JitModule`, what `minijit.jit(module)` returns.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.modules.module as torch_module

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.outside import OutsideView
from minijit.runtime import distributed
from minijit.runtime.checks import Check, tensor_checks

# The hook dicts `Module._call_impl` consults, per module and globally, and what to call them.
_HOOK_KINDS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
               "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}
_GLOBAL_HOOKS = {f"_global{name}": f"global {kind}" for name, kind in _HOOK_KINDS.items()}
_GLOBAL_LABEL = "torch.nn.modules.module"


class ModuleWrapper(torch.nn.Module):
    """A module that wraps another, held in its `__dict__` as `_orig_mod` (`JitModule`): a fetch reads through it."""


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
        # The two leading arguments' names, unlike any of the forward's own (RWKV's forward takes `state`).
        taken = {p.name for p in forward_params}
        lead = [inspect.Parameter(_fresh(n, taken), inspect.Parameter.POSITIONAL_ONLY) for n in ("params", "state")]
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

    def state_checks(self, position: int, subject: str, value: Any, symbolic: bool) -> list[Check] | None:
        """The checks on the `params` and `state` arguments (positions 0 and 1), named by path (None for the
        other arguments)."""
        if position == 0:
            checks = [Check("self", "length", subject, (type(value), len(value)),
                            explain=functools.partial(_slots_changed, self))]
            for i, ((path, *_), tensor) in enumerate(zip(self.slots, value, strict=True)):
                checks += [dataclasses.replace(c, explain=functools.partial(_unless_slots_changed, self, c))
                           for c in tensor_checks(f"self.{path}", f"{subject}[{i}]", tensor, symbolic)]
            return checks
        if position == 1:  # interned: the key holds it by identity
            return [Check("self", "object", subject, (type(value), id(value)),
                          explain=functools.partial(_state_changed, value))]
        return None


def _fresh(base: str, taken: set[str]) -> str:
    """`base`, or `module_<base>` with underscores added, whichever is first not in `taken`."""
    name = base
    while name in taken:
        name = f"module_{base}" if name == base else name + "_"
    return name


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
        if isinstance(root.get_submodule(parent)._modules[child], ModuleWrapper):
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
