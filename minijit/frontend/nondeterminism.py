"""Lookasides for calls whose result or effect changes from call to call: RNG state, clocks, entropy.

Run natively while tracing, such a call would happen once and its value (or its effect)
would be frozen into the trace. Each family gets one behaviour:

- torch's default generator (`torch.manual_seed`, `torch.seed`, `torch.initial_seed`,
  `torch.get_rng_state`/`set_rng_state`, `torch.random.fork_rng`, the methods of
  `torch.default_generator`): recorded as RANDOM prims, so every call reproduces eager,
  in order with the random ops around it;
- draws from an explicit `torch.Generator` (`generator=g`): traced, the generator a constant of
  the trace (minijit.ops.ltorch.randomness); seeding or reading other generators
  (`torch.cuda.manual_seed`, `g.manual_seed`) or making one (`torch.Generator()`) inside the
  function: refused, with what to do instead;
- Python's `random` (module functions and `random.Random` instances), `numpy.random`,
  clocks (`time.time`, `time.perf_counter`, `datetime.now`, ...), `os.urandom` and
  `uuid.uuid1/uuid4`: refused with a `FrozenValueError` naming the call and the user's
  line: their values do not come from torch's generator, so the trace cannot draw them
  as eager does. The fix is to call them outside and pass the value in as an argument.
  One exception: a generator the function itself creates with a constant seed
  (`random.Random(0)`, `numpy.random.default_rng(0)`) draws the same values on every
  call, so its draws run (once, while tracing) like any other Python code.

Outside tracing (the interpreter on plain Python) all of these run natively.
"""

from __future__ import annotations

import datetime
import os
import random
import time
import types
import uuid
from collections.abc import Callable
from typing import Any

import torch

from minijit.errors import FrozenValueError, UnsupportedOpError
from minijit.frontend.lookasides import LOOKASIDES, lookaside
from minijit.ir import NumberProxy, TensorProxy, current_trace
from minijit.ir.context import where_now
from minijit.ops import prims

_CPU = torch.device("cpu")


# -- torch's default generator: recorded ------------------------------------------------------------

@lookaside(torch.manual_seed)
def manual_seed(seed: Any) -> torch.Generator:
    """torch.manual_seed: reseeds the default generators when the trace runs, in order with its draws."""
    prims.manual_seed(seed if isinstance(seed, NumberProxy) else int(seed))
    return torch.default_generator


@lookaside(torch.seed)
def seed() -> Any:
    """torch.seed: reseeds from a non-deterministic source when the trace runs; the seed is known only then."""
    return prims.seed()


@lookaside(torch.initial_seed)
def initial_seed() -> Any:
    """torch.initial_seed, read when the trace runs (after any manual_seed before it)."""
    return prims.initial_seed()


@lookaside(torch.get_rng_state)
def get_rng_state() -> TensorProxy:
    """torch.get_rng_state, read when the trace runs."""
    return prims.get_rng_state(_CPU)


@lookaside(torch.set_rng_state)
def set_rng_state(new_state: Any) -> None:
    """torch.set_rng_state, when the trace runs (a state read inside the function, or a tensor from outside)."""
    prims.set_rng_state(new_state, _CPU)


class _ForkedRng:
    """`torch.random.fork_rng()` in a trace: reads the generators' states on entry, restores them on exit."""

    def __init__(self, devices: list[torch.device]):
        self.devices = devices
        self.states: list[Any] = []

    def __enter__(self) -> None:
        self.states = [prims.get_rng_state(d) for d in self.devices]

    def __exit__(self, *exc: Any) -> None:
        for device, state in zip(self.devices, self.states, strict=True):
            prims.set_rng_state(state, device)


