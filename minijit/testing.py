"""How close a result computed by minijit must be to eager PyTorch's: one rule, for the tests and scripts/gpu_check.py.

Fusion executors compute the same math as eager, but sums may add their terms in another order (a row kernel,
a different matmul tiling), and 16-bit floats are rounded once at the end rather than after every op. The
difference is rounding: a few units of the result dtype's precision, plus the accumulation error of the
longest sum behind the value, which grows like the square root of its length. (Evidence, examples/gpt.py
with executors=["triton"] after one AdamW step, CPU and Triton's interpreter: eager float32 is itself up to
3.0e-5 from a float64 run, Triton up to 5.9e-5; they differ from each other by up to 3.9e-5.)
"""

from __future__ import annotations

import math

import torch


def tolerance(dtype: torch.dtype, reduction_length: int = 1) -> dict[str, float]:
    """`rtol` and `atol` for comparing a result of `dtype` with eager's, for values that went through sums
    of up to `reduction_length` terms (a norm's row width, a matmul's inner size, a gradient's batch x sequence).

    Eight units of `dtype`'s precision, plus 16 units of the accumulation dtype's (float32, float64 for
    float64 results) times the square root of the sum's length. Pass both to `torch.testing.assert_close`.

    Example::

        torch.testing.assert_close(got, want, **tolerance(torch.bfloat16, reduction_length=4096))
    """
    accumulate = torch.float64 if dtype == torch.float64 else torch.float32
    tol = 8 * torch.finfo(dtype).eps + 16 * torch.finfo(accumulate).eps * math.sqrt(max(1, reduction_length))
    return {"rtol": tol, "atol": tol}
