"""Functionalization (docs/design.md, invariants 1 and 2): in-place programs under jit match eager, inputs included."""

import pytest
import torch

import minijit
from minijit.errors import CopyToOutError, InplaceError, UnsupportedOpError
from minijit.extend import get_executor
from minijit.ir import TensorProxy
from minijit.ops import prims
from minijit.ops.registry import ALL_LTORCH
from minijit.runtime import trace_callable
from minijit.transforms import check_copies, functionalize
from tests.oputil import trace_call
from tests.transforms.mutation_util import check_final_trace, run_both


def _add_(x, y):
    x.add_(y)
    return x * 2


def _iadd(x, y):
    x += 1
    x *= y
    return x


def _alpha(x, y):
    x.sub_(y, alpha=0.5)
    return x


def _twice(x, y):
    a = x * 1
    x.mul_(y)
    x.add_(a)
    return a + x


def _copy(x, y):
    x.copy_(y)
    return x + y


def _zero_fill(x, y):
    x.zero_()
    y.fill_(3.0)
    return x + y


def _clamp_lerp(x, y):
    x.clamp_(-0.5, 0.5)
    y.lerp_(x, 0.25)
    return x - y


def _addc(x, y):
    x.addcdiv_(y, y.abs() + 1, value=0.5)
    y.addcmul_(x, x, value=2.0)
    return x


def _intermediate(x, y):
    t = x + y
    t.mul_(2)
    t.add_(1)
    return t


def _broadcast_src(x, y):
    x.add_(y.sum(0))
    return x


def _view_write(x, y):
    x.t().mul_(2)
    return x + 0


def _view_then_base(x, y):
    v = x.t()
    x.add_(y)
    return v * 1


def _sibling_views(x, y):
    v = x.t()
    w = x.transpose(0, 1)
    v.add_(y)
    return w + 0


def _view_of_view(x, y):
    v = x.t().t()
    v.mul_(3)
    return x.t() + v


def _view_of_intermediate(x, y):
    t = x * 1
    t.t().add_(y)
    return t


def _copy_then_mutate_source(x, y):
    x.copy_(y)
    y.add_(1)
    return x


def _swap_through_views(x, y):
    x.copy_(y.t())
    y.copy_(x.t())
    return x * y


def _old_view_returned(x, y):
    v = y.t()
    x.copy_(y.t())
    y.add_(1)
    return v


def _copy_self_transposed(x, y):
    y.copy_(x.t())  # y's final value is a view of x's old value: its copy must precede x's
    x.add_(1)
    return y


def _no_mutation(x, y):
    return (x + y).t()


def _mutated_returned_twice(x, y):
    x.add_(1)
    return x, x.t(), y


def _reshape_of_transpose_copies(x, y):
    r = x.t().reshape(-1)  # eager copies: a transpose cannot be viewed flat
    r.add_(1)
    w = x[1:3].reshape(8)  # a view: rows are contiguous
    w.mul_(y[0, 0])
    return r, w


def _flat_view_strided_write(x, y):
    x.view(-1)[::2].zero_()
    v = x.view(2, 8)
    x[0].add_(1)
    return v


def _write_through_expand(x, y):
    y.unsqueeze(0).expand(2, 4, 4)[1].mul_(3)
    x.expand(3, 4, 4).zero_()
    return y


def _diagonal(x, y):
    x.diagonal().add_(1)
    return x.diagonal(1) * 1


def _setitems(x, y):
    x[0] = y[1]
    x[:, 1:3] += 1
    x[x > 0] = 0
    y[..., None][2] = 7.0
    return x


def _unbind_chunk_split(x, y):
    a, b = x.unbind(0)[:2]
    a.add_(1)
    c, d = y.chunk(2, 1)
    d.mul_(2)
    p, q = x.split([1, 3])
    q[1:].mul_(0)
    return b, c, p


def _view_chain(x, y):
    x.movedim(0, 1).mT.select(0, 2).narrow(0, 1, 2).zero_()
    x.unsqueeze(-1).squeeze(-1).T.add_(y)
    return x


