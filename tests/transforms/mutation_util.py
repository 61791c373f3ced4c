"""Helpers for mutation tests: run a function eagerly and under jit on clones, and check final traces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import minijit
from minijit.ir import Proxy, Trace, tree_iter

# Ops whose output may share memory with an input when run by torch (an independent,
# deliberately simple list; the code under test has its own).
_ALIASING = {"reshape", "transpose", "t", "permute", "slice", "squeeze", "unsqueeze", "broadcast_in_dim",
             "expand", "view", "getitem", "select", "narrow", "split", "chunk", "unbind", "flatten",
             "movedim", "T", "mT", "diagonal", "expand_as", "view_as", "reshape_as", "contiguous",
             "detach", "unflatten", "ravel", "broadcast_to", "tensor_split", "swapaxes", "real", "imag",
             "convert_element_type", "prims_transpose", "prims_reshape", "prims_squeeze"}


def tensors_in(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_iter(x) if isinstance(t, torch.Tensor)]


def run_both(fn: Callable[..., Any], *args: Any, **jit_kwargs: Any) -> tuple[Any, minijit.runtime.JitFunction]:
    """Run `fn` eagerly and jitted on clones of `args`; assert outputs and final inputs match."""
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    jit_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = fn(*eager_args)
    jf = minijit.jit(fn, **jit_kwargs)
    got = jf(*jit_args)
    assert_same(got, expected)
    for i, (e, j) in enumerate(zip(eager_args, jit_args, strict=True)):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(j, e, rtol=1e-6, atol=1e-6, equal_nan=True,
                                       msg=lambda m, i=i: f"input {i} after the call differs: {m}")
    return got, jf


def assert_same(got: Any, expected: Any) -> None:
    g, e = tensors_in(got), tensors_in(expected)
    assert len(g) == len(e)
    for a, b in zip(g, e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)


def copies_per_input(trace: Trace) -> dict[str, int]:
    """Input name -> how many copy_to_out_ write into it; also asserts copies only target inputs."""
    inputs = {p.name for p in trace.args}
    counts: dict[str, int] = {}
    for bsym in trace.bound_symbols:
        if bsym.sym.name == "copy_to_out_":
            out = bsym.kwargs["out"]
            assert out.name in inputs, f"copy_to_out_ into the intermediate {out.name}"
            counts[out.name] = counts.get(out.name, 0) + 1
    return counts


def assert_reads_precede_copies(trace: Trace) -> None:
    """Every read of an input's old value (the input, or an alias made from it) precedes the copy into it."""
    derived: dict[int, set[str]] = {id(p): {p.name} for p in trace.args}
    copy_at: dict[str, int] = {}
    for i, bsym in enumerate(trace.bound_symbols):
        name = bsym.sym.name
        if name == "copy_to_out_":
            copy_at.setdefault(bsym.kwargs["out"].name, i)
        if name in _ALIASING and "out" not in bsym.kwargs:
            srcs = set().union(*(derived.get(id(p), set()) for p in bsym.proxy_args()))
            for o in bsym.proxy_outputs():
                derived[id(o)] = srcs
    for i, bsym in enumerate(trace.bound_symbols):
        reads = [p for k, v in [("args", bsym.args), *bsym.kwargs.items()] if k != "out" for p in tree_iter(v)
                 if isinstance(p, Proxy)]
        for p in reads:
            for name in derived.get(id(p), ()):
                if name in copy_at and i > copy_at[name]:
                    raise AssertionError(f"bound symbol {i} ({bsym.sym.id}) reads {p.name}, an alias of {name}'s "
                                         f"old value, after the copy into {name}:\n{trace}")
    for p in tree_iter(trace.output):
        for name in derived.get(id(p), ()) if isinstance(p, Proxy) else ():
            assert name not in copy_at, f"the output {p.name} is {name}'s old value, overwritten by its copy"


def check_final_trace(jf: minijit.runtime.JitFunction, mutated: set[str] | None = None) -> Trace:
    """Invariant 1 on the last trace: one copy per mutated input, none elsewhere, reads before copies."""
    final = minijit.last_traces(jf)[-1]
    counts = copies_per_input(final)
    assert all(c == 1 for c in counts.values()), counts
    if mutated is not None:
        assert set(counts) == mutated, (counts, final)
    assert_reads_precede_copies(final)
    return final
