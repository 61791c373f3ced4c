"""In-place and `out=` ops whose operand overlaps the tensor they write: refused as eager refuses, else as eager.

Each case runs eagerly and under jit on copies of one storage; either both raise (jit
with InplaceError) or both return equal values and leave equal storages. Where eager does
not check (a strided or expanded operand sharing elements with the written tensor) its
result depends on the order its kernel visits the elements: jit refuses those.
"""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import InplaceError
from minijit.transforms import overlap


def _storage(x: torch.Tensor) -> torch.Tensor:
    return x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)


def _compare(fn, make, **jit_kwargs):
    """Run `fn` eagerly and jitted on `make()` twice: both raise, or equal results and storages. Returns 'raised' or 'ok'."""
    eager_args, jit_args = make(), make()
    try:
        expected = fn(*eager_args)
    except RuntimeError:
        with pytest.raises(InplaceError, match=r"clone\(\)"):
            minijit.jit(fn, **jit_kwargs)(*jit_args)
        return "raised"
    got = minijit.jit(fn, **jit_kwargs)(*jit_args)
    torch.testing.assert_close(got, expected)
    for e, j in zip(eager_args, jit_args, strict=True):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(_storage(j), _storage(e))
    return "ok"


def _arange(n):
    return lambda: (torch.arange(float(n)),)


def _setitem_overlapping(u):
    u[0:4] = u[2:6]
    return u


def _setitem_disjoint(u):
    u[0:4] = u[6:10]
    return u


def _setitem_one_element(u):
    u[0:2] = u[1:2]  # broadcast first: eager copies from an expanded value, element 1 onto itself
    return u


def _setitem_scalar_tensor(u):
    u[0:2] = u[1]
    return u


def _setitem_index_put(u):
    u[torch.tensor([0, 1])] = u[6:8]  # index_put_ refuses any overlap with the tensor it writes
    return u


def _intermediate(x, lo):
    y = x * 2
    y[0:4].add_(y[lo:lo + 4])
    return y


IDX = torch.tensor([0, 1])
PERM = torch.arange(9, -1, -1)

# (function, inputs): eager raises "some elements of the input tensor and the written-to tensor refer to
# a single memory location" on the first group, and computes the second.
CASES = {
    "slices add_": (lambda u: u[0:4].add_(u[2:6]), _arange(10)),
    "unsqueeze": (lambda x: x.unsqueeze(0).add_(x), _arange(10)),
    "transpose": (lambda u: u.view(4, 4).add_(u.view(4, 4).t()), _arange(16)),
    "copy_": (lambda u: u[0:4].copy_(u[2:6]), _arange(10)),
    "index_copy_": (lambda u: u[0:4].index_copy_(0, IDX, u[2:4]), _arange(10)),
    "index_copy_ from itself": (lambda u: u.index_copy_(0, PERM, u), _arange(10)),
    "addcmul_": (lambda u: u[0:4].addcmul_(u[2:6], u[1:5]), _arange(10)),
    "lerp_": (lambda u: u[0:4].lerp_(u[2:6], 0.5), _arange(10)),
    "add out=": (lambda u: torch.add(u[2:6], 1, out=u[0:4]), _arange(10)),
    "frac out= (opaque)": (lambda u: torch.frac(u[2:6], out=u[0:4]), _arange(10)),
    "cat out=": (lambda u: torch.cat([u[2:4], u[6:8]], out=u[0:4]), _arange(10)),
    "int32 views": (lambda u: u[0:4].view(torch.int32).add_(u[2:6].view(torch.int32)), _arange(10)),
    "0-d operand": (lambda u: u.add_(u[3]), _arange(10)),
    "setitem": (_setitem_overlapping, _arange(10)),
    "setitem index_put": (_setitem_index_put, _arange(10)),
    "intermediate": (lambda x: _intermediate(x, 2), _arange(10)),
    # eager computes these
    "disjoint slices": (lambda u: u[0:4].add_(u[6:10]), _arange(10)),
    "interleaved halves": (lambda t: t.view(4, 10)[:, ::2].add_(t.view(4, 10)[:, 1::2]), _arange(40)),
    "mul_ by itself": (lambda a: a.mul_(a), _arange(10)),
    "identical views": (lambda a: a[1:5].mul_(a[1:5]), _arange(10)),
    "identical strided views": (lambda a: a[::2].mul_(a[::2]), _arange(10)),
    "diagonal and row meet at one position": (lambda x: x.view(4, 4).diagonal().add_(x[0:4]), _arange(16)),
    "fill_ with its own element": (lambda u: u.fill_(u[3]), _arange(10)),
    "masked_fill_ with its own element": (lambda u: u.masked_fill_(u > 3, u[3]), _arange(10)),
    "add out= the operand itself": (lambda x, y: torch.add(x, y, out=y), lambda: (torch.arange(4.0), torch.ones(4))),
    "cat out= disjoint": (lambda u: torch.cat([u[4:6], u[6:8]], out=u[0:4]), _arange(10)),
    "reshape that copies": (lambda x: x.view(4, 4).view(-1)[0:8].add_(x.view(4, 4).t().reshape(-1)[4:12]),
                            _arange(16)),
    "setitem disjoint": (_setitem_disjoint, _arange(10)),
    "setitem one element": (_setitem_one_element, _arange(10)),
    "setitem 0-d value": (_setitem_scalar_tensor, _arange(10)),
    "intermediate disjoint": (lambda x: _intermediate(x, 5), _arange(10)),
}
RAISING = {"slices add_", "unsqueeze", "transpose", "copy_", "index_copy_", "index_copy_ from itself", "addcmul_",
           "lerp_", "add out=", "frac out= (opaque)", "cat out=", "int32 views", "0-d operand", "setitem",
           "setitem index_put", "intermediate"}


