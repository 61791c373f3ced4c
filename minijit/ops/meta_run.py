"""Running a torch callable on meta tensors: its outputs' metadata and its effects, as torch itself sees them.

`run_on_meta(fn, args, kwargs)` stands an empty tensor on the meta device in for every
tensor proxy among the arguments (one meta tensor per proxy, so aliasing is kept; with
the proxy's eager strides where they are known, `minijit.ops.strides`, which `as_strided`
always asks for),
calls `fn` under a dispatch mode that records the ATen operators it reaches, and
reads off

- each output's shape, dtype and requires_grad, from torch's meta kernels and its
  autograd (so an output needs grad exactly where eager's would);
- the arguments it writes: an operator whose schema marks an argument as written
  (`Tensor(a!)`: in-place ops, `out=`) on a tensor sharing an argument's storage, or
  an argument whose version counter moved;
- the argument each output views: it shares that argument's storage (the schema's
  `Tensor(a)` annotation is what makes a meta kernel return a view);
- whether it is random: an operator tagged `nondeterministic_seeded`;
- whether its output shape depends on the data: an operator tagged
  `dynamic_output_shape` or `data_dependent_output` (`nonzero`, `unique`, `.item()`)
  failed on meta tensors (`DataDependentShapeError`: the capture may then run the op on the
  real values, minijit.runtime.values). That, an operator without a meta kernel, a result that is not
  made of tensors, or an in-place change of an argument's shape are `MinijitError`s
  naming the op and the user's line.

Results are cached per signature (the callable, the arguments' metadata and values,
grad mode, default dtype): a meta run costs about a millisecond, a cache hit a few
microseconds. (The first meta run in a process costs more: torch imports its Python
meta kernels' dependencies then.)
"""

from __future__ import annotations

import functools
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from minijit.errors import DataDependentShapeError, MetaError, UnsupportedOpError
from minijit.ir import NumberProxy, TensorProxy, tree_flatten, tree_structure
from minijit.ir.containers import sequence_leaves
from minijit.ir.context import where_now
from minijit.ir.layouts import outside_inference_mode
from minijit.ir.proxies import data_dependent, number_value
from minijit.ops.eager_errors import raised_on_cpu
from minijit.ops.strides import eager_layout, known_layout, meta_like
from minijit.ops.symbolic_sizes import has_symbolic_sizes, size_rule, symbolic_output_shapes


@dataclass(frozen=True)
class TensorMeta:
    """What a proxy for one output tensor needs (a leaf of trees, unlike a named tuple)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


@dataclass(frozen=True)
class MetaResult:
    """What one call did, in terms of the flattened leaves of its (args, kwargs) (`tree_flatten`).

    `outputs` is the result with each tensor replaced by its `TensorMeta` (torch's
    structseq results, `torch.return_types.max`, become named tuples). Per flattened
    output leaf, `views` names the input leaf whose storage it shares and `same_as` the
    input leaf it is (an in-place op returns its argument); `written` lists the input
    leaves written into, `written_meta` their metadata afterwards; `ops` the ATen operators
    the call reached (`aten::mm`), each once.
    """

    outputs: Any
    views: tuple[int | None, ...]
    same_as: tuple[int | None, ...]
    written: tuple[int, ...]
    written_meta: tuple[TensorMeta, ...]
    random: bool
    ops: tuple[str, ...] = ()


class _Recorder:
    """A dispatch mode that notes each ATen operator called, with its arguments."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.calls = calls

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                calls.append((func, args, kwargs))
                try:
                    return func(*args, **kwargs)
                except NotImplementedError:
                    if not _only_writes(func):
                        raise
                    # No meta kernel (torch._fused_sgd_), but nothing to describe: the op returns nothing
                    # and its effects are the writes its schema declares, which `_written_by` reads.
                    return None

        self.mode = Mode()


def _only_writes(func: Any) -> bool:
    """Whether an ATen operator returns nothing and writes some of its arguments (its schema says so)."""
    schema = func._schema
    return not schema.returns and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