@lookaside(torch.random.fork_rng)
def fork_rng(devices: Any = None, enabled: bool = True, _caller: str = "fork_rng", _devices_kw: str = "devices",
             device_type: str | None = None) -> Any:
    """torch.random.fork_rng for the CPU generator and CUDA devices, restored when the trace runs."""
    if device_type not in (None, "cuda"):
        raise UnsupportedOpError(f"torch.random.fork_rng(device_type={device_type!r}){where_now()} is not supported "
                                 "inside a jitted function; fork the RNG outside it")
    if not enabled:
        return _ForkedRng([])
    indices = list(range(torch.cuda.device_count())) if devices is None else list(devices)
    return _ForkedRng([_CPU, *(torch.device("cuda", int(i)) for i in indices)])


def _default_generator_method(name: str, record: Callable[..., Any]) -> None:
    native = getattr(torch.Generator, name)

    def method(generator: torch.Generator, *args: Any) -> Any:
        if generator is not torch.default_generator:
            raise UnsupportedOpError(
                f"torch.Generator.{name} on a generator other than torch.default_generator{where_now()} would run "
                "only while tracing: call it outside the jitted function (draws from the generator, `generator=g`, "
                "are traced and run on every call)")
        return record(*args)

    method.__doc__ = f"torch.default_generator.{name}, recorded like its torch.* function."
    LOOKASIDES[native] = method


_default_generator_method("manual_seed", manual_seed)
_default_generator_method("seed", seed)
_default_generator_method("initial_seed", initial_seed)
_default_generator_method("get_state", get_rng_state)
_default_generator_method("set_state", lambda state: (set_rng_state(state), torch.default_generator)[1])


@lookaside(torch.Generator)
def generator(*args: Any, **kwargs: Any) -> torch.Generator:
    """torch.Generator() inside traced code: refused (the trace would keep drawing from the one made while tracing)."""
    if current_trace() is None:
        return torch.Generator(*args, **kwargs)
    raise FrozenValueError(
        f"torch.Generator(){where_now()} made inside a jitted function would be made once, while tracing, and every "
        "later call would draw on from it; make the generator outside and pass it in (or draw from torch's default "
        "generator)")


def _refuse_cuda_rng(fn: Any, name: str) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOpError(
            f"{name}{where_now()} inside a jitted function would run only while tracing; call it outside, or use "
            "torch.manual_seed (which seeds every device) or torch.random.fork_rng inside")

    LOOKASIDES[fn] = refuse


for _name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "get_rng_state", "get_rng_state_all",
              "set_rng_state", "set_rng_state_all", "initial_seed"):
    _refuse_cuda_rng(getattr(torch.cuda, _name), f"torch.cuda.{_name}")


# -- values from outside torch's generator: refused ----------------------------------------------------

def _frozen(name: str, kind: str) -> FrozenValueError:
    if kind == _SEEDS:
        what = ("changes a random generator's state; in a jitted function it would run only once, while tracing, "
                "and later calls would not repeat it. Call it outside the jitted function")
    else:
        what = ("gives a new value on each call; in a jitted function it would run only once, while tracing, and "
                "every later call would reuse that value. Call it outside the jitted function and pass the result "
                "in as an argument (a tensor, or a Python number, for which minijit.jit traces again)")
    return FrozenValueError(f"{name}(){where_now()} {what}")


_DRAWS = "draws"
_SEEDS = "seeds"
_STATE_METHODS = {"seed", "setstate", "set_state", "set_bit_generator"}


def _refuse(fn: Any, name: str | Callable[..., str], kind: str = _DRAWS) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        trace = current_trace()
        if trace is None or (args and trace.capture is not None
                             and any(g is args[0] for g in trace.capture.seeded_generators)):
            return fn(*args, **kwargs)
        raise _frozen(name(*args) if callable(name) else name, kind)

    refuse.__doc__ = f"{name if isinstance(name, str) else getattr(fn, '__qualname__', fn)}: refused (FrozenValueError)."
    LOOKASIDES[fn] = refuse


