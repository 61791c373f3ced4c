"""`loss.backward()`, `torch.autograd.backward` and `torch.autograd.grad` called by traced code.

Each call records one `autograd.grad_of` (minijit.transforms.inline_grad): the gradients of the outputs
with respect to the tensors they depend on, as fresh values of the trace, expanded into the backward's
ops after functionalization. `backward()` then accumulates them into `.grad` as eager's AccumulateGrad
does: a tensor whose `.grad` is None gets the new gradient (laid out like the tensor), one with a `.grad`
gets it added in place. The `.grad` written is shown to the rest of the traced code (an optimizer's step
reads it) and set on the real tensor by every call, as an effect (docs/design.md: "A whole training step
in one trace").

A backward reaches the trace's inputs requiring grad (a module's parameters read from outside; the call's
arguments, whose `.grad` is read and set through the call's own input, guarded on every call) and the leaves
the traced code made itself (`x.detach().requires_grad_()`: `CaptureState.made_leaves`, whose `.grad` is a
value of the trace only). A tensor from outside with a history (an argument computed outside with grad: a frozen
encoder's output, a model split in two) has its gradient computed by the trace, and the backward goes on through
its history in eager's autograd after the call's computation (an effect calling `torch.autograd.backward`); traced code
reading, after that backward, the `.grad` of a leaf that history accumulates into is refused, since it would not
see the gradient yet (checked against each call's graph). The hooks a tensor from outside holds run as in eager, traced:
`register_hook`'s on its gradient before it is accumulated (or returned by `torch.autograd.grad`),
`register_post_accumulate_grad_hook`'s on the tensor after (the guard holds each tensor's hooks). What eager does and
minijit refuses, by name:
`create_graph=True` (a gradient that is differentiable again).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.calls import call
from minijit.frontend.frame import current_state
from minijit.frontend.guards import accumulated_leaves
from minijit.frontend.lookasides import lookaside
from minijit.frontend.outside import tensor_attribute
from minijit.ir import Proxy, TensorProxy, current_trace
from minijit.ir.context import where_now
from minijit.ir.proxies import TENSOR_METHODS
from minijit.ops.grad_of import GRAD_OF


def _as_tuple(x: Any) -> tuple[Any, ...]:
    if x is None:
        return ()
    return tuple(x) if isinstance(x, Sequence) and not isinstance(x, torch.Tensor) else (x,)


def captured(x: Any) -> Any:
    """The proxy traced code computes with for `x` (a real tensor read from outside is captured)."""
    trace = current_trace()
    if isinstance(x, torch.Tensor) and not isinstance(x, Proxy) and trace is not None and trace.capture_tensor:
        return trace.capture_tensor(x)
    return x


def _outputs_and_cotangents(tensors: Any, grad_tensors: Any, what: str) -> tuple[tuple[TensorProxy, ...],
                                                                                tuple[TensorProxy, ...]]:
    outputs = tuple(captured(t) for t in _as_tuple(tensors))
    given = _as_tuple(grad_tensors) or (None,) * len(outputs)
    if len(given) != len(outputs):
        raise RuntimeError(f"{what}: got {len(given)} gradients for {len(outputs)} tensors")
    cotangents = []
    for i, (out, g) in enumerate(zip(outputs, given)):
        if not isinstance(out, TensorProxy) or not out.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        if g is None:
            if out.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            g = _op(torch.ones_like, out)
        g = captured(g)
        if not isinstance(g, TensorProxy):
            raise TypeError(f"{what}: a gradient must be a tensor, got {type(g).__name__}")
        cotangents.append(g)
    return outputs, tuple(cotangents)


def _reached(outputs: Sequence[TensorProxy], candidates: Sequence[TensorProxy] | None) -> list[TensorProxy]:
    """The tensors whose gradients `outputs` need: the given `candidates` they depend on, else the trace's inputs
    requiring grad they depend on (the leaves eager's backward accumulates into), in the trace's order."""
    trace = current_trace()
    assert trace is not None
    made = [entry[0] for entry in trace.capture.made_leaves.values()] if trace.capture is not None else []
    # A leaf the code made is where its gradient stops (`x.detach().requires_grad_()`: none flows on into x).
    stop = {id(p) for p in (*(candidates or ()), *made)}
    needed = {id(p) for p in outputs}  # what the outputs depend on with grad, the candidates included
    for b in reversed(trace.bound_symbols):
        if not any(isinstance(p, TensorProxy) and p.requires_grad and id(p) in needed and id(p) not in stop
                   for p in b.proxy_outputs()):
            continue  # not needed, recorded without grad, or not differentiable: the gradient stops here
        needed.update(id(p) for p in b.proxy_args() if isinstance(p, TensorProxy) and p.requires_grad)
    pool = candidates if candidates is not None else [p for p in (*trace.args, *made) if isinstance(p, TensorProxy)
                                                      and p.requires_grad and (p.dtype.is_floating_point or p.dtype.is_complex)]
    return [p for p in pool if id(p) in needed]


def _refuse_create_graph(create_graph: bool, what: str) -> None:
    if create_graph:
        raise UnsupportedSyntaxError(
            f"{what}(create_graph=True){where_now()} is not supported inside a jitted function: minijit takes "
            "gradients inside a trace as values that are not differentiable again. Take this gradient outside "
            "the jitted function")


@lookaside(torch.autograd.backward)
def backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool | None = None, create_graph: bool = False,
             grad_variables: Any = None, inputs: Any = None) -> None:
    """torch.autograd.backward: the gradients, accumulated into the `.grad` of the tensors reached."""
    _refuse_create_graph(create_graph, "backward")
    outputs, cotangents = _outputs_and_cotangents(tensors, grad_tensors if grad_tensors is not None
                                                  else grad_variables, "backward")
    given = [captured(x) for x in _as_tuple(inputs)] if inputs is not None else None
    leaves = _reached(outputs, given)
    holders = [_made_leaf(p) or _real_leaf(p, through_history=given is None) for p in leaves]
    if not leaves:
        return
    grads = GRAD_OF(outputs, cotangents, tuple(leaves), retain_graph=bool(retain_graph))
    # A tensor with a history gets its hooks from eager's backward through that history (`_backward_later`).
    grads = [g if isinstance(holder, _History) else _run_hooks(p, g) for p, holder, g in zip(leaves, holders, grads)]
    later = [(p, holder, g) for p, holder, g in zip(leaves, holders, grads) if isinstance(holder, _History)]
    with torch.no_grad():
        for holder, g in zip(holders, grads):
            if isinstance(holder, list):
                _accumulate_made(holder, g)
            elif not isinstance(holder, _History):
                _accumulate(holder, g)
                _run_post_accumulate_hooks(holder)
    if later:
        _backward_later([p for p, _, _ in later], [h.real for _, h, _ in later], [g for _, _, g in later],
                        bool(retain_graph))


def tensor_backward(self: TensorProxy, gradient: Any = None, retain_graph: bool | None = None,
                    create_graph: bool = False, inputs: Any = None) -> None:
    """Tensor.backward on a traced tensor."""
    backward(self, gradient, retain_graph, create_graph, inputs=inputs)


TENSOR_METHODS["backward"] = tensor_backward


def _grad_fn(self: TensorProxy) -> None:
    """Tensor.grad_fn of a traced tensor that does not require grad (`zero_grad(set_to_none=False)` asks a `.grad`
    a backward made): None, as in eager. One that requires grad has a node minijit does not make: refused."""
    if self.requires_grad:
        raise UnsupportedSyntaxError(f"Tensor.grad_fn of {self.name}{where_now()}, which requires grad: minijit does "
                                     "not make autograd nodes while tracing; read it outside the jitted function")
    return None


_grad_fn.tensor_property = True  # type: ignore[attr-defined]
TENSOR_METHODS["grad_fn"] = _grad_fn
lookaside(torch.Tensor.backward)(tensor_backward)


@lookaside(torch.autograd.grad)
def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: bool | None = None,
         is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple[Any, ...]:
    """torch.autograd.grad: the gradients of `outputs` with respect to `inputs`, as values (no `.grad` written)."""
    _refuse_create_graph(create_graph, "torch.autograd.grad")
    if is_grads_batched:
        raise UnsupportedSyntaxError(f"torch.autograd.grad(is_grads_batched=True){where_now()} is not supported "
                                     "inside a jitted function; take this gradient outside it")
    outs, cotangents = _outputs_and_cotangents(outputs, grad_outputs, "torch.autograd.grad")
    wanted = [captured(x) for x in _as_tuple(inputs)]
    for i, x in enumerate(wanted):
        if not isinstance(x, TensorProxy) or not x.requires_grad:
            raise RuntimeError(f"One of the differentiated Tensors does not require grad (input {i})")
    reached = _reached(outs, wanted)
    unused = [i for i, x in enumerate(wanted) if not any(x is r for r in reached)]
    if unused and not (allow_unused or materialize_grads):
        raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                           "Set allow_unused=True if this is the desired behavior.")
    unique = list({id(p): p for p in reached}.values())
    values = {id(p): _run_hooks(p, g) for p, g in zip(unique, GRAD_OF(outs, cotangents, tuple(unique),
                                                                      retain_graph=bool(retain_graph)))
              } if unique else {}
    result = []
    for x in wanted:
        g = values.get(id(x))
        if g is None and materialize_grads:
            with torch.no_grad():
                g = _op(torch.zeros_like, x)
        result.append(g)
    return tuple(result)


def _hooks(real: torch.Tensor, name: str) -> list[Any]:
    """The hooks `real` holds in its attribute `name` (`_backward_hooks`, `_post_accumulate_grad_hooks`), read
    with a guard on the attribute and on the keys of its dict: a hook registered or removed later is a miss."""
    hooks = _attribute(real, name)
    if hooks is None:
        return []
    current_state().outside.observe(current_state().guards, hooks, "keys")
    return list(hooks.values())


def _run_hooks(p: TensorProxy, g: TensorProxy) -> TensorProxy:
    """The gradient `g` of `p` after the hooks registered on the tensor from outside `p` stands for
    (`Tensor.register_hook`), which eager runs on it before accumulating it or returning it; each is traced."""
    real = real_tensor(p)
    if real is None:
        return g
    for hook in _hooks(real, "_backward_hooks"):
        result = call(hook, (g,), {})
        if result is not None:
            g = result
    return g


def _run_post_accumulate_hooks(real: torch.Tensor) -> None:
    """The hooks eager runs on the leaf `real` once its gradient is accumulated
    (`Tensor.register_post_accumulate_grad_hook`), each traced; they get the tensor itself, as in eager."""
    for hook in _hooks(real, "_post_accumulate_grad_hooks"):
        if call(hook, (real,), {}) is not None:
            raise RuntimeError("Tensor post accumulate grad hooks should return None.")


def _made_leaf(p: TensorProxy) -> list[Any] | None:
    """[p, its .grad] where `p` is a leaf the traced code made (`x.detach().requires_grad_()`), else None."""
    trace = current_trace()
    entry = trace.capture.made_leaves.get(id(p)) if trace is not None and trace.capture is not None else None
    return entry if entry is not None and entry[0] is p else None


def real_tensor(p: TensorProxy) -> torch.Tensor | None:
    """The tensor from outside that the trace input `p` stands for: one read from outside the call (a module's
    parameter), or an argument of the call, from then on read through the call's input (its `.grad` guarded on
    every call); None for a tensor the trace computed."""
    trace = current_trace()
    capture = trace.capture if trace is not None else None
    if capture is None:
        return None
    real = capture.captured_from.get(p.name)
    if real is None:
        real = capture.arguments.get(p.name)
        if real is not None:
            current_state().outside.note_argument(real, p.name)
    return real


@dataclass(frozen=True)
class _History:
    """A tensor from outside the call with a history (a grad_fn) that a backward reaches: eager goes on through it."""

    real: torch.Tensor


def _real_leaf(p: TensorProxy, through_history: bool = True) -> torch.Tensor | _History:
    """The tensor from outside that the input `p` stands for, whose `.grad` a backward accumulates into where it is a
    leaf; a `_History` where it was computed outside with grad (checked on every call: a later call may pass a
    tensor with a history, or without), unless not `through_history` (`backward(inputs=...)` stops there)."""
    real = real_tensor(p)
    if real is None:
        raise UnsupportedSyntaxError(
            f"backward(){where_now()} reaches {p.name}, which requires grad and is neither an input of the jitted "
            "function nor a leaf it made; call backward() outside the function")
    if not _attribute(real, "is_leaf"):
        if through_history:
            return _History(real)
        raise UnsupportedSyntaxError(
            f"backward(inputs=...){where_now()} names {p.name}, a tensor computed outside the jitted function (it has "
            "a grad_fn), whose .grad eager would populate; call backward() outside the function")
    return real


def _backward_later(proxies: list[TensorProxy], reals: list[torch.Tensor], grads: list[TensorProxy],
                    retain_graph: bool) -> None:
    """Go on with a backward through the histories outside the call of `proxies` (eager's autograd graph, which
    the trace does not hold): `torch.autograd.backward` on the call's own tensors with the gradients the trace
    computed, as an effect after the call's computation. The leaves that graph accumulates into are noted: traced
    code reading their `.grad` after this point is refused (it would not see the gradient yet), and a `.grad` it
    reads is guarded to stay out of each call's histories (`Outside.note_grad_read`)."""
    outside = current_state().outside
    line = where_now()
    for leaf in accumulated_leaves(reals).values():
        outside.accumulated_later.setdefault(id(leaf), (leaf, line))
    outside.histories_later.append((tuple(p.name for p in proxies), []))
    outside.call_function(torch.autograd.backward, (tuple(proxies), tuple(grads)), {"retain_graph": retain_graph})