# Torch callables whose result depends on the argument's layout in memory, not only its values.
READS_STORAGE = {torch.as_strided, torch.Tensor.as_strided, torch.as_strided_copy}


@size_rule(*READS_STORAGE)
def _as_strided_sizes(args: tuple[Any, ...], kwargs: dict[str, Any],
                      traced: list[tuple[int, ...] | None]) -> list[tuple[Any, ...] | None] | None:
    """`as_strided(x, size, stride, storage_offset)`'s output has exactly the sizes asked for, symbolic or not.

    The strides and offset are arguments the trace passes on as they are: the elements read are the
    ones eager reads as long as x's storage is laid out as eager lays it out, which the layout guard of
    x's inputs (`run_on_meta`) and the executors' eager kernels keep. Size 0 is specialised.
    """
    size = kwargs["size"] if "size" in kwargs else args[1] if len(args) > 1 else None
    if not isinstance(size, list | tuple) or len(traced) != 1 or traced[0] is None:
        return None
    if any(isinstance(d, NumberProxy) and d.expr is None for d in size):
        return None
    shape = tuple(d.python_type(d) if isinstance(d, NumberProxy) and d.value < 1 else d for d in size)
    if tuple(number_value(d) for d in shape) != tuple(traced[0]):
        return None
    return [shape]


_CACHE: OrderedDict[Any, MetaResult | Exception] = OrderedDict()
_CACHE_SIZE = 4096


