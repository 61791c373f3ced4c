"""DDP, FSDP2 and tensor parallelism around a jitted module: their communication runs eagerly, the computation is jitted.

DDP's forward and FSDP2's and DTensor's forward hooks talk to process groups and C++ reducers
(all-gathers, reduce-scatters, bucket bookkeeping, autograd hooks on parameters): work a
trace can neither record nor replay on later calls. So that work stays eager and only the
module's computation is jitted, whichever way round the user wraps:

- `DDP(minijit.jit(m))`: DDP's forward calls the jitted module; nothing to do here.
- `minijit.jit(DDP(m))`: DDP's forward runs eagerly, with its `module` swapped for the jitted
  module during the call (`WRAPPERS`, `call_through_wrapper`).
- `minijit.jit(fully_shard(m))` and `fully_shard(minijit.jit(m))`: FSDP2's forward hooks on the
  root are *eager hooks* (`is_eager_hook`): hidden from the trace, and run around the compiled
  call, the pre-hooks before the parameters are fetched (they all-gather the parameters the
  trace then reads), the post-hooks after (`run_pre_hooks`, `run_post_hooks`).
- Tensor parallelism (`parallelize_module`, DTensor): its hooks too come from torch.distributed
  and are eager hooks. `parallelize_module(model, mesh, plan)`, then each parallelized module that
  holds no other one jitted in place: its hooks (a rank's local tensor made a DTensor, redistributed,
  and back) run around the compiled call, and the trace computes on DTensor parameters and inputs.
  DTensor disables `__torch_function__`, so the capture sees each as a tensor of its global shape,
  and the compiled trace's torch ops, run on the DTensors, are dispatched by DTensor: sharded, with
  its redistributions, as eager runs them.
- Eager hooks on a submodule of the jitted module (per-layer `fully_shard` or `parallelize_module`,
  then `jit`) would have to run between the layers of one trace: refused where the forward calls the
  submodule (`refusing_inner_eager_hooks`),
  naming whose hooks they are (`hook_origin`) and the patterns that work.

FSDP2 keys its state by the module object given to `fully_shard` and finds it again through
`named_modules()`; a jitted module FSDP2 was applied to therefore lists itself there in place
of the module it wraps (`has_composable_state`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.lookasides import LOOKASIDES
from minijit.ir.context import where_now

FSDP2_PATTERNS = (
    "jit each layer before sharding it (fully_shard(minijit.jit(layer)) for each layer, then fully_shard(model), "
    "left un-jitted; torch.compile goes there too: fully_shard(torch.compile(layer, backend='minijit'))), or shard "
    "only the jitted root (minijit.jit(fully_shard(model)) or fully_shard(minijit.jit(model)))"
)
TP_PATTERNS = (
    "parallelize first, then jit each parallelized module that holds no other parallelized module, and the "
    "modules between them (parallelize_module(model, mesh, plan), then model.fc = minijit.jit(model.fc) per layer), "
    "leaving the modules that hold parallelized ones un-jitted"
)


def _wrapper_types() -> dict[type, str]:
    if not torch.distributed.is_available():
        return {}
    from torch.nn.parallel import DistributedDataParallel

    return {DistributedDataParallel: "module"}


# Wrapper module types whose forward runs eagerly around the module they hold -> that module's attribute name.
WRAPPERS: dict[type, str] = _wrapper_types()


def wrapped_attribute(module: torch.nn.Module) -> str | None:
    """The attribute holding the module that a wrapper like DDP runs (None for other modules)."""
    for cls, attribute in WRAPPERS.items():
        if isinstance(module, cls):
            return attribute
    return None


def call_through_wrapper(wrapper: torch.nn.Module, attribute: str, jitted: torch.nn.Module,
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`wrapper(*args, **kwargs)` run eagerly, with `jitted` (a jitted module) in place of its wrapped module."""
    modules = wrapper._modules
    original = modules[attribute]
    modules[attribute] = jitted
    try:
        return wrapper(*args, **kwargs)
    finally:
        modules[attribute] = original


def is_eager_hook(hook: Any) -> bool:
    """True for a hook from torch.distributed (FSDP2's, composable replicate's): it must run eagerly."""
    module = getattr(_hook_function(hook), "__module__", None) or ""
    return f"{module}.".startswith("torch.distributed.")  # the package or a module in it


def _hook_function(hook: Any) -> Any:
    """The function under a hook's bound-method and functools.partial wrappers."""
    while True:
        inner = getattr(hook, "__func__", None) or getattr(hook, "func", None)
        if inner is None or inner is hook:
            return hook
        hook = inner


def hook_origin(hook: Any) -> tuple[str, str]:
    """(whose hook it is, in words; the patterns that work with it) for an eager hook."""
    module = getattr(_hook_function(hook), "__module__", None) or ""
    if module == "torch.distributed.tensor" or module.startswith("torch.distributed.tensor."):
        return ("DTensor's (tensor parallelism: parallelize_module or distribute_module was applied to it, its "
                "parameters are DTensors and the hook redistributes its inputs or outputs)", TP_PATTERNS)
    if module.startswith("torch.distributed.fsdp") or module.startswith("torch.distributed._composable"):
        return "FSDP2's (fully_shard was applied to it)", FSDP2_PATTERNS
    return f"from {module}", f"{FSDP2_PATTERNS}; for tensor parallelism: {TP_PATTERNS}"


