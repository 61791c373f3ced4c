"""The interpreter against native CPython on pure-Python functions: same results, same exceptions."""

from __future__ import annotations

from typing import Any

import pytest

from minijit.frontend import interpret
from tests.frontend import (  # noqa: F401 - register
    pycases_advanced,
    pycases_basic,
    pycases_classes,
    pycases_flow,
    pycases_more,
    pycases_stdlib,
    pycases_versions,
)
from tests.frontend.cases import CASES


def _outcome(run: Any) -> tuple[str, Any, Any]:
    try:
        return ("ok", run(), None)
    except Exception as e:  # the outcome is compared, whatever it is
        return ("raised", type(e), str(e))


@pytest.mark.parametrize("name,fn,args", CASES, ids=[c[0] for c in CASES])
def test_same_as_native(name: str, fn: Any, args: tuple[Any, ...]) -> None:
    native = _outcome(lambda: fn(*args))
    # Outside tracing: pure Python may write globals (while tracing, that is refused as a side effect).
    interpreted = _outcome(lambda: interpret(fn, args, {}))
    # Classes defined inside a case differ between the two runs: then compare what they print.
    assert interpreted == native or repr(interpreted) == repr(native)


def test_enough_cases() -> None:
    assert len(CASES) >= 150