def _seeded_constructor(make: Any, name: str) -> None:
    """`make(seed)` creating a generator: with a constant seed its draws repeat on every call; else refused."""
    def construct(*args: Any, **kwargs: Any) -> Any:
        trace = current_trace()
        if trace is None:
            return make(*args, **kwargs)
        seed = args[0] if args else next(iter(kwargs.values()), None)
        if seed is None or not isinstance(seed, int | float | str | bytes) or isinstance(seed, NumberProxy):
            raise _frozen(name, _DRAWS)
        generator = make(*args, **kwargs)
        if trace.capture is not None:  # noted in the capture's state (a bare trace has none: draws refused)
            trace.capture.seeded_generators.append(generator)
        return generator

    construct.__doc__ = f"{name}(seed): allowed with a constant seed (its draws repeat on every call)."
    LOOKASIDES[make] = construct


def _refuse_methods(cls: type, public_name: Callable[[Any, str], str]) -> None:
    """Refuse every public method of `cls`, named as the user called it (`random.randint`, `rng.randint`)."""
    for attr in dir(cls):
        fn = getattr(cls, attr, None)
        if attr.startswith("_") or isinstance(fn, type) or not callable(fn):
            continue
        kind = _SEEDS if attr in _STATE_METHODS else _DRAWS
        _refuse(fn, lambda obj=None, *_, attr=attr: public_name(obj, attr), kind)


def _python_random_name(obj: Any, attr: str) -> str:
    return f"random.{attr}" if obj is random._inst else f"random.{type(obj).__name__}.{attr}"  # type: ignore[attr-defined]


# Module-level random.random() is a method of a hidden Random instance; methods written in Python
# (randint, choice, shuffle, gauss) are refused before they reach the C ones (random, getrandbits).
_refuse_methods(random.Random, _python_random_name)
_refuse_methods(random.SystemRandom, _python_random_name)
_seeded_constructor(random.Random, "random.Random")

for _fn, _name in ((time.time, "time.time"), (time.time_ns, "time.time_ns"), (time.perf_counter, "time.perf_counter"),
                   (time.perf_counter_ns, "time.perf_counter_ns"), (time.monotonic, "time.monotonic"),
                   (time.monotonic_ns, "time.monotonic_ns"), (time.process_time, "time.process_time"),
                   (time.process_time_ns, "time.process_time_ns"), (time.thread_time, "time.thread_time"),
                   (time.thread_time_ns, "time.thread_time_ns"), (datetime.datetime.now, "datetime.datetime.now"),
                   (datetime.datetime.utcnow, "datetime.datetime.utcnow"),
                   (datetime.datetime.today, "datetime.datetime.today"), (datetime.date.today, "datetime.date.today"),
                   (os.urandom, "os.urandom"), (uuid.uuid1, "uuid.uuid1"), (uuid.uuid4, "uuid.uuid4")):
    _refuse(_fn, _name)


def _refuse_numpy() -> None:
    try:
        import numpy.random as npr
    except ImportError:
        return
    _refuse_methods(npr.RandomState, lambda obj, attr: f"numpy.random.{attr}" if obj is npr.mtrand._rand
                    else f"numpy.random.RandomState.{attr}")
    _refuse_methods(npr.Generator, lambda obj, attr: f"numpy.random.Generator.{attr}")
    _seeded_constructor(npr.RandomState, "numpy.random.RandomState")
    for attr in dir(npr):
        fn = getattr(npr, attr)
        # Bound methods of the hidden global RandomState are its methods, refused above.
        if attr.startswith("_") or isinstance(fn, type | types.ModuleType | types.MethodType) or not callable(fn):
            continue
        kind = _SEEDS if attr in _STATE_METHODS else _DRAWS
        _refuse(getattr(fn, "__func__", fn), f"numpy.random.{attr}", kind)
    _seeded_constructor(npr.default_rng, "numpy.random.default_rng")


_refuse_numpy()

__all__ = ["fork_rng", "get_rng_state", "initial_seed", "manual_seed", "seed", "set_rng_state"]