PROGRAMS = [_add_, _iadd, _alpha, _twice, _copy, _zero_fill, _clamp_lerp, _addc, _intermediate, _broadcast_src,
            _view_write, _view_then_base, _sibling_views, _view_of_view, _view_of_intermediate,
            _copy_then_mutate_source, _swap_through_views, _old_view_returned, _copy_self_transposed, _no_mutation,
            _mutated_returned_twice, _reshape_of_transpose_copies, _flat_view_strided_write, _write_through_expand,
            _diagonal, _setitems, _unbind_chunk_split, _view_chain]
MUTATES = {_add_: {"x"}, _iadd: {"x"}, _alpha: {"x"}, _twice: {"x"}, _copy: {"x"}, _zero_fill: {"x", "y"},
           _clamp_lerp: {"x", "y"}, _addc: {"x", "y"}, _intermediate: set(), _broadcast_src: {"x"},
           _view_write: {"x"}, _view_then_base: {"x"}, _sibling_views: {"x"},
           _view_of_view: {"x"}, _view_of_intermediate: set(), _copy_then_mutate_source: {"x", "y"},
           _swap_through_views: {"x", "y"}, _old_view_returned: {"x", "y"}, _copy_self_transposed: {"x", "y"},
           _no_mutation: set(), _mutated_returned_twice: {"x"}, _reshape_of_transpose_copies: {"x"},
           _flat_view_strided_write: {"x"}, _write_through_expand: {"x", "y"}, _diagonal: {"x"},
           _setitems: {"x", "y"}, _unbind_chunk_split: {"x", "y"}, _view_chain: {"x"}}


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__.strip("_"))
def test_matches_eager_with_one_copy_per_mutated_input(fn):
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    _, jf = run_both(fn, x, y)
    check_final_trace(jf, MUTATES[fn])
    functional = minijit.last_traces(jf)[1]
    assert functional.pass_name == "functionalize"
    for bsym in functional.bound_symbols:
        assert bsym.sym.name == "copy_to_out_" or not bsym.written(), bsym.sym.id


def test_setitem_with_an_index_tensor():
    def f(x, idx, v):
        x[idx] = v
        x[idx] += 2
        return x.sum(0)
    run_both(f, torch.randn(5, 3), torch.tensor([0, 3]), torch.randn(2, 3))


def test_write_into_overlapping_expanded_view_is_refused():
    def f(x, y):
        x.expand(2, 3).copy_(y)  # eager refuses it as well
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        f(torch.randn(3), torch.randn(2, 3))
    with pytest.raises(InplaceError, match=r"ltorch.copy_.*expanded tensor.*clone\(\)"):
        minijit.jit(f)(torch.randn(3), torch.randn(2, 3))


def test_float16_input_written_from_float32():
    def f(x, y):
        x.add_(y)
        return x
    run_both(f, torch.randn(3, 4).half(), torch.randn(4))


def test_integer_input_and_scalar_tensor():
    def f(x, s):
        x.mul_(s)
        x.add_(2)
        return x
    run_both(f, torch.arange(6).reshape(2, 3), torch.tensor(3))


def test_adam_step_writes_straight_into_its_inputs():
    def adam(p, g, m, v):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        denom = (v / 0.001).sqrt().add_(1e-8)
        p.addcdiv_(m, denom, value=-0.01)
    args = [torch.randn(64) for _ in range(4)]
    ptrs = [a.data_ptr() for a in args]
    _, jf = run_both(adam, *args)
    final = check_final_trace(jf, {"p", "m", "v"})
    notes = [b.note for b in final.bound_symbols if b.sym.name == "copy_to_out_"]
    assert len(notes) == 3 and all(n.startswith("in place") for n in notes), final
    # lerp writes m, addcdiv p, and both mul and addcmul v (mul's result is only read by addcmul)
    writes = [b.kwargs["out"].name for b in final.bound_symbols if "out" in b.kwargs and b.sym.name != "copy_to_out_"]
    assert sorted(n for n in writes if n in ("p", "m", "v")) == ["m", "p", "v", "v"], final
    # the same tensors, updated in place, on a second call too
    jf(*args)
    assert [a.data_ptr() for a in args] == ptrs


