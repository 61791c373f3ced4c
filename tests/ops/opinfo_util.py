"""PyTorch OpInfo entries -> ltorch symbols -> sample inputs, and the check of one sample against eager.

Op tests (and grad tests) name an OpInfo by `name` and `variant`, get the ltorch
symbol that stands for its torch callable, draw its CPU samples for a dtype, and
skip (but count) the samples that use features minijit does not support.

Example::

    case = OpCase("softmax", variant="with_dtype")
    for sample in case.samples(torch.float32).supported:
        check_sample(case, sample, torch.float32)
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from minijit.ir import Symbol
from minijit.ops.registry import ALL_LTORCH, ltorch_symbol_for
from tests.oputil import run_decomposed, run_trace_source

# (atol, rtol) per dtype, loose enough for a decomposition that rounds differently from torch's kernel.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1.3e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
TEST_DTYPES = (*FLOAT_DTYPES, torch.int64, torch.bool)


@cache
def _op_db() -> dict[tuple[str, str], Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {(info.name, info.variant_test_name): info for info in op_db}



@contextlib.contextmanager
def no_test_fn_lookup() -> Iterator[None]:
    """OpInfo's sample iterators look for the running unittest method with `inspect.stack()`.

    Under pytest that reads the source of ~50 frames per call and took most of an OpInfo test's
    time; there is no unittest method to find here, so the lookup is skipped.
    """
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    lookups = common_utils.extract_test_fn, core.extract_test_fn
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn = lookups


def opinfo(name: str, variant: str = "") -> Any:
    """The OpInfo called `name` (with `variant`, e.g. 'with_dtype')."""
    return _op_db()[(name, variant)]


def ltorch_symbol(info: Any) -> Symbol:
    """The ltorch symbol for an OpInfo: the one its torch callable maps to, else the op of the same name."""
    sym = ltorch_symbol_for(info.op)
    if sym is None:
        sym = ALL_LTORCH[info.name.split(".")[-1]]
    return sym


@dataclass
class Samples:
    """An OpInfo's samples for one dtype, split into the supported ones and counts of the skipped ones by reason."""

    supported: list[Any]
    skipped: Counter[str] = field(default_factory=Counter)

    @property
    def supported_share(self) -> float:
        total = len(self.supported) + sum(self.skipped.values())
        return len(self.supported) / total if total else 0.0


@dataclass
class OpCase:
    """One OpInfo entry as a test case: its symbol, the samples to skip, tolerances, the least supported share."""

    name: str
    variant: str = ""
    # sample -> the reason to skip it, or None to test it
    skip: Callable[[Any], str | None] | None = None
    tolerances: dict[torch.dtype, tuple[float, float]] = field(default_factory=dict)
    min_share: float = 0.75
    symbol_name: str | None = None
    # (symbol) -> a callable with the OpInfo op's signature, where the two differ (argument order, say)
    adapter: Callable[[Symbol], Callable[..., Any]] | None = None
    # False for ops whose values are unspecified (empty) or random: compare shape, dtype and device only
    compare_values: bool = True

    @property
    def id(self) -> str:
        return f"{self.name}.{self.variant}" if self.variant else self.name

    @property
    def info(self) -> Any:
        return opinfo(self.name, self.variant)

    @property
    def symbol(self) -> Symbol:
        return ALL_LTORCH[self.symbol_name] if self.symbol_name else ltorch_symbol(self.info)

    def as_op(self) -> Callable[..., Any]:
        """The symbol as a callable taking the OpInfo op's arguments."""
        sym = self.symbol
        return self.adapter(sym) if self.adapter else (lambda *args, **kwargs: sym(*args, **kwargs))

    def dtypes(self, wanted: tuple[torch.dtype, ...] = TEST_DTYPES) -> list[torch.dtype]:
        """The wanted dtypes that the OpInfo supports on CPU."""
        supported = self.info.supported_dtypes("cpu")
        return [d for d in wanted if d in supported]

    def samples(self, dtype: torch.dtype) -> Samples:
        """The OpInfo's CPU samples for `dtype`, less the skipped ones (counted by reason)."""
        out = Samples([])
        # One seed for the whole draw (not torch's per-sample reseeding, which dominates the run time),
        # without disturbing the caller's random state.
        with torch.random.fork_rng(devices=[]), no_test_fn_lookup():
            torch.manual_seed(0)
            samples = list(self.info.sample_inputs("cpu", dtype, requires_grad=False, set_seed=False))
        for sample in samples:
            reason = self.skip(sample) if self.skip else None
            if reason:
                out.skipped[reason] += 1
            else:
                out.supported.append(sample)
        return out

    def tolerance(self, dtype: torch.dtype, result_dtype: torch.dtype | None = None) -> tuple[float, float]:
        """(atol, rtol) for results in `result_dtype` computed from inputs in `dtype`: the looser of the two."""
        if dtype in self.tolerances:
            return self.tolerances[dtype]
        a = TOLERANCES.get(dtype, (0.0, 0.0))
        b = TOLERANCES.get(result_dtype, (0.0, 0.0)) if result_dtype is not None else a
        return max(a[0], b[0]), max(a[1], b[1])


