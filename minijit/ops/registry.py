"""Declaring ltorch ops, and the table from torch callables to them.

An ltorch op is declared once, with `@ltorch_op(torch_fns=..., methods=...)` on its
decomposition. The decomposition takes exactly the arguments of the torch callable
it stands for, so the torch executor can run the op by calling `impl` (by default
the first of `torch_fns`) with the bound symbol's arguments unchanged.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from minijit.errors import MetaError, MinijitError
from minijit.ir import NO_EFFECTS, TENSOR_METHODS, Effects, Symbol, TensorProxy, check_table, current_trace
from minijit.ops import prims
from minijit.ops.autocast import autocast_arguments
from minijit.ops.eager_errors import eager_error, eager_refusal, stand_ins
from minijit.ops.eager_facts import EAGER_BY_SYMBOL
from minijit.ops.number_args import known_slice_bounds, note_number_tensor

# torch callable (function, method descriptor, builtin) -> ltorch symbol
TORCH_TO_LTORCH: dict[Any, Symbol] = {}
# ltorch op name -> symbol
ALL_LTORCH: dict[str, Symbol] = {}


_any_autocast = torch._C._is_any_autocast_enabled

# The Python types torch's argument parser takes as dtypes, and the dtype each stands for (`float` is float64,
# whatever the default dtype).
PYTHON_TYPE_DTYPES: dict[type, torch.dtype] = {int: torch.int64, float: torch.float64, bool: torch.bool,
                                               complex: torch.complex128}


def _torch_dtypes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with a Python type given as a dtype (`dtype=int`, `x.to(float)`) replaced by its torch dtype,
    as eager's argument parser does: no torch op takes the classes themselves as anything else."""
    if any(type(a) is type and a in PYTHON_TYPE_DTYPES for a in args):
        args = tuple(PYTHON_TYPE_DTYPES[a] if type(a) is type and a in PYTHON_TYPE_DTYPES else a for a in args)
    dtype = kwargs.get("dtype")
    if type(dtype) is type and dtype in PYTHON_TYPE_DTYPES:
        kwargs = {**kwargs, "dtype": PYTHON_TYPE_DTYPES[dtype]}
    return args, kwargs