def test_chained_slice_writes_run_in_place():
    def f(x, y):
        x[1].add_(y[0])
        x[:, 2:].mul_(2)
        return y
    _, jf = run_both(f, torch.randn(4, 4), torch.randn(4, 4))
    final = check_final_trace(jf, {"x"})
    (copy,) = [b for b in final.bound_symbols if b.sym.name == "copy_to_out_"]
    assert copy.note.startswith("in place") and "1 intermediate" in copy.note, final
    # Reading the intermediate after the next step overwrote its memory is caught by the check.
    steps = [i for i, b in enumerate(final.bound_symbols) if b.sym.name == "slice_scatter_"]
    first = final.bound_symbols[steps[0]]
    reader = prims.mul.bind(first.output, 1.0, output=TensorProxy.like(first.output))
    broken = final.derive([*final.bound_symbols[:-1], reader, final.bound_symbols[-1]], pass_name="broken")
    with pytest.raises(CopyToOutError, match=rf"reads {first.output.name} after `t\d+ = torchex.slice_scatter_"):
        check_copies(broken)


def test_unsafe_in_place_write_becomes_a_real_copy():
    # y's new value is produced before the copy into x reads y's old value (x <- y).
    _, jf = run_both(_copy_then_mutate_source, torch.randn(3, 3), torch.randn(3, 3))
    final = minijit.last_traces(jf)[-1]
    notes = {b.kwargs["out"].name: b.note for b in final.bound_symbols if b.sym.name == "copy_to_out_"}
    assert notes["x"].startswith("copy") and "trace input" in notes["x"]
    assert notes["y"].startswith("copy") and "read after" in notes["y"]
    assert not any("out" in b.kwargs for b in final.bound_symbols if b.sym.name != "copy_to_out_")


