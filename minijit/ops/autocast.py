"""torch.autocast: eager's casting policy, applied to each ltorch op that the user's code calls.

Under `torch.autocast(device_type, dtype)` eager PyTorch casts the floating point
tensor arguments of some ops before running them, per device type (ATen's
`autocast_mode.cpp`):

- LOWER: every eligible argument to the autocast dtype (matmul, linear, sdpa, ...);
- FP32: every eligible argument to float32 (losses, and on CUDA exp, log, norms, ...);
- FP32_UNLESS_DTYPE: the result in float32 through the op's `dtype` argument, unless the
  call gives one (CUDA sum, softmax, cumsum, ...), when the first argument is eligible;
- PROMOTE: every eligible argument to the widest of their dtypes (cat on CPU, ...).

An argument is eligible when it is a floating point tensor of that device type and
not float64. Every other op runs on its arguments as they are. `ATEN_POLICIES` holds
eager's lists, by device type and operator name (ltorch's and ATen's); `POLICIES` is
the same by ltorch op (`Symbol`), keyed once every ltorch op is declared
(`key_policies`, which also checks that each ltorch op whose ATen operator eager casts
has a policy). An ltorch op standing for a composite torch function without its own
entry (`torch.square` is `pow(x, 2)`, `F.normalize` divides by a `norm`) gets the
policy that gives the composite's result.

The casts are recorded as `prims.convert_element_type` in front of the op, so the
printed trace shows them and the compiled trace runs without autocast (minijit's
runtime turns it off around the call). As in eager, the op's own decomposition runs
with autocast off: only calls made by the user's code are cast
(`Trace.recording_user_call`). Casts of float32 trace inputs that require grad (the
parameters) to the autocast dtype are shared, as eager caches casts of weights
(`torch.is_autocast_cache_enabled()`), until eager would clear its cache
(`clear_cast_cache`, called where the traced code calls `torch.clear_autocast_cache`,
as leaving the outermost autocast context does).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.errors import MetaError, UnsupportedOpError
from minijit.ir import Symbol, TensorProxy, Trace, check_table, current_trace, tree_iter, tree_map
from minijit.ir.context import where_now
from minijit.ops import prims

LOWER = "lower precision"
FP32 = "float32"
FP32_UNLESS_DTYPE = "float32 unless dtype is given"
PROMOTE = "widest input type"

_CONVOLUTIONS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "convolution")
# Op names are ltorch's and ATen's (the same name for an op both have); ATen operators with no ltorch
# op are opaque torch ops (minijit/ops/opaque.py), cast by `opaque_autocast_arguments`.
_CPU_LOWER = ("matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "scaled_dot_product_attention",
              "conv_tbc", "prelu", *_CONVOLUTIONS)
_CPU_FP32 = ("prod", "mse_loss", "l1_loss", "nll_loss", "nll_loss2d", "cross_entropy", "binary_cross_entropy",
             "binary_cross_entropy_with_logits", "avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
             "cdist", "trace", "poisson_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss",
             "triplet_margin_loss", "reflection_pad1d", "smooth_l1_loss", "multilabel_margin_loss", "soft_margin_loss",
             "multi_margin_loss", "huber_loss")
# hstack and vstack are cat underneath.
_CPU_PROMOTE = ("cat", "stack", "hstack", "vstack", "index_copy")

_CUDA_LOWER = ("matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "scaled_dot_product_attention", *_CONVOLUTIONS,
               "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell")
_CUDA_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "nll_loss",
    "l1_loss", "mse_loss", "binary_cross_entropy_with_logits", "logsumexp",
    # Composites: cross_entropy is log_softmax (float32 unless dtype) then nll_loss (float32); square
    # is pow(x, 2); normalize divides by a float32 norm.
    "cross_entropy", "square", "normalize",
)
_CUDA_FP32_UNLESS_DTYPE = ("sum", "prod", "cumsum", "softmax", "log_softmax", "vector_norm", "norm")
_CUDA_PROMOTE = ("addcdiv", "addcmul", "atan2", "index_put", "scatter_add")

# device type -> operator name -> cast policy (ops not listed run on their arguments as given): eager's lists, which
# name ltorch's ops and the ATen operators without one (opaque ops, known to `opaque_autocast_arguments` by name).
ATEN_POLICIES: dict[str, dict[str, str]] = {
    "cpu": {**dict.fromkeys(_CPU_LOWER, LOWER), **dict.fromkeys(_CPU_FP32, FP32),
            **dict.fromkeys(_CPU_PROMOTE, PROMOTE)},
    "cuda": {**dict.fromkeys(_CUDA_LOWER, LOWER), **dict.fromkeys(_CUDA_FP32, FP32),
             **dict.fromkeys(_CUDA_FP32_UNLESS_DTYPE, FP32_UNLESS_DTYPE), **dict.fromkeys(_CUDA_PROMOTE, PROMOTE)},
}

# device type -> ltorch op -> cast policy: ATEN_POLICIES by symbol, filled by `key_policies`.
POLICIES: dict[str, dict[Symbol, str]] = {}


def key_policies(ltorch_ops: dict[str, Symbol], aten_operator: Callable[[Symbol], str | None]) -> None:
    """Fill POLICIES from eager's lists for the ltorch ops (by name), and check it: a MinijitError names each op
    whose ATen operator (`aten_operator(op)`) has an autocast kernel of its own in eager but no policy here."""
    for device_type, by_name in ATEN_POLICIES.items():
        table = POLICIES[device_type] = {ltorch_ops[n]: p for n, p in by_name.items() if n in ltorch_ops}
        key = _autocast_key(device_type)

        def cast_by_eager(sym: Symbol, key: str | None = key) -> bool:
            op = aten_operator(sym)
            return key is not None and op is not None and _has_kernel(op, key)

        check_table(table, ltorch_ops.values(), cast_by_eager,
                    f"{device_type} autocast policy (minijit/ops/autocast.py)")


# A real tensor among an op's arguments (a global, a closure value) becomes a trace constant when
# recorded; autocast casts it like a proxy.
_TENSORS = (TensorProxy, torch.Tensor)


def _device_type(tensors: list[Any]) -> str:
    # Eager dispatches to the backend with the highest priority among the arguments: CUDA over CPU.
    types = {t.device.type for t in tensors}
    return "cuda" if "cuda" in types else tensors[0].device.type


def _eligible(x: Any, device_type: str) -> bool:
    return (isinstance(x, _TENSORS) and x.device.type == device_type and x.dtype.is_floating_point
            and x.dtype != torch.float64)


def _widest(op: str, tensors: list[Any], lower: torch.dtype, device_type: str) -> torch.dtype:
    widest = lower
    for t in tensors:
        if not _eligible(t, device_type):
            continue
        if widest == torch.float32 or t.dtype == torch.float32:
            widest = torch.float32
        elif t.dtype != lower:
            raise MetaError(f"{op}: autocast cannot promote {t.dtype} and {lower} (eager raises 'Unexpected floating "
                            f"ScalarType in at::autocast::prioritize'){where_now()}; cast the arguments first")
    return widest


def _cast(trace: Trace, x: Any, dtype: torch.dtype, lower: torch.dtype) -> TensorProxy:
    """x in `dtype`, sharing one cast per parameter while autocast stays entered, as eager does."""
    if x.dtype == dtype:
        return x
    cacheable = (dtype == lower and x.dtype == torch.float32 and x.requires_grad
                 and torch.is_autocast_cache_enabled() and any(a is x for a in trace.args))
    if not cacheable:
        return prims.convert_element_type(x, dtype)
    assert trace.capture is not None  # casts only calls the user's code made: recorded by a capture
    cache = trace.capture.cast_cache
    cast = cache.get((id(x), dtype))
    if cast is None:
        cast = cache[(id(x), dtype)] = prims.convert_element_type(x, dtype)
    return cast


def clear_cast_cache() -> None:
    """Forget the casts shared in the trace being recorded (eager's `torch.clear_autocast_cache`)."""
    trace = current_trace()
    if trace is not None and trace.capture is not None:
        trace.capture.cast_cache.clear()


_SIGNATURES: dict[Callable[..., Any], inspect.Signature] = {}


def _with_float32_dtype(meta: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                        device_type: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with `dtype=torch.float32` unless given, when the first argument is eligible."""
    sig = _SIGNATURES.get(meta)
    if sig is None:
        sig = _SIGNATURES[meta] = inspect.signature(meta)
    bound = sig.bind(*args, **kwargs)
    first = next(iter(bound.arguments.values()), None)
    if not _eligible(first, device_type) or bound.arguments.get("dtype") is not None:
        return args, kwargs
    bound.arguments["dtype"] = torch.float32
    return bound.args, bound.kwargs


def autocast_arguments(sym: Symbol, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments eager would run ltorch op `sym` on under the current autocast state.

    Records the casts (`prims.convert_element_type`) into the current trace. The op's
    decomposition (`sym.meta`) locates a `dtype` argument by its signature.
    """
    tensors = [x for x in tree_iter((args, kwargs)) if isinstance(x, _TENSORS)]
    if not tensors:
        return args, kwargs
    device_type = _device_type(tensors)
    if device_type not in POLICIES or not torch.is_autocast_enabled(device_type):
        return args, kwargs
    return _by_policy(POLICIES[device_type].get(sym), sym.name, sym.meta, tensors, device_type, args, kwargs)


def _by_policy(policy: str | None, op_name: str, meta: Callable[..., Any] | None, tensors: list[Any],
               device_type: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments cast by `policy` (None: as given); `meta` locates a `dtype` argument for FP32_UNLESS_DTYPE."""
    if policy is None:
        return args, kwargs
    lower = torch.get_autocast_dtype(device_type)
    if policy == FP32_UNLESS_DTYPE:
        assert meta is not None, f"{op_name}: FP32_UNLESS_DTYPE needs the op's signature"
        return _with_float32_dtype(meta, args, kwargs, device_type)
    if policy == LOWER:
        dtype = lower
    elif policy == FP32:
        dtype = torch.float32
    else:
        dtype = _widest(op_name, tensors, lower, device_type)

    trace = current_trace()

    def cast(x: Any) -> Any:
        return _cast(trace, x, dtype, lower) if _eligible(x, device_type) else x

    return tree_map(cast, (args, kwargs))


def _autocast_key(device_type: str) -> str | None:
    """The dispatch key of autocast's kernels for `device_type` (`AutocastCPU`), or None where there is none."""
    key = f"Autocast{device_type.upper()}"
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm", key)
    except RuntimeError:
        return None
    return key


def _has_kernel(op: str, key: str) -> bool:
    """Whether ATen operator `op` (`aten::mm`) has its own kernel for dispatch key `key` (False if no such op)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
    except RuntimeError:  # no such operator
        return False


def active_autocast(args: Any, kwargs: dict[str, Any]) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of the autocast state that applies to a call on these arguments, or None.

    It applies where autocast is on for the arguments' device type and one of them is eligible
    (a floating point tensor of that device, not float64).
    """
    tensors = [x for x in tree_iter((args, kwargs)) if isinstance(x, _TENSORS)]
    if not tensors:
        return None
    device_type = _device_type(tensors)
    if not torch.is_autocast_enabled(device_type) or not any(_eligible(t, device_type) for t in tensors):
        return None
    return device_type, torch.get_autocast_dtype(device_type)


def opaque_autocast_arguments(what: str, op: str | None, reached: Sequence[str], args: tuple[Any, ...],
                              kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments eager would run an opaque torch op on under the current autocast state.

    `op` is the ATen operator the call stands for (`aten::addbmm`), if any; `reached` the
    ATen operators its run on meta tensors reached. Eager casts where an operator has its
    own autocast kernel: where `op` has one, its policy from POLICIES applies to the
    arguments (recorded as casts, as for ltorch ops). The trace runs with autocast off, so
    a policy minijit does not know, or a cast eager makes inside the op (an operator the meta
    run reached has a kernel), is an UnsupportedOpError rather than a silently skipped cast.
    (Casts inside kernels the meta run does not see through are repeated where the op runs:
    minijit/ops/opaque.py runs it under the same autocast state.)
    """
    state = active_autocast(args, kwargs)
    if state is None:
        return args, kwargs
    device_type = state[0]
    key = _autocast_key(device_type)
    advice = "cast the arguments yourself, or call it outside the autocast region"
    if key is None:
        raise UnsupportedOpError(f"{what}{where_now()} runs under torch.autocast({device_type!r}), whose casts minijit "
                                 f"does not know for that device type; {advice}")
    if op is not None and _has_kernel(op, key):
        name = op.split("::")[-1]
        policy = ATEN_POLICIES.get(device_type, {}).get(name)
        if policy in (LOWER, FP32, PROMOTE):
            tensors = [x for x in tree_iter((args, kwargs)) if isinstance(x, _TENSORS)]
            return _by_policy(policy, name, None, tensors, device_type, args, kwargs)
        raise UnsupportedOpError(f"{what}{where_now()} runs under torch.autocast({device_type!r}), where eager casts "
                                 f"its arguments by a policy minijit does not know for {op}; {advice}")
    inner = [o for o in reached if _has_kernel(o, key)]
    if inner:
        raise UnsupportedOpError(f"{what}{where_now()} runs under torch.autocast({device_type!r}), where eager casts "
                                 f"inside it (autocast applies to {', '.join(inner)}), which minijit cannot repeat; "
                                 f"{advice}")
    return args, kwargs


__all__ = ["ATEN_POLICIES", "FP32", "FP32_UNLESS_DTYPE", "LOWER", "POLICIES", "PROMOTE", "active_autocast",
           "autocast_arguments", "clear_cast_cache", "key_policies", "opaque_autocast_arguments"]
