"""Real tensors from outside the inputs (globals, closures, plain attributes) are read afresh on every call."""

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
    assert "def _masked(x, MASK)" in str(minijit.last_traces(jf)[0])


def test_a_reassigned_global_tensor_is_seen():
    global MASK
    jf = minijit.jit(_masked)
    x = torch.randn(3)
    saved = MASK
    try:
        for i in range(3):
            MASK = torch.randn(3) + i
            torch.testing.assert_close(jf(x), _masked(x))
    finally:
        MASK = saved
    assert minijit.cache_info(jf).misses == 1


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


def test_captured_tensor_that_requires_grad_gets_its_gradient():
    w = torch.randn(3, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    jf = minijit.jit(lambda x: (x * w).sum())
    for _ in range(3):
        x = torch.randn(3)
        jf(x).backward()
        (x * w_eager).sum().backward()
        torch.testing.assert_close(w.grad, w_eager.grad)


def test_many_tensors_read_from_outside_are_checked_together_and_each_change_misses():
    """Five tensors read from an object: the guard checks them in one C call, falling back to one by one. Each
    change of shape, dtype or requires_grad of one of them is a miss naming it; inference mode (another dispatch
    state) still hits; every result equals eager's."""
    class Holder:
        pass

    holder = Holder()
    holder.ts = [torch.randn(3) for _ in range(4)] + [torch.nn.Parameter(torch.randn(3))]

    def total(x):
        return sum(t * x for t in holder.ts)

    jf = minijit.jit(total)
    x = torch.randn(3)
    changes = [lambda t: t.to(torch.float64), lambda t: torch.randn(4), lambda t: t.detach().requires_grad_(),
               lambda t: torch.nn.Parameter(t.detach().clone())]
    with torch.no_grad():
        torch.testing.assert_close(jf(x), total(x))
        with torch.inference_mode():
            torch.testing.assert_close(jf(x), total(x))
        assert minijit.cache_info(jf).misses == 1
        for i, change in enumerate(changes):
            holder.ts[i] = change(holder.ts[i])
            if i == 1:  # shape (4,) against x's (3,): eager raises, and so does the jitted call
                with pytest.raises(RuntimeError):
                    total(x)
                with pytest.raises(RuntimeError):
                    jf(x)
                holder.ts[i] = torch.randn(3)
            else:
                torch.testing.assert_close(jf(x), total(x))
    reasons = minijit.cache_info(jf).miss_reasons
    assert "ts_0" in reasons[1] and "float64" in reasons[1], reasons
    assert any("ts_1" in r and "shape (4,)" in r for r in reasons), reasons
    assert any("ts_2" in r and "requires_grad=True" in r for r in reasons), reasons