def _accumulate_made(leaf: list[Any], g: TensorProxy) -> None:
    """Add the gradient `g` into the `.grad` of a leaf the traced code made: a value of the trace only."""
    if leaf[1] is None:
        leaf[1] = g
    else:
        _op(torch.Tensor.add_, leaf[1], g)


def _accumulate(real: torch.Tensor, g: TensorProxy) -> None:
    """Add the gradient `g` into `real.grad` as eager's AccumulateGrad does (under no_grad): a new `.grad` is `g`
    (laid out as eager lays it out when it is set: `minijit.runtime.call_plan.replay`), an existing one is added to
    in place."""
    current = _grad_attribute(real)
    if current is None:
        assign_grad(real, g, accumulated=True)
    else:
        _op(torch.Tensor.add_, current, g)


def _op(fn: Any, *args: Any) -> Any:
    """`fn(*args)` as traced code calling it (recorded, real tensors captured)."""
    return call(fn, args, {})


def _grad_attribute(real: torch.Tensor) -> Any:
    """`real.grad` as traced code sees it (guarded where it is read from the tensor)."""
    return _attribute(real, "grad")


def _attribute(real: torch.Tensor, name: str) -> Any:
    """`real.name` as traced code sees it (guarded where it is read from the tensor)."""
    trace = current_trace()
    assert trace is not None and trace.capture_tensor is not None
    state = current_state()
    return tensor_attribute(state.outside, state.guards, real, name, trace.capture_tensor)