class LtorchSymbol(Symbol):
    """An ltorch op. A call made by the user's code under `torch.autocast` first casts its
    arguments as eager would (`minijit.ops.autocast`); one that makes a 0-dim int64 tensor of sizes and
    numbers only keeps the number it holds (`minijit.ops.number_args.note_number_tensor`), which a slice bound
    given later reads (`known_slice_bounds`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = current_trace()
        if trace is None or not trace.recording_user_call:
            return super().__call__(*args, **kwargs)
        args, kwargs = _torch_dtypes(args, kwargs)
        if _any_autocast():
            args, kwargs = autocast_arguments(self, args, kwargs)
        args = known_slice_bounds(args)
        try:
            output = super().__call__(*args, **kwargs)
        except MetaError as e:
            # Inputs eager rejects too: the error is eager's type as well, for the user's `except`.
            typed = eager_error(e, self, args, kwargs)
            if typed is e:
                raise
            raise typed.with_traceback(e.__traceback__) from e.__cause__
        except (TypeError, AttributeError, ValueError, IndexError) as e:
            # A check that failed on an argument of a type it does not expect: eager's refusal, where eager refuses.
            if isinstance(e, MinijitError):
                raise
            refusal = eager_refusal(self, args, kwargs)
            if refusal is None:
                raise
            raise refusal from None
        note_number_tensor(self.name, args, kwargs, output)
        return output


def ltorch_op(
    name: str | None = None,
    *,
    torch_fns: Sequence[Any] = (),
    methods: Sequence[str] = (),
    impl: Callable[..., Any] | None = None,
    effects: Effects = NO_EFFECTS,
    tags: Iterable[str] = (),
) -> Callable[[Callable[..., Any]], Symbol]:
    """Declare an ltorch op from its decomposition.

    `torch_fns` are the torch callables that the interpreter maps to this op;
    `methods` the `Tensor` method names that dispatch to it on proxies; `impl` the
    eager implementation with the decomposition's signature (default: the first
    torch callable); `effects` what it does besides computing its outputs (views,
    writes into its arguments, randomness: `minijit.ir.Effects`); `tags` the other
    facts passes ask about it (`minijit.ir.Tag`).

    Example::

        @ltorch_op(torch_fns=[torch.relu, torch.nn.functional.relu], methods=["relu"])
        def relu(a): ...
    """

    def register(decomposition: Callable[..., Any]) -> Symbol:
        op_name = name or decomposition.__name__
        if op_name in ALL_LTORCH:
            raise ValueError(f"ltorch op {op_name!r} is declared twice")
        eager = impl if impl is not None else (torch_fns[0] if torch_fns else None)
        if effects.views is not None and not effects.same_if_unchanged and eager is not None:
            decomposition = _new_objects_as_eager(decomposition, eager)
        sym = LtorchSymbol(op_name, decomposition, namespace="ltorch", effects=effects, tags=frozenset(tags))
        sym.__doc__ = decomposition.__doc__
        ALL_LTORCH[op_name] = sym
        for fn in torch_fns:
            TORCH_TO_LTORCH[fn] = sym
        for method in methods:
            TENSOR_METHODS[method] = sym
        if eager is not None:
            EAGER_BY_SYMBOL[sym] = eager
        return sym

    return register


def _new_objects_as_eager(decomposition: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
    """A view op's decomposition that, called by the user's code, hands back a new tensor where it would hand back
    an argument unchanged and eager makes a new view of it (`x.view(x.shape)`, `x[:]`, `x.permute(0, 1)`): an
    identity view, as eager's, viewing the argument. Where eager returns the argument itself (`x.flatten()` of a
    1-d `x`), so does the op. The object matters after the call: an in-place change of the result's metadata
    (`y.unsqueeze_(0)`), a hook registered on it, or `y is x`, must not reach or find the argument."""

    @functools.wraps(decomposition)
    def decompose(*args: Any, **kwargs: Any) -> Any:
        output = decomposition(*args, **kwargs)
        trace = current_trace()
        if trace is None or not trace.in_user_op:
            return output
        outputs = list(output) if isinstance(output, (tuple, list)) else [output]
        given = {id(a) for a in (*args, *kwargs.values()) if isinstance(a, TensorProxy)}
        if not any(isinstance(o, TensorProxy) and id(o) in given for o in outputs):
            return output
        made = _eager_objects(eager, args, kwargs)
        if made is None or len(made) != len(outputs):
            return output
        fresh = [_identity_view(o) if isinstance(o, TensorProxy) and id(o) in given and not made[i] else o
                 for i, o in enumerate(outputs)]
        return fresh[0] if not isinstance(output, (tuple, list)) else type(output)(fresh)

    return decompose


def _eager_objects(eager: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bool] | None:
    """For each output of `eager` run on meta stand-ins of the call, whether it is one of its arguments itself;
    None where eager does not run on them."""
    call_args, call_kwargs = stand_ins(args, kwargs, on_cpu=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = eager(*call_args, **call_kwargs)
    except Exception:  # a meta kernel's limit: keep the decomposition's answer
        return None
    given = {id(a) for a in (*call_args, *call_kwargs.values()) if isinstance(a, torch.Tensor)}
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    return [id(r) in given for r in results]


def _identity_view(a: TensorProxy) -> TensorProxy:
    """A new view of all of `a`, laid out as `a`."""
    return prims.transpose(a, tuple(range(a.ndim)))


def declare_op(name: str, decomposition: Callable[..., Any], doc: str, **options: Any) -> Symbol:
    """Declare the ltorch op `name` from `decomposition`, a function a factory made for it, documented by `doc`.

    `options` are `ltorch_op`'s; without `torch_fns`, the op is `torch.<name>` and the `Tensor` method `name`.
    """
    decomposition.__name__, decomposition.__doc__ = name, doc
    if "torch_fns" not in options:
        options.update(torch_fns=[getattr(torch, name), getattr(torch.Tensor, name)], methods=[name])
    return ltorch_op(name, **options)(decomposition)


def ltorch_symbol_for(fn: Any) -> Symbol | None:
    """The ltorch symbol that stands for the torch callable `fn`, if any."""
    try:
        return TORCH_TO_LTORCH.get(fn)
    except TypeError:  # unhashable
        return None


def check_eager_table(symbols: Iterable[Symbol] | None = None) -> None:
    """Raise a MinijitError naming each ltorch op (of `symbols`, by default every one declared) that has no
    eager callable (`torch_fns` or `impl`): the eager errors, layouts and views of its calls ask it."""
    check_table(EAGER_BY_SYMBOL, ALL_LTORCH.values() if symbols is None else symbols, lambda s: True,
                "eager implementation (`ltorch_op`'s torch_fns or impl)")
