"""The op sweeps' verification level.

The session verifies every pass's trace (tests/conftest.py). The sweeps over torch's op database below run
thousands of one-op traces through the same passes that the pass tests, fuzzers and model tests verify
after every pass. These sweeps check each op's result against eager at the default level (the `copies
settled` rule on settled traces, as users run), which takes about a fifth off their time.
"""

from __future__ import annotations

from typing import Any

import pytest

OP_SWEEPS = {"test_elementwise", "test_opinfo", "test_nn", "test_reductions", "test_creation", "test_modelops",
             "test_autocast"}


@pytest.fixture(autouse=True)
def _default_checks_in_op_sweeps(request: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] in OP_SWEEPS:
        monkeypatch.setenv("MINIJIT_CHECK_TRACES", "")
