"""Inputs that share memory, detected at call time: the same tensor twice, views, and mutation.

Inputs that overlap without being the same view and are written are rebuilt in the
trace as views of one synthetic base (their common storage); the guard checks where
each sits in that storage.
"""

import pytest
import torch

import minijit


def _write_then_read(a, b):
    a.mul_(2).add_(1)
    return (b * 3).sin()


def _run(alias):
    torch.manual_seed(0)
    x = torch.randn(4)
    return {"none": (x, torch.randn(4)), "same": (x, x)}[alias]


@pytest.mark.parametrize("order", [("none", "same", "none"), ("same", "none", "same")])
def test_same_tensor_twice_matches_eager_and_is_guarded(order):
    jf = minijit.jit(_write_then_read)
    for alias in order:
        (a, b), (ea, eb) = _run(alias), _run(alias)
        torch.testing.assert_close(jf(a, b), _write_then_read(ea, eb))
        torch.testing.assert_close(a, ea)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 1)
    assert "inputs share memory differently" in info.miss_reasons[1]


def _storage(x):
    return x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)


# Views of one 4x4 tensor t passed as (a, b); the functions below write one and read the other.
OVERLAPS = {
    "t[1:3], t[2:4]": lambda t: (t[1:3], t[2:4]),
    "t, t[1]": lambda t: (t, t[1]),
    "t.t(), t[0]": lambda t: (t.t(), t[0]),
    "t[:, ::2], t[:, 1::2]": lambda t: (t[:, ::2], t[:, 1::2]),
    "t[0], t[:, 0]": lambda t: (t[0], t[:, 0]),
    "t.view(-1)[3:11], t[1:3]": lambda t: (t.view(-1)[3:11].view(2, 4), t[1:3]),
}


def _write_a_read_b_write_b(a, b):
    before = b * 1.5
    a.mul_(2).add_(1)
    after = (b * 3).sin()
    b.sub_(0.5)
    return before, after, a.sum(), a[0]


def _write_b_in_a_view(a, b):
    a[0].zero_()
    b.add_(a.sum())
    return a + 1


@pytest.mark.parametrize("fn", [_write_then_read, _write_a_read_b_write_b, _write_b_in_a_view])
@pytest.mark.parametrize("pattern", OVERLAPS)
def test_overlapping_views_written_in_place_match_eager(pattern, fn):
    torch.manual_seed(0)
    t = torch.randn(4, 4)
    ours, theirs = t.clone(), t.clone()
    jf = minijit.jit(fn)
    got = jf(*OVERLAPS[pattern](ours))
    expected = fn(*OVERLAPS[pattern](theirs))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(_storage(ours), _storage(theirs))  # every element of the shared storage
    # The trace writes the shared storage back once (docs/design.md, invariant 1): one copy, into the base.
    final = minijit.last_traces(jf)[-1]
    copies = [b for b in final.bound_symbols if b.sym.name == "copy_to_out_"
              or any(s.sym.name == "copy_to_out_" for s in b.subsymbols)]
    assert len(copies) == 1, final


def test_synthetic_base_entry_is_guarded_by_where_inputs_sit():
    def f(a, b):
        a.add_(1)
        return b * 2

    jf = minijit.jit(f)
    calls = [lambda t: (t[0:2], t[1:3]), lambda t: (t[1:3], t[2:4]), lambda t: (t[0:2], t[0:2]),
             lambda t: (t[0:2], t[1:3]), lambda t: (t[0:2], t[2:4].clone())]
    for make in calls:
        torch.manual_seed(0)
        t = torch.randn(4, 3)
        ours, theirs = t.clone(), t.clone()
        torch.testing.assert_close(jf(*make(ours)), f(*make(theirs)))
        torch.testing.assert_close(ours, theirs)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (4, 1), info
    assert "sit differently" in info.miss_reasons[1] and "sit differently" in info.miss_reasons[2]
    assert "share memory differently" in info.miss_reasons[3]


