"""In-place writes through views under each grad mode (grad, no_grad, inference_mode), compared with eager.

Each case calls one jitted function several times, switching the grad mode between
calls and making its inputs inside or outside `torch.inference_mode()`; each call
must give eager's result, leave the inputs as eager leaves them (or raise where eager
raises), and give eager's gradients where grad is on. The grad mode is in the cache
key (no_grad and inference_mode share their traces): the number of traces is asserted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import InplaceError, MinijitError


def _select_method(kc, k):
    kc[0].add_(k)
    return kc.sum(0) * 2


def _setitem(kc, k):
    kc[1] = k * 3
    return kc.sum(1)


def _out(kc, k):
    torch.mul(k, 2, out=kc[2])
    return kc + 1


def _index_copy(kc, k):
    kc[1:3].index_copy_(0, torch.tensor([1]), k[None] * 2)
    return kc.mean(0)


def _view_of_view(kc, k):
    kc[1:3][1].mul_(k + 1)
    return kc.sum()


def _slice(kc, k):
    kc[:, 1:].add_(k[1:])
    return kc * k


def _view(kc, k):
    kc.view(-1)[2:5].sub_(k)
    return kc.sum(0)


def _transpose(kc, k):
    kc.t()[1].add_(1)
    return kc.sum(0) + k


def _unsqueeze(kc, k):
    kc[3].unsqueeze(0).add_(k)
    return kc.amax(0)


def _narrow(kc, k):
    kc.narrow(1, 0, 2).mul_(k[0] + 2)
    return kc.sum(1)


def _diagonal(kc, k):
    kc[1:].diagonal().add_(k)
    return kc.sum(0)


def _copy(kc, k):
    kc[0].copy_(k)
    kc[2:].zero_()
    return kc.sum()


def _opaque_fill_diagonal(kc, k):
    kc[:3].fill_diagonal_(5.0)
    return kc.sum(0) * k


def _whole(kc, k):
    kc.add_(k)
    return kc.sum(0)


def _whole_mul(kc, k):
    kc.mul_(k)
    return kc[1:].sum(0)


def _reshape_that_copies(kc, k):
    kc.t().reshape(-1)[:3].add_(k)  # eager's reshape copies a transpose: kc keeps its values
    return kc.sum(0)


def _unbind(kc, k):
    kc.unbind(0)[2].mul_(k)
    return kc.sum(1)


def _permute(kc, k):
    kc[None].permute(0, 2, 1)[0, 1].add_(1.5)
    return kc * k


def _chunk(kc, k):
    kc.chunk(2, 1)[0].sub_(k[:2])
    return kc.sum(0)


def _as_strided(kc, k):
    kc.as_strided((2, 2), (3, 1), 1).add_(k[0])
    return kc.sum(1)


def _advanced_setitem(kc, k):
    kc[torch.tensor([0, 2])] = k * 2
    return kc.sum(0)


def _into_clone(kc, k):
    y = kc.clone()
    y[1].add_(k)
    return y.t()[0] * 2


FORMS: dict[str, Callable[..., Any]] = {f.__name__.lstrip("_"): f for f in (
    _select_method, _setitem, _out, _index_copy, _view_of_view, _slice, _view, _transpose, _unsqueeze,
    _narrow, _diagonal, _copy, _opaque_fill_diagonal, _whole, _whole_mul, _reshape_that_copies, _unbind, _permute,
    _chunk, _as_strided, _advanced_setitem, _into_clone)}

# (grad mode of the call, inputs made inside inference_mode?) per call.
SEQUENCES = {
    "inference-first": [("inference", True), ("no_grad", False), ("inference", False), ("grad", False)],
    "no_grad-first": [("no_grad", False), ("inference", True), ("no_grad", True), ("grad", False)],
    "grad-first": [("grad", False), ("inference", True), ("no_grad", False), ("grad", True), ("grad", False)],
}

_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}


def _inputs(seed: int, inside_inference: bool, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode() if inside_inference else contextlib.nullcontext():
        kc = torch.randn(4, 3, generator=gen)
    # (An inference tensor cannot require grad: k is made outside inference_mode where it does.)
    with torch.inference_mode() if inside_inference and not grad else contextlib.nullcontext():
        k = torch.randn(3, generator=gen)
    return kc, (k.requires_grad_(True) if grad else k)


def _call(fn: Callable[..., Any], mode: str, kc: torch.Tensor, k: torch.Tensor) -> tuple[Any, BaseException | None]:
    with _MODES[mode]():
        try:
            return fn(kc, k), None
        except (RuntimeError, MinijitError) as e:
            return None, e


@pytest.mark.parametrize("sequence", list(SEQUENCES))
@pytest.mark.parametrize("form", list(FORMS))
def test_inplace_through_views_matches_eager_across_grad_modes(form: str, sequence: str) -> None:
    _check_calls(FORMS[form], SEQUENCES[sequence], "constant values")


@pytest.mark.parametrize("form", list(FORMS))
def test_inplace_through_views_matches_eager_across_grad_modes_with_symbolic_values(form: str) -> None:
    _check_calls(FORMS[form], SEQUENCES["inference-first"], "symbolic values")


def _check_calls(fn: Callable[..., Any], calls: list[tuple[str, bool]], cache: str) -> None:
    jf = minijit.jit(fn, cache=cache)
    traced_for = set()  # the grad modes (in the key) of the calls that got a trace
    for seed, (mode, inside) in enumerate(calls):
        grad = mode == "grad"
        e_kc, e_k = _inputs(seed, inside, grad)
        j_kc, j_k = _inputs(seed, inside, grad)
        before = e_kc.clone()
        expected, e_err = _call(fn, mode, e_kc, e_k)
        got, j_err = _call(jf, mode, j_kc, j_k)
        what = f"call {seed} ({mode}, inputs made {'inside' if inside else 'outside'} inference_mode)"
        if e_err is not None:
            # A write into an inference tensor outside inference mode (eager raises after its first write;
            # minijit refuses before writing anything), or out= with an argument requiring grad.
            assert isinstance(j_err, MinijitError), f"{what}: eager raised {e_err!r}, jit gave {j_err!r}"
            torch.testing.assert_close(j_kc, before, msg=lambda m: f"{what}: refused, but kc was written: {m}")
            if "inference" in str(j_err):  # refused by the traced function, when called
                assert j_kc.is_inference()
                traced_for.add(grad)
            continue
        assert j_err is None, f"{what}: {j_err!r}"
        traced_for.add(grad)
        torch.testing.assert_close(got, expected, msg=lambda m: f"{what}: result differs: {m}")
        torch.testing.assert_close(j_kc.detach(), e_kc.detach(), msg=lambda m: f"{what}: kc after the call: {m}")
        torch.testing.assert_close(j_k.detach(), e_k.detach())
        assert got.requires_grad == expected.requires_grad, what
        if expected.requires_grad:
            expected.sum().backward()
            got.sum().backward()
            torch.testing.assert_close(j_k.grad, e_k.grad, msg=lambda m: f"{what}: grad of k differs: {m}")
    # One trace with grad on (k requires grad), one shared by no_grad and inference_mode.
    assert minijit.cache_info(jf).entries == len(traced_for)


def test_trace_made_under_inference_mode_is_reused_under_no_grad() -> None:
    # The first call's mode must not leak into the trace: the write through the view is kept.
    def f(kc, k):
        kc[0].add_(k)
        return kc.sum()

    jf = minijit.jit(f)
    with torch.inference_mode():
        kc = torch.zeros(2, 3)
        got = jf(kc, torch.ones(3))
    ref = torch.zeros(2, 3)
    assert got.item() == f(ref, torch.ones(3)).item()
    torch.testing.assert_close(kc, ref)
    with torch.no_grad():
        kc2, ref2 = torch.zeros(2, 3), torch.zeros(2, 3)
        torch.testing.assert_close(jf(kc2, torch.ones(3)), f(ref2, torch.ones(3)))
    torch.testing.assert_close(kc2, ref2)
    info = minijit.cache_info(jf)
    assert (info.entries, info.hits) == (1, 1)


def test_write_into_inference_tensor_outside_inference_mode_is_refused_before_any_write() -> None:
    def f(a, b):
        a.add_(1)
        b.mul_(2)
        return a + b

    jf = minijit.jit(f)
    a = torch.zeros(3)
    with torch.inference_mode():
        b = torch.ones(3)
    with torch.inference_mode():
        b_eager = torch.ones(3)
    with pytest.raises(RuntimeError, match="inference tensor"):
        f(a.clone(), b_eager)
    with pytest.raises(MinijitError, match=r"mul_ at .*b\.mul_\(2\).*inference"):
        jf(a, b)
    torch.testing.assert_close(a, torch.zeros(3))  # nothing written
    torch.testing.assert_close(b, torch.ones(3))
    with torch.inference_mode():
        a2, b2 = a.clone(), b.clone()
        torch.testing.assert_close(jf(a, b), f(a2, b2))
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(b, b2)


@pytest.mark.parametrize("op", ["fill_diagonal_", "index_fill_", "put_", "unfold"])
def test_opaque_ops_on_inference_tensors(op: str) -> None:
    def f(x):
        y = x.clone()
        if op == "fill_diagonal_":
            y.fill_diagonal_(0)
        elif op == "index_fill_":
            y.t().index_fill_(0, torch.tensor([1]), -1.0)
        elif op == "put_":
            y[1:].put_(torch.tensor([0, 2]), torch.tensor([7.0, 8.0]))
        else:
            y.view(-1).unfold(0, 3, 3)[1].mul_(x[0])
        return y * 2

    jf = minijit.jit(f)
    for mode in ("inference", "no_grad", "inference"):
        with torch.inference_mode():
            x = torch.randn(3, 3)
        with _MODES[mode]():
            torch.testing.assert_close(jf(x), f(x))


def test_code_reading_inference_mode_is_guarded_on_it() -> None:
    # no_grad and inference_mode share a cache key; a trace that kept the mode's value must not be shared.
    def f(x):
        if torch.is_inference_mode_enabled():
            return x * 2
        return x * 3

    jf = minijit.jit(f)
    x = torch.ones(2)
    for mode in ("inference", "no_grad", "inference", "grad", "no_grad"):
        with _MODES[mode]():
            torch.testing.assert_close(jf(x), f(x))
    info = minijit.cache_info(jf)
    assert (info.entries, info.hits) == (3, 2)
    assert "torch.is_inference_mode_enabled() == True" in info.miss_reasons[1]


def test_inference_mode_entered_inside_the_function_keeps_one_trace() -> None:
    def f(x):
        with torch.inference_mode():
            y = x * 2 if torch.is_inference_mode_enabled() else x
        return y + 1

    jf = minijit.jit(f)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(jf(x), f(x))
    assert minijit.cache_info(jf).entries == 1


@pytest.mark.parametrize("form", ["select_method", "view_of_view", "narrow", "diagonal", "whole_mul", "transpose"])
def test_inplace_into_a_non_leaf_input_requiring_grad(form: str) -> None:
    # The written input is part of the graph: its old value (or a view of it) saved for the
    # backward must be the value before the write, as eager's in-place op keeps it.
    fn = FORMS[form]
    jf = minijit.jit(fn)
    for seed in range(3):
        grads = []
        for f in (fn, jf):
            gen = torch.Generator().manual_seed(seed)
            leaf = torch.randn(4, 3, generator=gen, requires_grad=True)
            k = torch.randn(3, generator=gen, requires_grad=True)
            kc = leaf * 1
            out = f(kc, k)
            (out.sum() + kc.pow(2).sum()).backward()
            grads.append((out.detach(), kc.detach(), leaf.grad, k.grad))
        for got, expected in zip(grads[1], grads[0], strict=True):
            torch.testing.assert_close(got, expected)
    assert minijit.cache_info(jf).entries == 1


def _view_made_without_grad(x, k):
    with torch.no_grad():
        v = x[0]
    v.mul_(k)  # needs grad (k requires it)
    return x.sum()


def _leaf_view_made_without_grad(x, k):
    with torch.no_grad():
        v = x[1:]
    v.mul_(2)  # with grad on: x is a leaf that requires grad
    return x.sum() * k


def _view_made_in_inference_mode(x, k):
    with torch.inference_mode():
        v = x.t()
    v.add_(k[:, None])
    return x.sum(0)


@pytest.mark.parametrize("fn", [_view_made_without_grad, _leaf_view_made_without_grad, _view_made_in_inference_mode])
def test_inplace_with_grad_into_a_view_made_with_grad_off_is_refused_as_in_eager(fn) -> None:
    def inputs():
        return torch.randn(3, 3, requires_grad=fn is _leaf_view_made_without_grad), torch.randn(3, requires_grad=True)

    with pytest.raises(RuntimeError):
        fn(*inputs())
    x, k = inputs()
    before = x.detach().clone()
    with pytest.raises(InplaceError):
        minijit.jit(fn)(x, k)
    torch.testing.assert_close(x.detach(), before)
    # With grad off (and k not requiring grad) eager runs it, and so does minijit.
    with torch.no_grad():
        (x, k), (xe, ke) = inputs(), inputs()
        xe.copy_(x)
        ke.copy_(k)
        torch.testing.assert_close(minijit.jit(fn)(x, k), fn(xe, ke))
        torch.testing.assert_close(x, xe)


def _no_grad_write_into_a_view(x, k):
    with torch.no_grad():
        x[0].mul_(2)
    return x.sum() * k


def _no_grad_write_then_saved(x, k):
    with torch.no_grad():
        x.add_(1)
    return (x * k).sum(0)


def _no_grad_write_through_transpose(x, k):
    with torch.no_grad():
        x.t()[1].copy_(k)
    return (x.exp() * k).sum(1)


@pytest.mark.parametrize("leaf", [True, False])
@pytest.mark.parametrize("fn", [_no_grad_write_into_a_view, _no_grad_write_then_saved,
                                _no_grad_write_through_transpose])
def test_write_under_no_grad_inside_the_function_into_an_input_requiring_grad(fn, leaf: bool) -> None:
    # Eager lets code write under torch.no_grad() into a tensor that requires grad, leaf or not;
    # the tensor keeps its place in the graph.
    jf = minijit.jit(fn)
    for seed in range(3):
        results = []
        for f in (fn, jf):
            gen = torch.Generator().manual_seed(seed)
            source = torch.randn(3, 3, generator=gen, requires_grad=True)
            k = torch.randn(3, generator=gen, requires_grad=True)
            x = source if leaf else source * 1
            out = f(x, k)
            out.sum().backward()
            results.append((out.detach(), x.detach().clone(), source.grad, k.grad, x.is_leaf))
        for got, expected in zip(results[1], results[0], strict=True):
            if isinstance(expected, torch.Tensor):
                torch.testing.assert_close(got, expected)
            else:
                assert got == expected
    assert minijit.cache_info(jf).entries == 1


def _clamped_clone(v: torch.Tensor) -> torch.Tensor:
    v = v.clone()
    with torch.no_grad():
        v.clamp_(min=0.5)  # torch's gaussian_nll_loss does this to its variance
    return (v * v).sum()


def _scaled_view_of_clone(v: torch.Tensor) -> torch.Tensor:
    w = v * 2
    with torch.no_grad():
        w[1:].mul_(3)
    return (w.exp() * v).sum()


def _gaussian_nll(v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gaussian_nll_loss(v.detach() * 0.5 + 0.1, v.detach(), v)


@pytest.mark.parametrize("fn", [_clamped_clone, _scaled_view_of_clone, _gaussian_nll], ids=lambda f: f.__name__)
def test_in_place_under_no_grad_keeps_the_written_tensors_gradient(fn: Callable[..., Any]) -> None:
    """A tensor that requires grad, written in place under no_grad: its value changes, its history stays (eager)."""
    jf = minijit.jit(fn)
    for i in range(3):
        v = (torch.rand(5, generator=torch.Generator().manual_seed(i)) + 0.2).requires_grad_()
        want = torch.autograd.grad(fn(v), v)[0]
        got = torch.autograd.grad(jf(v), v)[0]
        torch.testing.assert_close(got, want)


def test_ops_after_a_write_under_no_grad_stay_whole_and_constant_for_grad() -> None:
    """`p.mul_(k); p.addcdiv_(e, d, value=s)` under no_grad into a parameter (torch.optim's AdamW): the second op
    reads the first's value again, and functionalize records it anew; it was run without grad, so it stays constant
    for VJP, one op (not split into prims by the grad transform), and the parameter ends as eager leaves it."""
    def step(p: torch.Tensor, e: torch.Tensor, d: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            p.mul_(0.9)
            p.addcdiv_(e, d, value=-s)
        return (p * e).sum()

    jitted = minijit.jit(step)
    for i in range(2):
        g = torch.Generator().manual_seed(i)
        e, d, s = torch.randn(6, generator=g), torch.rand(6, generator=g) + 1, torch.rand((), generator=g)
        p_eager, p_jit = (torch.randn(6, generator=torch.Generator().manual_seed(9 + i)).requires_grad_() for _ in "ab")
        want = torch.autograd.grad(step(p_eager, e, d, s), p_eager)[0]
        got = torch.autograd.grad(jitted(p_jit, e, d, s), p_jit)[0]
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(p_jit.detach(), p_eager.detach())
    forward = minijit.last_traces(jitted)[-1]
    assert [b.sym.name for b in forward.bound_symbols if b.sym.name == "addcdiv"] == ["addcdiv"]


def _copy_into_fresh(w: torch.Tensor) -> torch.Tensor:
    a = torch.zeros_like(w)
    with torch.no_grad():
        a.copy_(w)  # torch.optim.ASGD's `ax.copy_(param)` into its new state
    return a


def _setitem_into_fresh(w: torch.Tensor) -> torch.Tensor:
    a = w.new_zeros(w.shape)
    with torch.no_grad():
        a[:] = w
    return a


def _copy_of_a_written_input(w: torch.Tensor) -> torch.Tensor:
    a = torch.zeros_like(w)
    with torch.no_grad():
        w.mul_(0.5)  # ASGD: the parameter updated in place, then `ax.copy_(param)`
        a.copy_(w)
    return a


@pytest.mark.parametrize("fn", [_copy_into_fresh, _setitem_into_fresh, _copy_of_a_written_input],
                         ids=lambda f: f.__name__)
def test_value_moved_under_no_grad_leaves_its_history_behind(fn: Callable[..., Any]) -> None:
    """A value moved as it is into a tensor under no_grad (`a.copy_(w)`): `a` holds w's values and no history, as in
    eager: it does not require grad, and a gradient through it does not reach `w` (it was moved whole)."""
    jf = minijit.jit(fn)
    for i in range(2):
        w_eager, w_jit = (torch.randn(4, generator=torch.Generator().manual_seed(i)).requires_grad_() for _ in "ab")
        want, got = fn(w_eager), jf(w_jit)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad
        assert torch.autograd.grad((got * 2 + w_jit).sum(), w_jit)[0].tolist() == \
            torch.autograd.grad((want * 2 + w_eager).sum(), w_eager)[0].tolist()


def _power_iteration(w: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """nn.utils.spectral_norm's power method: `out=` ops under no_grad on values computed from `w`."""
    with torch.no_grad():
        for _ in range(2):
            u = torch.nn.functional.normalize(torch.mv(w, v), dim=0, out=u)
            v = torch.nn.functional.normalize(torch.mv(w.t(), u), dim=0, out=v)
    return (w * u[:, None] * v).sum()


def test_out_ops_under_no_grad_recorded_again_with_grad_off() -> None:
    """An op the code ran under no_grad, recorded again by functionalize (its `out=` tensor was written before) with
    arguments that require grad: recorded with grad off as captured, so its `out=` is allowed, as in eager."""
    jf = minijit.jit(_power_iteration)
    for n in (4, 6, 3):
        g = torch.Generator().manual_seed(n)
        w, u, v = torch.randn(5, n, generator=g), torch.randn(5, generator=g), torch.randn(n, generator=g)
        w_eager, w_jit = w.clone().requires_grad_(), w.clone().requires_grad_()
        u_jit, v_jit = u.clone(), v.clone()
        want, got = _power_iteration(w_eager, u, v), jf(w_jit, u_jit, v_jit)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close((u_jit, v_jit), (u, v))
        torch.testing.assert_close(torch.autograd.grad(got, w_jit)[0], torch.autograd.grad(want, w_eager)[0])
