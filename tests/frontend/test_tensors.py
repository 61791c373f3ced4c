"""The interpreter on tensor programs: traced through minijit.jit and compared with eager PyTorch."""

from __future__ import annotations

import inspect
import math
import os
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F

import minijit
from minijit.errors import MinijitError, UnsupportedOpError, UnsupportedSyntaxError
from minijit.frontend import interpret
from minijit.frontend.opcodes import HANDLERS
from minijit.ir import TENSOR_METHODS, TensorProxy, Trace, tracing, tree_map
from minijit.ops.registry import ltorch_symbol_for

torch.manual_seed(0)


def _line_of(fn, text: str) -> int:
    """The file line number of the first line of `fn`'s source containing `text` (read by inspect)."""
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def _capture(fn, *args):
    """The capture trace of `fn` on proxies of `args` (tensors become inputs)."""
    trace = Trace()

    def to_proxy(a):
        return trace.add_input(TensorProxy(a.shape, a.dtype, a.device), "a") if isinstance(a, torch.Tensor) else a

    with tracing(trace):
        trace.output = interpret(fn, tree_map(to_proxy, args), {})
    return trace


def _all_bsyms(trace):
    return list(trace.bound_symbols)


# -- programs compared with eager ----------------------------------------------------------------
def _block(x, w, b):
    h = F.linear(x, w, b)
    return F.gelu(h)


def mlp(x, weights, biases):
    for w, b in zip(weights, biases):
        x = _block(x, w, b)
        if x.shape[-1] > 4:  # shape-based branch: specialised at trace time
            x = x * 2.0
    return x.sum(1)


def tensor_methods_and_operators(x, y):
    z = (x + y) * x - y / 2
    z = z.tanh().exp() + torch.Tensor.add(x, y) + torch.add(x, y, alpha=2)
    z = -z @ y.t()
    return z.sum(), abs(z), z.transpose(0, 1) ** 2


def dict_and_list_of_tensors(params, xs):
    out = {}
    for name, p in sorted(params.items()):
        out[name] = [torch.tanh(x * p) for x in xs]
    total = sum(t.sum() for ts in out.values() for t in ts)
    return out, total


def uses_python_features(x, n):
    def scale(t, k=1.0):
        return t * k

    fns = [lambda t: t + 1, functools_partial_scale(scale, 3.0), torch.sin]
    acc = [f(x) for f in fns]
    if isinstance(x, torch.Tensor) and type(x) is torch.Tensor and len(x) == x.shape[0]:
        acc.append(x.sum(dim=0, keepdim=True))
    try:
        acc.append(x.no_such_method())
    except AttributeError:
        acc.append(x * n)
    return acc


def functools_partial_scale(fn, k):
    import functools

    return functools.partial(fn, k=k)


class Layer:
    """A plain Python class holding tensors (not an nn.Module)."""

    def __init__(self, w):
        self.w = w

    @property
    def wt(self):
        return self.w.t()

    def __call__(self, x):
        return torch.tanh(x @ self.wt)


def class_with_property(x, w):
    layer = Layer(w)
    return layer(layer(x).t()).sum()


def generator_over_tensors(xs):
    def scaled():
        for i, x in enumerate(xs):
            yield x * (i + 1)

    return [a + b for a, b in zip(scaled(), scaled())], list(scaled())


CASES = [
    (mlp, lambda: (torch.randn(3, 5), [torch.randn(6, 5), torch.randn(4, 6)], [torch.randn(6), torch.randn(4)])),
    (tensor_methods_and_operators, lambda: (torch.randn(4, 4), torch.randn(4, 4))),
    (dict_and_list_of_tensors, lambda: ({"a": torch.randn(3), "b": torch.randn(3)}, [torch.randn(3), torch.randn(3)])),
    (uses_python_features, lambda: (torch.randn(2, 3), 3)),
    (class_with_property, lambda: (torch.randn(3, 3), torch.randn(3, 3))),
    (generator_over_tensors, lambda: ([torch.randn(2), torch.randn(2)],)),
]


