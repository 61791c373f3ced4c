"""Recurrent layers: torch's `_VF.lstm`, `_VF.gru`, `_VF.rnn_tanh`, `_VF.rnn_relu` and their cells.

nn.LSTM, nn.GRU and nn.RNN call these with the flat list of their weights. Each is
decomposed into its cell unrolled over the time steps, the way aten computes it on
the CPU: the input projection of every step in one `linear`, then per step the
hidden projection plus that step's input projection, the gates, the new state. Its
gradient is the decomposition's. Without grad the torch executor runs the op as one
torch call. Packed sequences are refused.

Under `cache="symbolic values"` an unrolled decomposition would fix the number of time
steps. Where that number is symbolic the op is instead one opaque torch call (its gradient
torch's own, minijit.transforms.vjp.opaque) whose output sizes follow the input's by a size
rule (`_recurrent_sizes`): one trace serves every length. Dropout between layers in training
draws random numbers per step: that call keeps the unrolled form (and a fixed length).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from minijit.ir import NumberProxy, Symbol, TensorProxy, tree_flatten
from minijit.ir.proxies import rule_compare
from minijit.ops.ltorch.elementwise import add, mul, sub, tanh
from minijit.ops.ltorch.nn import dropout, linear, relu, sigmoid
from minijit.ops.ltorch.shape import cat, chunk, stack, transpose, unbind
from minijit.ops.opaque import opaque_call
from minijit.ops.registry import declare_op, ltorch_op
from minijit.ops.symbolic_sizes import size_rule
from minijit.ops.utils import fail, unsupported

State = tuple[TensorProxy, ...]  # (h,) or (h, c)
# (input projection of one step, state, w_hh, b_hh, w_hr) -> new state
Cell = Callable[[TensorProxy, State, TensorProxy, Any, Any], State]

# A packed sequence (nn.utils.rnn.PackedSequence): no decomposition; the torch op is recorded whole, run on the real
# batch sizes while tracing (its kernel reads their values), its result's shape checked on every call.
PACKED = "packed sequences (nn.utils.rnn.PackedSequence) have no decomposition"


def _lstm_cell(x_proj: TensorProxy, state: State, w_hh: TensorProxy, b_hh: Any, w_hr: Any) -> State:
    h, c = state
    i, f, g, o = chunk(add(linear(h, w_hh, b_hh), x_proj), 4, 1)
    c = add(mul(sigmoid(f), c), mul(sigmoid(i), tanh(g)))
    h = mul(sigmoid(o), tanh(c))
    return (linear(h, w_hr) if w_hr is not None else h), c


def _gru_cell(x_proj: TensorProxy, state: State, w_hh: TensorProxy, b_hh: Any, w_hr: Any) -> State:
    (h,) = state
    x_r, x_z, x_n = chunk(x_proj, 3, 1)
    h_r, h_z, h_n = chunk(linear(h, w_hh, b_hh), 3, 1)
    r = sigmoid(add(h_r, x_r))
    z = sigmoid(add(h_z, x_z))
    n = tanh(add(x_n, mul(h_n, r)))
    return (add(mul(sub(h, n), z), n),)


def _simple_cell(activation: Callable[[TensorProxy], TensorProxy]) -> Cell:
    def cell(x_proj: TensorProxy, state: State, w_hh: TensorProxy, b_hh: Any, w_hr: Any) -> State:
        return (activation(add(linear(state[0], w_hh, b_hh), x_proj)),)
    return cell


_CELLS: dict[str, Cell] = {"lstm": _lstm_cell, "gru": _gru_cell, "rnn_tanh": _simple_cell(tanh),
                           "rnn_relu": _simple_cell(relu)}


def _layer_weights(op: str, params: Sequence[Any], has_biases: bool, num_layers: int,
                   directions: int) -> list[tuple[Any, Any, Any, Any, Any]]:
    """(w_ih, w_hh, b_ih, b_hh, w_hr) per layer and direction, from torch's flat weight list."""
    count = len(params) // (num_layers * directions) if num_layers * directions else 0
    if count * num_layers * directions != len(params) or count not in ((4, 5) if has_biases else (2, 3)):
        raise fail(op, f"got {len(params)} weights for {num_layers} layer(s) x {directions} direction(s) "
                       f"with has_biases={has_biases}")
    if count in (3, 5) and op != "lstm":
        raise fail(op, "projections (proj_size) exist only for LSTM")
    out = []
    for k in range(num_layers * directions):
        group = list(params[k * count:(k + 1) * count])
        w_ih, w_hh = group[0], group[1]
        b_ih, b_hh = (group[2], group[3]) if has_biases else (None, None)
        w_hr = group[-1] if count in (3, 5) else None
        out.append((w_ih, w_hh, b_ih, b_hh, w_hr))
    return out