def test_printed_functional_trace_runs():
    def f(x, y):
        x.t().add_(y)
        return x.sum()
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    jf = minijit.jit(f)
    xe, xj = x.clone(), x.clone()
    expected = f(xe, y)
    functional, _ = functionalize(trace_call(f, xj, y))
    got = trace_callable(functional)(xj, y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(xj, xe)
    del jf


def test_aliased_inputs_share_one_copy():
    def f(x, y):
        x.add_(1)
        return y * 2  # y is x: sees the addition
    t = torch.randn(3)
    expected_t = t.clone()
    expected = f(expected_t, expected_t)
    functional, _ = functionalize(trace_call(f, t, t), input_aliases=[(0, 1)])
    copies = [b for b in functional.bound_symbols if b.sym.name == "copy_to_out_"]
    assert len(copies) == 1
    check_copies(functional)
    got = trace_callable(functional)(t, t)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(t, expected_t)


def test_leaf_requiring_grad_is_refused_like_eager():
    def f(x):
        x.add_(1)
        return x
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        f(x)
    with pytest.raises(InplaceError, match=r"ltorch.add_.*a leaf Variable that requires grad is being used in an in-place"):
        minijit.jit(f)(x)

    def g(x):
        x.t().mul_(2)
        return x
    with pytest.raises(InplaceError, match="a view of a leaf Variable that requires grad"):
        minijit.jit(g)(torch.randn(2, 2, requires_grad=True))
    with torch.no_grad():
        xe, xj = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        f(xe)
        minijit.jit(f)(xj)
        torch.testing.assert_close(xj, xe)


def test_check_reports_a_read_after_the_copy():
    def f(x, y):
        a = x * 2
        x.add_(y)
        return a
    functional, _ = functionalize(trace_call(f, torch.randn(3), torch.randn(3)))
    check_copies(functional)
    mul, add, copy = functional.bound_symbols
    broken = functional.derive([add, copy, mul], pass_name="broken")
    with pytest.raises(CopyToOutError, match=r"`t\d+ = ltorch.mul\(t0, 2\)` reads the old value of input t0 after "
                                             r"`t0 = prims.copy_to_out_\(t\d+, out=t0\)` overwrote its memory"):
        check_copies(broken)


def test_check_reports_two_copies_into_one_input():
    def f(x, y):
        x.add_(y)
    jf = minijit.jit(f)
    jf(torch.randn(3), torch.randn(3))
    final = minijit.last_traces(jf)[-1]
    copy = final.bound_symbols[-1]
    doubled = final.derive([*final.bound_symbols, copy], pass_name="broken")
    with pytest.raises(CopyToOutError, match="written by 2 copies"):
        check_copies(doubled)


def test_check_reports_an_unsafe_out_write():
    def f(x, y):
        t = x + y
        return t * x  # reads x after t's producer
    jf = minijit.jit(f)
    jf(torch.randn(3), torch.randn(3))
    final = minijit.last_traces(jf)[-1]
    producer, reader = final.bound_symbols
    unsafe = get_executor("torch").produce_into(producer, final.args[0])  # `torch.add(x, y, out=x)`
    copy = prims.copy_to_out_.bind(producer.output, out=final.args[0], output=final.args[0])
    broken = final.derive([unsafe, reader, copy], pass_name="broken")
    with pytest.raises(CopyToOutError, match=r"reads the old value of input x after `t\d+ = torchex.add\(x, y, out=x\)`"):
        check_copies(broken)


def test_view_that_cannot_be_inverted_is_refused_on_write():
    # A view op whose decomposition is not made of view prims: reading works, writing is refused.
    from minijit.ir import Effects
    from minijit.ops.registry import ltorch_op

    name = "_test_fancy_view"
    if name not in ALL_LTORCH:
        @ltorch_op(name, effects=Effects(views=0), impl=lambda a: a * 1)
        def _fancy(a):
            return prims.mul(a, 1.0)
    sym = ALL_LTORCH[name]

    def f(x):
        v = sym(x)
        v.add_(1)
        return v
    with pytest.raises(UnsupportedOpError, match=f"ltorch.{name}.*cannot update its base"):
        functionalize(trace_call(f, torch.randn(3)))


@pytest.mark.skipif("index_copy_" not in ALL_LTORCH or "scaled_dot_product_attention" not in ALL_LTORCH,
                    reason="index_copy_ and sdpa land from other branches")
def test_index_copy_then_sdpa():
    def sdpa(*args):
        # torch's function on tensors, the ltorch symbol on proxies (until the interpreter maps one to the other)
        fn = ALL_LTORCH["scaled_dot_product_attention"] if isinstance(args[0], TensorProxy) else None
        return (fn or torch.nn.functional.scaled_dot_product_attention)(*args)

    def f(q, k, v, mask, idx, src):
        q.index_copy_(2, idx, src)
        k.index_copy_(2, idx, src)
        return sdpa(q, k, v, mask)
    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    mask = torch.randn(8, 8)
    idx, src = torch.tensor([1, 5]), torch.randn(2, 3, 2, 4)
    _, jf = run_both(f, q, k, v, mask, idx, src)
    final = check_final_trace(jf, {"q", "k"})
    notes = [b.note for b in final.bound_symbols if b.sym.name == "copy_to_out_"]
    assert all(n.startswith("in place") for n in notes), final


@pytest.mark.parametrize("fn", [_view_write, _setitems, _write_through_expand, _view_chain, _unbind_chunk_split],
                         ids=lambda f: f.__name__.strip("_"))
def test_symbolic_values_mode(fn):
    _, jf = run_both(fn, torch.randn(4, 4), torch.randn(4, 4), cache="symbolic values")
    check_final_trace(jf)


def _masked_fill_expanded(x, y):
    x.expand(3, 4).masked_fill_(x.sin() < 0.3, -2.0)
    return x * 1


def _masked_fill_transposed_expand(x, y):
    v = x.expand(2, 4).transpose(0, 1)
    v.masked_fill_(y.view(4, 2) > 0, -2.0)  # a mask that differs between positions on one element
    return x.clone(), v + 1


def _masked_fill_strided_expand(x, y):
    x.expand(3, 4)[:, 1::2].masked_fill_(x.expand(3, 4)[:, 1::2] > 0, 3.0)
    return x.clone()


def _masked_fill_tensor_value(x, y):
    x.expand(2, 4).masked_fill_(y.view(2, 4) > 0, y.sum())
    return x.clone()


def _masked_fill_expanded_input(x, y):
    x.masked_fill_(y.view(2, 4) > 0, 1.5)
    return x + 1


@pytest.mark.filterwarnings("ignore:Use of masked_fill_ on expanded tensors")
@pytest.mark.parametrize("cache", ["constant values", "symbolic values"])
@pytest.mark.parametrize("fn", [_masked_fill_expanded, _masked_fill_transposed_expand, _masked_fill_strided_expand,
                                _masked_fill_tensor_value, _masked_fill_expanded_input])
def test_masked_fill_through_an_expanded_view_matches_eager(fn, cache):
    # Eager allows masked_fill_ into an expanded tensor: an element gets the value when any of
    # the positions sharing it is masked.
    for seed in range(3):
        torch.manual_seed(seed)
        x, y = torch.randn(4), torch.randn(8)
        make = (lambda t: t.expand(2, 4)) if fn is _masked_fill_expanded_input else (lambda t: t)
        ours, theirs = x.clone(), x.clone()
        got, expected = minijit.jit(fn, cache=cache)(make(ours), y), fn(make(theirs), y)
        for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,),
                        strict=True):
            torch.testing.assert_close(g, e)
        torch.testing.assert_close(ours, theirs)


