"""The intermediate representation: proxies, symbols, bound symbols and traces."""

from minijit.ir.context import current_trace, tracing
from minijit.ir.proxies import TENSOR_METHODS, FloatProxy, IntegerProxy, NumberProxy, Proxy, TensorProxy
from minijit.ir.pytree import tree_flatten, tree_iter, tree_map
from minijit.ir.symbol import BoundSymbol, SourceLocation, Symbol
from minijit.ir.trace import Trace

__all__ = [
    "TENSOR_METHODS", "BoundSymbol", "FloatProxy", "IntegerProxy", "NumberProxy", "Proxy",
    "SourceLocation", "Symbol", "TensorProxy", "Trace", "current_trace", "tracing",
    "tree_flatten", "tree_iter", "tree_map",
]