@pytest.mark.parametrize("fn,make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_jit_matches_eager(fn, make_args):
    args = make_args()
    expected = fn(*args)
    actual = minijit.jit(fn)(*args)
    torch.testing.assert_close(actual, expected)


def test_trace_records_ops_not_python():
    trace = _capture(mlp, torch.randn(3, 5), [torch.randn(6, 5)], [torch.randn(6)])
    names = [b.sym.name for b in trace.bound_symbols]
    assert names == ["linear", "gelu", "mul", "sum"]


# -- source locations ----------------------------------------------------------------------------
def _helper(t):
    u = torch.tanh(t)
    return u


def outer(x):
    y = x * 3.0
    z = _helper(y)
    return z + 1.0


def test_bound_symbols_carry_user_lines_through_nested_calls():
    trace = _capture(outer, torch.randn(2))
    by_name = {b.sym.name: b.source for b in trace.bound_symbols}
    filename = os.path.basename(__file__)
    mul, tanh, add = by_name["mul"], by_name["tanh"], by_name["add"]
    assert os.path.basename(mul.filename) == filename
    assert (mul.lineno, mul.text) == (_line_of(outer, "x * 3.0"), "y = x * 3.0")
    # The innermost user line wins inside the helper ...
    assert (tanh.lineno, tanh.text) == (_line_of(_helper, "torch.tanh"), "u = torch.tanh(t)")
    # ... and the caller's location is back once the helper returns.
    assert (add.lineno, add.text) == (_line_of(outer, "z + 1.0"), "return z + 1.0")
    assert f"{filename}:{add.lineno}" in str(add)


def test_printed_trace_names_source_lines():
    jf = minijit.jit(outer)
    jf(torch.randn(2))
    printed = minijit.last_traces(jf)[0].python()
    assert f":{_line_of(_helper, 'torch.tanh')}  u = torch.tanh(t)" in printed


# -- errors --------------------------------------------------------------------------------------
def uses_nonzero(x):
    y = x + 1
    return torch.nonzero(y, out=torch.empty(0, 1, dtype=torch.long))


def test_unsupported_torch_op_names_op_and_line():
    # nonzero's result shape depends on the data: written into an out= tensor, a trace cannot record it.
    with pytest.raises(UnsupportedOpError) as info:
        minijit.jit(uses_nonzero)(torch.randn(4))
    message = str(info.value)
    assert "torch.nonzero" in message and "depends on the values" in message
    assert f"{os.path.basename(__file__)}:{_line_of(uses_nonzero, 'torch.nonzero')}" in message
    assert "return torch.nonzero(y, out=" in message


def swallows_errors(x):
    try:
        return torch.nonzero(x, out=torch.empty(0, 1, dtype=torch.long))
    except Exception:
        return x


def test_user_except_does_not_hide_minijit_errors():
    with pytest.raises(UnsupportedOpError):
        minijit.jit(swallows_errors)(torch.randn(4))


async def _coroutine(x):
    return x


def calls_async(x):
    coro = _coroutine(x)
    return coro


async def _async_generator(x):
    yield x


def calls_async_generator(x):
    agen = _async_generator(x)
    return agen


@pytest.mark.parametrize("fn,call_text", [(calls_async, "_coroutine(x)"), (calls_async_generator, "agen = ")])
def test_coroutine_is_refused_with_line(fn, call_text):
    with pytest.raises(UnsupportedSyntaxError) as info:
        minijit.jit(fn)(torch.randn(2))
    message = str(info.value)
    assert "RETURN_GENERATOR" in message and "async" in message
    assert f":{_line_of(fn, call_text)}" in message


def uses_except_star(x):
    try:
        raise ExceptionGroup("g", [ValueError(), KeyError()])
    except* ValueError:
        x = x * 2
    except* KeyError:
        x = x + 1
    return x


def test_except_star_on_tensors():
    x = torch.randn(3)
    torch.testing.assert_close(minijit.jit(uses_except_star)(x), uses_except_star(x))


def swallows_errors_in_groups(x):
    try:
        return torch.nonzero(x, out=torch.empty(0, 1, dtype=torch.long))  # a data-dependent shape into out=: refused
    except* Exception:
        return_value = x
    return return_value


def test_user_except_star_does_not_hide_minijit_errors():
    with pytest.raises(UnsupportedOpError):
        minijit.jit(swallows_errors_in_groups)(torch.randn(4))


def deletes_an_item(x):
    d = {"x": x}
    del d["x"]
    return x


def test_unsupported_opcode_names_opcode_and_line(monkeypatch):
    # Every opcode ordinary code compiles to has a handler: take one away to see the refusal.
    monkeypatch.delitem(HANDLERS, "DELETE_SUBSCR")
    with pytest.raises(UnsupportedSyntaxError) as info:
        minijit.jit(deletes_an_item)(torch.randn(2))
    message = str(info.value)
    assert "DELETE_SUBSCR" in message
    assert f":{_line_of(deletes_an_item, 'del d')}" in message


def passes_proxy_to_math(x):
    return math.sqrt(x)


def formats_data(x):
    return f"{x.cumsum(0)}"  # (a 0-dim tensor formats as its item, read behind a value check)


@pytest.mark.parametrize("fn", [passes_proxy_to_math, formats_data])
def test_proxy_misuse_is_a_clear_error(fn):
    # math.sqrt of a 3-element tensor: eager's "only one element tensors" refusal, naming the line.
    with pytest.raises(MinijitError) as info:
        minijit.jit(fn)(torch.randn(3))
    assert os.path.basename(__file__) in str(info.value)


def _check_shape(x):
    if x.shape[0] == 3:
        raise KeyError("shape three")


def fails_in_helper(x):
    _check_shape(x)
    return x


def test_user_exceptions_propagate_unchanged_with_a_note_of_user_lines():
    with pytest.raises(KeyError, match="shape three") as info:
        interpret(fails_in_helper, (torch.randn(3),), {})
    (note,) = info.value.__notes__
    name = os.path.basename(__file__)
    outer = f"{name}:{_line_of(fails_in_helper, '_check_shape(x)')}  _check_shape(x)"
    inner = f"{name}:{_line_of(_check_shape, 'raise KeyError')}  raise KeyError(\"shape three\")"
    assert note.index(outer) < note.index(inner)


def test_a_jitted_call_raising_while_traced_raises_eagers_exception_with_the_user_frames():
    # The call runs eagerly (minijit.runtime.fallback): the traceback holds the user's own frames.
    with pytest.raises(KeyError, match="shape three") as info:
        minijit.jit(fails_in_helper)(torch.randn(3))
    frames = [(f.name, f.lineno) for f in traceback.extract_tb(info.value.__traceback__)]
    outer = frames.index(("fails_in_helper", _line_of(fails_in_helper, "_check_shape(x)")))
    assert frames.index(("_check_shape", _line_of(_check_shape, "raise KeyError"))) > outer


def _squares(xs):
    for x in xs:
        yield torch.tanh(x)


def consumes_generator(a, b):
    return [t * 2.0 for t in _squares([a, b])]


def test_generator_ops_carry_the_generator_lines():
    trace = _capture(consumes_generator, torch.randn(2), torch.randn(2))
    lines = [(b.sym.name, b.source.lineno) for b in trace.bound_symbols]
    tanh_line = _line_of(_squares, "torch.tanh")
    mul_line = _line_of(consumes_generator, "t * 2.0")
    assert lines == [("tanh", tanh_line), ("mul", mul_line), ("tanh", tanh_line), ("mul", mul_line)]


def _echo():
    received = None
    while True:
        received = torch.sin((yield received))


def drives_generator(x):
    g = _echo()
    next(g)
    y = g.send(x)
    return g.send(y + 1.0)


def test_resumed_generator_sets_its_line_again():
    trace = _capture(drives_generator, torch.randn(2))
    lines = [(b.sym.name, b.source.lineno) for b in trace.bound_symbols]
    sin_line = _line_of(_echo, "torch.sin")
    assert lines == [("sin", sin_line), ("add", _line_of(drives_generator, "y + 1.0")), ("sin", sin_line)]


def fails_inside_handlers(x):
    try:
        with torch.no_grad():
            try:
                torch.nonzero(x, out=torch.empty(0, 1, dtype=torch.long))
            except:  # noqa: E722 - must not swallow minijit's error
                warnings.warn("bare except ran", stacklevel=1)
            warnings.warn("after bare except", stacklevel=1)
    finally:
        warnings.warn("finally ran", stacklevel=1)


def test_minijit_error_runs_finally_and_exit_but_no_except():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UnsupportedOpError):
            minijit.jit(fails_inside_handlers)(torch.randn(4))
    assert [str(w.message) for w in caught] == ["finally ran"]
    assert torch.is_grad_enabled()  # no_grad's __exit__ ran