def check_sample(case: OpCase, sample: Any, dtype: torch.dtype) -> None:
    """The symbol's decomposition (prims only) and its ltorch-level trace both match eager torch on `sample`."""
    expected = case.info.op(sample.input, *sample.args, **sample.kwargs)
    fn = case.as_op()
    for runner in (run_decomposed, run_trace_source):
        actual = runner(fn, sample.input, *sample.args, **sample.kwargs)
        what = f"{case.id} {runner.__name__} on {sample_summary(sample)}"
        if case.compare_values:
            assert_matches(actual, expected, lambda d: case.tolerance(dtype, d), what)
        else:
            assert_same_metadata(actual, expected, what)


def assert_matches(actual: Any, expected: Any, tolerance: Callable[[torch.dtype], tuple[float, float]],
                   what: str) -> None:
    """Equal values, shapes and dtypes (tuples elementwise; NaNs equal); `tolerance(result dtype)` is (atol, rtol)."""
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected), f"{what}: got {actual!r}"
        for a, e in zip(actual, expected):
            assert_matches(a, e, tolerance, what)
        return
    atol, rtol = tolerance(expected.dtype) if isinstance(expected, torch.Tensor) else (0.0, 0.0)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def assert_same_metadata(actual: Any, expected: Any, what: str) -> None:
    """Same shape, dtype and device (values are not compared)."""
    assert isinstance(actual, torch.Tensor), f"{what}: got {actual!r}"
    got = (actual.shape, actual.dtype, actual.device)
    want = (expected.shape, expected.dtype, expected.device)
    assert got == want, f"{what}: got {got}, expected {want}"


