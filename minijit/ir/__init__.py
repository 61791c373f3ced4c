"""The intermediate representation: proxies, symbols, bound symbols and traces."""

from minijit.ir.capture_state import CaptureState
from minijit.ir.context import current_trace, tracing
from minijit.ir.proxies import TENSOR_METHODS, FloatProxy, IntegerProxy, NumberProxy, Proxy, TensorProxy
from minijit.ir.pytree import tree_flatten, tree_iter, tree_map, tree_structure
from minijit.ir.symbol import (
    NO_EFFECTS,
    VIEWS_ANY_LAYOUT,
    VIEWS_IF_BASIC_KEY,
    VIEWS_IF_SPLITS,
    BoundSymbol,
    Effects,
    SourceLocation,
    Symbol,
    Tag,
    check_table,
)
from minijit.ir.trace import Trace

__all__ = [
    "NO_EFFECTS", "TENSOR_METHODS", "VIEWS_ANY_LAYOUT", "VIEWS_IF_BASIC_KEY", "VIEWS_IF_SPLITS", "BoundSymbol",
    "CaptureState", "Effects", "FloatProxy", "IntegerProxy", "NumberProxy", "Proxy", "SourceLocation", "Symbol", "Tag",
    "TensorProxy",
    "Trace", "check_table", "current_trace", "tracing",
    "tree_flatten", "tree_iter", "tree_map", "tree_structure",
]
