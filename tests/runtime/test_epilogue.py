"""The epilogue (minijit.runtime.epilogue): what a call runs around its compiled trace, generated, printed, and equal
to eager."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

import minijit
from minijit.errors import InplaceError


class _Box:
    pass


BOX = _Box()
SCALE = torch.randn(3)


def _effects(x: torch.Tensor, y: torch.Tensor, seen: list[Any]) -> dict[str, torch.Tensor]:
    x.mul_(2)  # a write into an input: its version counter is bumped, as eager's is
    BOX.out = x * SCALE  # SCALE is captured from outside; the setattr is replayed
    seen.append(y)  # an input stored as itself
    return {"sum": x + y, "y": y}  # the result rebuilt around the call's tensors, y as itself


def _code_of(printed: str, name: str) -> Any:
    """The code object of the function `name` in the printed source (a method of a class in it too)."""
    codes = [compile(printed, "<printed epilogue>", "exec")]
    for code in codes:
        codes += [c for c in code.co_consts if hasattr(c, "co_code")]
    return next(c for c in codes if c.co_name == name)


def test_show_prints_the_epilogue_and_it_is_the_source_that_runs() -> None:
    jf = minijit.jit(_effects)
    jf(torch.randn(3), torch.randn(3), [])
    out = io.StringIO()
    minijit.show(jf, "epilogue", file=out)
    printed = out.getvalue()
    entry = jf.last_entry()
    assert entry.computation.__minijit_source__ == printed == jf.last_epilogue()
    assert _code_of(printed, "call").co_code == entry.computation.__code__.co_code
    # Each step the closures made is a line of it now.
    for step in ("SCALE", ".is_inference()", "_bump((x,))", "_replay(", ".rebuild("):
        assert step in printed, step


@pytest.mark.parametrize("call", range(3))
def test_an_entry_that_writes_stores_and_rebuilds_does_what_eager_does(call: int) -> None:
    jf = minijit.jit(_effects)
    for _ in range(call + 1):  # the first call compiles, the others hit
        x, y = torch.randn(3), torch.randn(3)
        xe, seen, seen_e = x.clone(), [], []
        got = jf(x, y, seen)
        x_version = x._version
        want = _effects(xe, y, seen_e)
        torch.testing.assert_close(BOX.out, xe * SCALE)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, xe)
        assert got["y"] is y and seen[0] is y and len(seen) == len(seen_e)
        assert x_version > 0 and (x_version > 0) == (xe._version > 0)


def test_a_write_into_an_inference_tensor_is_refused_before_anything_runs() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        BOX.before = x + 1
        x.add_(1)
        return x

    jf = minijit.jit(f)
    jf(torch.randn(3))
    with torch.inference_mode():
        x = torch.randn(3)
    with pytest.raises(RuntimeError, match="inference"):
        f(x)  # eager refuses it too
    BOX.before = None
    kept = x.clone()
    with pytest.raises(InplaceError, match="inference_mode"):
        jf(x)
    assert BOX.before is None  # nothing of the call was replayed
    torch.testing.assert_close(x, kept)


@pytest.mark.parametrize("which", [0, 4])
def test_a_write_into_one_of_many_inputs_made_under_inference_mode_is_refused_naming_it(which: int) -> None:
    # Five written inputs: asked about all at once first, then one by one for the one to name.
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, e: torch.Tensor) -> None:
        for t in (a, b, c, d, e):
            t.mul_(2)

    jf = minijit.jit(f)
    jf(*[torch.randn(3) for _ in range(5)])
    tensors = [torch.randn(3) for _ in range(5)]
    with torch.inference_mode():
        tensors[which] = torch.randn(3)
    with pytest.raises(RuntimeError, match="inference"):
        f(*[t.clone() if i != which else t for i, t in enumerate(tensors)])  # eager refuses it too
    kept = [t.clone() for t in tensors]
    with pytest.raises(InplaceError, match=f"into {'abcde'[which]}, a tensor made under torch.inference_mode"):
        jf(*tensors)
    for t, k in zip(tensors, kept, strict=True):  # nothing was written
        torch.testing.assert_close(t, k)
    ran = [torch.randn(3) for _ in range(5)]  # and no inference tensor: the call runs
    want = [t * 2 for t in ran]
    jf(*ran)
    for t, w in zip(ran, want, strict=True):
        torch.testing.assert_close(t, w)


def test_a_split_entry_prints_its_forward_and_call_and_differentiates_as_eager() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        BOX.w = w * SCALE
        return (x * w).sin().sum()

    jf = minijit.jit(f)
    x = torch.randn(3)
    w = torch.randn(3, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    jf(x, w).backward()
    got_box = BOX.w
    f(x, we).backward()
    torch.testing.assert_close(w.grad, we.grad)
    torch.testing.assert_close(got_box, BOX.w)
    printed = jf.last_epilogue()
    entry = jf.last_entry()
    assert entry.computation.__minijit_source__ == printed
    assert _code_of(printed, "forward").co_code == entry.epilogue.env["_JitFunction"].forward.__code__.co_code
    assert _code_of(printed, "call").co_code == entry.computation.__code__.co_code


def _penalty(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).tanh().sum()


def test_a_split_entry_prints_its_backward_and_the_node_runs_it_as_eager_does() -> None:
    jf = minijit.jit(_penalty)
    x = torch.randn(4, 3, dtype=torch.float64)
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    out = jf(x, w)
    printed = jf.last_epilogue()
    node = jf.last_entry().epilogue.env["_JitFunction"]
    # The autograd node of the call is the printed Function's, and its backward is the printed one.
    assert type(out.grad_fn)._forward_cls is node
    assert _code_of(printed, "backward").co_code == node.backward.__code__.co_code
    for step in ("_JitFunction.apply(", "def backward(", "with _no_autocast():", "_backward(", "_grad_enabled()"):
        assert step in printed, step
    # Its gradients, and those of a double backward (create_graph=True), are eager's.
    (g,) = torch.autograd.grad(out, w, create_graph=True)
    (ge,) = torch.autograd.grad(_penalty(x, we), we, create_graph=True)
    torch.testing.assert_close(g, ge)
    torch.testing.assert_close(torch.autograd.grad(g.square().sum(), w), torch.autograd.grad(ge.square().sum(), we))


def test_an_entry_with_nothing_to_differentiate_makes_no_node_as_eager() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * w.detach()

    jf = minijit.jit(f)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    got, want = jf(x, w), f(x, w)
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad and got.grad_fn is None
    assert "apply(" not in jf.last_epilogue() and "_no_grad()" in jf.last_epilogue()


def test_nothing_runs_around_a_trace_with_nothing_to_do() -> None:
    jf = minijit.jit(lambda x: x + 1)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), x + 1)
    entry = jf.last_entry()
    assert entry.computation is entry.epilogue.trace  # no frame on the hit path
    assert "Nothing runs around" in jf.last_epilogue()


def test_inputs_named_like_the_epilogue_s_own_names_keep_their_values() -> None:
    def f(out: torch.Tensor, result: torch.Tensor, _trace: torch.Tensor, values: list[Any]) -> Any:
        out.add_(1)
        values.append(result)
        BOX.leaves = _trace * 2
        return out, result

    jf = minijit.jit(f)
    args = [torch.randn(3) for _ in range(3)]
    eager_args = [a.clone() for a in args]
    got, want = jf(*args, []), f(*eager_args, [])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(BOX.leaves, eager_args[2] * 2)
    assert got[1] is args[1]


class _Scale:
    def __init__(self, k: float):
        self.k = k


def _cholesky_or_zeros(x: torch.Tensor, scale: _Scale) -> torch.Tensor:
    try:
        y = torch.linalg.cholesky(x) * scale.k
    except RuntimeError:
        y = x * 0
    return y


def test_an_entry_rebound_to_new_objects_keeps_the_eager_fallback_of_ops_in_a_try() -> None:
    jf = minijit.jit(_cholesky_or_zeros)
    jf(torch.eye(2), _Scale(2.0))
    bad = -torch.eye(2)
    got = jf(bad, _Scale(2.0))  # a new object: the entry is moved to it, its epilogue with it
    assert minijit.cache_info(jf).rebound == 1
    torch.testing.assert_close(got, _cholesky_or_zeros(bad, _Scale(2.0)))
    assert minijit.cache_info(jf).eager_calls == 1
