"""torch.func.grad, grad_and_value and vmap inside a jitted function, compared with the same function run eagerly:
per-sample gradients as torch.func's tutorial computes them, on a model's detached parameters. vmap batches the
ops of the function traced once on a sample (minijit/frontend/batching.py): the traces here are counted to show
that nothing is unrolled where a batching rule exists, and that an op without one is unrolled alone."""

import pytest
import torch
from torch.func import functional_call, grad, grad_and_value, vmap

import minijit


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def test_per_sample_gradients_match_eager():
    model = _model()

    def loss_of(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, y.unsqueeze(0))

    def per_sample_grads(params, x, y):
        return vmap(grad(loss_of), in_dims=(None, 0, 0))(params, x, y)

    jitted = minijit.jit(per_sample_grads)
    for _ in range(3):
        params = {k: v.detach() for k, v in model.named_parameters()}
        x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
        want, got = per_sample_grads(params, x, y), jitted(params, x, y)
        assert set(got) == set(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k])


def test_transforms_made_outside_the_jitted_function_run_inside_it():
    """PyTorch's per-sample-gradients tutorial: `vmap(grad(loss))` and `grad_and_value` made at module level, called by
    the jitted function; gradients and values equal eager's."""
    model = _model()

    def loss_of(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, y.unsqueeze(0))

    per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))
    with_value = torch.func.grad_and_value(loss_of)

    def step(params, x, y):
        return per_sample(params, x, y), with_value(params, x[0], y[0])

    jitted = minijit.jit(step)
    for _ in range(2):
        params = {k: v.detach() for k, v in model.named_parameters()}
        x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
        torch.testing.assert_close(jitted(params, x, y), step(params, x, y))


def test_grad_with_argnums_aux_and_grad_and_value_match_eager():
    def f(a, b, scale):
        value = ((a * b).sin() * scale).sum()
        return value, value.detach() * 2

    def both(a, b):
        (ga, gb), aux = grad(f, argnums=(0, 1), has_aux=True)(a, b, 3.0)
        g, (v, aux2) = grad_and_value(f, has_aux=True)(a, b, 0.5)
        return ga, gb, aux, g, v, aux2

    jitted = minijit.jit(both)
    for _ in range(2):
        a, b = torch.randn(3, 4), torch.randn(3, 4)
        for got, want in zip(jitted(a, b), both(a, b)):
            torch.testing.assert_close(got, want)


def test_vmap_of_a_plain_function_matches_eager_and_random_ops_raise_as_in_eager():
    def f(x, w):
        return vmap(lambda row, k: (row @ w).relu() * k, in_dims=(0, None), out_dims=1)(x, 2.0)

    x, w = torch.randn(4, 3), torch.randn(3, 5)
    torch.testing.assert_close(minijit.jit(f)(x, w), f(x, w))

    def noisy(x):
        return vmap(lambda row: row + torch.rand(3))(x)

    with pytest.raises(RuntimeError, match="randomness"):
        noisy(x)
    with pytest.raises(RuntimeError, match="randomness"):
        minijit.jit(noisy)(x)


def test_gradients_of_tensors_requiring_grad_outside_are_refused_by_name():
    def f(x):
        return grad(lambda t: t.pow(2).sum())(x)

    with pytest.raises(minijit.UnsupportedSyntaxError, match="requires grad outside"):
        minijit.jit(f)(torch.randn(3, requires_grad=True))


def _symbols(jitted, *names: str) -> int:
    """How many bound symbols of the last trace `jitted` ran are calls of the symbols `names` (all, if none)."""
    trace = minijit.last_traces(jitted)[-1]
    return sum(1 for b in trace.bound_symbols if not names or b.sym.name in names)


def _linear_per_sample_grads():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)

    def loss_of(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, y.unsqueeze(0))

    def per_sample_grads(params, x, y):
        return vmap(grad(loss_of), in_dims=(None, 0, 0))(params, x, y)

    return model, per_sample_grads


