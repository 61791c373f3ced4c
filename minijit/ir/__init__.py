"""The intermediate representation: proxies, symbols, bound symbols and traces."""

from minijit.ir.context import current_trace, tracing
from minijit.ir.proxies import TENSOR_METHODS, FloatProxy, IntegerProxy, NumberProxy, Proxy, TensorProxy
from minijit.ir.pytree import tree_flatten, tree_iter, tree_map
from minijit.ir.symbol import (
    NO_EFFECTS,
    BoundSymbol,
    Effects,
    SourceLocation,
    Symbol,
)
from minijit.ir.trace import Trace

__all__ = [
    "NO_EFFECTS", "TENSOR_METHODS", "BoundSymbol", "Effects", "FloatProxy", "IntegerProxy", "NumberProxy", "Proxy",
    "SourceLocation", "Symbol", "TensorProxy", "Trace", "current_trace", "tracing",
    "tree_flatten", "tree_iter", "tree_map",
]
