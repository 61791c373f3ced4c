"""The errors minijit raises. Each message says what went wrong, where, and what to do."""

from __future__ import annotations


class MinijitError(Exception):
    """Base class of every error minijit raises on purpose."""


class UnsupportedOpError(MinijitError):
    """A torch callable or symbol that no minijit op or executor can run."""


class DataDependentShapeError(UnsupportedOpError):
    """A torch op whose result's shape depends on its input's values (`nonzero`, `unique`), where no value can be read."""


class UnsupportedMethodError(UnsupportedOpError, AttributeError):
    """A Tensor method or attribute a traced tensor does not support (an AttributeError too, for hasattr)."""


class UnsupportedSyntaxError(MinijitError):
    """A Python construct (opcode, builtin on a proxy, ...) the interpreter refuses."""


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


class InplaceError(MinijitError):
    """An in-place op that eager PyTorch refuses too (a leaf that requires grad, an expanded tensor)."""


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