def eager_hooks(module: torch.nn.Module) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
    """The eager (pre, post) forward hooks registered on `module`, as (handle id, hook), in call order."""
    namespace = vars(module)
    pre = [(i, h) for i, h in namespace["_forward_pre_hooks"].items() if is_eager_hook(h)]
    post = [(i, h) for i, h in namespace["_forward_hooks"].items() if is_eager_hook(h)]
    return pre, post


def without_root_eager_hooks(module: torch.nn.Module, label: str) -> dict[tuple[int, str], Any]:
    """While tracing: the root's hook dicts as the capture reads them, without its eager hooks (they run around
    the call), as {(id(module), name): hooks}; the module's own dicts are left as they are. The eager hooks must
    be outermost: eager pre-hooks before every traced one, eager post-hooks after."""
    namespace = vars(module)
    shown = {}
    for name, outermost_first in (("_forward_pre_hooks", True), ("_forward_hooks", False)):
        hooks = namespace[name]
        kinds = [is_eager_hook(h) for h in hooks.values()]
        if not any(kinds):
            continue
        order = kinds if outermost_first else kinds[::-1]
        if order != sorted(order, reverse=True):
            raise UnsupportedSyntaxError(
                f"{label} has forward {'pre-' if outermost_first else ''}hooks from torch.distributed and others in "
                f"between; minijit runs the torch.distributed ones eagerly around the compiled call, so they must "
                f"come {'first' if outermost_first else 'last'}. Register your hooks "
                f"{'after' if outermost_first else 'before'} applying FSDP2 or tensor parallelism, or with prepend="
                f"{'False' if outermost_first else 'True'}{where_now()}")
        shown[(id(module), name)] = type(hooks)((i, h) for i, h in hooks.items() if not is_eager_hook(h))
    return shown


class _RefusingHook:
    """What the capture reads in place of a submodule's eager hooks: calling the submodule is refused there, at
    the user's line (a lookaside, so that the refusal is minijit's, not an exception of the traced code)."""

    def __init__(self, what: str, instead: str):
        self.what, self.instead = what, instead

    def refuse(self, module: torch.nn.Module, *args: Any) -> None:
        """Raise the refusal, naming the line being traced."""
        raise UnsupportedSyntaxError(f"{self.what}{where_now()}{self.instead}")


LOOKASIDES[_RefusingHook.refuse] = _RefusingHook.refuse


def refusing_inner_eager_hooks(module: torch.nn.Module, path: str) -> dict[tuple[int, str], Any]:
    """While tracing: the hook dicts the capture reads for a submodule with eager hooks (FSDP2 or tensor parallelism
    applied per layer), as {(id(module), name): hooks}: calling it is refused, since its hooks would have to run
    between the layers of one trace. A submodule the forward never calls is no reason to refuse."""
    namespace = vars(module)
    for name in ("_forward_pre_hooks", "_forward_hooks"):
        for hook in namespace[name].values():
            if is_eager_hook(hook):
                whose, patterns = hook_origin(hook)
                refusing = _RefusingHook(
                    f"{type(module).__name__} at self.{path} has a forward hook from torch.distributed "
                    f"({getattr(_hook_function(hook), '__qualname__', repr(hook))}: {whose}), which must run eagerly "
                    f"between the layers of the jitted forward, where it is called",
                    f"; minijit cannot split one trace there. Instead: {patterns}")
                return {(id(module), "_forward_pre_hooks"): OrderedDict([(-1, refusing.refuse)])}
    return {}


def run_pre_hooks(module: torch.nn.Module, hooks: Iterable[tuple[int, Any]], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Run forward pre-hooks as `nn.Module.__call__` does: each may replace the arguments."""
    with_kwargs = vars(module)["_forward_pre_hooks_with_kwargs"]
    for hook_id, hook in hooks:
        if hook_id in with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                       f"but got {result}.")
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    return args, kwargs


def run_post_hooks(module: torch.nn.Module, hooks: Iterable[tuple[int, Any]], args: tuple[Any, ...],
                   kwargs: dict[str, Any], output: Any) -> Any:
    """Run forward hooks as `nn.Module.__call__` does: each may replace the output."""
    with_kwargs = vars(module)["_forward_hooks_with_kwargs"]
    for hook_id, hook in hooks:
        result = hook(module, args, kwargs, output) if hook_id in with_kwargs else hook(module, args, output)
        if result is not None:
            output = result
    return output


def has_composable_state(module: torch.nn.Module) -> bool:
    """True when a torch.distributed composable API (fully_shard) was applied to `module` itself."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed._composable_state import _get_module_state

    return _get_module_state(module) is not None


__all__ = ["FSDP2_PATTERNS", "TP_PATTERNS", "WRAPPERS", "call_through_wrapper", "eager_hooks", "has_composable_state",
           "hook_origin", "is_eager_hook", "refusing_inner_eager_hooks", "run_post_hooks", "run_pre_hooks",
           "without_root_eager_hooks", "wrapped_attribute"]
