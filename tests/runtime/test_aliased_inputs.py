"""Inputs that share memory, detected at call time: the same tensor twice, views, and mutation."""

import pytest
import torch

import minijit


def _write_then_read(a, b):
    a.mul_(2).add_(1)
    return (b * 3).sin()


def _run(alias):
    torch.manual_seed(0)
    x = torch.randn(4)
    return {"none": (x, torch.randn(4)), "same": (x, x)}[alias]


@pytest.mark.parametrize("order", [("none", "same", "none"), ("same", "none", "same")])
def test_same_tensor_twice_matches_eager_and_is_guarded(order):
    jf = minijit.jit(_write_then_read)
    for alias in order:
        (a, b), (ea, eb) = _run(alias), _run(alias)
        torch.testing.assert_close(jf(a, b), _write_then_read(ea, eb))
        torch.testing.assert_close(a, ea)
    info = minijit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 1)
    assert "inputs share memory differently" in info.miss_reasons[1]


def test_overlapping_views_written_in_place_are_refused():
    x = torch.randn(4)
    with pytest.raises(minijit.AliasError, match="overlap in memory without being the same view"):
        minijit.jit(_write_then_read)(x, x[1:3])


def test_aliasing_does_not_matter_without_writes():
    def f(a, b):
        return a * b + 1

    jf = minijit.jit(f)
    x = torch.randn(4)
    torch.testing.assert_close(jf(x, x), f(x, x))
    torch.testing.assert_close(jf(x, x[:4]), f(x, x[:4]))
    y = torch.randn(4)
    torch.testing.assert_close(jf(x, y), f(x, y))
    assert minijit.cache_info(jf).misses == 1