def _run_layer(cell: Cell, x: TensorProxy, state: State, weights: tuple[Any, ...], reverse: bool) -> tuple[TensorProxy, State]:
    """One direction of one layer over a (T, B, I) input: ((T, B, H) outputs, final state)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    steps = unbind(linear(x, w_ih, b_ih), 0)
    outputs: list[Any] = [None] * len(steps)
    for t in (reversed(range(len(steps))) if reverse else range(len(steps))):
        state = cell(steps[t], state, w_hh, b_hh, w_hr)
        outputs[t] = state[0]
    return stack(outputs, 0), state


def _recurrent(op: str, input: TensorProxy, hx: State, params: Sequence[Any], has_biases: bool,  # noqa: A002
               num_layers: int, dropout_p: float, train: bool, bidirectional: bool,
               batch_first: bool) -> tuple[TensorProxy, tuple[TensorProxy, ...]]:
    if not isinstance(params, list | tuple):
        raise unsupported(op, PACKED)
    if not isinstance(input, TensorProxy) or input.ndim != 3:
        raise fail(op, f"expects a 3-d input, got {getattr(input, 'shape', input)}")
    directions = 2 if bidirectional else 1
    weights = _layer_weights(op, params, has_biases, num_layers, directions)
    steps = input.shape[1 if batch_first else 0]
    if isinstance(steps, NumberProxy) and not (dropout_p and train and num_layers > 1):
        # Symbolic length: one torch call, its sizes by `_recurrent_sizes` (unrolling would fix the length).
        output, *finals = opaque_call(getattr(torch, op), (input, hx if op == "lstm" else hx[0], list(params),
                                      has_biases, num_layers, dropout_p, train, bidirectional, batch_first), {})
        return output, tuple(finals)
    x = transpose(input, 0, 1) if batch_first else input
    if rule_compare(x.shape[0], "==", 0):
        raise fail(op, "expects a sequence of at least one step")
    initial = [unbind(s, 0) for s in hx]  # per state tensor, one (B, H) slice per layer and direction
    finals: list[State] = []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            k = layer * directions + d
            out, final = _run_layer(_CELLS[op], x, tuple(s[k] for s in initial), weights[k], reverse=d == 1)
            outs.append(out)
            finals.append(final)
        x = outs[0] if directions == 1 else cat(outs, 2)
        if dropout_p and train and layer < num_layers - 1:
            x = dropout(x, dropout_p, True)
    output = transpose(x, 0, 1) if batch_first else x
    return output, tuple(stack([f[i] for f in finals], 0) for i in range(len(hx)))


@size_rule(torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)
def _recurrent_sizes(args: tuple[Any, ...], kwargs: dict[str, Any],
                     traced: list[tuple[int, ...] | None]) -> list[tuple[Any, ...] | None] | None:
    """The output sizes of `torch.lstm` (and gru, rnn) on a padded batch: the output has the input's time and
    batch sizes, each final state the input's batch size; the feature sizes (from the weights) are specialised.

    (torch checks that the initial states' batch size is the input's: where it is not, eager and the
    trace raise alike.)
    """
    if kwargs or len(args) != 9 or not isinstance(args[0], TensorProxy) or args[0].ndim != 3:
        return None
    input, hx, *_, batch_first = args  # noqa: A001
    states = [hx] if isinstance(hx, TensorProxy) else list(hx)
    if len(traced) != 1 + len(states) or any(s is None or len(s) != 3 for s in traced):
        return None
    time, batch = (1, 0) if batch_first else (0, 1)
    followed = {(id(input), time), (id(input), batch), *((id(s), 1) for s in states if isinstance(s, TensorProxy))}
    for x in tree_flatten((args, kwargs)):
        for i, d in enumerate(x.shape if isinstance(x, TensorProxy) else (x,)):
            if isinstance(d, NumberProxy) and d.expr is not None and (id(x), i) not in followed:
                d.python_type(d)  # the trace relies on its value
    out = traced[0]
    assert out is not None
    steps, rows = input.shape[time], input.shape[batch]
    shapes: list[tuple[Any, ...] | None] = [
        tuple(steps if i == time else rows if i == batch else out[i] for i in range(3))]
    shapes += [(s[0], rows, s[2]) for s in traced[1:] if s is not None]
    return shapes


@ltorch_op(torch_fns=[torch.lstm])
def lstm(input: TensorProxy, hx: Sequence[TensorProxy], params: Sequence[TensorProxy], has_biases: bool,  # noqa: A002
         num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> tuple[TensorProxy, TensorProxy, TensorProxy]:
    """_VF.lstm (nn.LSTM): (output, h_n, c_n) of a stacked, possibly bidirectional LSTM."""
    if isinstance(hx, TensorProxy) or len(hx) != 2:
        raise unsupported("lstm", PACKED)
    output, (h, c) = _recurrent("lstm", input, tuple(hx), params, has_biases, num_layers, dropout, train,
                                bidirectional, batch_first)
    return output, h, c


def _single_state_op(name: str) -> Symbol:
    """Declares _VF.{name}, a recurrent net with one state (h)."""
    def recurrent(input: TensorProxy, hx: TensorProxy, params: Sequence[TensorProxy], has_biases: bool,  # noqa: A002
                  num_layers: int, dropout: float, train: bool, bidirectional: bool,
                  batch_first: bool) -> tuple[TensorProxy, TensorProxy]:
        output, (h,) = _recurrent(name, input, (hx,), params, has_biases, num_layers, dropout, train,
                                  bidirectional, batch_first)
        return output, h

    return declare_op(name, recurrent, f"_VF.{name} (nn.{'GRU' if name == 'gru' else 'RNN'}): (output, h_n).",
                      torch_fns=[getattr(torch, name)])


gru = _single_state_op("gru")
rnn_tanh = _single_state_op("rnn_tanh")
rnn_relu = _single_state_op("rnn_relu")


# -- cells (nn.LSTMCell, nn.GRUCell, nn.RNNCell) --------------------------------------------------

def _cell_input(op: str, input: Any, hx: Any) -> None:  # noqa: A002
    for x, what in ((input, "input"), (hx, "hx")):
        if not isinstance(x, TensorProxy) or x.ndim != 2:
            raise fail(op, f"expects a 2-d {what} (batch, features), got {getattr(x, 'shape', x)}")


@ltorch_op(torch_fns=[torch.lstm_cell])
def lstm_cell(input: TensorProxy, hx: Sequence[TensorProxy], w_ih: TensorProxy, w_hh: TensorProxy,  # noqa: A002
              b_ih: TensorProxy | None = None, b_hh: TensorProxy | None = None) -> tuple[TensorProxy, TensorProxy]:
    """_VF.lstm_cell (nn.LSTMCell): one LSTM step, (h, c)."""
    h, c = hx
    _cell_input("lstm_cell", input, h)
    h, c = _lstm_cell(linear(input, w_ih, b_ih), (h, c), w_hh, b_hh, None)
    return h, c


@ltorch_op(torch_fns=[torch.gru_cell])
def gru_cell(input: TensorProxy, hx: TensorProxy, w_ih: TensorProxy, w_hh: TensorProxy,  # noqa: A002
             b_ih: TensorProxy | None = None, b_hh: TensorProxy | None = None) -> TensorProxy:
    """_VF.gru_cell (nn.GRUCell): one GRU step."""
    _cell_input("gru_cell", input, hx)
    return _gru_cell(linear(input, w_ih, b_ih), (hx,), w_hh, b_hh, None)[0]


def _simple_cell_op(name: str) -> Symbol:
    """Declares _VF.{name}, one step of an Elman RNN."""
    def simple_cell(input: TensorProxy, hx: TensorProxy, w_ih: TensorProxy, w_hh: TensorProxy,  # noqa: A002
                    b_ih: TensorProxy | None = None, b_hh: TensorProxy | None = None) -> TensorProxy:
        _cell_input(name, input, hx)
        return _CELLS[name.removesuffix("_cell")](linear(input, w_ih, b_ih), (hx,), w_hh, b_hh, None)[0]

    return declare_op(name, simple_cell, f"_VF.{name} (nn.RNNCell): one step of an Elman RNN.",
                      torch_fns=[getattr(torch, name)])


rnn_tanh_cell = _simple_cell_op("rnn_tanh_cell")
rnn_relu_cell = _simple_cell_op("rnn_relu_cell")
