"""The errors minijit raises. Each message says what went wrong, where, and what to do."""

from __future__ import annotations


class MinijitError(Exception):
    """Base class of every error minijit raises on purpose."""


class UnsupportedOpError(MinijitError):
    """A torch callable or symbol that no minijit op or executor can run."""


class TracesEagerBody(UnsupportedOpError):
    """An ltorch op declining a call that its torch function's Python body, traced op by op, records as eager
    runs it (F.embedding with `max_norm` renormalises `weight.detach()` in place, then looks up): the
    interpreter traces that body instead of recording the call opaque."""


class DataDependentShapeError(UnsupportedOpError):
    """A torch op whose result's shape depends on its input's values (`nonzero`, `unique`), where no value can be read."""


class LayoutDecidesView(UnsupportedOpError):
    """Whether eager returns a view or a copy (`reshape`) depends on a layout minijit does not know: raised where
    a write makes the answer matter (`minijit.transforms.memory.MustShare`)."""


class UnsupportedMethodError(UnsupportedOpError, AttributeError):
    """A Tensor method or attribute a traced tensor does not support (an AttributeError too, for hasattr)."""


class UnsupportedSyntaxError(MinijitError):
    """A Python construct (opcode, builtin on a proxy, ...) the interpreter refuses."""


class UnguardedComparisonError(MinijitError):
    """A comparison operator on a symbolic number where nothing records guards (outside a capture): the
    code deciding there calls an explicit function (`minijit.ir.proxies.same_value`, `rule_compare`)."""


class UnguardedValueError(MinijitError):
    """A pass (outside a capture and its replays) converted a symbolic number to a Python value (`int(n)`,
    `bool(n)`): nothing guards the value seen while capturing, so a later call of other sizes would get a trace
    decided on it. A bug in minijit: the pass decides with `same_value` / `known_compare`, or reads a value it
    knows is safe with `minijit.ir.proxies.fixed_value`."""


class FrozenValueError(UnsupportedSyntaxError):
    """A call whose result or effect changes from call to call (a clock, Python's or NumPy's random
    numbers) that a trace would run only once, while tracing, freezing its value."""


class AliasError(MinijitError):
    """Inputs alias in a way the trace cannot handle safely."""


class MetaError(MinijitError):
    """An op was called with inputs it cannot accept (shapes, dtypes, devices, strides)."""


class DeviceError(MetaError):
    """Tensors on devices that the op cannot combine, where eager PyTorch raises too (a 0-dim CPU tensor
    combines with any device, as a scalar)."""


class InplaceError(MinijitError, RuntimeError):
    """An in-place op that eager PyTorch refuses too (a leaf that requires grad, an expanded tensor): a
    RuntimeError too, as eager's refusal is."""


class CopyToOutError(MinijitError):
    """A trace breaks the copy_to_out_ rules: a write into an input before a read of its old value."""


class TraceInvariantError(MinijitError):
    """A pass produced a trace that breaks a rule every trace keeps (minijit.transforms.verify): a bug in minijit."""


class GuardError(MinijitError):
    """Inputs do not match what a trace was specialised on."""


class ValueGuardError(GuardError):
    """A value the traced code read from a tensor (`if x.sum() > 0`) cannot be guarded: the compiled trace
    computes another value than the capture read, or too many values were read for one function."""


def where(source: object | None) -> str:
    """Format a source location for an error message, or '' when unknown."""
    return f" at {source}" if source is not None else ""


class EnvironmentVariableError(MinijitError, ValueError):
    """A minijit environment variable (`MINIJIT_WARN_RETRACES`, ...) set to a value that means nothing to it."""


class RegistrationError(MinijitError):
    """A rule or implementation registered for a symbol that does not exist, or that does not fit its signature."""


class ValueGuardMiss(Exception):
    """Raised by a compiled trace's `prims.check_value` when a value the trace branched on differs on this call.

    Internal: the jitted function catches it before any write into an input or outside state
    has happened, and runs the call again with the cache entry made for the value seen.
    Not a `MinijitError`: it never reaches the user.
    """

    def __init__(self, ordinal: int, observed: object):
        super().__init__(ordinal, observed)
        self.ordinal = ordinal
        self.observed = observed


# --- errors that stand for eager's --------------------------------------------------------------------------

# The exception types eager PyTorch raises for bad input that a minijit error may stand for.
EAGER_TYPES: tuple[type[Exception], ...] = (IndexError, ValueError, TypeError, NotImplementedError, RuntimeError)
_EAGER_TYPED: dict[tuple[type[MinijitError], type[Exception]], type[MinijitError]] = {}


def as_eager(error: MinijitError, eager: type[BaseException]) -> MinijitError:
    """`error` as an instance of a class deriving from both its class and `eager`, the exception type eager
    raises for the same input (`MetaError[IndexError]`): the user's `except IndexError` catches it, as in
    eager, both inside traced code and around the jitted call. `error` itself where `eager` is no type
    eager raises for bad input (or where it already is one)."""
    if not issubclass(eager, EAGER_TYPES) or isinstance(error, eager):
        return error
    cls = type(error)
    typed = _EAGER_TYPED.get((cls, eager))
    if typed is None:
        name = f"{cls.__name__}[{eager.__name__}]"
        try:
            typed = type(name, (cls, eager), {"__module__": cls.__module__, "__qualname__": name, "eager_type": eager,
                                              "__doc__": f"{cls.__name__}, standing for eager's {eager.__name__}.",
                                              "__reduce__": _reduce_eager_typed})
        except TypeError:  # an exception type whose instance layout cannot be combined
            return error
        _EAGER_TYPED[(cls, eager)] = typed
    new = typed(*error.args)
    new.__cause__, new.__suppress_context__ = error.__cause__, error.__suppress_context__
    return new


def _reduce_eager_typed(error: MinijitError) -> tuple[object, ...]:
    """Pickling: the class is made on demand, so it is rebuilt from its base and eager's type."""
    base = next(c for c in type(error).__mro__[1:] if issubclass(c, MinijitError))
    return (_rebuild_eager_typed, (base, type(error).eager_type, error.args))  # type: ignore[attr-defined]


def _rebuild_eager_typed(base: type[MinijitError], eager: type[BaseException], args: tuple[object, ...]) -> MinijitError:
    return as_eager(base(*args), eager)


def reaches_user(exc: BaseException) -> bool:
    """True for a MinijitError no `except` in traced code may catch: one that does not stand for eager's error."""
    return isinstance(exc, MinijitError) and getattr(type(exc), "eager_type", None) is None
