"""Convolution, pooling, batch statistics norms, resampling and routing ops against eager torch.

OpInfo samples run each op's decomposition (prims only) and its ltorch-level trace;
the other tests cover call forms OpInfo misses and the errors minijit gives instead
of a wrong answer. Gradients: tests/transforms/test_grad_opinfo.py and test_grad_modelops.py;
real torch.nn modules: tests/models/test_nn_layers.py.
"""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import MetaError
from minijit.ops import ltorch
from tests.ops.opinfo_util import OpCase, assert_matches, check_sample
from tests.oputil import run_decomposed, run_trace_source

F = torch.nn.functional


def _bf16_loose(tol: float = 0.05) -> dict[torch.dtype, tuple[float, float]]:
    return {torch.bfloat16: (tol, tol)}


MODEL_CASES = [
    *(OpCase(f"nn.functional.{name}", tolerances={torch.float32: (1e-4, 1e-4), **_bf16_loose(0.1)})
      for name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")),
    OpCase("nn.functional.batch_norm", tolerances=_bf16_loose()),
    OpCase("nn.functional.instance_norm", tolerances=_bf16_loose()),
    OpCase("nn.functional.local_response_norm", tolerances=_bf16_loose()),
    *(OpCase(f"nn.functional.{kind}_pool{n}d") for kind in ("max", "avg", "adaptive_avg", "adaptive_max")
      for n in (1, 2, 3)),
    *(OpCase("nn.functional.interpolate", mode, tolerances=_bf16_loose())
      for mode in ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")),
    OpCase("nn.functional.upsample_nearest"), OpCase("nn.functional.upsample_bilinear", tolerances=_bf16_loose()),
    *(OpCase("nn.functional.pad", mode) for mode in ("reflect", "replicate", "replicate_negative", "circular")),
    OpCase("nn.functional.pixel_shuffle"), OpCase("nn.functional.pixel_unshuffle"),
    OpCase("nn.functional.one_hot", min_share=0.5,
           skip=lambda s: "num_classes=-1 (data-dependent)" if s.kwargs.get("num_classes", -1) == -1 else None),
    OpCase("histc"),
]
PARAMS = [pytest.param(case, dtype, id=f"{case.id}-{str(dtype)[6:]}") for case in MODEL_CASES
          for dtype in case.dtypes((torch.float32, torch.bfloat16, torch.int64))]


# Max pooling's OpInfo has up to 1440 samples (every combination of its options): a spread of them suffices.
MAX_SAMPLES = 24


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_model_op_matches_eager(case: OpCase, dtype: torch.dtype) -> None:
    samples = case.samples(dtype)
    assert samples.supported_share >= case.min_share, f"{case.id}: skipped {dict(samples.skipped)}"
    step = -(-len(samples.supported) // MAX_SAMPLES)
    for sample in samples.supported[::step]:
        check_sample(case, sample, dtype)


def _both(fn, *args, atol=1e-5, rtol=1.3e-5, **kwargs) -> None:
    """fn (an F function, mapped to its ltorch op on proxies) decomposed and at ltorch level, against eager."""
    expected = fn(*args, **kwargs)
    for runner in (run_decomposed, run_trace_source):
        assert_matches(runner(fn, *args, **kwargs), expected, lambda d: (atol, rtol), runner.__name__)


@pytest.mark.parametrize("padding", ["same", "valid", (1, 2), 1])
def test_conv2d_padding_forms(padding) -> None:
    x, w, b = torch.randn(2, 4, 7, 6), torch.randn(6, 2, 4, 3), torch.randn(6)
    _both(lambda *a: F.conv2d(*a, padding=padding, dilation=(1, 2), groups=2) if isinstance(a[0], torch.Tensor)
          else ltorch.conv2d(*a, padding=padding, dilation=(1, 2), groups=2), x, w, b, atol=1e-4, rtol=1e-4)


def test_unbatched_conv_and_pool() -> None:
    x = torch.randn(3, 9)
    w = torch.randn(4, 3, 2)
    _both(lambda a, b: F.max_pool1d(F.conv1d(a, b), 2, return_indices=True) if isinstance(a, torch.Tensor)
          else ltorch.max_pool1d(ltorch.conv1d(a, b), 2, return_indices=True), x, w, atol=1e-4, rtol=1e-4)


def test_interpolate_scale_forms() -> None:
    x = torch.randn(1, 2, 5, 4)
    for kwargs in ({"scale_factor": 1.7, "mode": "bilinear"}, {"scale_factor": (0.5, 2.25), "mode": "nearest"},
                   {"scale_factor": 1.5, "mode": "bicubic", "recompute_scale_factor": True},
                   {"size": 3, "mode": "area"}, {"size": (7, 3), "mode": "bilinear", "align_corners": True}):
        _both(lambda a, kw=kwargs: (F.interpolate if isinstance(a, torch.Tensor) else ltorch.interpolate)(a, **kw),
              x, atol=1e-5, rtol=1e-5)


def test_batch_norm_writes_running_stats_like_eager() -> None:
    x = torch.randn(4, 3, 5)
    stats = [torch.randn(3), torch.rand(3) + 0.5]
    expected = [s.clone() for s in stats]
    want = F.batch_norm(x, *expected, training=True, momentum=0.3)
    got = minijit.jit(lambda a, m, v: F.batch_norm(a, m, v, training=True, momentum=0.3))(x, *stats)
    torch.testing.assert_close(got, want)
    for s, e in zip(stats, expected):
        torch.testing.assert_close(s, e)



@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("module", ["BatchNorm2d", "BatchNorm1d", "InstanceNorm2d", "InstanceNorm2d tracked"])
def test_norms_of_an_empty_batch_match_eager(module, training) -> None:
    """An empty batch: eager normalizes nothing and gives the weight and bias zero gradients; minijit's backward
    ran aten's batch-norm backward kernel, which divides by the batch's size (the process died of SIGFPE), and its
    instance norm refused the batch. An instance norm tracking statistics sets them to nan, as eager's does."""
    cls = getattr(torch.nn, module.split()[0])
    make = (lambda: cls(5, track_running_stats=True)) if "tracked" in module else (lambda: cls(5))
    torch.manual_seed(0)
    eager = make().double().train(training)
    jitted = make().double().train(training)
    jitted.load_state_dict(eager.state_dict())
    compiled = minijit.jit(jitted)
    shape = (0, 5) if module == "BatchNorm1d" else (0, 5, 2, 2)
    for _ in range(2):
        x = torch.randn(shape, dtype=torch.float64)
        xe, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_e, out_j = eager(xe), compiled(xj)
        out_e.sum().backward()
        out_j.sum().backward()
        torch.testing.assert_close(out_j, out_e)
        torch.testing.assert_close(xj.grad, xe.grad)
        for p, q in zip(jitted.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        for b, c in zip(jitted.buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, equal_nan=True)


@pytest.mark.parametrize(("training", "eps"), [(True, 0.0), (True, -1.0), (False, -1.0)])
def test_batch_norm_eps_refused_as_eager(training, eps) -> None:
    """F.batch_norm refuses eps <= 0 in training and eps < 0 in evaluation (ValueError), which its ltorch op checks."""
    module = torch.nn.BatchNorm1d(3, eps=eps).train(training)
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="eps must be") as eager:
        module(x)
    with pytest.raises(ValueError, match="eps must be") as jitted:
        minijit.jit(module)(x)
    assert str(eager.value) in str(jitted.value)

def test_one_hot_and_histc() -> None:
    idx = torch.tensor([[0, 3], [2, 1]])
    torch.testing.assert_close(minijit.jit(lambda i: F.one_hot(i, 5))(idx), F.one_hot(idx, 5))
    x = torch.randn(50)
    torch.testing.assert_close(minijit.jit(lambda a: torch.histc(a, bins=7))(x), torch.histc(x, bins=7))
    torch.testing.assert_close(minijit.jit(lambda a: a.histc(4, -1, 1))(x), x.histc(4, -1, 1))


def test_grouped_mm_forward() -> None:
    a, b = torch.randn(6, 8), torch.randn(2, 8, 4)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    torch.testing.assert_close(minijit.jit(lambda p, q, o: torch._grouped_mm(p, q, offs=o))(a, b, offs),
                               torch._grouped_mm(a, b, offs=offs))
    a3 = torch.randn(2, 3, 8)
    torch.testing.assert_close(minijit.jit(lambda p, q: F.grouped_mm(p, q))(a3, b), F.grouped_mm(a3, b))


def test_is_nested_is_false_for_traced_tensors() -> None:
    x = torch.randn(2)
    torch.testing.assert_close(minijit.jit(lambda a: a * 2 if not a.is_nested else a)(x), x * 2)


@pytest.mark.parametrize(("fn", "x"), [
    (lambda a: F.interpolate(a, scale_factor=2, mode="bilinear", antialias=True), torch.randn(1, 1, 3, 3)),
    (lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), torch.randint(0, 255, (1, 2, 3, 3), dtype=torch.uint8)),
])
def test_interpolate_forms_the_decomposition_declines_run_as_the_torch_op(fn, x) -> None:
    torch.testing.assert_close(minijit.jit(fn)(x), fn(x))


@pytest.mark.parametrize(("fn", "args", "message"), [
    (lambda a, b: F.conv2d(a, b), ((2, 3, 5), (4, 3, 2, 2)), r"conv2d: input \(torch.float32\) and weight"),
    (lambda a, b: F.conv2d(a, b, stride=2, padding="same"), ((1, 3, 5, 5), (4, 3, 2, 2)),
     "padding='same' is not supported for strided"),
    (lambda a, b: F.conv1d(a, b), ((3, 5, 5, 5), (4, 3, 2)), "conv1d: expected a 2-d .* or 3-d"),
    (lambda a, b: F.one_hot(a.long()), ((3,), (1,)), "one_hot: num_classes=-1 takes the number of classes"),
    (lambda a, b: F.pad(a, (3, 3), mode="reflect"), ((2, 3), (1,)), "reflect padding .* must be less than"),
    (lambda a, b: F.batch_norm(a, None, None, training=True), ((1, 3), (1,)),
     "expected more than 1 value per channel when training"),
    (lambda a, b: F.max_pool2d(a, 2, padding=2), ((1, 1, 4, 4), (1,)), "prims.max_pool: pad should be"),
])
def test_bad_input_raises_meta_error_naming_the_op(fn, args, message) -> None:
    tensors = [torch.randn(s) for s in args]
    if "conv2d: input" in message:
        tensors[1] = tensors[1].double()
        message = r"conv2d: expected a 3-d \(unbatched\)|" + message
    with pytest.raises(MetaError, match=message):
        minijit.jit(fn)(*tensors)


def test_data_dependent_values_are_errors_naming_the_op_and_line() -> None:
    def formats(x):
        return f"{x.sum().item():.2f}"  # text would need a trace per value: refused

    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"computed by Tensor.item\(\) at .*test_modelops.py"):
        minijit.jit(formats)(torch.randn(3))
    # A data-dependent shape written into out= (without out=, the capture runs it and the trace checks the shape).
    with pytest.raises(minijit.UnsupportedOpError, match=r"torch.nonzero: its result depends on the values.* at "
                                                         r".*test_modelops"):
        minijit.jit(lambda x: torch.nonzero(x, out=torch.empty(0, 1, dtype=torch.long)))(torch.randn(3))


def test_item_in_arithmetic_is_computed_on_every_call() -> None:
    jf = minijit.jit(lambda x: x * x.max().item() + float(x[0]))
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(jf(x), x * x.max().item() + float(x[0]))
    assert minijit.cache_info(jf).hits == 1
