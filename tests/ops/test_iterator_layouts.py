"""Layouts predicted on meta tensors follow eager's C++ kernels where dims of size 1 make them differ.

The meta kernels of elementwise ops are Python references whose stride rule differs from ATen's
TensorIterator on dims of size 1 (and, through broadcasting, on the others); minijit replays ops on
meta tensors under `iterator_layouts`, which lays their outputs out as the CPU kernels do. Checked
two ways: each op on random layouts, meta under the mode against real CPU tensors; and programs
whose values depend on those layouts, under `minijit.jit` against eager.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minijit
from minijit.ops.iterator_layouts import iterator_layouts

Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

OPS: dict[str, Op] = {
    "mul_number": lambda a, b: a * 1,
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "sub_number": lambda a, b: a - 0.5,
    "rsub": lambda a, b: 1 - a,
    "div_number": lambda a, b: a / 2,
    "pow": lambda a, b: a**2,
    "neg": lambda a, b: -a,
    "sin": lambda a, b: a.sin(),
    "abs": lambda a, b: a.abs(),
    "sigmoid": lambda a, b: torch.sigmoid(a),
    "relu": lambda a, b: torch.relu(a),
    "gelu": lambda a, b: F.gelu(a),
    "gt_number": lambda a, b: a > 0,
    "eq": lambda a, b: a == b,
    "logical_and": lambda a, b: (a > 0) & (b > 0),
    "maximum": lambda a, b: torch.maximum(a, b),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "where_number": lambda a, b: torch.where(a > 0, a, 0.0),
    "clamp_number": lambda a, b: a.clamp(0),
    "clamp_tensor": lambda a, b: a.clamp(b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "bool_mul": lambda a, b: a * (b > 0),
    "int_add": lambda a, b: a.to(torch.int32) + b,
    "int_expanded_add": lambda a, b: a[..., :1].to(torch.int64).expand(a.shape) + b,
    "int_sliced_sin": lambda a, b: (a * 10).to(torch.int32)[..., ::2].sin(),
    "sliced_mul": lambda a, b: a[..., ::2] * b[..., ::2],
    "expanded_add": lambda a, b: a.expand(*[2 if n == 1 else n for n in a.shape]) + b.sum(),
    "empty_like": lambda a, b: torch.empty_like(a),
    "zeros_like": lambda a, b: torch.zeros_like(a),
    "full_like": lambda a, b: torch.full_like(a, 2.0),
    "rand_like": lambda a, b: torch.rand_like(a),
    "clone": lambda a, b: a.clone(),
    "contiguous": lambda a, b: a.contiguous(),
    "to_float64": lambda a, b: a.to(torch.float64),
    "masked_fill": lambda a, b: a.masked_fill(b > 0, 1.0),
    "softmax": lambda a, b: a.softmax(0),
    "log_softmax": lambda a, b: a.log_softmax(-1),
    "layer_norm": lambda a, b: F.layer_norm(a, a.shape[-1:]),
    "group_norm": lambda a, b: F.group_norm(a, 1) if a.dim() >= 2 else a,
    "norm": lambda a, b: a.norm(dim=-1, keepdim=True),
    "tril": lambda a, b: a.tril() if a.dim() > 1 else a,
    "flip": lambda a, b: a.flip(-1),
    "roll": lambda a, b: a.roll(1, -1),
    "sort": lambda a, b: a.sort(-1)[0],
    "index_put": lambda a, b: a.index_put((torch.tensor([0]),), torch.tensor(1.0)),
    # Ops whose kernels are not TensorIterators, or whose CPU path differs from meta's before any kernel runs.
    "batch_norm_training": lambda a, b: F.batch_norm(a, None, None, training=True) if a.dim() >= 2 else a,
    "conv1d": lambda a, b: F.conv1d(a, b.expand(2, a.shape[1], 1)) if a.dim() == 3 and b.dim() == 3 else a,
    "mse_loss": lambda a, b: F.mse_loss(a, b, reduction="none"),
    "smooth_l1_loss": lambda a, b: F.smooth_l1_loss(a, b, reduction="none"),
    "huber_loss": lambda a, b: F.huber_loss(a, b, reduction="none"),
    "soft_margin_loss": lambda a, b: F.soft_margin_loss(a, b, reduction="none"),
    "binary_cross_entropy": lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(), reduction="none"),
    "nan_to_num": lambda a, b: torch.nan_to_num(a),
    "mvlgamma": lambda a, b: torch.mvlgamma(a.abs() + 2, 2),
    "rrelu": lambda a, b: F.rrelu(a, training=False),
    "glu": lambda a, b: F.glu(torch.cat([a, a], -1)),
    "channel_shuffle": lambda a, b: F.channel_shuffle(torch.cat([a, a], 1), 2) if a.dim() >= 3 else a,
    "fft": lambda a, b: torch.fft.fft(a, dim=0),
    "fftn": lambda a, b: torch.fft.fftn(a),
    "rfftn": lambda a, b: torch.fft.rfftn(a),
    "irfftn": lambda a, b: torch.fft.irfftn(a.to(torch.complex64)),
    "hfft": lambda a, b: torch.fft.hfft(a.to(torch.complex64), dim=0),
}


def _layout(rng: random.Random, shape: list[int] | None = None) -> torch.Tensor:
    """A tensor of up to 4 dims, sizes 1-3, dims permuted; sometimes its size-1 dims get odd strides."""
    shape = shape or [rng.choice([1, 1, 2, 3]) for _ in range(rng.randint(1, 4))]
    perm = list(range(len(shape)))
    rng.shuffle(perm)
    t = torch.randn([shape[p] for p in perm]).permute([perm.index(i) for i in range(len(shape))])
    if rng.random() < 0.3:
        strides = [rng.choice([1, 2, 3, 6, 9]) if n == 1 else s for n, s in zip(shape, t.stride(), strict=True)]
        t = torch.randn(100).as_strided(shape, strides)
    return t


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.mark.parametrize("chunk", range(2))
def test_ops_on_meta_tensors_lay_out_their_outputs_as_on_the_cpu(chunk: int) -> None:
    rng = random.Random(chunk)
    checked, wrong = 0, []
    for _ in range(1500):
        a = _layout(rng)
        b = _layout(rng, list(a.shape)) if rng.random() < 0.7 else _layout(rng, [1] * a.dim())
        name = rng.choice(list(OPS))
        try:
            want = OPS[name](a, b)
        except (RuntimeError, ValueError):
            continue  # eager refuses these arguments
        with iterator_layouts("cpu"):
            have = OPS[name](_meta(a), _meta(b))
        checked += 1
        if have.stride() != want.stride():
            wrong.append(f"{name}{tuple(a.shape)}@{a.stride()}, {tuple(b.shape)}@{b.stride()}: "
                         f"meta {have.stride()}, cpu {want.stride()}")
    assert checked > 1000
    assert not wrong, "\n".join(wrong[:10])


_WEIGHT = torch.randn(4, 3, 3, 3)

# Ops on 4-d images (channels-last, contiguous or permuted), whose CPU kernels follow a channels-last input.
IMAGE_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "conv2d": lambda a: F.conv2d(a, _WEIGHT.to(a.device), padding=1),
    "conv2d_channels_last_weight": lambda a: F.conv2d(
        a, _WEIGHT.to(a.device).contiguous(memory_format=torch.channels_last), padding=1),
    "conv_transpose2d": lambda a: F.conv_transpose2d(a, _WEIGHT.to(a.device).transpose(0, 1)[:, :2]),
    "batch_norm": lambda a: F.batch_norm(a, torch.zeros(3, device=a.device), torch.ones(3, device=a.device)),
    "max_pool2d": lambda a: F.max_pool2d(a, 2),
    "avg_pool2d": lambda a: F.avg_pool2d(a, 2),
    "adaptive_avg_pool2d": lambda a: F.adaptive_avg_pool2d(a, 2),
    "interpolate": lambda a: F.interpolate(a, scale_factor=2),
    "bilinear": lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"),
    "cat": lambda a: torch.cat([a, a], 1),
    "roll": lambda a: a.roll(1, 2),
    "roll_dims": lambda a: a.roll((1, 2), (2, 3)),
    "pixel_shuffle": lambda a: F.pixel_shuffle(torch.cat([a] * 4, 1), 2),
    "hardswish": lambda a: F.hardswish(a),
    "logsigmoid": lambda a: F.logsigmoid(a),
    "prelu": lambda a: F.prelu(a, torch.full((3,), 0.1, device=a.device)),
    "floor_divide": lambda a: torch.floor_divide(a, 2),
    "add_bias": lambda a: a + torch.ones(3, 1, 1, device=a.device),
    "group_norm": lambda a: F.group_norm(a, 3, torch.ones(3, device=a.device)),
    "instance_norm": lambda a: F.instance_norm(a),
    "batch_norm_training": lambda a: F.batch_norm(a, None, None, training=True),
    "replicate_pad": lambda a: F.pad(a, (1, 0, 0, 1), mode="replicate"),
    "reflect_pad": lambda a: F.pad(a, (1, 0, 0, 1), mode="reflect"),
    "channel_shuffle": lambda a: F.channel_shuffle(torch.cat([a, a], 1), 2),
    "max_unpool2d": lambda a: F.max_unpool2d(*F.max_pool2d(a, 2, return_indices=True), 2),
    "rfft2": lambda a: torch.fft.rfft2(a),
}


def test_image_ops_on_meta_tensors_lay_out_their_outputs_as_on_the_cpu() -> None:
    rng = random.Random(0)
    wrong = []
    for _ in range(600):
        a = torch.randn(rng.choice([1, 2]), 3, rng.choice([1, 4, 5]), rng.choice([1, 4, 6]))
        kind = rng.choice(["channels_last", "contiguous", "permuted"])
        if kind == "channels_last":
            a = a.to(memory_format=torch.channels_last)
        elif kind == "permuted":
            a = a.transpose(2, 3).contiguous().transpose(2, 3)
        name = rng.choice(list(IMAGE_OPS))
        try:
            want = IMAGE_OPS[name](a)
        except (RuntimeError, ValueError):
            continue
        with iterator_layouts("cpu"):
            have = IMAGE_OPS[name](_meta(a))
        if have.stride() != want.stride():
            wrong.append(f"{name}({kind} {tuple(a.shape)}@{a.stride()}): meta {have.stride()}, cpu {want.stride()}")
    assert not wrong, "\n".join(wrong[:10])


def _stride_after_a_kernel(x: torch.Tensor) -> tuple[int, ...]:
    return (x.transpose(0, 2) * 1).stride()


def _write_through_contiguous_of_a_broadcast(x: torch.Tensor) -> torch.Tensor:
    y = x.transpose(0, 2) * 1
    z = y[:, :1].expand(1, 3, 3) * 1
    z.contiguous().add_(1)  # a copy where z is not contiguous, z itself where it is
    return z


def _view_of_a_like_factory(x: torch.Tensor) -> torch.Tensor:
    y = torch.zeros_like(x.transpose(0, 2))[:, :1].expand(1, 3, 3) * 1
    return y.view(-1) + 1  # eager views where y is contiguous and raises where not


def _as_strided_after_a_write_into_the_tensor_it_was_computed_from(x: torch.Tensor) -> torch.Tensor:
    y = x.transpose(0, 2) * 1
    y.flatten().sub_(1)  # functionalized: y's new value is rebuilt from the flat one, laid out contiguously
    z = (y[:, :1].expand(y.shape[0], 3, y.shape[2]) * 1).exp()
    return z.as_strided(z.shape, z.stride()) + 0  # reads z's memory as laid out from y's eager strides


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("program", [_as_strided_after_a_write_into_the_tensor_it_was_computed_from,
                                     _stride_after_a_kernel, _write_through_contiguous_of_a_broadcast,
                                     _view_of_a_like_factory])
def test_programs_whose_values_follow_a_size_one_dim_s_stride_match_eager(mode: str, program: Callable) -> None:
    jitted = minijit.jit(program, cache=mode)
    for shape in ((3, 1, 1), (3, 1, 1), (3, 2, 1)):
        x = torch.randn(shape)
        try:
            want = program(x.clone())
        except RuntimeError:
            with pytest.raises(minijit.MinijitError):
                jitted(x.clone())
            continue
        have = jitted(x.clone())
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(have, want)
        else:
            assert have == want


def _images() -> list[torch.Tensor]:
    return [torch.randn(2, 3, 5, 4).contiguous(memory_format=torch.channels_last), torch.randn(2, 3, 5, 4),
            torch.randn(1, 3, 6, 6).contiguous(memory_format=torch.channels_last)]


def _sequences() -> list[torch.Tensor]:
    return [torch.randn(2, 5, 3).transpose(1, 2), torch.randn(2, 3, 5)]


def _matrices() -> list[torch.Tensor]:
    return [torch.randn(4, 3), torch.randn(3, 4).t()]


# Ops whose CPU kernels lay out their outputs otherwise than torch's meta kernels do (each followed by
# `iterator_layouts`), and inputs that show it: channels-last images, a batch of sequences with channels innermost,
# a transform along dim 0 (MKL lays the transformed dim innermost, and orders dims of size 1 its own way).
_PRODUCERS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[], list[torch.Tensor]]]] = {
    "conv2d": (lambda x: F.conv2d(x, _WEIGHT, padding=1), _images),
    "group_norm": (lambda x: F.group_norm(x, 3), _images),
    "replicate_pad": (lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate"), _images),
    "channel_shuffle": (lambda x: F.channel_shuffle(torch.cat([x, x], 1), 2), _images),
    "batch_norm_training": (lambda x: F.batch_norm(x, None, None, training=True), _sequences),
    "conv1d": (lambda x: F.conv1d(x, torch.ones(4, 3, 2).transpose(1, 2).contiguous().transpose(1, 2)), _sequences),
    "max_pool1d": (lambda x: F.max_pool1d(x, 2), _sequences),
    "rfft": (lambda x: torch.fft.rfft(x, dim=0), _matrices),
    "ifft2": (lambda x: torch.fft.ifft2(x.to(torch.complex64), dim=(0, 1)), _matrices),
    "fft": (lambda x: torch.fft.fft(x, dim=0), lambda: [torch.randn(2, 3, 1), torch.randn(1, 3, 1)]),
    "eig": (lambda x: torch.linalg.eig(x)[1], lambda: [torch.randn(4, 4), torch.randn(2, 3, 3)]),  # LAPACK's order
    "svd": (lambda x: torch.linalg.svd(x, full_matrices=False)[2], lambda: [torch.randn(4, 3), torch.randn(2, 3, 4)]),
    "svd_full": (lambda x: torch.linalg.svd(x)[2], lambda: [torch.randn(3, 4), torch.randn(2, 3, 3)]),
    "svd_v": (lambda x: torch.svd(x)[2], lambda: [torch.randn(4, 3), torch.randn(2, 3, 4)]),  # Vh's adjoint
}


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("producer", list(_PRODUCERS))
def test_a_write_through_contiguous_lands_as_eager_after_an_op_with_its_own_layout(mode: str, producer: str) -> None:
    op, inputs = _PRODUCERS[producer]

    def program(x: torch.Tensor) -> torch.Tensor:
        y = op(x)
        y.contiguous().add_(1)  # a copy where the CPU's kernel laid y out otherwise, y itself where contiguously
        return y

    jitted = minijit.jit(program, cache=mode)
    for x in inputs():
        torch.testing.assert_close(jitted(x), program(x))


@pytest.mark.parametrize("producer", list(_PRODUCERS))
def test_a_view_after_an_op_with_its_own_layout_raises_as_eager(producer: str) -> None:
    op, inputs = _PRODUCERS[producer]

    def program(x: torch.Tensor) -> torch.Tensor:
        return op(x).view(-1)

    for x in inputs():
        try:
            want = program(x)
        except RuntimeError:
            with pytest.raises(minijit.MinijitError, match="view size is not compatible"):
                minijit.jit(program)(x)
            continue
        torch.testing.assert_close(minijit.jit(program)(x), want)


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("producer", list(_PRODUCERS))
def test_strides_read_after_an_op_with_its_own_layout_match_eager(mode: str, producer: str) -> None:
    op, inputs = _PRODUCERS[producer]

    def program(x: torch.Tensor) -> tuple[tuple[int, ...], bool]:
        y = op(x)
        return y.stride(), y.is_contiguous()

    jitted = minijit.jit(program, cache=mode)
    for x in inputs():
        assert jitted(x) == program(x)


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
@pytest.mark.parametrize("grad", [True, False])
def test_max_pool1d_lays_out_as_eager_with_grad_and_without(mode: str, grad: bool) -> None:
    """The CPU's 1-d max pool is a kernel of its own that writes contiguously, unless grad is asked for (then the
    2-d kernel with indices, whose output follows a channels-innermost input's layout)."""
    def program(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], bool]:
        y = F.max_pool1d(x, 2)
        s, c = y.stride(), y.is_contiguous()
        y.contiguous().add_(1)
        return y, s, c

    jitted = minijit.jit(program, cache=mode)
    for x in [*_sequences(), torch.randn(2, 8, 1).transpose(1, 2)]:
        x = x.detach().requires_grad_(grad)
        for outside in (torch.enable_grad, torch.no_grad):
            with outside():
                want, have = program(x), jitted(x)
            torch.testing.assert_close(have[0], want[0])
            assert have[1:] == want[1:]
