"""Serving zoo models under `cache="symbolic values"` over batches starting at 1 (issue 28): few traces.

A small sweep of `scripts/symbolic_zoo.py` (which runs the whole zoo over batches 1-8 and lengths
5-17): a batch of 1 first, then larger batches and other lengths (image sizes for the CNN, whose
last feature map is 1x1 for the smaller images). Every output equals eager's; the traces are
counted: a size traced at 1 stays symbolic, so the first trace serves the larger batches
(mistral and gemma2 trace once more where the length passes their sliding window of 8, longformer
where the length needs no padding to its attention window).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import minijit
from tests.models.test_zoo import HF_MODELS, VOCAB, tensors_in


def _inputs(kind: str, batch: int, length: int) -> dict[str, Any]:
    if kind == "image":
        return {"pixel_values": torch.randn(batch, 3, length, length)}
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, :2] = 0  # the last sequence is padded
    return {"input_ids": torch.randint(3, VOCAB, (batch, length)), "attention_mask": mask}


# name -> (batch, length) calls in order, the traces they may take
CASES = {
    "resnet": ([(1, 5), (3, 9)], 1),
    "mistral": ([(1, 5), (2, 6), (1, 9), (3, 9)], 2),
    "gemma2": ([(1, 5), (2, 6), (1, 9), (3, 9)], 2),
    # Longformer pads the length to a multiple of its window (4) where it is not one (a Python branch): a
    # trace with the padding, one without; its attention's `stride()` and `as_strided` follow the sizes.
    # Each is first traced at a batch of 1, whose trace serves the larger batches too: where torch's stride
    # rules decide on the batch being 1, the answer at 2 or more is the same (minijit.ops.symbolic_strides).
    "longformer": ([(1, 5), (2, 5), (3, 7), (1, 12), (2, 9), (4, 12), (3, 16), (5, 13), (1, 6), (1, 16)], 2),
    # Its selective scan is an associative_scan over the length: one opaque scan, not one trace per length.
    "mamba": ([(1, 5), (2, 6), (1, 9), (3, 13), (2, 17)], 1),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_serving_from_a_batch_of_one_traces_at_most_twice(name: str) -> None:
    build, kind = HF_MODELS[name]
    calls, traces = CASES[name]
    torch.manual_seed(0)
    model = build().eval()
    jm = minijit.jit(model, cache="symbolic values")
    with torch.no_grad():
        for batch, length in calls:
            inputs = _inputs(kind, batch, length)
            want, have = tensors_in(model(**inputs)), tensors_in(jm(**inputs))
            assert len(have) == len(want)
            for h, w in zip(have, want, strict=True):
                torch.testing.assert_close(h, w, rtol=1e-4, atol=1e-5)
    info = minijit.cache_info(jm)
    assert info.misses == traces, info
