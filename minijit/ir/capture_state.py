"""What a capture keeps while it records the user's code: one object, owned by the capture.

The capture (`minijit/runtime/pipeline.py`, `_compile`'s `capture()`) creates a `CaptureState`, sets it as
`trace.capture` for as long as it records, and clears it after; the traces passes build have none
(`Trace.derive` does not copy it). A traced `torch.autograd.Function` records its forward and backward into
sub-traces of their own, each with a state of its own (`minijit/frontend/autograd_function.py`).

Example::

    trace = Trace("f")
    trace.capture = CaptureState(capture_tensor=capturer, captures_user_code=True)
    with tracing(trace):
        ...  # record
    state, trace.capture = trace.capture, None
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minijit.ir.proxies import Proxy, TensorProxy
from minijit.ir.symbol import BoundSymbol, SourceLocation, Tag

__all__ = ["CaptureState"]


@dataclass
class CaptureState:
    """The capture's hooks into recording, and what recording notes for it."""

    # Turns a real torch.Tensor met among an op's arguments (a global, a closure value, a
    # tensor created natively) into a proxy.
    capture_tensor: Callable[[torch.Tensor], Proxy] | None = None
    # Given (kind of read, its `Source`, the number read) for a Python number read from outside the call: the
    # proxy the trace takes as an input in its place where the runtime made that place a dynamic source of
    # numbers, else None (minijit.runtime.inputs.number_capturer).
    capture_number: Callable[[str, Any, Any], Any] | None = None
    # True for a trace that records the user's code, where an op called at the top level is a call
    # the user's code made; ops may then adjust their arguments (autocast).
    captures_user_code: bool = False
    # True where numbers the trace computes between ops stay tensors (minijit/frontend/lookasides.py): the compiled
    # trace replays from CUDA graphs (jit(cuda_graphs=True)), whose replays repeat their kernels' arguments, or a
    # fusion executor asks for it (`FusionExecutor.numbers_stay_tensors`).
    numbers_stay_tensors: bool = False
    # Where the user's code sits in a `try` whose `except` may catch an error (None: nowhere); each op
    # recorded there is noted in `ops_in_try` as (op, the user's line).
    try_probe: Callable[[], SourceLocation | None] | None = None
    ops_in_try: list[tuple[str, SourceLocation]] = field(default_factory=list)
    # Input name -> the tensor from outside the call it stands for (minijit.runtime.inputs.tensor_capturer): where
    # a backward() in the traced code accumulates gradients (minijit/frontend/backward.py).
    captured_from: dict[str, torch.Tensor] = field(default_factory=dict)
    # Input name -> the tensor the call passed as an argument (its leaf's `.grad` is read and accumulated into
    # through the call's own input: minijit/frontend/backward.py).
    arguments: dict[str, torch.Tensor] = field(default_factory=dict)
    # (input name, input name, whether they are one tensor object) for each `a is b` the code evaluated on two
    # trace inputs: the same tensor passed twice is two inputs, so `is` is answered by the real tensors and guarded.
    identities: list[tuple[str, str, bool]] = field(default_factory=list)
    # id -> [tensor, its .grad or None]: leaves requiring grad the traced code made itself (`x.detach().requires_grad_()`,
    # `torch.zeros(..., requires_grad=True)`), whose gradients are values of the trace.
    made_leaves: dict[int, list[Any]] = field(default_factory=dict)
    # Names of the outputs recorded while torch's grad mode was off (torch.no_grad() in the code):
    recorded_without_grad: set[str] = field(default_factory=set)
    # ... and of the results of in-place ops recorded then, which are the tensors they wrote (whose history
    # stays: `v = w.clone()`, then `v.clamp_()` under no_grad, still has grad through the clone):
    written_without_grad: set[str] = field(default_factory=set)
    # (op, why its decomposition declined the call) for each op recorded opaque instead:
    declined: list[tuple[str, str]] = field(default_factory=list)
    # The generators the traced function created with a constant seed, whose draws repeat
    # (minijit/frontend/nondeterminism.py):
    seeded_generators: list[Any] = field(default_factory=list)
    # {(id of a trace input, dtype): its cast}: one cast per parameter while autocast stays entered
    # (minijit/ops/autocast.py's `_cast`; `clear_cast_cache` empties it):
    cast_cache: dict[tuple[int, torch.dtype], TensorProxy] = field(default_factory=dict)
    # Tensors computed at trace time from Python numbers only (torch.div(6, 2)), by id: their values
    # are known, so a size may read them (minijit/frontend/folding.py). Kept alive here: ids stay unique.
    folded_constants: dict[int, torch.Tensor] = field(default_factory=dict)
    # 0-dim int64 tensors the trace computes from sizes and numbers only (torch.div(x.size(1), 2)), by id:
    # each with the number it holds, an expression of the trace's numbers, so that a size may read it
    # without a guard on its value (minijit/ops/number_args.py). Forgotten where a write may change it.
    number_tensors: dict[int, tuple[Proxy, Any]] = field(default_factory=dict)
    # The fake tensors with symbolic sizes that layouts under symbolic sizes are followed on, one session per
    # capture, made on the first layout question (minijit/ops/symbolic_strides.py):
    strides_session: Any = None
    # The fake tensors that sizes only the trace knows are followed on (`nonzero`'s count: one symbol for
    # `torch.where(mask)` and `x[mask]` of one mask), made on the first such op (minijit/ops/unbacked.py):
    unbacked_session: Any = None
    # (number prim, its arguments) -> its result, for arithmetic on numbers the trace computes whose values the
    # capture saw (`NumberProxy.seen`: clamped slice bounds, minijit/ops/runtime_bounds.py): one proxy per
    # computation, so that `x[:k]` twice has one size, which no pass after the capture could compare.
    seen_numbers: dict[tuple[Any, ...], Proxy] = field(default_factory=dict)

    def forget_numbers(self, bsym: BoundSymbol) -> None:
        """Forget the known numbers `bsym` may change: all of them where it writes an integer tensor (which may
        be a view of one: ltorch views keep the dtype), the ones it reads where it is an opaque op; and the fake
        tensors of the unbacked session where it writes anything (a count taken before may no longer hold)."""
        if self.unbacked_session is not None and bsym.written():
            self.unbacked_session.forget()
        if any(not (t.dtype.is_floating_point or t.dtype.is_complex) for t in bsym.written()):
            self.number_tensors.clear()
        elif Tag.OPAQUE in bsym.sym.tags:
            for p in bsym.proxy_args():
                self.number_tensors.pop(id(p), None)
