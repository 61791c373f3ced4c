"""Python's `int`, `float`, `bool` and `complex` given as dtypes mean what eager's argument parser makes of them."""

import pytest
import torch

import minijit

CASES = {
    "tensor": lambda x, t: torch.tensor([1, 0], dtype=t),
    "zeros": lambda x, t: torch.zeros(3, dtype=t),
    "full": lambda x, t: torch.full((2,), 1, dtype=t),
    "arange": lambda x, t: torch.arange(4, dtype=t) if t in (int, float) else x,
    "to": lambda x, t: x.to(t),
    "to keyword": lambda x, t: x.to(dtype=t),
    "zeros_like": lambda x, t: torch.zeros_like(x, dtype=t),
    "new_zeros": lambda x, t: x.new_zeros(2, dtype=t),
    "sum": lambda x, t: x.sum(dtype=t) if t is not bool else x,
    "cumsum": lambda x, t: x.cumsum(0, dtype=t) if t is not bool else x,
    "dtype read back": lambda x, t: torch.tensor([1], dtype=t).dtype == torch.ones(1, dtype=t).dtype,
    "index": lambda x, t: x[torch.tensor([1, 0, 1], dtype=t)] if t in (int, bool) else x,
}


@pytest.mark.parametrize("python_type", [int, float, bool, complex], ids=lambda t: t.__name__)
@pytest.mark.parametrize("case", list(CASES))
def test_a_python_type_as_dtype_equals_eager(case, python_type):
    fn = CASES[case]
    x = torch.tensor([1.5, -2.0, 3.0])
    expected = fn(x, python_type)
    got = minijit.jit(fn)(x, python_type)
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    else:
        assert type(got) is type(expected) and got == expected