class GeluBlock(torch.nn.Module):
    """A module without parameters: called through nn.Module.__call__, which is interpreted too."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return F.gelu(x * self.scale) + y


def test_module_call_is_interpreted():
    block = GeluBlock(2.0)
    x, y = torch.randn(3), torch.randn(3)
    jf = minijit.jit(lambda a, b: block(a, b))
    torch.testing.assert_close(jf(x, y), block(x, y))
    bsyms = minijit.last_traces(jf)[0].bound_symbols
    assert [b.sym.name for b in bsyms] == ["mul", "gelu", "add"]
    assert bsyms[1].source.lineno == _line_of(GeluBlock.forward, "F.gelu")


REAL = torch.randn(3)


def real_tensor_method_on_proxy(x):
    # kron has no ltorch decomposition: it is recorded as an opaque torch op on the captured REAL.
    return REAL.kron(x).sum() + REAL.add(x)


def test_method_of_a_real_tensor_with_a_proxy_argument_runs_like_eager():
    assert ltorch_symbol_for(torch.Tensor.kron) is None
    x = torch.randn(3)
    torch.testing.assert_close(minijit.jit(real_tensor_method_on_proxy)(x), real_tensor_method_on_proxy(x))


def real_tensor_method_with_bad_argument(x):
    return REAL.histc(x)


def test_method_of_a_real_tensor_with_a_bad_argument_names_op_and_line():
    with pytest.raises(MinijitError) as info:
        minijit.jit(real_tensor_method_with_bad_argument)(torch.randn(3))
    message = str(info.value)
    assert "histc" in message and "must be int, not Tensor" in message
    assert f"{os.path.basename(__file__)}:{_line_of(real_tensor_method_with_bad_argument, 'REAL.histc')}" in message


def metadata_queries(x):
    if torch.is_tensor(x) and torch.is_floating_point(x) and not torch.is_complex(x) and torch.numel(x) == 6:
        return x * 2.0
    return x


def test_torch_metadata_queries_on_proxies():
    x = torch.randn(2, 3)
    torch.testing.assert_close(minijit.jit(metadata_queries)(x), metadata_queries(x))


def iterates_rows(x):
    out = [row * float(i) for i, row in enumerate(x)]
    a, b = x
    return out, a - b


@pytest.mark.skipif("getitem" not in TENSOR_METHODS, reason="needs the ltorch getitem op")
def test_iterating_over_a_tensor_gives_its_rows():
    x = torch.randn(2, 3)
    torch.testing.assert_close(minijit.jit(iterates_rows)(x), iterates_rows(x))