def test_overlapping_views_that_require_grad_are_refused_clearly():
    w = torch.randn(4, requires_grad=True)
    x = w * 1  # not a leaf: eager may write into its views
    with pytest.raises(minijit.AliasError, match="requires grad"):
        minijit.jit(_write_then_read)(x[0:3], x[1:4])


def test_aliasing_does_not_matter_without_writes():
    def f(a, b):
        return a * b + 1

    jf = minijit.jit(f)
    x = torch.randn(4)
    torch.testing.assert_close(jf(x, x), f(x, x))
    torch.testing.assert_close(jf(x, x[:4]), f(x, x[:4]))
    y = torch.randn(4)
    torch.testing.assert_close(jf(x, y), f(x, y))
    assert minijit.cache_info(jf).misses == 1


def test_gradient_of_another_input_next_to_overlapping_views_matches_eager():
    def f(w, a, b):
        a.mul_(2)
        return (w * b).sum() + (w * a).sum()

    torch.manual_seed(0)
    t, w = torch.randn(4, 4), torch.randn(2, 4, requires_grad=True)
    ours, theirs, w2 = t.clone(), t.clone(), w.detach().clone().requires_grad_()
    got = minijit.jit(f)(w, ours[1:3], ours[2:4])
    expected = f(w2, theirs[1:3], theirs[2:4])
    got.backward()
    expected.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(w.grad, w2.grad)


