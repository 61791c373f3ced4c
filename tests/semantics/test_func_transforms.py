"""torch.func.grad, grad_and_value and vmap inside a jitted function, compared with the same function run eagerly:
per-sample gradients as torch.func's tutorial computes them, on a model's detached parameters."""

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


def test_a_transformed_function_returned_by_a_jitted_call_works_as_eagers():
    """The function torch.func.grad/grad_and_value make inside the jitted call may leave it: called afterwards, it
    gives what the one eager returned gives."""
    def loss(w, x):
        return (x @ w).tanh().sum()

    def make(scale):
        return torch.func.grad(loss), torch.func.grad_and_value(loss, argnums=(0, 1)), scale * 2

    w, x = torch.randn(3, 2), torch.randn(4, 3)
    eager_grad, eager_gv, eager_scaled = make(torch.ones(1))
    jit_grad, jit_gv, jit_scaled = minijit.jit(make)(torch.ones(1))
    torch.testing.assert_close(jit_scaled, eager_scaled)
    torch.testing.assert_close(jit_grad(w, x), eager_grad(w, x))
    torch.testing.assert_close(jit_gv(w, x), eager_gv(w, x))
