"""`t.requires_grad = flag` on a tensor the jitted function computed: as in eager, or refused."""

from __future__ import annotations

import pytest
import torch

import minijit

F64 = torch.float64


def feature_encoder(x, w, flag):
    h = x[:, None]  # a view of an input that does not require grad: a leaf, as in transformers' wav2vec2 family
    h.requires_grad = flag
    seen = h.requires_grad
    y = torch.nn.functional.conv1d(h, w).tanh()
    return y, seen, y.requires_grad


@pytest.mark.parametrize("flag", [True, False])
def test_turning_requires_grad_on_a_computed_leaf_matches_eager(flag: bool) -> None:
    x, w = torch.randn(2, 9, dtype=F64), torch.randn(3, 1, 4, dtype=F64)
    we, wj = w.clone().requires_grad_(), w.clone().requires_grad_()
    want, have = feature_encoder(x, we, flag), minijit.jit(feature_encoder)(x, wj, flag)
    torch.testing.assert_close(have[0], want[0])
    assert have[1:] == want[1:]
    want[0].square().sum().backward()
    have[0].square().sum().backward()
    torch.testing.assert_close(wj.grad, we.grad)
    assert x.grad is None and not x.requires_grad


def test_changing_the_flag_of_a_computed_tensor_with_history_raises_eagers_error() -> None:
    def f(w):
        y = w * 2
        y.requires_grad = True
        return y

    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf variables") as eager:
        f(w)
    with pytest.raises(type(eager.value), match="leaf variables"):
        minijit.jit(f)(w)


def test_turning_it_on_where_no_input_requires_grad_is_refused() -> None:
    def f(x):
        h = x * 2
        h.requires_grad = True
        return h.sin()

    with pytest.raises(minijit.MinijitError, match=r"requires_grad = True.*none of whose inputs requires grad"):
        minijit.jit(f)(torch.randn(3))
