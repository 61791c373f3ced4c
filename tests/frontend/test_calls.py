"""Calls the interpreter does not trace: the refusal names what the user's code called."""

import pytest
import torch
from torch.func import hessian, jacfwd, jacrev

import minijit


def _g(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * x.sum()


@pytest.mark.parametrize(("transform", "made_by"), [(jacrev, "jacrev"), (jacfwd, "jacfwd"), (hessian, "jacfwd")])
def test_a_function_torch_made_of_the_users_function_is_named_by_its_maker(transform, made_by) -> None:
    """`torch.func.jacrev(g)` returns a closure wearing g's name (functools.wraps); a refusal of it names the torch
    function that made it, not only the user's `g`, which minijit does trace."""
    _g(torch.randn(3))  # eager runs it
    with pytest.raises(minijit.UnsupportedOpError, match=rf"the function torch\.func\.{made_by} made of .*_g"):
        minijit.jit(lambda x: transform(_g)(x))(torch.randn(3))