def run_on_meta(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> MetaResult:
    """Run `fn(*args, **kwargs)` with meta tensors for the tensor proxies; `what` names the op in errors.

    Symbolic numbers among the arguments (and sizes): output sizes that follow from them are
    symbolic (`minijit.ops.symbolic_sizes`, which records the constraints torch's kernel
    relied on); where that cannot be derived, they are specialised on: their values are used,
    and the constraints that they keep those values are recorded.
    """
    if fn in READS_STORAGE:
        # Its result depends on where the argument's elements sit in memory: use (and guard) its eager layout.
        for x in tree_flatten((args, kwargs)):
            if isinstance(x, TensorProxy):
                eager_layout(x, offset_matters=True)
    key = _signature(fn, args, kwargs)
    cached = _CACHE.get(key) if key is not None else None
    if cached is None:
        try:
            with outside_inference_mode():
                cached = _run(fn, args, kwargs, what)
        except (MetaError, UnsupportedOpError) as e:
            cached = e
        if key is not None:
            _CACHE[key] = cached
            if len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    symbolic = has_symbolic_sizes((args, kwargs))
    if isinstance(cached, Exception):
        # An error may depend on the sizes; a refusal to read a tensor's value does not (the caller may
        # retry with the numbers such a tensor holds, minijit/frontend/calls.py).
        if symbolic and not isinstance(cached, DataDependentShapeError):
            _specialise((args, kwargs))
        error = type(cached)(f"{cached.args[0]}{where_now()}")
        if hasattr(cached, "eager_raised"):  # the type of torch's own error, for the user's `except`
            error.eager_raised = cached.eager_raised  # type: ignore[attr-defined]
        raise error from cached.__cause__
    if symbolic:
        return _with_symbolic_shapes(fn, args, kwargs, cached)
    return cached


def _with_symbolic_shapes(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                          result: MetaResult) -> MetaResult:
    """`result` with the output sizes that follow from the arguments' symbolic sizes as number proxies
    (`minijit.ops.symbolic_sizes`); where they cannot be derived soundly, the symbolic numbers among the
    arguments are specialised (the trace relies on their values)."""
    leaves = tree_flatten((args, kwargs))
    metas = sequence_leaves(result.outputs)
    concrete = [m.shape if isinstance(m, TensorMeta) else None for m in metas]
    factory = kwargs.get("device") is not None or not any(isinstance(x, TensorProxy) for x in leaves)
    derived = None
    if not result.written:
        derived = symbolic_output_shapes(fn, args, kwargs, concrete, meta_device=factory,
                                         reads_layout=fn in READS_STORAGE)
    if derived is None:
        _specialise((args, kwargs))
        return _argument_shapes(result, leaves)
    shapes = iter(derived)

    def with_shape(meta: TensorMeta | None, _: int) -> TensorMeta | None:
        shape = next(shapes)
        return None if meta is None else replace(meta, shape=shape)

    return replace(result, outputs=map_leaves(result.outputs, with_shape))


def _argument_shapes(result: MetaResult, leaves: list[Any]) -> MetaResult:
    """`result` (of a run whose arguments' symbolic sizes were specialised) with each output whose shape is a tensor
    argument's, as traced, given that argument's sizes: equal on every call the trace serves (the guard checks their
    values), and the same sizes to the passes after the capture, which compare sizes without recording anything (an
    in-place opaque op's result written back through a view of its input was refused: a constant against a proxy)."""
    by_values: dict[tuple[int, ...], tuple[Any, ...]] = {}
    for x in leaves:
        if isinstance(x, TensorProxy) and not any(data_dependent(d) or (isinstance(d, NumberProxy) and d.read)
                                                  for d in x.shape):
            by_values.setdefault(tuple(number_value(d) for d in x.shape), tuple(x.shape))
    if not any(isinstance(d, NumberProxy) for shape in by_values.values() for d in shape):
        return result

    def with_shape(meta: TensorMeta | None, _: int) -> TensorMeta | None:
        shape = None if meta is None else by_values.get(tuple(meta.shape))
        return meta if shape is None else replace(meta, shape=shape)

    return replace(result, outputs=map_leaves(result.outputs, with_shape),
                   written_meta=tuple(with_shape(m, 0) for m in result.written_meta))


def _specialise(args: Any) -> None:
    """Use the values of the symbolic numbers among `args` (a tree), recording that the trace relies on them
    (a size only the trace knows is read: the trace checks its value)."""
    for x in tree_flatten(args):
        for d in x.shape if isinstance(x, TensorProxy) else (x,):
            if isinstance(d, NumberProxy) and (d.expr is not None or (data_dependent(d) and d.python_type is int)):
                d.python_type(d)


# -- the signature a result is cached under ------------------------------------------------

def _signature(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A hashable key of everything the meta run depends on, or None where an argument is not hashable."""
    seen: dict[int, int] = {}
    parts: list[Any] = [fn, torch.is_grad_enabled(), torch.get_default_dtype()]
    try:
        for x in tree_flatten((args, kwargs)):
            parts.append(_leaf_key(x, seen))
        parts.append(tuple(kwargs))
        parts.append(len(args))
        parts.append(tree_structure(args))
        key = tuple(parts)
        hash(key)
        return key
    except TypeError:
        return None


def _leaf_key(x: Any, seen: dict[int, int]) -> Any:
    if isinstance(x, TensorProxy):
        alias = seen.setdefault(id(x), len(seen))
        return ("tensor", alias, tuple(number_value(d) for d in x.shape), x.dtype, x.device, x.requires_grad,
                known_layout(x))
    if isinstance(x, NumberProxy):
        return (x.python_type, x.value)
    if isinstance(x, torch.Tensor):
        alias = seen.setdefault(id(x), len(seen))
        return ("real tensor", alias, id(x))
    return (type(x), x)


# -- the run ----------------------------------------------------------------------------------

def _to_meta(x: Any, metas: dict[int, torch.Tensor], grad: bool, column_major: bool = False) -> Any:
    if isinstance(x, TensorProxy):
        t = metas.get(id(x))
        if t is None:
            shape = tuple(number_value(d) for d in x.shape)
            # Not a leaf where it requires grad: eager refuses in-place writes into leaves that
            # require grad, and minijit reports those itself (functionalize), naming the input.
            needs_grad = grad and x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)
            layout = known_layout(x)
            if layout is not None:  # its eager layout is known (minijit.ops.strides)
                t = meta_like(x, layout, requires_grad=needs_grad)
            else:  # unknown: taken contiguous, or (`_aliasing`, asking whether the layout decides) column-major
                t = torch.empty(shape[::-1] if column_major else shape, dtype=x.dtype, device="meta")
                if column_major:
                    t = t.permute(*reversed(range(len(shape))))
                if needs_grad:
                    t = t.requires_grad_(True).clone()
            metas[id(x)] = t
        return t
    if isinstance(x, NumberProxy):
        return x.value
    return x


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    """The device outputs made on the meta device belong to: the `device=` argument, else the inputs'."""
    requested = kwargs.get("device")
    if requested is not None:
        return torch.device(requested)
    devices = {x.device for x in tree_flatten((args, kwargs)) if isinstance(x, TensorProxy)}
    if not devices:
        return torch.get_default_device()
    # A CPU tensor mixed with tensors of another device is a scalar riding along (torch's rule).
    others = sorted((d for d in devices if d.type != "cpu"), key=str)
    return others[0] if others else next(iter(devices))


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def _run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> MetaResult:
    grad = torch.is_grad_enabled()
    leaves = tree_flatten((args, kwargs))
    meta_leaves, margs, mkwargs = _metas(args, kwargs, grad)
    device = _device_of(args, kwargs)
    firsts = _first_positions(meta_leaves)
    inputs = [(i, meta_leaves[i]) for i in firsts.values()]
    before = {i: (t._version, _layout(t), t.requires_grad) for i, t in inputs}
    recorder = _Recorder()
    try:
        with recorder.mode:
            out = fn(*margs, **mkwargs)
    except Exception as e:
        raise _explain(e, recorder.calls, what, fn, args, kwargs) from e

    storage_of = _storage_positions(inputs)
    written: dict[int, None] = {}
    for func, cargs, ckwargs in recorder.calls:
        if torch.Tag.inplace_view in func.tags:
            continue  # a view's metadata changed (`t.squeeze_()`), not memory; checked on the arguments below
        for t in _written_by(func, cargs, ckwargs):
            i = storage_of.get(_storage(t))
            if i is not None:
                written[i] = None
    for i, t in inputs:
        version, layout, requires_grad = before[i]
        if t._version != version:
            written[i] = None
        if _layout(t) != layout:
            raise UnsupportedOpError(f"{what} changes the shape or strides of an argument in place, which a trace "
                                     "cannot follow; use the out-of-place op instead")
        if t.requires_grad != requires_grad:
            raise UnsupportedOpError(f"{what} turns requires_grad {'on' if t.requires_grad else 'off'} for an argument, "
                                     "which changes autograd's graph, which minijit does not trace; set requires_grad "
                                     "on the function's inputs before the call, or use x.detach()")
    outputs, views, same_as = _describe(out, firsts, storage_of, device, what)
    unknown = [x.name for x in leaves if isinstance(x, TensorProxy) and x.ndim > 1 and known_layout(x) is None]
    if unknown and any(i is not None for i in (*views, *same_as)) \
            and _aliasing(fn, args, kwargs, grad, device, what, column_major=True) not in (None, (views, same_as)):
        raise UnsupportedOpError(f"{what}: whether it returns a view of its argument or a copy depends on the memory "
                                 f"layout of {', '.join(unknown)}, which minijit does not know (made by an op without "
                                 "an eager implementation, or by autograd); call it outside the jitted function, or "
                                 "make the layout known first (`.clone()`)")
    random = any(torch.Tag.nondeterministic_seeded in func.tags for func, _, _ in recorder.calls)
    written_meta = tuple(_tensor_meta(meta_leaves[i], device) for i in written)
    ops = tuple(dict.fromkeys(func._schema.name for func, _, _ in recorder.calls))
    return MetaResult(outputs, tuple(views), tuple(same_as), tuple(written), written_meta, random, ops)


def _metas(args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool,
           column_major: bool = False) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The call's flattened leaves, arguments and keyword arguments with each proxy a meta tensor (one per
    proxy)."""
    metas: dict[int, torch.Tensor] = {}
    leaves = tree_flatten((args, kwargs))
    meta_leaves = [_to_meta(x, metas, grad, column_major) for x in leaves]
    margs = [_to_meta_tree(a, metas, grad, column_major) for a in args]
    mkwargs = {k: _to_meta_tree(v, metas, grad, column_major) for k, v in kwargs.items()}
    if mkwargs.get("device") is not None or not any(isinstance(x, TensorProxy) for x in leaves):
        # A factory (`torch.randperm(n)`) makes its result on the meta device too, drawing no random numbers.
        mkwargs["device"] = "meta"
    return meta_leaves, margs, mkwargs


def _aliasing(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool,
              device: torch.device, what: str, column_major: bool) -> tuple[list[int | None], list[int | None]] | None:
    """Which arguments `fn`'s results view or are, run again with the tensors of unknown layout laid out
    column-major (None where it raises then): where the answer differs from the contiguous run's, the layout
    decides it."""
    meta_leaves, margs, mkwargs = _metas(args, kwargs, grad, column_major)
    firsts = _first_positions(meta_leaves)
    try:
        out = fn(*margs, **mkwargs)
    except Exception:
        return None
    storage_of = _storage_positions([(i, meta_leaves[i]) for i in firsts.values()])
    _, views, same_as = _describe(out, firsts, storage_of, device, what)
    return views, same_as


def _first_positions(meta_leaves: list[Any]) -> dict[int, int]:
    """Each tensor once, at its first position (a proxy passed twice is one tensor: `torch.add(x, y, out=y)`)."""
    firsts: dict[int, int] = {}
    for i, t in enumerate(meta_leaves):
        if isinstance(t, torch.Tensor):
            firsts.setdefault(id(t), i)
    return firsts


def _storage_positions(inputs: list[tuple[int, torch.Tensor]]) -> dict[int, int]:
    """The position of the first input on each storage."""
    storage_of: dict[int, int] = {}
    for i, t in inputs:
        storage_of.setdefault(_storage(t), i)
    return storage_of


def _to_meta_tree(x: Any, metas: dict[int, torch.Tensor], grad: bool, column_major: bool = False) -> Any:
    t = type(x)
    if t is tuple or t is list:
        return t(_to_meta_tree(v, metas, grad, column_major) for v in x)
    if t is dict:
        return {k: _to_meta_tree(v, metas, grad, column_major) for k, v in x.items()}
    if t is slice:
        return slice(*(_to_meta_tree(v, metas, grad, column_major) for v in (x.start, x.stop, x.step)))
    return _to_meta(x, metas, grad, column_major)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _written_by(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an ATen call writes into, per its schema's alias annotations (`Tensor(a!)`)."""
    found = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        for t in value if isinstance(value, list | tuple) else (value,):
            if isinstance(t, torch.Tensor):
                found.append(t)
    return found


def _tensor_meta(t: torch.Tensor, device: torch.device) -> TensorMeta:
    return TensorMeta(tuple(t.shape), t.dtype, device if t.device.type == "meta" else t.device, t.requires_grad)


def map_leaves(outputs: Any, fn: Callable[[TensorMeta | None, int], Any]) -> Any:
    """`outputs` (a meta run's: TensorMeta and None leaves in lists, tuples and named tuples) rebuilt with each leaf
    replaced by `fn(leaf, its position among the leaves)`."""
    position = iter(range(1 << 62))

    def walk(x: Any) -> Any:
        if x is None or isinstance(x, TensorMeta):
            return fn(x, next(position))
        items = [walk(v) for v in x]
        kind = type(x)
        if kind is list or kind is tuple:
            return kind(items)
        return kind(*items) if hasattr(x, "_fields") else kind(items)  # a named tuple; torch.return_types

    return walk(outputs)


@functools.cache
def named_tuple_for(t: type) -> type:
    """A named tuple class with the fields of a torch structseq type (`torch.return_types.max`)."""
    return namedtuple(t.__name__, t.__match_args__)


def _describe(out: Any, by_id: dict[int, int], storage_of: dict[int, int], device: torch.device,
              what: str) -> tuple[Any, list[int | None], list[int | None]]:
    views: list[int | None] = []
    same_as: list[int | None] = []

    def convert(x: Any) -> Any:
        t = type(x)
        if isinstance(x, torch.Tensor):
            same = by_id.get(id(x))
            same_as.append(same)
            views.append(None if same is not None else storage_of.get(_storage(x)))
            return _tensor_meta(x, device)
        if x is None:
            views.append(None)
            same_as.append(None)
            return None
        if t is list:
            return [convert(v) for v in x]
        if t is tuple:
            return tuple(convert(v) for v in x)
        if isinstance(x, tuple) and hasattr(t, "__match_args__") and hasattr(t, "n_fields"):
            return named_tuple_for(t)(*(convert(v) for v in x))
        raise UnsupportedOpError(f"{what} returns a {t.__name__}, not tensors; minijit traces only tensor "
                                 "results of torch ops (a Python value read from a tensor cannot be traced); "
                                 "compute it outside the jitted function")

    return convert(out), views, same_as


_DATA_DEPENDENT_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
# Torch functions whose kernels read the values of a CPU tensor argument (a packed sequence's lengths or batch
# sizes) to size their results, with no tag saying so: no meta or fake tensor can stand in for it (a run on fake
# tensors with symbolic sizes may crash), so they run on the real values only (`kernel_reads_values`).
_READS_VALUES = frozenset({"_pack_padded_sequence", "_pad_packed_sequence", "lstm", "gru", "rnn_tanh", "rnn_relu"})


def kernel_reads_values(fn: Any, args: tuple[Any, ...]) -> bool:
    """Whether the torch function `fn` reads the values of a tensor among `args` in its kernel: the packing of
    sequences, and the recurrent nets on a packed batch (`torch.lstm(data, batch_sizes, ...)`, whose second
    argument is a tensor)."""
    name = getattr(fn, "__name__", None)
    if name not in _READS_VALUES or not (getattr(fn, "__module__", None) or "torch").startswith("torch"):
        return False
    return name.startswith("_") or (len(args) > 1 and isinstance(args[1], TensorProxy | torch.Tensor))


def _explain(e: Exception, calls: list[Any], what: str, fn: Any = None, args: tuple[Any, ...] = (),
             kwargs: dict[str, Any] | None = None) -> Exception:
    """The MinijitError for a meta run of `fn(*args)` that raised `e` (after the ATen `calls` it made)."""
    last = calls[-1][0] if calls else None
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if (last is not None and any(tag in last.tags for tag in _DATA_DEPENDENT_TAGS)) or \
            (fn is not None and kernel_reads_values(fn, args)) or \
            "no data" in text or "cannot be called on meta tensors" in text:
        op = f" ({last})" if last is not None else ""
        return DataDependentShapeError(
            f"{what}: its result depends on the values in its input tensors{op} (a data-dependent output shape "
            "or a Python value read from a tensor), which a trace can record only where the jitted function itself "
            "calls the op, without out= (it then checks the result's shape on every call); compute it outside the "
            "jitted function, or use an op whose result shape is known (torch.where instead of masking, say)")
    if isinstance(e, NotImplementedError) and "Meta" in text:
        op = f" ({last})" if last is not None else ""
        return UnsupportedOpError(f"{what}: torch has no meta kernel for it{op}, so minijit cannot know its "
                                  "result's shape; call it outside the jitted function")
    # Where the proxies are small CPU tensors, eager's own kernel decides the error's type and words: a meta kernel
    # may raise another type (an AssertionError, RuntimeError for aminmax's IndexError).
    found = raised_on_cpu(fn, args, kwargs or {}) if fn is not None else None
    if found is not None and str(found).strip():
        e, text = found, str(found).strip().splitlines()[0]
    error = MetaError(f"{what}: torch raised {type(e).__name__}: {text}")
    error.eager_raised = type(e)  # type: ignore[attr-defined]
    return error
