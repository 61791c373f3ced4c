"""Strides on proxies: layout-dependent ops (view, reshape, contiguous, as_strided) follow eager torch.

Each program runs on contiguous and non-contiguous inputs (`t()`, slices with steps,
expand, permute), eagerly and under `minijit.jit`: the same values and the same strides,
or the same error (eager raises -> jit raises a MinijitError naming the user's line).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import minijit
from minijit.errors import MinijitError
from tests.oputil import assert_refused_as_eager


def make_input(layout: str) -> torch.Tensor:
    """A (4, 6) float tensor with the memory layout `layout`, over a base tensor of its own."""
    if layout == "t":
        return torch.arange(24.0).reshape(6, 4).t()
    if layout == "step_slice":
        return torch.arange(48.0).reshape(4, 12)[:, ::2]
    if layout == "expand":
        return torch.arange(6.0).reshape(1, 6).expand(4, 6)
    if layout == "permute":
        return torch.arange(24.0).reshape(6, 1, 4).permute(2, 1, 0).squeeze(1)
    if layout == "offset":
        return torch.arange(30.0).reshape(5, 6)[1:]
    return torch.arange(24.0).reshape(4, 6)


LAYOUTS = ["contiguous", "t", "step_slice", "expand", "permute", "offset"]

PROGRAMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "view_flat": lambda x: x.view(-1),
    "view_split": lambda x: x.view(2, 2, 6),
    "view_merge_rows": lambda x: x.view(4, 2, 3),
    "view_as": lambda x: x.view_as(torch.empty(24)),
    "t_view": lambda x: x.t().view(-1),
    "t_view_back": lambda x: x.t().view(6, 4),
    "transpose_view": lambda x: x.transpose(0, 1).view(3, 8),
    "step_view": lambda x: x[:, ::2].view(-1),
    "column_view": lambda x: x[:, 1:3].view(-1),
    "add_then_view": lambda x: (x + 1).view(-1),
    "t_add_then_view": lambda x: (x.t() * 2).view(-1),
    "permute_view": lambda x: x.unsqueeze(0).permute(2, 0, 1).view(6, 4),
    "expand_view": lambda x: x[:, :1].expand(4, 3).view(-1),
    "reshape_flat": lambda x: x.reshape(-1),
    "t_reshape": lambda x: x.t().reshape(-1),
    "step_reshape": lambda x: x[:, ::2].reshape(2, 6),
    "flatten": lambda x: x.flatten(),
    "contiguous": lambda x: x.contiguous(),
    "t_contiguous": lambda x: x.t().contiguous(),
    "t_contiguous_view": lambda x: x.t().contiguous().view(-1),
    "as_strided": lambda x: x.as_strided((3, 2), (1, 2)),
    "t_as_strided": lambda x: x.t().as_strided((2, 3), (3, 1)),
    "slice_as_strided": lambda x: x[1:].as_strided((2, 2), (2, 1)),
    "computed_as_strided": lambda x: (x.t() * 2).as_strided((2, 3), (1, 4)),
    "elementwise": lambda x: x * 3 - 1,
    "t_elementwise": lambda x: torch.sin(x.t()),
    "sum_keepdim": lambda x: x.sum(dim=0, keepdim=True),
}


def _run(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> tuple[str, object]:
    try:
        return "ok", fn(*args)
    except RuntimeError as e:  # a MinijitError is not a RuntimeError: it fails the comparison below
        return "raised", e


def _shares_memory(out: torch.Tensor, x: torch.Tensor) -> bool:
    return out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def _check(program: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """`program(x)` under jit gives eager's values, strides and aliasing of x, or eager's error."""
    expected_kind, expected = _run(program, x)
    jitted = minijit.jit(program)
    if expected_kind == "raised":
        with pytest.raises(MinijitError) as info:
            jitted(x)
        assert str(expected).splitlines()[0] in str(info.value)
        assert "test_strides.py:" in str(info.value)  # the user's line
        return
    got = jitted(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert got.stride() == expected.stride()
    assert got.storage_offset() == expected.storage_offset() or not _shares_memory(expected, x)
    assert _shares_memory(got, x) == _shares_memory(expected, x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_layout_program_like_eager(name: str, layout: str) -> None:
    _check(PROGRAMS[name], make_input(layout))


# -- writes through reshape and contiguous: eager's copy-or-view decides what the input sees --------

def _write_through(op: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def program(x: torch.Tensor) -> torch.Tensor:
        y = op(x)
        y.add_(100)
        return y * 1
    return program


WRITES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "reshape": lambda x: x.reshape(-1),
    "flatten": lambda x: x.flatten(),
    "contiguous": lambda x: x.contiguous(),
    "t_reshape": lambda x: x.t().reshape(24),
    "computed_t_reshape": lambda x: (x.t() + 0).reshape(-1),
    "computed_reshape": lambda x: (x + 0).reshape(-1),
}


@pytest.mark.parametrize("layout", ["contiguous", "t", "step_slice", "offset"])
@pytest.mark.parametrize("name", list(WRITES))
def test_write_through_copy_or_view_like_eager(name: str, layout: str) -> None:
    program = _write_through(WRITES[name])
    x_eager, x_jit = make_input(layout), make_input(layout)
    expected = program(x_eager)
    got = minijit.jit(program)(x_jit)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(x_jit, x_eager, rtol=0, atol=0)  # the input written where eager wrote it


# -- the cache: a layout the trace relied on is part of the entry's guard -------------------------------

def test_view_of_differently_strided_input_misses_and_raises() -> None:
    jf = minijit.jit(lambda x: x.view(-1) * 2)
    torch.testing.assert_close(jf(make_input("contiguous")), make_input("contiguous").view(-1) * 2)
    with pytest.raises(RuntimeError) as eager:
        make_input("t").view(-1)
    with pytest.raises(MinijitError, match="view size is not compatible") as info:
        jf(make_input("t"))  # same shape, dtype and device: only the strides differ
    assert str(eager.value).splitlines()[0] in str(info.value)
    assert minijit.cache_info(jf).misses == 2


def test_layout_free_trace_does_not_guard_strides() -> None:
    jf = minijit.jit(lambda x: torch.sin(x) + 1)
    for layout in ("contiguous", "t", "step_slice"):
        x = make_input(layout)
        got, expected = jf(x), torch.sin(x) + 1
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride()
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (1, 2)


def test_reshape_write_retraces_for_a_non_contiguous_input() -> None:
    program = _write_through(WRITES["reshape"])
    jf = minijit.jit(program)
    for layout in ("contiguous", "t", "contiguous"):
        x_eager, x_jit = make_input(layout), make_input(layout)
        torch.testing.assert_close(jf(x_jit), program(x_eager))
        torch.testing.assert_close(x_jit, x_eager)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 1)
    assert "stride" in info.miss_reasons[1] or "contiguous" in info.miss_reasons[1]


def test_layout_queries_like_eager() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        y = x.t() * 2
        return x * x.stride(0) + y.stride()[1] + int(y.is_contiguous()) + x[1:].storage_offset()
    for layout in LAYOUTS:
        x = make_input(layout)
        torch.testing.assert_close(minijit.jit(program)(x), program(x))


def _one_head(canonical: bool) -> torch.Tensor:
    """A (2, 1, 8, 16) tensor torch calls contiguous: the stride of its dim of size 1 is 128 (as torch makes it) or
    16 (a transposed (2, 8, 1, 16) tensor, as a kernel may lay out a cache of one key/value head)."""
    return torch.randn(2, 1, 8, 16) if canonical else torch.randn(2, 8, 1, 16).transpose(1, 2)


@pytest.mark.parametrize("mode", ["constant values", "symbolic values", "automatic"])
def test_a_stride_read_on_a_dim_of_size_one_is_each_calls_own(mode: str) -> None:
    """Layouts that differ only in the stride of a dim of size 1 are alike for what the trace computes, but a
    program that reads that stride (or the dims' order, whose ties it breaks) reads each call's own, as eager."""
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * x.stride(1) + x.transpose(1, 2).stride(2) + sum(i * d for i, d in enumerate(x.dim_order()))
    jitted = minijit.jit(program, cache=mode)
    for canonical in (True, False, True, False):
        x = _one_head(canonical)
        torch.testing.assert_close(jitted(x), program(x))


# -- symbolic sizes: a view of a contiguous tensor holds at every size ---------------------------------

def test_symbolic_sizes_view_reuses_the_trace_and_still_raises() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1) + 1
    jf = minijit.jit(program, cache="symbolic values")
    for n in (3, 5, 8):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jf(x), program(x))
    assert (minijit.cache_info(jf).misses, minijit.cache_info(jf).hits) == (1, 2)
    x = torch.randn(4, 6).t()
    assert_refused_as_eager(jf, program, x)


def test_layouts_of_tensors_the_function_creates() -> None:
    def program(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
        m = torch.full((4, 3), 2.0).t()
        s = torch.empty_strided((2, 3), (1, 2))
        return m.contiguous().view(-1) + x.sum(), m.stride(), s.stride()
    x = torch.randn(3)
    got, expected = minijit.jit(program)(x), program(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1:] == expected[1:]


def _reshape_then_write(x: torch.Tensor) -> torch.Tensor:
    y = x.reshape(-1)
    y.add_(100)
    return y * 1


def _step_slice_reshape_then_write(x: torch.Tensor) -> torch.Tensor:
    y = x[:, ::2].reshape(-1)  # a view where x's last size is 1 or 2, a copy otherwise
    y.add_(100)
    return y * 1


@pytest.mark.parametrize("fn, inputs", [
    (_reshape_then_write, [lambda: torch.randn(4, 6), lambda: torch.randn(6, 4).t(), lambda: torch.randn(5, 7)]),
    (_step_slice_reshape_then_write, [lambda: torch.randn(3, 8), lambda: torch.randn(3, 2), lambda: torch.randn(3, 7),
                                      lambda: torch.randn(4, 4)]),
])
def test_symbolic_sizes_copy_or_view_with_writes_like_eager(fn: Callable[[torch.Tensor], torch.Tensor],
                                                           inputs: list[Callable[[], torch.Tensor]]) -> None:
    # With symbolic sizes, a copy-or-view decision taken at one size must not be reused at sizes
    # where eager decides otherwise (found in review: the write reached x, or did not, wrongly).
    jf = minijit.jit(fn, cache="symbolic values")
    for make in inputs:
        x = make()
        x_eager = torch.empty_strided(x.shape, x.stride()).copy_(x)
        x_jit = torch.empty_strided(x.shape, x.stride()).copy_(x)
        torch.testing.assert_close(jf(x_jit), fn(x_eager), rtol=0, atol=0)
        torch.testing.assert_close(x_jit, x_eager, rtol=0, atol=0)


def test_symbolic_sizes_layout_query_holds_for_its_sizes_only() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)[:: x.stride(0)]  # the stride, a Python int, is the row length

    jf = minijit.jit(fn, cache="symbolic values")
    for shape in [(3, 8), (4, 5), (3, 8)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)


def _merge_a_slice(x: torch.Tensor) -> torch.Tensor:
    return x[:, :4].view(-1) * 2  # viewable only where x's last size is 4


def _merge_a_transposed_slice(x: torch.Tensor) -> torch.Tensor:
    return x.t()[1:].view(-1) + 1  # viewable only where x has one column left, or one row


def _split_a_chunk(x: torch.Tensor) -> torch.Tensor:
    a, _ = x.split(4, -1)
    return a.view(x.shape[0], 2, 2) * 3  # splitting a dimension: viewable at every size


def _split_heads_of_a_chunk(x: torch.Tensor) -> torch.Tensor:
    # Hugging Face GPT-2's attention: a chunk of the fused projection viewed as heads, the heads' count as -1.
    q, k = x.split(8, dim=2)
    return k.view((*k.shape[:-1], -1, 4)).transpose(1, 2) * 3 + q.sum()


@pytest.mark.parametrize("fn, shapes", [
    (_merge_a_slice, [(3, 4), (3, 8), (5, 4), (2, 6)]),
    (_split_heads_of_a_chunk, [(2, 3, 16), (2, 5, 16), (3, 7, 16)]),
    (_merge_a_transposed_slice, [(1, 3), (4, 2), (2, 2), (5, 2)]),
    (_split_a_chunk, [(3, 8), (5, 8), (7, 8)]),
])
def test_symbolic_sizes_view_raises_where_eager_does(fn: Callable[[torch.Tensor], torch.Tensor],
                                                     shapes: list[tuple[int, ...]]) -> None:
    # A view whose possibility changes with the sizes holds for the sizes it was traced at only:
    # at other sizes the call traces again, and raises where eager raises.
    jf = minijit.jit(fn, cache="symbolic values")
    for shape in shapes:
        x = torch.randn(*shape)
        try:
            expected = fn(x)
        except RuntimeError as eager:
            with pytest.raises(MinijitError) as info:
                jf(x)
            assert str(eager).splitlines()[0] in str(info.value)
            continue
        torch.testing.assert_close(jf(x), expected)
    if fn in (_split_a_chunk, _split_heads_of_a_chunk):
        assert minijit.cache_info(jf).misses == 1  # splits hold at every size: one trace


def test_layout_through_a_move_to_a_device_matches_eager() -> None:
    # x.to(device=d) is replayed on meta tensors with the device as meta: the layout stays known.
    import minijit

    def f(x):
        y = x.t().to(device=x.device, dtype=torch.float64)
        return y.stride(), y.view(-1) if y.is_contiguous() else y.reshape(-1)

    x = torch.randn(3, 4)
    want, have = f(x), minijit.jit(f)(x)
    assert have[0] == want[0]
    torch.testing.assert_close(have[1], want[1])


def _flat_memory(y: torch.Tensor) -> torch.Tensor:
    """y's elements in the order they sit in memory from its first (`as_strided` reads the storage)."""
    return y.as_strided((y.numel(),), (1,)) + 0


@pytest.mark.parametrize("mode", ["constant values", "symbolic values"])
def test_as_strided_reads_a_kernel_s_result_laid_out_as_eager_s(mode: str) -> None:
    # `y.sum(-1, keepdim=True) + y` could be computed into the buffer of y (a transposed layout); eager lays
    # the sum out contiguously, and `as_strided` reads its memory in that order.
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = (x.transpose(0, 1) * 0.1).exp()
        return _flat_memory((y.sum(-1, keepdim=True) + y) * 2)

    jf = minijit.jit(fn, cache=mode)
    for shape in ((2, 4, 3), (3, 5, 2), (2, 4, 3)):
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), fn(x))