def test_per_sample_gradients_of_linear_and_cross_entropy_are_batched_not_unrolled():
    model, per_sample_grads = _linear_per_sample_grads()
    params = {k: v.detach() for k, v in model.named_parameters()}
    counts = []
    for batch in (4, 16):
        jitted = minijit.jit(per_sample_grads)
        for _ in range(2):
            x, y = torch.randn(batch, 6), torch.randint(0, 4, (batch,))
            want, got = per_sample_grads(params, x, y), jitted(params, x, y)
            for k in want:
                torch.testing.assert_close(got[k], want[k])
        counts.append(_symbols(jitted))
        assert _symbols(jitted, "stack", "select") == 0  # no op run once per sample
    assert counts[0] == counts[1]


def test_per_sample_gradients_with_a_symbolic_batch_size_trace_once():
    model, per_sample_grads = _linear_per_sample_grads()
    params = {k: v.detach() for k, v in model.named_parameters()}
    jitted = minijit.jit(per_sample_grads, cache="symbolic values")
    for batch in (3, 5, 8):
        x, y = torch.randn(batch, 6), torch.randint(0, 4, (batch,))
        want, got = per_sample_grads(params, x, y), jitted(params, x, y)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    assert minijit.cache_info(jitted).misses == 1


@pytest.mark.parametrize("a_shape, b_shape, in_dims", [
    ((4, 3), (3,), (0, None)), ((4, 3), (4, 3), (0, 0)), ((3,), (4, 3, 5), (None, 0)), ((2, 3), (4, 3), (None, 0)),
    ((4, 2, 3), (3, 5), (0, None)), ((4, 3), (2, 3, 5), (0, None)), ((4, 7, 2, 3), (4, 3, 5), (0, 0)),
    ((4, 3), (4, 7, 3, 5), (0, 0)), ((7, 2, 3), (4, 3), (None, 0)), ((2, 3), (3, 4, 5), (None, 1)),
])
def test_vmap_of_matmul_matches_eager_for_each_rank_and_in_dims(a_shape, b_shape, in_dims):
    def f(a, b):
        return vmap(torch.matmul, in_dims=in_dims, out_dims=1 if len(a_shape) + len(b_shape) > 4 else 0)(a, b)

    jitted = minijit.jit(f)
    for _ in range(2):
        a, b = torch.randn(a_shape), torch.randn(b_shape)
        torch.testing.assert_close(jitted(a, b), f(a, b))
    assert _symbols(jitted, "stack") == 0


def test_nested_vmap_and_nested_in_dims_match_eager():
    def outer_product_sums(x, y):
        return vmap(lambda a: vmap(lambda b: (a * b).sum().tanh(), in_dims=0)(y))(x)

    def from_dict(d, scale):
        return vmap(lambda d, s: (d["a"] + d["b"]) * s, in_dims=({"a": 0, "b": 1}, None), out_dims=1)(d, scale)

    jitted, jitted_dict = minijit.jit(outer_product_sums), minijit.jit(from_dict)
    for _ in range(2):
        x, y = torch.randn(3, 5), torch.randn(4, 5)
        torch.testing.assert_close(jitted(x, y), outer_product_sums(x, y))
        d, scale = {"a": torch.randn(3, 4), "b": torch.randn(4, 3)}, torch.randn(4)
        torch.testing.assert_close(jitted_dict(d, scale), from_dict(d, scale))
    assert _symbols(jitted, "stack") == _symbols(jitted_dict, "stack") == 0


def test_vmap_of_reductions_reshapes_and_indexing_matches_eager():
    def f(x, idx):
        def per_sample(e, i):
            rows = e.reshape(2, -1).softmax(-1)
            picked = torch.where(e > 0, e, e[i]) + e[1:3].sum()
            return rows.mean(0), torch.cat([e.unsqueeze(0), picked.unsqueeze(0)]).amax(0), e.var()
        return vmap(per_sample, out_dims=(0, 1, 0), chunk_size=2)(x, idx)

    jitted = minijit.jit(f)
    for _ in range(2):
        x, idx = torch.randn(5, 6), torch.randint(0, 6, (5,))
        for got, want in zip(jitted(x, idx), f(x, idx)):
            torch.testing.assert_close(got, want)
    assert _symbols(jitted, "stack") == 0