@pytest.mark.parametrize("name", list(CASES))
def test_overlap_as_eager(name):
    fn, make = CASES[name]
    assert _compare(fn, make) == ("raised" if name in RAISING else "ok")


def _views(make_views):
    def make():
        base = torch.arange(40.0)
        return (*make_views(base), base)
    return make


def _add_(a, b, base):
    a.add_(b)
    return a * 1


# The same as two inputs of the jitted function, views of one storage (rebuilt from a synthetic base).
INPUT_CASES = {
    "t[0:4], t[2:6]": (lambda t: (t[0:4], t[2:6]), "raised"),
    "t, t.t()": (lambda t: (t[:16].view(4, 4), t[:16].view(4, 4).t()), "raised"),
    "t[0:4], t[5:9]": (lambda t: (t[0:4], t[5:9]), "ok"),
    "t[:, ::2], t[:, 1::2]": (lambda t: (t.view(4, 10)[:, ::2], t.view(4, 10)[:, 1::2]), "ok"),
    "t, t": (lambda t: (t, t), "ok"),
    "t[1], t[0]": (lambda t: (t.view(4, 10)[1], t.view(4, 10)[0]), "ok"),
}


@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_overlapping_inputs_as_eager(name):
    make_views, expected = INPUT_CASES[name]
    assert _compare(_add_, _views(make_views)) == expected


def _strided_chain(u):
    v = u[::2]
    v[1:6].add_(v[0:5])  # eager chains the values through memory, in the order its kernel visits them
    return u


def _expanded_operand(u):
    u[0:4].add_(u[1:2].expand(4))
    return u


def _setitem_strided(u):
    u[::2][1:4] = u[::2][0:3]
    return u


ORDER_DEPENDENT = {
    "strided slices": (_strided_chain, _arange(40)),
    "expanded operand": (_expanded_operand, _arange(10)),
    "setitem strided": (_setitem_strided, _arange(10)),
    "strided inputs": (_add_, _views(lambda t: (t[::2][1:6], t[::2][0:5]))),
}


@pytest.mark.parametrize("name", list(ORDER_DEPENDENT))
def test_order_dependent_overlap_refused(name):
    fn, make = ORDER_DEPENDENT[name]
    fn(*make())  # eager does not check: it returns a result that depends on its kernel's order
    with pytest.raises(InplaceError, match=r"test_inplace_overlap.py:\d+.*order the kernel visits.*clone\(\)"):
        minijit.jit(fn)(*make())


def test_error_names_op_tensors_and_line():
    def f(u):
        u[0:4].add_(u[2:6])
        return u

    with pytest.raises(InplaceError) as info:
        minijit.jit(f)(torch.arange(10.0))
    message = str(info.value)
    assert message.startswith("ltorch.add_ at ")
    assert f"test_inplace_overlap.py:{f.__code__.co_firstlineno + 1} (u[0:4].add_(u[2:6]))" in message
    assert "the operand t2 (a view of u) and the written-to tensor t1 (a view of u)" in message
    assert "clone() t2" in message


