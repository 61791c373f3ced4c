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
import warnings
from typing import Any

import torch

from minijit.errors import EAGER_TYPES, MetaError, MinijitError, as_eager
from minijit.ir import NumberProxy, Symbol, TensorProxy, tree_flatten, tree_map
from minijit.ir.context import where_now
from minijit.ops.eager_facts import eager_impl
from minijit.ops.strides import _sizes, known_layout, meta_like


def eager_error(error: MinijitError, sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> MinijitError:
    """`error`, raised while recording the user's call of ltorch op `sym`, typed as eager's error for that call."""
    if not isinstance(error, MetaError) or getattr(type(error), "eager_type", None) is not None:
        return error
    # Eager's own CPU kernels decide where they run on stand-ins: a meta kernel may raise another type than the
    # kernel does (aminmax on an empty dim: RuntimeError on meta, IndexError on the CPU), or an AssertionError.
    found = raised_on_cpu(eager_impl(sym), args, kwargs)
    raised = type(found) if found is not None else getattr(error, "eager_raised", None)
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


def out_refusal(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                shared: bool = False) -> MinijitError | None:
    """Eager's refusal of `fn(*args, **kwargs, out=out)` because of `out=` itself, as a MetaError of eager's type; None
    where eager takes that `out` (or where the call does not run on stand-ins, so eager's answer is not found here).

    It runs `fn` on stand-ins (`stand_ins`) once without `out=` and once with stand-ins shaped and typed like the out=
    tensors: an error only the second call raises is the out= tensors' (a dtype eager will not cast into, a shape it
    will not resize, `flip` taking no `out`, `where`'s out= overload wanting a tensor `other`)."""
    concrete = stand_ins(args, kwargs, on_cpu=_small_cpu(args, kwargs))
    try:
        with torch.no_grad(), warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")
            results = fn(*concrete[0], **concrete[1])
    except Exception:  # the call does not run on stand-ins: eager's answer is not found here
        return None
    targets = out if isinstance(out, tuple | list) else (out,)
    made = results if isinstance(results, tuple | list) else (results,)
    if not all(isinstance(t, TensorProxy | torch.Tensor) for t in targets) or not all(
            isinstance(r, torch.Tensor) for r in made):
        return None
    device = made[0].device if made else "cpu"
    # With `shared`, an out= tensor that is also an argument is that argument's stand-in, so eager sees the overlap
    # (some ops refuse any overlap; where none needs resizing, functionalization refuses it with its own words).
    same = {id(p): c for p, c in zip(tree_flatten((args, kwargs)), tree_flatten(concrete), strict=True)
            if shared and isinstance(p, TensorProxy | torch.Tensor) and isinstance(c, torch.Tensor)}
    outs = [same.get(id(t)) if id(t) in same else torch.empty(
        _sizes(t) if isinstance(t, TensorProxy) else t.shape, dtype=t.dtype, device=device) for t in targets]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = _raised(fn, (concrete[0], {**concrete[1], "out": type(out)(outs) if targets is out else outs[0]}))
    if found is None or not isinstance(found, EAGER_TYPES):
        return None
    text = str(found).strip().splitlines()[0] if str(found).strip() else type(found).__name__
    name = getattr(fn, "__name__", "the op")
    return as_eager(MetaError(f"torch.{name} with out=: torch raised {type(found).__name__}: {text}{where_now()}"),
                    type(found))


def _small_cpu(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the tensor proxies of a call are all CPU tensors, few elements in all (stand-ins of zeros are cheap)."""
    proxies = [x for x in tree_flatten((tuple(args), kwargs)) if isinstance(x, TensorProxy)]
    return all(x.device.type == "cpu" for x in proxies) and sum(math.prod(_sizes(x)) for x in proxies) <= 2**16


def stand_ins(args: Any, kwargs: dict[str, Any], on_cpu: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call with each tensor proxy a CPU tensor of zeros (`on_cpu`) or a meta tensor (of its layout where known),
    one per proxy (a tensor given twice is one tensor, as in eager), and each number proxy its value."""
    made: dict[int, torch.Tensor] = {}

    def stand_in(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            if id(x) not in made:
                made[id(x)] = _tensor_like(x, on_cpu)
            return made[id(x)]
        return x.value if isinstance(x, NumberProxy) else x

    return tree_map(stand_in, (tuple(args), dict(kwargs)))


def _tensor_like(x: TensorProxy, on_cpu: bool) -> torch.Tensor:
    if on_cpu:
        return torch.zeros(_sizes(x), dtype=x.dtype)
    layout = known_layout(x)
    return meta_like(x, layout) if layout is not None else torch.empty(_sizes(x), dtype=x.dtype, device="meta")


def _raised_on_meta(sym: Symbol, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception | None:
    """The exception eager's implementation of `sym` raises on stand-ins like the proxies (CPU ones first), if any."""
    impl = eager_impl(sym)
    if impl is None:
        return None
    found = raised_on_cpu(impl, args, kwargs)
    if found is not None:
        return found
    found = _raised(impl, stand_ins(args, kwargs, on_cpu=False))
    # On meta tensors a NotImplementedError is the meta kernel's limit (`torch.where(mask)` runs nonzero, whose
    # size depends on the values), never eager refusing.
    return None if isinstance(found, NotImplementedError) else found


def raised_on_cpu(impl: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception | None:
    """The exception `impl` raises on small CPU tensors of zeros like the proxies, where all are small CPU tensors.

    On CPU tensors, eager's own kernels decide: meta kernels skip some checks (the dtypes a CPU kernel supports)
    and raise others as another type (`normal_` on int64: RuntimeError on meta, NotImplementedError on the CPU)."""
    if impl is None or not any(isinstance(x, TensorProxy) for x in tree_flatten((tuple(args), kwargs))) or \
            not _small_cpu(args, kwargs):
        return None
    return _raised(impl, stand_ins(args, kwargs, on_cpu=True))


def raised_for_any_values(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception | None:
    """The exception eager's `fn` raises on small CPU tensors of zeros like the proxies where it raises on meta
    tensors too, so not because of the values (zeros make `inv` singular and integer division divide by zero);
    None otherwise."""
    found = raised_on_cpu(fn, args, kwargs)
    if found is None:
        return None
    on_meta = _raised(fn, stand_ins(args, kwargs, on_cpu=False))
    return None if on_meta is None or isinstance(on_meta, NotImplementedError) else found


def _raised(impl: Any, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Exception | None:
    """The exception `impl(*args, **kwargs)` raises (none for a missing meta kernel), or None."""
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # a random op's draws leave the generator as it was
            impl(*call[0], **call[1])
    except NotImplementedError as e:
        return None if "Meta" in str(e) else e
    except Exception as e:  # what eager raises is what we are after
        return e
    return None