def sample_summary(sample: Any) -> str:
    """A short description of a sample for failure messages."""
    def describe(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
        if isinstance(x, list | tuple):
            return "(" + ", ".join(describe(v) for v in x) + ")"
        return repr(x)

    args = [describe(sample.input), *(describe(a) for a in sample.args)]
    args += [f"{k}={describe(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(args)


def run_case(case: OpCase, dtype: torch.dtype) -> Samples:
    """Check every supported sample of `case` in `dtype`, and that enough of them are supported."""
    samples = case.samples(dtype)
    assert samples.supported, f"{case.id}: no supported samples for {dtype} (skipped: {dict(samples.skipped)})"
    for sample in samples.supported:
        check_sample(case, sample, dtype)
    assert samples.supported_share >= case.min_share, (
        f"{case.id} {dtype}: only {samples.supported_share:.0%} of samples supported; skipped {dict(samples.skipped)}")
    return samples


# -- the OpInfo entries minijit's ops are tested against (op tests and grad tests share them) ---------

_UNARY = (
    "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal", "erf", "erfc",
    "erfinv", "lgamma", "digamma", "floor", "ceil", "round", "trunc", "sign", "bitwise_not", "isfinite", "isnan",
    "isinf", "signbit", "logical_not", "positive", "square",
)
_BINARY = (
    "add", "sub", "rsub", "mul", "pow", "remainder", "fmod", "maximum", "minimum", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "floor_divide", "atan2", "copysign", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
)
_LOOSE_BF16 = {torch.bfloat16: (0.1, 0.05)}  # several roundings in bf16 where torch rounds once
_CANCELLING_BF16 = {torch.bfloat16: (0.25, 0.05)}

ELEMENTWISE_CASES = [
    *(OpCase(name) for name in _UNARY + _BINARY),
    OpCase("div", "no_rounding_mode"), OpCase("div", "trunc_rounding"), OpCase("div", "floor_rounding"),
    OpCase("where", adapter=lambda sym: lambda x, cond, y: sym(cond, x, y)),
    OpCase("clamp"), OpCase("lerp"), OpCase("addcmul", tolerances=_LOOSE_BF16),
    OpCase("addcdiv", tolerances=_LOOSE_BF16),
]

REDUCTION_CASES = [
    OpCase("sum"), OpCase("mean"), OpCase("prod"), OpCase("amax"), OpCase("amin"),
    OpCase("max", "binary"), OpCase("max", "reduction_no_dim"), OpCase("max", "reduction_with_dim"),
    OpCase("min", "binary"), OpCase("min", "reduction_no_dim"), OpCase("min", "reduction_with_dim"),
    OpCase("argmax"), OpCase("argmin"),
    OpCase("var"), OpCase("var", "unbiased"), OpCase("std"), OpCase("std", "unbiased"),
    OpCase("var_mean"), OpCase("var_mean", "unbiased"), OpCase("std_mean"), OpCase("std_mean", "unbiased"),
    OpCase("all"), OpCase("any"), OpCase("logsumexp"), OpCase("cumsum"), OpCase("diff"),
    OpCase("norm"), OpCase("norm", "fro"), OpCase("norm", "inf"), OpCase("linalg.vector_norm"),
    OpCase("topk"), OpCase("sort"), OpCase("argsort"),
]


def _skip_dropout(sample: Any) -> str | None:
    return "random (dropout_p > 0)" if sample.kwargs.get("dropout_p", 0) else None


def _skip_embedding(sample: Any) -> str | None:
    # The symbol declines both: max_norm's in-place renorm is traced from F.embedding's body, a sparse gradient is
    # torch's own (tests/semantics/test_embedding_max_norm.py runs these samples through minijit.jit).
    if sample.kwargs.get("max_norm") is not None:
        return "max_norm (writes weight: traced from F.embedding)"
    return "sparse (a sparse gradient: run opaque)" if sample.kwargs.get("sparse") else None


NN_CASES = [
    OpCase("matmul"), OpCase("mm"), OpCase("bmm"), OpCase("baddbmm"), OpCase("addmm"), OpCase("nn.functional.linear"),
    *(OpCase(f"nn.functional.{name}") for name in (
        "relu", "relu6", "leaky_relu", "elu", "gelu", "silu", "softplus", "hardtanh", "logsigmoid", "hardsigmoid",
        "hardswish", "mish", "selu", "celu", "softsign", "tanhshrink")),
    OpCase("sigmoid"), OpCase("tanh"),
    OpCase("softmax"), OpCase("softmax", "with_dtype"), OpCase("log_softmax"), OpCase("log_softmax", "with_dtype"),
    OpCase("nn.functional.layer_norm"), OpCase("nn.functional.rms_norm"), OpCase("nn.functional.group_norm"),
    OpCase("nn.functional.normalize"), OpCase("nn.functional.pad", "constant"),
    OpCase("nn.functional.embedding", skip=_skip_embedding, min_share=0.6,
           adapter=lambda sym: lambda weight, indices, **kwargs: sym(indices, weight, **kwargs)),
    # Weighted losses sum terms of mixed sign: in bf16 the cancellation leaves eager itself ~0.1 off.
    OpCase("nn.functional.cross_entropy", tolerances=_CANCELLING_BF16),
    OpCase("nn.functional.nll_loss", tolerances=_CANCELLING_BF16), OpCase("nn.functional.mse_loss"),
    OpCase("nn.functional.l1_loss"), OpCase("nn.functional.binary_cross_entropy_with_logits"),
    OpCase("nn.functional.scaled_dot_product_attention", skip=_skip_dropout, min_share=0.5,
           tolerances={torch.float32: (3e-5, 1e-4)}),
]

def _skip_memory_format(sample: Any) -> str | None:
    """A conversion given a memory format is declined by its decomposition (the opaque op decides whether it copies:
    tests/semantics/test_writes_through_memory.py compares those through minijit.jit)."""
    if sample.kwargs.get("memory_format", torch.preserve_format) != torch.preserve_format:
        return "a memory format: run as the opaque torch op"
    return None


CREATION_CASES = [
    OpCase("to", skip=_skip_memory_format, min_share=0.4),
    *(OpCase(name, skip=_skip_memory_format, min_share=0.4)
      for name in ("float", "double", "half", "bfloat16", "long", "int", "bool")),
    *(OpCase(name) for name in ("zeros", "ones", "full", "arange", "zeros_like", "ones_like", "full_like",
                                "new_zeros", "new_ones", "new_full")),
    # empty's values are unspecified and each run of a random op draws anew: metadata only (seeded draws
    # are compared with eager's in tests/ops/test_random.py)
    *(OpCase(name, compare_values=False) for name in ("empty", "empty_like", "new_empty", "rand_like",
                                                      "randn_like")),
]

ALL_CASES = ELEMENTWISE_CASES + REDUCTION_CASES + NN_CASES + CREATION_CASES


def case_params(cases: list[OpCase]) -> list[Any]:
    """pytest params (case, dtype), one per case and supported test dtype, with readable ids."""
    import pytest

    return [pytest.param(case, dtype, id=f"{case.id}-{str(dtype)[6:]}") for case in cases for dtype in case.dtypes()]
