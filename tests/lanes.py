"""Which slice of a random sweep this Python runs.

CI runs the whole suite once per supported Python (3.11, 3.12, 3.13). A fuzzer runs its own seeds in each lane
rather than the same ones three times: the lanes together cover three times the programs one lane runs, in the
time one lane's share takes. `MINIJIT_TEST_LANE=k` runs lane k's seeds on any Python (to reproduce a failure).
"""

from __future__ import annotations

import os
import sys

LANES = 3
LANE = int(os.environ.get("MINIJIT_TEST_LANE", sys.version_info.minor % LANES))  # 3.12: 0, 3.13: 1, 3.11: 2


def lane_seeds(count: int, start: int = 0, step: int = 1) -> range:
    """This lane's `count` seeds of the sweep `start, start + step, ...` (lane k takes the k-th block of `count`)."""
    first = start + LANE * count * step
    return range(first, first + count * step, step)
