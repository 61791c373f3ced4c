"""Real tensors from outside the inputs (globals, closures, plain attributes) become trace constants."""

import pytest
import torch

import minijit

MASK = torch.tensor([1.0, 0.0, 2.0])


def _masked(x):
    return x * MASK


def test_global_tensor_is_read_at_run_time_like_eager():
    jf = minijit.jit(_masked)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), _masked(x))
    MASK.mul_(3)  # an in-place update of the global is seen, as in eager
    try:
        torch.testing.assert_close(jf(x), _masked(x))
    finally:
        MASK.div_(3)
    assert "prims.tensor_constant" in str(minijit.last_traces(jf)[0])


def test_plain_tensor_attribute_of_a_module():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = torch.tensor(2.5)  # neither parameter nor buffer

        def forward(self, x):
            return x * self.factor

    m = Scale()
    jm = minijit.jit(m)
    x = torch.randn(4)
    torch.testing.assert_close(jm(x), m(x))


def test_captured_tensor_that_requires_grad_is_refused():
    w = torch.randn(3, requires_grad=True)
    jf = minijit.jit(lambda x: x * w)
    with pytest.raises(minijit.UnsupportedOpError, match="requires grad reached the trace from outside"):
        jf(torch.randn(3))