def test_an_op_without_a_batching_rule_is_unrolled_alone():
    def f(m):
        return vmap(lambda a: torch.linalg.det(a) * a.exp().sum())(m)

    jitted = minijit.jit(f)
    for _ in range(2):
        m = torch.randn(3, 4, 4)
        torch.testing.assert_close(jitted(m), f(m))
    assert _symbols(jitted, "stack") == 1  # the determinants, one per sample
    assert _symbols(jitted, "prims_exp", "exp") == 1  # the rest once, on the batch


def test_vmap_writing_into_its_input_matches_eager():
    def f(x):
        return vmap(lambda row: row.mul_(2).relu_() + 1)(x)

    x = torch.randn(3, 4)
    mine = x.clone()
    torch.testing.assert_close(minijit.jit(f)(mine), f(x))
    torch.testing.assert_close(mine, x)


def test_vmap_randomness_other_than_error_is_refused_only_for_functions_that_draw():
    def quiet(x):
        return vmap(lambda row: row.exp(), randomness="different")(x)

    def noisy(x):
        return vmap(lambda row: row + torch.rand(3), randomness="same")(x)

    x = torch.randn(4, 3)
    torch.testing.assert_close(minijit.jit(quiet)(x), quiet(x))
    with pytest.raises(minijit.UnsupportedSyntaxError, match="randomness='same'"):
        minijit.jit(noisy)(x)


def test_gradients_through_a_batched_vmap_match_eager():
    def f(x, w):
        def per_sample(row):
            with torch.no_grad():
                scale = (w * 2).sum()
            return (row @ w).sin() * scale
        return vmap(per_sample)(x).sum()

    jitted = minijit.jit(f)
    for _ in range(2):
        x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True)
        want = torch.autograd.grad(f(x, w), (x, w))
        got = torch.autograd.grad(jitted(x, w), (x, w))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)


def test_a_transformed_function_returned_by_a_jitted_call_works_as_eagers():
    """The function torch.func.grad/grad_and_value/vmap make inside the jitted call may leave it: called afterwards, it
    gives what the one eager returned gives."""
    def loss(w, x):
        return (x @ w).tanh().sum()

    def make(scale):
        return (torch.func.grad(loss), torch.func.grad_and_value(loss, argnums=(0, 1)), torch.func.vmap(torch.sin),
                scale * 2)

    w, x = torch.randn(3, 2), torch.randn(4, 3)
    eager_grad, eager_gv, eager_map, eager_scaled = make(torch.ones(1))
    jit_grad, jit_gv, jit_map, jit_scaled = minijit.jit(make)(torch.ones(1))
    torch.testing.assert_close(jit_scaled, eager_scaled)
    torch.testing.assert_close(jit_grad(w, x), eager_grad(w, x))
    torch.testing.assert_close(jit_gv(w, x), eager_gv(w, x))
    torch.testing.assert_close(jit_map(x), eager_map(x))


def test_grad_of_a_function_writing_a_captured_tensor_raises_as_in_eager():
    # BatchNorm in training writes its running statistics, captured from outside the transform: eager's
    # torch.func refuses the write; minijit must not carry it out.
    bn = torch.nn.BatchNorm1d(3)
    params = {k: v.detach() for k, v in bn.named_parameters()}

    def f(p, x):
        return torch.func.grad(lambda q: torch.func.functional_call(bn, q, (x,)).pow(2).sum())(p)

    def inside(x):  # writes only what it made itself: allowed, as in eager
        def g(y):
            z = y * 2
            z.add_(1)
            return (z * y).sum()
        return torch.func.grad(g)(x)

    x = torch.randn(4, 3)
    outcomes = []
    for fn in (f, minijit.jit(f)):
        bn.running_mean.zero_()
        with pytest.raises(RuntimeError, match="would mutate a captured Tensor"):
            fn(params, x)
        outcomes.append(bn.running_mean.clone())
    assert torch.equal(outcomes[0], outcomes[1])
    assert torch.equal(minijit.jit(inside)(x), inside(x))
