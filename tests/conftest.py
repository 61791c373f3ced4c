"""Test-session set-up shared by every test module."""

import gc
import os
import types
from typing import Any

import torch

# Without a GPU, Triton kernels run through Triton's CPU interpreter. Triton reads
# TRITON_INTERPRET when it is imported, and other modules (torch._inductor) may import it
# before the Triton tests run: so it is set here, for the whole session, before any test.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist the workers already fill the cores: each gets one intra-op thread. With more threads
# than cores, torch's thread pools spin against each other (on 2 cores, the model tests' CPU time is 4x).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# torch.manual_seed also queues a reseed for each device initialised lazily (CUDA, XPU, MTIA) and keeps the
# caller's stack with it, which torch shows only if that device's initialisation later fails. Under pytest's
# deep stacks the three `traceback.format_stack()` calls take ~2 ms a seed: a tenth of the module-database
# tests' time, where each call seeds. The tests' devices never fail to initialise, so no stack is kept.
_NO_STACK = types.SimpleNamespace(format_stack=lambda: ["(the stack is not recorded in minijit's tests)\n"])
for _lazy_device in (torch.cuda, torch.xpu, torch.mtia):
    _lazy_device.traceback = _NO_STACK  # type: ignore[attr-defined]

# OpInfo's sample iterators look for the running unittest test by walking the whole stack with inspect.stack(),
# which reads the source of every frame: ~60 ms a call under pytest, most of the time of the database sweeps'
# error tests. These tests are pytest functions, not unittest TestCases, so the walk never finds one: it is
# skipped, and answers as it would (None).
from torch.testing._internal import common_utils as _torch_test_utils  # noqa: E402
from torch.testing._internal.opinfo import core as _opinfo_core  # noqa: E402

for _module in (_torch_test_utils, _opinfo_core):
    if hasattr(_module, "extract_test_fn"):
        _module.extract_test_fn = lambda: None

# Every pass's trace is verified (minijit/transforms/verify.py) in the whole test session:
# a pass that breaks a trace rule fails the test that ran it, naming the pass and the line.
os.environ.setdefault("MINIJIT_CHECK_TRACES", "1")


def pytest_collection_finish(session: Any) -> None:
    """Keep the collector off what the imports and the collection made, and let it run less often.

    A test session holds a large heap (torch, transformers, the OpInfo database, every test's parameters)
    that each full collection walks again; and a compile allocates many small objects, each 700 of which start
    a young collection by default. Measured on test_module_db + test_opinfo on one core: the collector took
    21.5 s of 89; frozen and with 10,000 allocations a young collection, 8 s of 74. Tests that need the
    collector (memory released, weak references cleared) call gc.collect() themselves.
    """
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The OpInfo coverage summary, where the run included tests/ops/test_opinfo.py."""
    from tests.ops.opinfo_summary import print_summary

    print_summary(terminalreporter)