def test_write_through_view_as_real_is_refused_naming_the_view():
    # Element positions cannot follow a view that reinterprets memory: a clear refusal, not a meta error.
    def f(x):
        z = torch.complex(x, x * 2)
        torch.view_as_real(z).select(-1, 1).add_(1)
        return z * 2

    x = torch.randn(3)
    f(x)  # eager runs it
    with pytest.raises(UnsupportedOpError, match=r"view_as_real at .*reinterprets"):
        minijit.jit(f)(x)


_STORED: dict[str, torch.Tensor] = {}


def _copied_in(x):
    a = torch.zeros_like(x)
    a.copy_(x)
    return a


def _copied_twice(x):
    b = x * 2
    a = torch.empty_like(x)
    a.copy_(b)
    return a, b


def _copied_and_stored(x):
    a = torch.zeros_like(x)
    a.copy_(x)
    _STORED["a"] = a  # as torch.optim keeps a state tensor it made and filled


@pytest.mark.parametrize("fn", [_copied_in, _copied_twice, _copied_and_stored], ids=lambda f: f.__name__)
def test_a_tensor_filled_by_copy_has_its_own_memory(fn):
    """`a.copy_(x)` into a tensor the function made: eager's `a` is a tensor of its own, whose values a later write into
    `x` (or into the other result) leaves alone; the trace must not hand back x's memory for it."""
    jf = minijit.jit(fn)
    for _ in range(2):
        x = torch.randn(4)
        result = jf(x)
        results = [*(result if isinstance(result, tuple) else [result] if result is not None else []),
                   *_STORED.values()]
        kept = [r.clone() for r in results]
        x.add_(1)
        for r in results:
            r.mul_(3)
        for r, k in zip(results, kept, strict=True):
            torch.testing.assert_close(r, k * 3)
    _STORED.clear()


def _copied_in_then_viewed(x):
    a = torch.zeros_like(x)
    a.copy_(x)
    return a[:2], a.view(2, 2)


def _set_whole_then_sliced(x):
    a = torch.zeros_like(x)
    a[:] = x
    return a, a[1:]


def _copied_into_empty_then_unsqueezed(x):
    a = torch.empty(4)
    a.copy_(x)
    return a.unsqueeze(0)


@pytest.mark.parametrize("fn", [_copied_in_then_viewed, _set_whole_then_sliced, _copied_into_empty_then_unsqueezed],
                         ids=lambda f: f.__name__)
def test_views_of_a_tensor_filled_by_copy_are_views_of_its_own_memory(fn):
    """Views of a tensor the function made and filled by `copy_` (returned whole or in part): after the call, a write
    into `x` leaves them alone and a write into one result shows in the others, as in eager."""
    jf = minijit.jit(fn)
    for _ in range(2):
        x = torch.randn(4)
        x_eager = x.clone()
        got, want = jf(x), fn(x_eager)
        x.add_(1)
        x_eager.add_(1)
        got[0].mul_(3)
        want[0].mul_(3)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def _input_filled_from_another_then_sliced(a, x):
    a.copy_(x)
    return a[:2]


def test_a_view_of_an_input_filled_from_another_input_is_not_that_input_s_memory():
    """`a.copy_(x); return a[:2]` with both inputs: eager's result views `a`. The trace's value of `a` is `x` as it came
    in, so the result must not be taken as a view of `x` (a later write into `x` changed it): it is materialized,
    as a result viewing a written input is where no executor writes it in place."""
    jf = minijit.jit(_input_filled_from_another_then_sliced)
    for _ in range(2):
        a, x = torch.zeros(4), torch.randn(4)
        a_eager, x_eager = a.clone(), x.clone()
        got, want = jf(a, x), _input_filled_from_another_then_sliced(a_eager, x_eager)
        x.add_(1)
        x_eager.add_(1)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(a, a_eager, rtol=0, atol=0)
