"""Traces per model when serving under `cache="symbolic values"` (issue 28): how often each model re-traces.

Every model of the zoo (tests/models/test_zoo.py: the Hugging Face models and the torch.nn models),
plus a torch.nn CNN and a function of `searchsorted`/`bucketize`/`embedding_bag`, is run in inference
(`eval()`, `torch.no_grad()`) over batch sizes 1-8 and sequence lengths 5-17 (image sizes 5-17 for the
CNNs; a ViT's image size is fixed by its position embeddings, so only its batch varies). Every output
is compared with eager's; the table gives the traces (cache misses) and calls per model. Speech models
get 40 samples per length step.

    python scripts/symbolic_zoo.py                      # the whole zoo, the full sweep
    python scripts/symbolic_zoo.py --models vit cnn --batches 1 2 3 --lengths 5 9
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import minijit  # noqa: E402

F = nn.functional
VOCAB = 128


class SmallCnn(nn.Module):
    """Convolutions (strided, padded, dilated, grouped), batch norm, max and average pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2), nn.ReLU(),
            nn.AvgPool2d(2, stride=1, padding=1),
            nn.Conv2d(8, 16, 1),
        )
        self.head = nn.Linear(16, 3)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.features(pixel_values)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Buckets(nn.Module):
    """searchsorted, bucketize and embedding_bag over a batch: bucket ids, their pooled embeddings."""

    def __init__(self):
        super().__init__()
        self.register_buffer("edges", torch.linspace(-2, 2, 9))
        self.bags = nn.EmbeddingBag(10, 4, mode="mean")

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = torch.bucketize(x, self.edges)
        right = torch.searchsorted(self.edges, x.contiguous(), right=True)
        offsets = torch.arange(x.shape[0]) * x.shape[1]
        pooled = self.bags(ids.flatten(), offsets)
        return {"ids": ids, "right": right, "pooled": pooled, "scaled": pooled * ids.shape[1]}


def _zoo() -> Any:
    from tests.models import test_zoo

    return test_zoo


def _text(kind: str) -> Callable[[int, int], dict[str, Any]]:
    def make(batch: int, seq: int) -> dict[str, Any]:
        ids = torch.randint(3, VOCAB, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[-1, :2] = 0  # the last sequence is padded
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if kind == "seq2seq":
            inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (batch, seq))
        return inputs
    return make


def _image(fixed: int | None) -> Callable[[int, int], dict[str, Any]]:
    return lambda batch, size: {"pixel_values": torch.randn(batch, 3, fixed or size, fixed or size)}


def _speech(batch: int, seq: int) -> dict[str, Any]:
    return {"input_values": torch.randn(batch, 40 * seq)}  # 200-680 samples: 9-33 frames after the convolutions


def _vectors(batch: int, seq: int) -> dict[str, Any]:
    return {"x": torch.randn(batch, seq, 32)}


def models() -> dict[str, tuple[Callable[[], nn.Module], Callable[[int, int], dict[str, Any]], bool]]:
    """name -> (builder, inputs for (batch, length), whether the length varies)."""
    zoo = _zoo()
    found: dict[str, tuple[Callable[[], nn.Module], Callable[[int, int], dict[str, Any]], bool]] = {}
    for name, (build, kind) in zoo.HF_MODELS.items():
        if kind == "image":
            fixed = 16 if name == "vit" else None  # a ViT's position embeddings fix its image size
            found[name] = (build, _image(fixed), fixed is None)
        elif kind == "audio":
            found[name] = (build, _speech, True)
        else:
            found[name] = (build, _text(kind), True)
    for name, (build, _) in zoo.NN_MODELS.items():
        if name == "LSTM_language_model":
            found[name] = (build, lambda b, s: {"input_ids": torch.randint(3, VOCAB, (b, s)),
                                                "labels": torch.randint(3, VOCAB, (b, s))}, True)
        else:
            found[name] = (build, _vectors, True)
    found["cnn"] = (SmallCnn, _image(None), True)
    found["buckets"] = (Buckets, lambda b, s: {"x": torch.randn(b, s) * 2}, True)
    return found


def _tensors(value: Any) -> list[torch.Tensor]:
    return _zoo().tensors_in(value)


def sweep(build: Callable[[], nn.Module], make: Callable[[int, int], dict[str, Any]], batches: list[int],
          lengths: list[int], why: bool = False) -> tuple[int, int]:
    """Serve a fresh model over every (batch, length); every output equals eager's. (traces, calls).

    With `why`, print why each call that traced again missed the cache."""
    torch.manual_seed(0)
    model = build().eval()
    jm = minijit.jit(model, cache="symbolic values")
    calls = 0
    with torch.no_grad():
        for batch in batches:
            for length in lengths:
                inputs = make(batch, length)
                want, have = _tensors(model(**inputs)), _tensors(jm(**inputs))
                assert len(have) == len(want), f"batch {batch}, length {length}: {len(have)} outputs, not {len(want)}"
                for h, w in zip(have, want, strict=True):
                    torch.testing.assert_close(h, w, rtol=1e-4, atol=1e-5,
                                               msg=lambda m: f"batch {batch}, length {length}: {m}")  # noqa: B023
                calls += 1
    info = minijit.cache_info(jm)
    if why:
        for i, reason in enumerate(info.miss_reasons, start=1):
            print(f"    miss {i}: {reason[:400]}")
    return info.misses, calls


def main() -> None:
    """Run the sweep for the chosen models and print a table of traces per model."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", help="model names (default: all)")
    parser.add_argument("--batches", nargs="*", type=int, default=list(range(1, 9)))
    parser.add_argument("--lengths", nargs="*", type=int, default=list(range(5, 18)))
    parser.add_argument("--why", action="store_true", help="print why each trace after the first was made")
    options = parser.parse_args()
    table = models()
    names = options.models or list(table)
    print("| model | traces | calls | seconds |")
    print("| --- | --- | --- | --- |")
    worst = 0
    for name in names:
        build, make, varies = table[name]
        lengths = options.lengths if varies else options.lengths[:1]
        start = time.perf_counter()
        try:
            traces, calls = sweep(build, make, options.batches, lengths, options.why)
            worst = max(worst, traces)
            print(f"| {name} | {traces} | {calls} | {time.perf_counter() - start:.1f} |", flush=True)
        except Exception as e:  # a report: name the failure and go on
            print(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | |", flush=True)
            worst = max(worst, 99)
    print(f"\nmost traces for one model: {worst}")


if __name__ == "__main__":
    main()
