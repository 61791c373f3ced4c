"""Errors that stand for eager's: a `MetaError` for a call the user's code made, typed as eager raises it.

Eager PyTorch raises `RuntimeError`, `IndexError`, `ValueError` or `TypeError` for inputs an op
rejects; user code catches them (`try: x.view(s) except RuntimeError: x.reshape(s)`). When an
ltorch op's checks reject a call the user's code made, the type eager would raise is found by
running the op's eager implementation on meta tensors shaped like the proxies (on small CPU
tensors of zeros where meta kernels skip the check, as they do dtype support; or taken from
torch's own error, where the check ran torch), and the `MetaError` becomes an instance of that
type too (`minijit.errors.as_eager`). Where eager's type cannot be found (torch accepts the meta
tensors, or has no meta kernel) the error stays a plain `MetaError`, which no user `except` catches.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from minijit.errors import MetaError, MinijitError, as_eager
from minijit.ir import NumberProxy, Symbol, TensorProxy, tree_flatten, tree_map
from minijit.ir.context import where_now
from minijit.ops.eager_facts import eager_impl
from minijit.ops.strides import _sizes, known_layout, meta_like


def eager_error(error: MinijitError, sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> MinijitError:
    """`error`, raised while recording the user's call of ltorch op `sym`, typed as eager's error for that call."""
    if not isinstance(error, MetaError) or getattr(type(error), "eager_type", None) is not None:
        return error
    raised = getattr(error, "eager_raised", None)
    if raised is None:
        found = _raised_on_meta(sym, args, kwargs)
        raised = None if found is None else type(found)
    return error if raised is None else as_eager(error, raised)


def eager_refusal(sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> MinijitError | None:
    """Where an ltorch op's checks failed without a MinijitError (an argument of a type it does not expect,
    `torch.sin(7)`): eager's refusal of the same call as a MetaError of eager's type, or None where eager
    accepts it (then the failure is minijit's own)."""
    found = _raised_on_meta(sym, args, kwargs)
    if found is None:
        return None
    text = str(found).strip().splitlines()[0] if str(found).strip() else type(found).__name__
    return as_eager(MetaError(f"{sym.id}: torch raised {type(found).__name__}: {text}{where_now()}"), type(found))


def _raised_on_meta(sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception | None:
    """The exception eager's implementation of `sym` raises on meta tensors like the proxies, if any."""
    impl = eager_impl(sym)
    if impl is None:
        return None

    def to_meta(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            layout = known_layout(x)
            if layout is not None:
                return meta_like(x, layout)
            return torch.empty(_sizes(x), dtype=x.dtype, device="meta")
        if isinstance(x, NumberProxy):
            return x.value
        return x

    # On CPU tensors, eager's own kernels decide, on small tensors of zeros: meta kernels skip some checks (the
    # dtypes a CPU kernel supports) and raise others as another type (`normal_` on int64: RuntimeError on meta,
    # NotImplementedError on the CPU).
    proxies = [x for x in tree_flatten((tuple(args), kwargs)) if isinstance(x, TensorProxy)]
    if proxies and all(x.device.type == "cpu" for x in proxies) and sum(math.prod(_sizes(x)) for x in proxies) <= 2**16:

        def to_zeros(x: Any) -> Any:
            if isinstance(x, TensorProxy):
                return torch.zeros(_sizes(x), dtype=x.dtype)
            return x.value if isinstance(x, NumberProxy) else x

        found = _raised(impl, tree_map(to_zeros, (tuple(args), dict(kwargs))))
        if found is not None:
            return found
    found = _raised(impl, tree_map(to_meta, (tuple(args), dict(kwargs))))
    # On meta tensors a NotImplementedError is the meta kernel's limit (`torch.where(mask)` runs nonzero, whose
    # size depends on the values), never eager refusing.
    return None if isinstance(found, NotImplementedError) else found


def _raised(impl: Any, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Exception | None:
    """The exception `impl(*args, **kwargs)` raises (none for a missing meta kernel), or None."""
    try:
        with torch.no_grad():
            impl(*call[0], **call[1])
    except NotImplementedError as e:
        return None if "Meta" in str(e) else e
    except Exception as e:  # what eager raises is what we are after
        return e
    return None
