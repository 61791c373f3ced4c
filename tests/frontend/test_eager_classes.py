"""What traced code sees of a proxy's class and text is eager's: a tensor's class is torch.Tensor and a symbolic
number's is int or float, through `type()`, `.__class__` (functools.singledispatch dispatches on it), class
patterns of `match`, and `repr()` (a list of sizes formatted). Each function runs eagerly and jitted, with
cache="symbolic values" and "automatic", over several sizes and numbers, and its results must be equal.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minijit


@functools.singledispatch
def _kind(a: Any) -> str:
    return "object"


@_kind.register
def _(a: int) -> str:
    return "int"


@_kind.register
def _(a: float) -> str:
    return "float"


@_kind.register
def _(a: torch.Tensor) -> str:
    return "tensor"


class _Dispatching:
    @functools.singledispatchmethod
    def kind(self, a: Any) -> str:
        return "object"

    @kind.register
    def _(self, a: int) -> str:
        return "int"


def _classes(x: torch.Tensor, k: int) -> Any:
    n = x.shape[0]
    return (type(n) is int, n.__class__ is int, type(k) is int, k.__class__.__name__, type(k * 0.5) is float,
            x.__class__ is torch.Tensor, issubclass(type(n), int))


def _dispatch(x: torch.Tensor, k: int) -> Any:
    return _kind(x), _kind(k), _kind(x.shape[0]), _kind(k / 2), _Dispatching().kind(k), x * len(_kind(k))


def _match(x: torch.Tensor, k: int) -> Any:
    match {"k": k, "rows": x.shape[0]}:
        case {"k": 0 | 1 as low}:
            kind = f"low {low}"
        case {"k": int(high), "rows": int(rows)}:
            kind = f"high {high} {rows}"
        case _:
            kind = "other"
    return kind, x + 1


def _text(x: torch.Tensor, k: int) -> Any:
    sizes = tuple(x.shape)
    return repr(x.shape[0]), f"{k!r}", str([k, x.shape[0]]), repr((k, x.shape[-1])), f"{sizes}", f"{[k]}", x * 2


@pytest.mark.parametrize("cache", ["automatic", "symbolic values"])
@pytest.mark.parametrize("fn", [_classes, _dispatch, _match, _text])
def test_traced_code_sees_eagers_classes(fn: Callable[..., Any], cache: str) -> None:
    jitted = minijit.jit(fn, cache=cache)
    for rows, k in [(2, 0), (3, 1), (4, 2), (5, 3), (3, 7)]:
        x = torch.ones(rows, 3)
        got, want = jitted(x, k), fn(x, k)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert type(g) is type(w), (rows, k, g, w)
            assert torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w, (rows, k, g, w)


def test_a_tensors_shape_is_a_torch_size_where_its_sizes_are_constants():
    # Where no size is symbolic, `x.shape` is eager's torch.Size: its text, class and numel() (sizes that went
    # symbolic are a tuple of them: noted in docs/design.md).
    def f(x):
        s = x.shape
        return x + 1, [str(s), f"{s}", repr(s[1:]), isinstance(s, torch.Size), type(s).__name__, s.numel(),
                       x.size() == s, str(x.T.shape)]

    jf = minijit.jit(f, cache="constant values")
    for shape in [(2, 3), (4, 3, 1)]:
        x = torch.ones(shape)
        assert jf(x)[1] == f(x)[1]


def test_a_torch_size_built_of_symbolic_sizes_is_taken_as_a_shape() -> None:
    # Dynamo's graphs build shapes so (GPT-2's Conv1D under torch.compile(backend="minijit") with dynamic shapes):
    # a tuple of the sizes, as `x.shape` is once they went symbolic; eager's errors for a size that is no int.
    def f(x):
        size = torch.Size([x.shape[0] * 2, x.shape[1] // 2])
        return x.view(size) + 1, x.view(torch.Size(d for d in x.shape[::-1])), tuple(size)

    jf = minijit.jit(f, cache="symbolic values")
    for rows in (2, 3, 5):
        x = torch.randn(rows, 4)
        got, want = jf(x), f(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
    with pytest.raises(TypeError):
        minijit.jit(lambda x: torch.Size([x.shape[0] / 2]), cache="symbolic values")(torch.ones(4, 2))