def _symbolic_calls():
    """(inputs made from a storage t) for calls at several sizes: overlapping, identical, distinct, repeating."""
    for n in (6, 8, 8, 10):
        yield n, lambda t, n=n: (t[0:n - 2], t[2:n])
        yield n, lambda t, n=n: (t[0:n], t[0:n])
        yield n, lambda t, n=n: (t[0:n], t[n:2 * n])
        yield n, lambda t, n=n: (t[0:n].view(2, n // 2).t()[0], t[0:n // 2])
        yield n, lambda t, n=n: (t[0:n], t[1:2].expand(n))


def test_overlapping_views_with_symbolic_sizes_match_eager():
    # Written inputs that share memory are rebuilt from their storage at their concrete sizes:
    # the symbolic entry is traced with those sizes constant, and every other size or aliasing misses.
    def f(a, b):
        a.mul_(2)
        return a * 3 + b.sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n, make in _symbolic_calls():
        torch.manual_seed(n)
        t = torch.randn(2 * n)
        ours, theirs = t.clone(), t.clone()
        torch.testing.assert_close(jf(*make(ours)), f(*make(theirs)))
        torch.testing.assert_close(ours, theirs)
    info = minijit.cache_info(jf)
    assert info.hits >= 5, info  # the repeated size reuses its entries


def test_distinct_inputs_stay_symbolic_after_an_aliased_call():
    def f(a, b):
        a.add_(b)
        return a

    jf = minijit.jit(f, cache="symbolic values")
    t = torch.randn(8)
    jf(t[0:4], t[0:4])
    for n in (5, 7, 9):
        a, b = torch.randn(n), torch.randn(n)
        expected = a + b
        torch.testing.assert_close(jf(a, b), expected)
    assert minijit.cache_info(jf).misses == 2  # the aliased call's entry, then one symbolic entry for all sizes


def test_written_input_that_repeats_elements_matches_eager_and_is_guarded():
    def f(a, b):
        a.zero_()
        return a + b

    jf = minijit.jit(f)
    for make in (lambda o: o.expand(4, 4), lambda o: o.expand(4, 4).clone(), lambda o: o.expand(4, 4)):
        torch.manual_seed(0)
        o, b = torch.randn(4), torch.randn(4, 4)
        ours, theirs = o.clone(), o.clone()
        torch.testing.assert_close(jf(make(ours), b), f(make(theirs), b))
        torch.testing.assert_close(ours, theirs)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 1), info


# An expanded tensor passed twice (or two identical expands of one tensor) and written, as eager allows:
# found by a held-out fuzzer, where the copy back into the expanded input crashed.
def _zero_a_read_b(a, b):
    a.zero_()
    return b.clone()


def _diagonal_of_a_read_b(a, b):
    a.diagonal().div_(2.0)
    return b * 1


@pytest.mark.parametrize("fn", [_zero_a_read_b, _diagonal_of_a_read_b])
@pytest.mark.parametrize("pattern", ["same expand twice", "two expands of s", "expand of s, s"])
def test_written_expanded_input_that_another_input_aliases_matches_eager(pattern, fn):
    def inputs(s):
        if pattern == "same expand twice":
            e = s.expand(3, 4)
            return e, e
        return (s.expand(3, 4), s.expand(3, 4)) if pattern == "two expands of s" else (s.expand(3, 4), s)

    ours, theirs = torch.arange(4.0), torch.arange(4.0)
    got = minijit.jit(fn)(*inputs(ours))
    expected = fn(*inputs(theirs))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("cache", ["constant values", "symbolic values", "automatic"])
def test_a_trace_for_a_plain_written_input_is_not_reused_for_one_repeating_its_elements(cache):
    # Traced for a contiguous `a` (copied back into), then called with an expanded one (rebuilt from a synthetic
    # base): the guard tells them apart, where the copy back into the expanded tensor crashed.
    def f(a, b):
        a.zero_()
        return a + b

    jf = minijit.jit(f, cache=cache)
    for make in (lambda o: o.expand(4, 4).clone(), lambda o: o.expand(4, 4), lambda o: o.expand(4, 4).clone()):
        o, b = torch.randn(4), torch.randn(4, 4)
        ours, theirs = o.clone(), o.clone()
        torch.testing.assert_close(jf(make(ours), b), f(make(theirs), b))
        torch.testing.assert_close(ours, theirs)


def test_inputs_lying_apart_in_one_storage_are_independent_and_guarded_by_where_they_sit():
    # Views of one storage whose bytes lie apart are separate memories (no synthetic base, which leaves requiring
    # grad could not have); the entry serves only calls where they sit as they did: views sitting elsewhere miss,
    # and views that overlap are refused as before.
    def f(a, b):
        with torch.no_grad():
            a.add_(1)
            b.mul_(a.sum())
        return b * 2

    def leaves(t, make):
        return [torch.nn.Parameter(v) for v in make(t)]

    jf = minijit.jit(f)
    calls = [lambda t: (t[0:2], t[2:4]), lambda t: (t[0:2], t[2:4]), lambda t: (t[2:4], t[0:2]),
             lambda t: (t[3], t[0]), lambda t: (t[0:2], t[2:4])]
    for make in calls:
        torch.manual_seed(0)
        t = torch.randn(4, 3)
        ours, theirs = t.clone(), t.clone()
        torch.testing.assert_close(jf(*leaves(ours, make)), f(*leaves(theirs, make)))
        torch.testing.assert_close(ours, theirs)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (3, 2), info
    with pytest.raises(minijit.AliasError, match="requires grad"):
        jf(*leaves(torch.randn(4, 3), lambda t: (t[0:2], t[1:3])))


@pytest.mark.parametrize("foreach", [False, True])
def test_parameters_viewing_one_flat_buffer_step_as_eager(foreach):
    # The FSDP-like layout: parameters viewing one flat buffer, their gradients one flat gradient buffer.
    shapes = [(3, 4), (5,), (2, 2, 2), (1,)]

    def make():
        torch.manual_seed(0)
        flat, flat_grad = torch.randn(sum(torch.Size(s).numel() for s in shapes)), torch.randn(26)
        params, at = [], 0
        for s in shapes:
            n = torch.Size(s).numel()
            params.append(torch.nn.Parameter(flat[at:at + n].view(s)))
            params[-1].grad = flat_grad[at:at + n].view(s)
            at += n
        return flat, flat_grad, params, torch.optim.AdamW(params, lr=0.1, weight_decay=0.1, foreach=foreach)

    ours, theirs = make(), make()
    step = minijit.jit(ours[3].step)
    for _ in range(3):
        step()
        theirs[3].step()
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
        for a, b in zip(ours[2], theirs[2], strict=True):
            for key, value in theirs[3].state[b].items():
                assert torch.equal(ours[3].state[a][key], value), key


def test_views_of_one_storage_some_apart_some_overlapping_match_eager():
    # Two overlapping pairs and views lying apart, in one storage: one synthetic base for all of them (a base spans
    # the storage from its start, so two would write over each other's bytes).
    def f(vs, ws):
        for t in vs:
            t.mul_(1.5).add_(0.25)
        return [w.sqrt() for w in ws]

    def make(x):
        return [x[i:i + 8] for i in range(0, 40, 8)], [x[0:8], x[36:40]]

    jf = minijit.jit(f)
    for _ in range(2):
        x = torch.rand(40) + 0.5
        ours = x.clone()
        for g, w in zip(jf(*make(ours)), f(*make(x)), strict=True):
            assert torch.equal(g, w)
        assert torch.equal(ours, x)


def test_views_lying_apart_read_past_their_bytes_by_as_strided_match_eager():
    # `as_strided` on one view reaches the other's bytes: they stay one synthetic base, not independent inputs.
    def f(a, b):
        b.mul_(2)
        a.as_strided((8,), (1,), 0).add_(1)
        b.mul_(2)
        return a * 1, b * 1

    for _ in range(2):
        x = torch.arange(8.0)
        ours = x.clone()
        for g, w in zip(minijit.jit(f)(ours[0:4], ours[4:8]), f(x[0:4], x[4:8]), strict=True):
            assert torch.equal(g, w)
        assert torch.equal(ours, x)


def test_is_between_inputs_that_are_one_tensor_object_matches_eager_and_is_guarded():
    # The same tensor passed twice is two trace inputs: `is` answers as eager does, and a call where the answer
    # changes misses.
    def f(ts, c):
        out = []
        for t in ts:
            out.append(t * 3 if t is c else t + c)
            c.add_(1)  # written: `c` and an element that is `c` are one memory, as in eager
        return out

    jf = minijit.jit(f)
    y, z = torch.rand(3), torch.rand(3)
    for args in ((lambda: ([y, z], z)), (lambda: ([y, z], y)), (lambda: ([y, y], y)), (lambda: ([y, z], z))):
        (ts, c), (ts2, c2) = args(), args()
        saved = {id(t): t.clone() for t in (y, z)}
        want = f(ts, c)
        after = {i: t.clone() for i, t in ((id(y), y), (id(z), z))}
        for t in (y, z):
            t.copy_(saved[id(t)])
        for g, w in zip(jf(ts2, c2), want, strict=True):
            assert torch.equal(g, w)
        assert torch.equal(y, after[id(y)]) and torch.equal(z, after[id(z)])
    info = minijit.cache_info(jf)
    assert info.hits == 1, info


def test_the_same_view_twice_among_views_lying_apart_matches_eager():
    # Parameters viewing one buffer, one of them passed twice: one memory for the two, the others independent.
    def f(ps):
        with torch.no_grad():
            for p in ps:
                p.mul_(2).add_(1)
        return [p * 1 for p in ps]

    for _ in range(2):
        flat = torch.rand(12)
        ours = flat.clone()
        mine = [torch.nn.Parameter(ours[i:i + 4]) for i in (0, 4, 8)]
        theirs = [torch.nn.Parameter(flat[i:i + 4]) for i in (0, 4, 8)]
        for g, w in zip(minijit.jit(f)([*mine, mine[1]]), f([*theirs, theirs[1]]), strict=True):
            assert torch.equal(g, w)
        assert torch.equal(ours, flat)