def test_contiguous_is_a_no_op_only_where_eager_s_is() -> None:
    # Whether `contiguous()` copies depends on the sizes here (a size-1 dim's stride does not count; a slice
    # is contiguous where it keeps whole rows): a trace that skipped the copy is not reused where eager copies.
    def transposed(x: torch.Tensor) -> torch.Tensor:
        return _flat_memory((x * 2).transpose(1, 2).contiguous())

    def sliced(x: torch.Tensor) -> torch.Tensor:
        return _flat_memory(x[:, :2].contiguous())

    for fn, shapes in ((transposed, [(2, 1, 2), (2, 3, 2), (3, 1, 4), (2, 4, 1)]),
                       (sliced, [(3, 2), (4, 2), (3, 5), (2, 2)])):
        jf = minijit.jit(fn, cache="symbolic values")
        for shape in shapes:
            x = torch.randn(shape)
            torch.testing.assert_close(jf(x), fn(x))


@pytest.mark.parametrize("write", ["mul_", "reshape(...).mul_"])
def test_as_strided_reads_the_contiguous_copy_of_a_view_of_a_tensor_written_before(write: str) -> None:
    """`contiguous()` of a transpose copies; after an in-place write into the transposed tensor, functionalizing
    records it again on the written value, where its layout is not known: it stays a copy, and `as_strided` reads
    the copy's memory, not the transpose's (found by the layout fuzzer, seed 1553)."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        if write == "mul_":
            y.mul_(2)
        else:
            y.reshape(y.shape[0], -1).mul_(2)
        y = y.transpose(0, 2).contiguous()
        return y.as_strided(y.shape, y.stride(), y.storage_offset()) + 0

    for shape in [(2, 1, 2), (3, 2, 4)]:
        x = torch.randn(shape)
        torch.testing.assert_close(minijit.jit(fn)(x), fn(x))


def test_as_strided_reads_a_copy_that_is_not_folded_into_its_source() -> None:
    # `contiguous()` then `clone()` of a strided slice are copies of its values: as values they could be
    # dropped, but `as_strided` reads the copy's memory, which the slice's is not.
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x[:, ::2].contiguous().clone()
        return y.as_strided(y.shape, y.stride(), y.storage_offset()) + 0

    x = torch.randn(2, 4, 4)
    torch.testing.assert_close(minijit.jit(fn)(x), fn(x))


@pytest.mark.parametrize("op", ["contiguous", "clone"])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_contiguous_copy_under_autograd_is_laid_out_as_eager_s(op: str, fmt: str, requires_grad: bool) -> None:
    """Under autograd `contiguous()` and `clone(memory_format=...)` run decomposed: their copy was a same-dtype
    conversion, which keeps the input's layout (the result was the transpose's strides, and `as_strided` read the
    wrong elements). The copy is laid out in the memory format asked for, its gradient passed through, as eager's."""
    memory_format = torch.contiguous_format if fmt == "contiguous" else torch.channels_last

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = getattr((x * 2).transpose(1, 3), op)(memory_format=memory_format)
        return y, y.as_strided((2, 3), (1, 2)) * 1

    x = torch.randn(2, 3, 4, 5, requires_grad=requires_grad)
    want, got = fn(x), minijit.jit(fn)(x)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
        assert g.stride() == w.stride()
    if requires_grad:
        weights = torch.randn(want[0].shape)
        want_grad = torch.autograd.grad((want[0] * weights).sum() + want[1].sum(), x)
        got_grad = torch.autograd.grad((got[0] * weights).sum() + got[1].sum(), x)
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["zeros_like", "zeros_like_read", "masked_fill", "flip"])
def test_as_strided_under_autograd_reads_eager_s_layout_of_a_decomposed_op(op: str) -> None:
    """Under autograd the forward ran these ops as prims, which the torch executor lays out otherwise than eager's
    op (`flip`, `masked_fill` as `where`, an add of `zeros_like`'s row-major `full`): `as_strided` read the wrong
    elements. An op whose result's layout is read runs as eager's, differentiated by torch's autograd."""
    ops = {"zeros_like": lambda y: torch.zeros_like(y) + y, "zeros_like_read": torch.zeros_like,
           "masked_fill": lambda y: y.masked_fill(y > 5, 0.0), "flip": lambda y: y.flip(0)}

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = ops[op]((x * 2).t())
        return y.as_strided((2, 2), (1, 2)) * x[0, 1]

    x = torch.arange(12.0).reshape(3, 4).requires_grad_(True)
    want, got = fn(x), minijit.jit(fn)(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weights = torch.randn(want.shape)
    torch.testing.assert_close(torch.autograd.grad((got * weights).sum(), x),
                               torch.autograd.grad((want * weights).sum(), x), rtol=0, atol=0)


def test_a_second_compile_reuses_the_order_only_answers_and_behaves_as_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which inputs an op's output layout depends on only through their order (`strides._order_only_inputs`) is
    answered once per op and argument layouts in a process: a second function alike replays nothing, and
    serves, misses and raises on the same calls as the first, and as eager."""
    from minijit.ops import strides

    replays: list[object] = []
    original = strides._loose_candidates
    monkeypatch.setattr(strides, "_loose_candidates", lambda *a: replays.append(a[0]) or original(*a))
    monkeypatch.setattr(strides, "_ORDER_ONLY_SEEN", {})

    def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * 2 + y).view(-1)

    calls = [
        (torch.arange(24.0).reshape(4, 6), torch.ones(4, 6)),
        (torch.arange(28.0).reshape(4, 7)[:, :6], torch.ones(4, 6)),  # row-major with gaps: the same layout out
        (torch.arange(24.0).reshape(6, 4).t(), torch.ones(6, 4).t()),  # transposed: eager's view raises
    ]
    infos = []
    for round_ in range(2):
        jf = minijit.jit(program)
        for x, y in calls:
            try:
                want = program(x, y)
            except RuntimeError as error:
                with pytest.raises(MinijitError, match="view size is not compatible"):
                    jf(x, y)
                assert "view size" in str(error)
                continue
            torch.testing.assert_close(jf(x, y), want)
        info = minijit.cache_info(jf)
        infos.append((info.hits, info.misses))
        if round_ == 0:
            assert replays, "the first compile worked its answers out"
            replays.clear()
    assert not replays, "the second compile replayed what the first had answered"
    assert infos[0] == infos[1] and infos[0][0] >= 1, infos
