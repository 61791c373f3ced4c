"""Torch operations that native code run for traced code makes on tensors from outside the call."""

import torch
from torch import nn
from torch.func import functional_call, grad

import minijit


def test_gradients_of_a_functional_call_reading_the_modules_buffers_match_eager() -> None:
    """torch.func.grad of a functional_call of a module whose forward reads its own buffers (BatchNorm's running
    statistics): native code runs inside traced code inside native code, so the modes recording native code's
    torch operations nest; the layout minijit reads off a buffer it captures is its own query, not the user's, for
    every one of them (it was refused as "torch.Tensor.stride returns a int")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 1)).eval()

    def per_batch_grads(x: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {k: v.detach() for k, v in model.named_parameters()}
        return grad(lambda p: functional_call(model, p, (x,)).sum())(params)

    jitted = minijit.jit(per_batch_grads)
    for n in (3, 5, 2):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jitted(x), per_batch_grads(x))
