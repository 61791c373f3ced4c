"""minijit.jit under autograd: ltorch rules, training, dtypes, constant symbols, multi-output symbols."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minijit
from minijit.extend import FusionExecutor
from minijit.ir import TensorProxy, Trace, tracing
from minijit.ops import ltorch, prims
from minijit.transforms.grad import is_constant_for_vjp, split_forward_backward

F64 = torch.float64


def _final_source(traces: list[Trace]) -> str:
    """The executed trace's code, without the comment lines that quote the user's source."""
    lines = traces[-1].python(subsymbol_depth=0).splitlines()
    return "\n".join(line for line in lines if not line.strip().startswith("#"))


def _compare_grads(jfn, efn, args, atol=1e-10, rtol=1e-8):
    """Outputs and gradients (for a random cotangent) of jit(jfn) and eager efn on `args`."""
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    got = minijit.jit(jfn)(*args)
    want = efn(*args)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    ct = torch.randn_like(want)
    g_got = torch.autograd.grad(got, inputs, ct, allow_unused=True)
    g_want = torch.autograd.grad(want, inputs, ct, allow_unused=True)
    for i, (a, b) in enumerate(zip(g_got, g_want)):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m, i=i: f"grad {i}: {m}")


def _params(*shapes, dtype=F64, requires_grad=True):
    return [torch.randn(*s, dtype=dtype, requires_grad=requires_grad) for s in shapes]


# -- ltorch ops with direct rules ----------------------------------------------------------------

@pytest.mark.parametrize("x_shape", [(5,), (4, 5), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_grad(x_shape, bias):
    torch.manual_seed(0)
    x, w, b = _params(x_shape, (3, 5), (3,))
    args = (x, w, b) if bias else (x, w)
    _compare_grads(lambda *a: ltorch.linear(*a), lambda *a: F.linear(*a), args)


def test_linear_stays_one_symbol_in_forward():
    x, w, b = _params((4, 5), (3, 5), (3,))
    jf = minijit.jit(lambda x, w, b: ltorch.linear(x, w, b))
    jf(x, w, b).sum().backward()
    fwd = _final_source(minijit.last_traces(jf))
    assert "torchex.linear(x, w, b)" in fwd
    assert fwd.count("torchex.") == 1, fwd
    bwd = _final_source(minijit.last_backward_traces(jf))
    assert "matmul" in bwd


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((2, 3, 4), (2, 4, 2))])
def test_matmul_grad(a_shape, b_shape):
    torch.manual_seed(0)
    a, b = _params(a_shape, b_shape)
    _compare_grads(lambda a, b: ltorch.matmul(a, b), torch.matmul, (a, b))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad(approximate):
    (x,) = _params((4, 6))
    _compare_grads(lambda x: ltorch.gelu(x, approximate=approximate), lambda x: F.gelu(x, approximate=approximate), (x,))


def test_gelu_grad_float32():
    (x,) = _params((4, 6), dtype=torch.float32)
    _compare_grads(lambda x: ltorch.gelu(x), F.gelu, (x,), atol=1e-5, rtol=1e-5)


def test_decomposition_used_without_rule():
    # ltorch.addcmul has no rule: its decomposition (mul, add) is differentiated.
    a, b, c = _params((3, 4), (3, 4), (4,))
    _compare_grads(lambda a, b, c: ltorch.addcmul(a, b, c, value=0.5),
                   lambda a, b, c: torch.addcmul(a, b, c, value=0.5), (a, b, c))


def test_broadcasting_and_promotion_grads():
    a = torch.randn(3, 1, dtype=F64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float32, requires_grad=True)
    _compare_grads(lambda a, b: (a * b + a / 2).tanh(), lambda a, b: (a * b + a / 2).tanh(), (a, b))


# -- training -----------------------------------------------------------------------------------

def _mlp(x, w1, b1, w2, b2, target):
    h = ltorch.linear(x, w1, b1).tanh()
    y = ltorch.linear(h, w2, b2)
    d = y - target
    return (d * d).sum() / d.numel()


def _mlp_eager(x, w1, b1, w2, b2, target):
    h = F.linear(x, w1, b1).tanh()
    return F.mse_loss(F.linear(h, w2, b2), target)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_two_layer_mlp_trains_like_eager(dtype):
    torch.manual_seed(0)
    tol = dict(atol=1e-10, rtol=1e-8) if dtype == F64 else dict(atol=1e-5, rtol=1e-4)
    params = [torch.randn(16, 8, dtype=dtype) * 0.3, torch.zeros(16, dtype=dtype),
              torch.randn(4, 16, dtype=dtype) * 0.3, torch.zeros(4, dtype=dtype)]
    jit_params = [p.clone().requires_grad_() for p in params]
    eager_params = [p.clone().requires_grad_() for p in params]
    jf = minijit.jit(_mlp)
    for _ in range(4):
        x, target = torch.randn(32, 8, dtype=dtype), torch.randn(32, 4, dtype=dtype)
        loss_j = jf(x, *jit_params, target)
        loss_e = _mlp_eager(x, *eager_params, target)
        torch.testing.assert_close(loss_j, loss_e, **tol)
        loss_j.backward()
        loss_e.backward()
        with torch.no_grad():
            for pj, pe in zip(jit_params, eager_params):
                torch.testing.assert_close(pj.grad, pe.grad, **tol)
                pj -= 0.1 * pj.grad
                pe -= 0.1 * pe.grad
                pj.grad = pe.grad = None
    assert minijit.cache_info(jf).misses == 1


# -- dtypes -------------------------------------------------------------------------------------

def test_bf16_linear_backward_has_no_float32():
    torch.manual_seed(0)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    w = torch.randn(4, 16, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4, dtype=torch.bfloat16, requires_grad=True)
    jf = minijit.jit(lambda x, w, b: ltorch.linear(x, w, b))
    out = jf(x, w, b)
    ct = torch.randn_like(out)
    gw, gb = torch.autograd.grad(out, (w, b), ct)
    bwd = _final_source(minijit.last_backward_traces(jf))
    assert "float32" not in bwd and "f32" not in bwd, bwd
    assert "convert_element_type" not in bwd, bwd
    assert gw.dtype == torch.bfloat16 and gb.dtype == torch.bfloat16
    ew, eb = torch.autograd.grad(F.linear(x, w, b), (w, b), ct)
    torch.testing.assert_close(gw, ew, atol=0.1, rtol=0.02)
    torch.testing.assert_close(gb, eb, atol=0.1, rtol=0.02)


def test_user_cast_round_trip_is_removed_in_both_traces():
    x = torch.randn(4, 3, dtype=torch.bfloat16, requires_grad=True)

    def f(x):
        y = prims.convert_element_type(prims.convert_element_type(x, torch.float32), torch.bfloat16)
        return y * x

    jf = minijit.jit(f)
    out = jf(x)
    ct = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, (x,), ct)
    (want,) = torch.autograd.grad(x.float().bfloat16() * x, (x,), ct)
    torch.testing.assert_close(g, want)
    assert g.dtype == torch.bfloat16
    assert "convert_element_type" not in _final_source(minijit.last_traces(jf))
    assert "convert_element_type" not in _final_source(minijit.last_backward_traces(jf))


def test_gradient_keeps_input_dtype_across_user_cast():
    x = torch.randn(5, dtype=torch.float32, requires_grad=True)
    _compare_grads(lambda x: prims.convert_element_type(x, F64).exp(), lambda x: x.to(F64).exp(), (x,), atol=1e-6, rtol=1e-6)


# -- constant for VJP -----------------------------------------------------------------------------

def test_is_constant_for_vjp_unit():
    t = Trace()
    with tracing(t):
        x = t.add_input(TensorProxy((3, 4), F64, torch.device("cpu"), requires_grad=True), "x")
        y = t.add_input(TensorProxy((3, 4), F64, torch.device("cpu")), "y")
        prims.shape(x)
        prims.argmax(x, 1)
        prims.lt(x, y)
        prims.mul(y, y)
        prims.mul(x, y)
    requires = {"x"}
    shape, argmax, lt, yy, xy = t.bound_symbols
    assert is_constant_for_vjp(shape, requires)  # ints out
    assert is_constant_for_vjp(argmax, requires)  # int64 out
    assert is_constant_for_vjp(lt, requires)  # bool out
    assert is_constant_for_vjp(yy, requires)  # no input requires grad
    assert not is_constant_for_vjp(xy, requires)


def test_constant_symbols_stay_in_forward_and_add_nothing_to_backward():
    def f(x, y):
        idx = prims.argmax(x, 1)
        scale = prims.exp(y)  # y does not require grad: constant
        return (x * scale).sum(), idx

    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    y = torch.randn(3, 4, dtype=F64)
    jf = minijit.jit(f)
    loss, idx = jf(x, y)
    assert torch.equal(idx, torch.argmax(x, 1)) and not idx.requires_grad
    loss.backward()
    torch.testing.assert_close(x.grad, torch.exp(y))
    fwd = _final_source(minijit.last_traces(jf))
    bwd = _final_source(minijit.last_backward_traces(jf))
    assert "argmax" in fwd and "exp" in fwd
    assert "argmax" not in bwd and "exp" not in bwd


def test_shape_prim_is_constant_and_kept():
    def f(x, y):
        n, m = prims.shape(x)
        return prims.mul(x, prims.broadcast_in_dim(y, (n, m), (1,)))

    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    y = torch.randn(4, dtype=F64, requires_grad=True)
    _compare_grads(f, lambda x, y: x * y, (x, y))


# -- multi-output symbols ---------------------------------------------------------------------------

@pytest.mark.parametrize("use", ["var", "mean", "both"])
def test_var_mean_under_grad(use):
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)

    def pick(var, mean):
        return {"var": var * 2, "mean": mean.exp(), "both": var * mean}[use]

    def f(x):
        var, mean = prims.var_mean(x, (1,), 1)
        return pick(var, mean)

    _compare_grads(f, lambda x: pick(*torch.var_mean(x, 1, correction=1)), (x,))


def test_var_mean_residuals_are_per_symbol():
    # Two var_mean calls whose first outputs are both unused: each keeps its own residuals.
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)

    def f(x):
        _, m1 = prims.var_mean(x, (1,), 0)
        v2, _ = prims.var_mean(x, (0,), 1)
        return m1.sum() * v2.sum()

    def e(x):
        _, m1 = torch.var_mean(x, 1, correction=0)
        v2, _ = torch.var_mean(x, 0, correction=1)
        return m1.sum() * v2.sum()

    _compare_grads(f, e, (x,))


# -- autograd integration ---------------------------------------------------------------------------

def test_autograd_grad_works():
    x, w = _params((3, 4), (4, 2))
    out = minijit.jit(lambda x, w: (x @ w).sin().sum())(x, w)
    gx, gw = torch.autograd.grad(out, (x, w))
    want = torch.autograd.grad((x @ w).sin().sum(), (x, w))
    torch.testing.assert_close((gx, gw), want)


def test_no_input_requiring_grad_takes_plain_path():
    x = torch.randn(3, dtype=F64)
    jf = minijit.jit(lambda x: x.exp())
    out = jf(x)
    assert minijit.last_backward_traces(jf) == []
    assert out.grad_fn is None
    assert not any("split" in t.pass_name for t in minijit.last_traces(jf))


def test_no_grad_mode_takes_plain_path_and_is_a_separate_cache_entry():
    x = torch.randn(3, dtype=F64, requires_grad=True)
    jf = minijit.jit(lambda x: x.exp())
    with torch.no_grad():
        out = jf(x)
    assert out.grad_fn is None and minijit.last_backward_traces(jf) == []
    out = jf(x)
    assert out.grad_fn is not None and minijit.last_backward_traces(jf)
    assert minijit.cache_info(jf).misses == 2


def test_only_needed_residuals_are_saved():
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    jf = minijit.jit(lambda x: x.exp().sin().sum())
    jf(x).backward()
    fwd_trace, bwd_trace = minijit.last_traces(jf)[-1], minijit.last_backward_traces(jf)[-1]
    saved = fwd_trace.output[1]
    # exp saves its output, sin its input (the same tensor); x itself is not needed.
    assert len(saved) == 1
    assert [p.name for p in bwd_trace.args][:1] == [saved[0].name]
    torch.testing.assert_close(x.grad, (x.exp().cos() * x.exp()).detach())


def test_split_returns_one_gradient_per_input():
    t = Trace()
    with tracing(t):
        x = t.add_input(TensorProxy((3,), F64, torch.device("cpu"), requires_grad=True), "x")
        y = t.add_input(TensorProxy((3,), F64, torch.device("cpu")), "y")
        t.output = prims.mul(x, y)
    fwd, bwd, _ = split_forward_backward(t)
    assert len(bwd.output) == 2 and bwd.output[1] is None
    assert fwd.output[0] is t.output


def test_split_makes_computed_saved_values_hidden_outputs_with_their_own_backward():
    cpu = torch.device("cpu")
    t = Trace()
    with tracing(t):
        x = t.add_input(TensorProxy((3, 4), F64, cpu, requires_grad=True), "x")
        w = t.add_input(TensorProxy((4, 2), F64, cpu, requires_grad=True), "w")
        e = prims.exp(x)
        t.output = prims.matmul(e, w)
    fwd, _, split = split_forward_backward(t)
    saved = fwd.output[1]
    # exp's result (read by the matmul's backward and exp's own) and w are saved, x is not: the double backward
    # differentiates exp's result through the node (a hidden output), with a backward taking its cotangent.
    assert sorted(p.name for p in saved) == sorted([e.name, "w"])
    assert [saved[i].name for i in split.hidden_saved] == [e.name]
    assert split.saved_inputs_with_history == ((next(i for i, p in enumerate(saved) if p.name == "w"), 1),)
    second = split.second_backward
    assert second is not None and second.args[-1].shape == e.shape
    assert [saved[i].name for i in split.second_saved] == [p.name for p in second.args[:-1]]
    assert len(second.output) == 2 and second.output[1] is None  # exp's input is x: no gradient for w

    _, _, inputs_only = split_forward_backward(_mul_trace())  # saves only its inputs, which carry their history
    assert inputs_only.hidden_saved == () and inputs_only.second_backward is None


def _mul_trace() -> Trace:
    t = Trace()
    with tracing(t):
        x = t.add_input(TensorProxy((3,), F64, torch.device("cpu"), requires_grad=True), "x")
        y = t.add_input(TensorProxy((3,), F64, torch.device("cpu"), requires_grad=True), "y")
        t.output = prims.mul(x, y)
    return t


# -- symbolic values ---------------------------------------------------------------------------------

def test_symbolic_values_unsqueeze_add_differentiates():
    # prims.shape binds several symbolic sizes; the backward reads them as residuals.
    def f(a, b):
        return (a.unsqueeze(0) + b).tanh().sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n, m in ((3, 4), (5, 2)):
        a = torch.randn(n, dtype=F64, requires_grad=True)
        b = torch.randn(m, n, dtype=F64, requires_grad=True)
        _ = jf(a, b)
        want = torch.autograd.grad(f(a, b), (a, b))
        got = torch.autograd.grad(jf(a, b), (a, b))
        torch.testing.assert_close(got, want)
    assert minijit.cache_info(jf).misses == 1
    assert "torchex.shape(" in _final_source(minijit.last_traces(jf))


def test_symbolic_values_linear_and_reductions():
    def f(x, w, b):
        h = ltorch.linear(x, w, b)
        var, mean = prims.var_mean(h, (1,), 1)
        return (var + mean * h.sum(0).mean()).sum()

    def e(x, w, b):
        h = F.linear(x, w, b)
        var, mean = torch.var_mean(h, 1, correction=1)
        return (var + mean * h.sum(0).mean()).sum()

    jf = minijit.jit(f, cache="symbolic values")
    for rows in (4, 6):
        x = torch.randn(rows, 5, dtype=F64)
        w, b = _params((3, 5), (3,))
        got = torch.autograd.grad(jf(x, w, b), (w, b))
        want = torch.autograd.grad(e(x, w, b), (w, b))
        torch.testing.assert_close(got, want)
    assert minijit.cache_info(jf).misses == 1


def test_symbolic_values_backward_saves_the_sizes_its_decompositions_read():
    # embedding's backward is one aten call whose decomposition reshapes the indices to their
    # count: for the positions, arange's length, a size the forward computed and nothing else
    # in the backward reads. An executor running the decomposition needs it: it is saved.
    def f(idx, wte, wpe):
        pos = torch.arange(0, idx.shape[1])
        return (F.embedding(idx, wte) + F.embedding(pos, wpe)).sum()

    jf = minijit.jit(f, cache="symbolic values")
    for n in (5, 7):
        idx = torch.randint(0, 8, (2, n))
        wte, wpe = _params((8, 4), (8, 4))
        got = torch.autograd.grad(jf(idx, wte, wpe), (wte, wpe))
        torch.testing.assert_close(got, torch.autograd.grad(f(idx, wte, wpe), (wte, wpe)))
    assert minijit.cache_info(jf).misses == 1
    backward = minijit.last_backward_traces(jf)[0]
    defined = {p.name for p in backward.args} | {p.name for b in backward.bound_symbols for p in b.proxy_outputs()}
    for bsym in backward.bound_symbols:
        inner = {p.name for sub in bsym.subsymbols for p in sub.proxy_outputs()}
        read = {p.name for sub in bsym.subsymbols for p in sub.proxy_args()} - inner
        assert read <= defined, (read - defined, backward)


@pytest.mark.parametrize(("op", "arg"), [("split", 2), ("split", [1, 3, 1]), ("chunk", 3), ("unbind", None)])
@pytest.mark.parametrize("use", ["all", "some"])
def test_multi_output_pieces_under_grad(op, arg, use):
    x = torch.randn(5, 4, dtype=F64, requires_grad=True)

    def body(x, cut):
        pieces = cut(x)
        chosen = pieces if use == "all" else pieces[1:2]
        total = chosen[0].sin().sum()
        for p in chosen[1:]:
            total = total + p.exp().sum()
        return total

    sym = getattr(ltorch, op)
    jit_cut = (lambda x: sym(x)) if arg is None else (lambda x: sym(x, arg, 0))
    eager_cut = (lambda x: getattr(torch, op)(x)) if arg is None else (lambda x: getattr(torch, op)(x, arg, 0))
    jf = minijit.jit(lambda x: body(x, jit_cut))
    _compare_grads(lambda x: body(x, jit_cut), lambda x: body(x, eager_cut), (x,))
    jf(x)
    bwd = minijit.last_backward_traces(jf)[-1].python()
    assert bwd.count("torchex.cat(") <= 1, bwd  # the pieces' gradients are joined once


class _NoFusion(FusionExecutor):
    """A fusion executor that fuses nothing: what the grad pass sees of any fusion executor in the list."""

    def __init__(self):
        super().__init__("nofusion")

    def fusible(self, bsym):
        return False

    def fuse(self, region):
        return None


@pytest.mark.parametrize("fusion", [True, False])
def test_cheap_pointwise_output_is_recomputed_where_a_fusion_executor_runs(fusion):
    # gelu's input is saved for gelu's backward anyway: with a fusion executor its output, needed by the
    # second linear's backward, is recomputed there (fused into the backward's regions) rather than kept
    # alive between forward and backward. With torch calls alone it is saved, as eager's autograd does:
    # recomputing would be one more kernel than eager runs.
    def f(x, w1, w2):
        return ltorch.linear(ltorch.gelu(ltorch.linear(x, w1)), w2).sum()

    x = torch.randn(4, 5, dtype=F64)
    w1, w2 = _params((6, 5), (3, 6))
    jf = minijit.jit(f, executors=[_NoFusion()] if fusion else None)
    out = jf(x, w1, w2)
    fwd = minijit.last_traces(jf)[-1]
    (gelu,) = [b for b in fwd.bound_symbols if b.sym.name == "gelu"]
    saved_names = {p.name for p in fwd.output[1]}
    assert (gelu.output.name not in saved_names) == fusion
    assert gelu.args[0].name in saved_names
    assert ("torchex.gelu(" in _final_source(minijit.last_backward_traces(jf))) == fusion
    got = torch.autograd.grad(out, (w1, w2))
    want = torch.autograd.grad(F.linear(F.gelu(F.linear(x, w1)), w2).sum(), (w1, w2))
    torch.testing.assert_close(got, want)


def test_square_has_one_gradient_term():
    # x * x: one 2 * x * g, not g * x twice and a sum.
    jf = minijit.jit(lambda x: (x * x).sum())
    x = torch.randn(5, dtype=F64, requires_grad=True)
    jf(x).backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    bwd = _final_source(minijit.last_backward_traces(jf))
    assert "prims_add" not in bwd, bwd


# -- with the interpreter: torch code, modules, no_grad regions --------------------------------------

def test_no_grad_region_inside_the_function_is_constant():
    def f(x):
        with torch.no_grad():
            s = x.sum()
        return (x * s).sum()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    (got,) = torch.autograd.grad(minijit.jit(f)(x), x)
    (want,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(got, want)


def test_detach_stops_gradients():
    def f(x):
        return (x * x.detach()).sum()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    (got,) = torch.autograd.grad(minijit.jit(f)(x), x)
    torch.testing.assert_close(got, x.detach())


def test_module_trains_like_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    jm = minijit.jit(model)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x, target = torch.randn(5, 8), torch.randint(0, 4, (5,))
        loss = F.cross_entropy(jm(x), target)
        ref_loss = F.cross_entropy(ref(x), target)
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
        loss.backward()
        ref_loss.backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    assert minijit.last_backward_traces(jm)


COMPLEX_PROGRAMS = {
    "mul abs": lambda x, w: (x * w).abs().sum(),
    "real part": lambda x, w: (x * w).real.sum(),
    "view_as_real": lambda x, w: torch.view_as_real(x * w).pow(2).sum(),
    "exp angle": lambda x, w: (x * w).exp().angle().sum(),
    "matmul": lambda x, w: (x.reshape(1, 3) @ (w + 0j).reshape(3, 1)).abs().sum(),
    "complex of reals": lambda x, w: torch.complex(w, w * 2).mul(x).abs().sum(),
    "fft": lambda x, w: torch.fft.fft(x * w).abs().sum(),
    "polar imag": lambda x, w: torch.polar(w.abs() + 1, w).mul(x).imag.sum(),
    "times 1j": lambda x, w: (w * 1j).abs().sum() + x.abs().sum(),
}


@pytest.mark.parametrize("complex_requires_grad", [False, True])
@pytest.mark.parametrize("program", list(COMPLEX_PROGRAMS))
def test_complex_values_differentiate_as_in_eager(program, complex_requires_grad):
    # A complex tensor times real weights: torch's autograd differentiates each op on complex values, so the
    # gradients (the conjugate convention, a real input's real part) are eager's.
    f = COMPLEX_PROGRAMS[program]
    x = torch.randn(3, dtype=torch.complex128, requires_grad=complex_requires_grad)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    wrt = [x, w] if complex_requires_grad else [w]
    expected = f(x, w)
    jf = minijit.jit(f)
    for _ in range(2):
        got = jf(x, w)
        torch.testing.assert_close(got, expected)
        for a, b in zip(torch.autograd.grad(got, wrt), torch.autograd.grad(f(x, w), wrt)):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b)
