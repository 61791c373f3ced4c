"""`loss.backward()`, `torch.autograd.backward` and `torch.autograd.grad` called by traced code.

Each call records one `autograd.grad_of` (minijit.transforms.inline_grad): the gradients of the outputs
with respect to the tensors they depend on, as fresh values of the trace, expanded into the backward's
ops after functionalization. `backward()` then accumulates them into `.grad` as eager's AccumulateGrad
does: a tensor whose `.grad` is None gets the new gradient (laid out like the tensor), one with a `.grad`
gets it added in place. The `.grad` written is shown to the rest of the traced code (an optimizer's step
reads it) and set on the real tensor by every call, as an effect (docs/design.md: "A whole training step
in one trace").

What eager does and minijit refuses, by name: `create_graph=True` (a gradient that is differentiable
again), and gradients reaching a tensor minijit cannot accumulate into (an argument requiring grad, a
tensor computed outside the call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minijit.errors import UnsupportedSyntaxError
from minijit.frontend.calls import call
from minijit.frontend.frame import current_state
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


def _proxy(x: Any) -> Any:
    """The proxy traced code computes with for `x` (a real tensor read from outside is captured)."""
    trace = current_trace()
    if isinstance(x, torch.Tensor) and not isinstance(x, Proxy) and trace is not None and trace.capture_tensor:
        return trace.capture_tensor(x)
    return x


def _outputs_and_cotangents(tensors: Any, grad_tensors: Any, what: str) -> tuple[tuple[TensorProxy, ...],
                                                                                tuple[TensorProxy, ...]]:
    outputs = tuple(_proxy(t) for t in _as_tuple(tensors))
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
        g = _proxy(g)
        if not isinstance(g, TensorProxy):
            raise TypeError(f"{what}: a gradient must be a tensor, got {type(g).__name__}")
        cotangents.append(g)
    return outputs, tuple(cotangents)


def _reached(outputs: Sequence[TensorProxy], candidates: Sequence[TensorProxy] | None) -> list[TensorProxy]:
    """The tensors whose gradients `outputs` need: the given `candidates` they depend on, else the trace's inputs
    requiring grad they depend on (the leaves eager's backward accumulates into), in the trace's order."""
    trace = current_trace()
    assert trace is not None
    stop = {id(p) for p in candidates or ()}
    needed = {id(p) for p in outputs}  # what the outputs depend on with grad, the candidates included
    for b in reversed(trace.bound_symbols):
        if not any(isinstance(p, TensorProxy) and p.requires_grad and id(p) in needed and id(p) not in stop
                   for p in b.proxy_outputs()):
            continue  # not needed, recorded without grad, or not differentiable: the gradient stops here
        needed.update(id(p) for p in b.proxy_args() if isinstance(p, TensorProxy) and p.requires_grad)
    pool = candidates if candidates is not None else [p for p in trace.args if isinstance(p, TensorProxy)
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
    given = [_proxy(x) for x in _as_tuple(inputs)] if inputs is not None else None
    leaves = _reached(outputs, given)
    reals = [_real_leaf(p) for p in leaves]
    if not leaves:
        return
    grads = GRAD_OF(outputs, cotangents, tuple(leaves), retain_graph=bool(retain_graph))
    with torch.no_grad():
        for real, g in zip(reals, grads):
            _accumulate(real, g)


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
    wanted = [_proxy(x) for x in _as_tuple(inputs)]
    for i, x in enumerate(wanted):
        if not isinstance(x, TensorProxy) or not x.requires_grad:
            raise RuntimeError(f"One of the differentiated Tensors does not require grad (input {i})")
    reached = _reached(outs, wanted)
    unused = [i for i, x in enumerate(wanted) if not any(x is r for r in reached)]
    if unused and not (allow_unused or materialize_grads):
        raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                           "Set allow_unused=True if this is the desired behavior.")
    unique = list({id(p): p for p in reached}.values())
    values = dict(zip(map(id, unique), GRAD_OF(outs, cotangents, tuple(unique),
                                                           retain_graph=bool(retain_graph)))) if unique else {}
    result = []
    for x in wanted:
        g = values.get(id(x))
        if g is None and materialize_grads:
            with torch.no_grad():
                g = _op(torch.zeros_like, x)
        result.append(g)
    return tuple(result)


def _real_leaf(p: TensorProxy) -> torch.Tensor:
    """The tensor from outside that the input `p` stands for, whose `.grad` a backward accumulates into."""
    trace = current_trace()
    real = trace.capture.captured_from.get(p.name) if trace is not None and trace.capture is not None else None
    if real is None:
        raise UnsupportedSyntaxError(
            f"backward(){where_now()} reaches the input {p.name}, which requires grad and is an argument of the "
            "jitted function: minijit accumulates gradients inside a trace only into tensors read from outside "
            "(a module's parameters). Read it from a module or object, or call backward() outside the function")
    if not real.is_leaf:
        raise UnsupportedSyntaxError(
            f"backward(){where_now()} reaches {p.name}, a tensor computed outside the jitted function (it has a "
            "grad_fn): eager would go on differentiating through its history, which the trace does not hold. "
            "Call backward() outside the function, or detach the tensor before the call")
    return real


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
    trace = current_trace()
    assert trace is not None and trace.capture_tensor is not None
    state = current_state()
    return tensor_attribute(state.outside, state.guards, real, "grad", trace.capture_tensor)


def assign_grad(real: torch.Tensor, value: Any, accumulated: bool = False) -> None:
    """`real.grad = value` by traced code, `value` a traced tensor: checked as eager checks it, shown to the rest of
    the traced code, and made by every call as an effect (`accumulated`: made by a backward, whose new `.grad`
    eager lays out like `real`)."""
    if not isinstance(value, TensorProxy):
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of {type(value).__name__}")
    if tuple(value.shape) != tuple(real.shape) or value.dtype != real.dtype or value.device != real.device:
        raise RuntimeError(f"assigned grad has data of a different size, type or device ({value.type_string()}) "
                           f"than the tensor's {tuple(real.shape)} {real.dtype} {real.device}{where_now()}")
    outside = current_state().outside
    outside.write_attribute(real, "grad", value, op="accumulate grad" if accumulated else None)
    outside.shown[(id(real), "grad")] = value


__all__ = ["assign_grad", "backward", "grad", "tensor_backward"]