def _grad(self: TensorProxy) -> Any:
    """Tensor.grad of a traced tensor: the `.grad` of the tensor from outside it stands for (an argument, a
    parameter; guarded, or the one a backward in the traced code made), that of a leaf the code made (a value of
    the trace), else None as in eager (a tensor computed by the trace is no leaf requiring grad)."""
    made = _made_leaf(self)
    if made is not None:
        return made[1]
    real = real_tensor(self)
    if real is not None:
        return _grad_attribute(real)
    if self.requires_grad:
        warnings.warn("The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
                      "attribute won't be populated during autograd.backward().", UserWarning, stacklevel=2)
    return None


_grad.tensor_property = True  # type: ignore[attr-defined]
TENSOR_METHODS["grad"] = _grad


def set_traced_grad(t: TensorProxy, value: Any) -> bool:
    """`t.grad = value` for a traced tensor: set on the tensor from outside it stands for (an effect), or on a leaf
    the code made (a value of the trace); False where `t` is neither (refused by the caller)."""
    made = _made_leaf(t)
    if made is not None:
        if value is not None:
            _check_grad(value, t)
        made[1] = value
        return True
    real = real_tensor(t)
    if real is None:
        return False
    outside = current_state().outside
    outside.shown.pop((id(real), "grad"), None)
    if value is None:
        outside.write_attribute(real, "grad", None)
        outside.shown[(id(real), "grad")] = None
    else:
        assign_grad(real, value)
    return True


def _check_grad(value: Any, t: Any) -> None:
    """Eager's checks of a `.grad` assigned to `t`."""
    if not isinstance(value, TensorProxy):
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of {type(value).__name__}")
    if tuple(value.shape) != tuple(t.shape) or value.dtype != t.dtype or value.device != t.device:
        raise RuntimeError(f"assigned grad has data of a different size, type or device ({value.type_string()}) "
                           f"than the tensor's {tuple(t.shape)} {t.dtype} {t.device}{where_now()}")


def assign_grad(real: torch.Tensor, value: Any, accumulated: bool = False) -> None:
    """`real.grad = value` by traced code, `value` a traced tensor: checked as eager checks it, shown to the rest of
    the traced code, and made by every call as an effect (`accumulated`: made by a backward, whose new `.grad`
    eager lays out like `real`)."""
    _check_grad(value, real)
    outside = current_state().outside
    outside.write_attribute(real, "grad", value, op="accumulate grad" if accumulated else None)
    outside.shown[(id(real), "grad")] = value


__all__ = ["assign_grad", "backward", "captured", "grad", "real_tensor", "set_traced_grad", "tensor_backward"]