def _ends_overlap(u):
    # narrow and select, not indexing: no other decision of the compile looks at the layout.
    u.narrow(0, 0, 4).add_(u.narrow(0, u.shape[0] - 4, 4))
    return u


def test_symbolic_sizes_decision_is_pinned_to_the_sizes():
    jf = minijit.jit(_ends_overlap, cache="symbolic values")
    torch.testing.assert_close(jf(torch.arange(10.0)), _ends_overlap(torch.arange(10.0)))
    with pytest.raises(RuntimeError):
        _ends_overlap(torch.arange(6.0))
    with pytest.raises(InplaceError):
        jf(torch.arange(6.0))  # the ends overlap at this size: a new compile, which refuses
    torch.testing.assert_close(jf(torch.arange(12.0)), _ends_overlap(torch.arange(12.0)))


def _column_into_column(a):
    a.select(1, 0).add_(a.select(1, 1))
    return a


def test_decision_is_pinned_to_the_strides():
    jf = minijit.jit(_column_into_column)
    a, ea = torch.arange(8.0).view(4, 2), torch.arange(8.0).view(4, 2)
    torch.testing.assert_close(jf(a), _column_into_column(ea))
    # The same shape with strides (1, 1): the columns overlap, eager refuses; the entry must not be reused.
    with pytest.raises(RuntimeError):
        _column_into_column(torch.arange(5.0).as_strided((4, 2), (1, 1)))
    with pytest.raises(InplaceError):
        jf(torch.arange(5.0).as_strided((4, 2), (1, 1)))
    assert minijit.cache_info(jf).misses == 2


@pytest.mark.parametrize("lo", [2, 5])
def test_with_grad(lo):
    """An input requiring grad flows into the op: refused where eager refuses, else equal values and gradients."""
    x = torch.randn(10, requires_grad=True)
    xj = x.detach().clone().requires_grad_(True)
    jf = minijit.jit(_intermediate)
    if lo == 2:
        with pytest.raises(RuntimeError):
            _intermediate(x, lo)
        with pytest.raises(InplaceError):
            jf(xj, lo)
        return
    expected, got = _intermediate(x, lo), jf(xj, lo)
    torch.testing.assert_close(got, expected)
    w = torch.linspace(0.5, 2.0, 10)
    (expected * w).sum().backward()
    (got * w).sum().backward()
    torch.testing.assert_close(xj.grad, x.grad)


@pytest.mark.parametrize("name", ["interleaved halves", "identical strided views"])
def test_one_layout_at_two_offsets_needs_no_enumeration(name, monkeypatch):
    """Large strided tensors of one layout (`t[:, ::2]`, `t[:, 1::2]`) are decided without listing their elements."""
    monkeypatch.setattr(overlap, "EXACT_LIMIT", 4)
    fn, make = CASES[name]
    assert _compare(fn, make) == "ok"
    fn, make = ORDER_DEPENDENT["strided slices"]
    with pytest.raises(InplaceError, match="order the kernel visits"):
        minijit.jit(fn)(*make())


_OUTSIDE: list[torch.Tensor] = []


def _out_into_outside():
    torch.add(_OUTSIDE[0], 1.25, out=_OUTSIDE[1])
    return _OUTSIDE[1] * 2


@pytest.mark.parametrize("lo", [4, 8])
def test_out_into_a_tensor_from_outside_overlapping_its_operand_as_eager(lo):
    # The tensors come from a global list (captured as themselves, not as arguments): the out= tensor is still
    # checked against the op's operand, as eager's kernel checks it.
    b = torch.arange(16.0)
    _OUTSIDE[:] = [b[0:8], b[lo:lo + 8]]
    try:
        want, eager_error = _out_into_outside(), None
    except RuntimeError as e:
        want, eager_error = None, e
    mine = torch.arange(16.0)
    _OUTSIDE[:] = [mine[0:8], mine[lo:lo + 8]]
    if eager_error is not None:
        with pytest.raises(InplaceError, match="share memory"):
            minijit.jit(_out_into_outside)()
    else:
        assert torch.equal(minijit.jit(_out_into_outside)(), want)
        assert torch.equal(mine, b)
