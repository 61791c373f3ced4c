"""torch.nn modules whose inputs change shape dim by dim between calls, under jit's default cache mode
("automatic"), forward and backward, against eager: outputs, input and parameter grads, buffers (BatchNorm's running
statistics in train mode). `python sweep/modules_sweep.py [REPEATS]`: each case REPEATS times from other seeds.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import minijit

TOL = {"rtol": 1e-4, "atol": 1e-5}


def conv_inputs(shapes: list[tuple[int, ...]]) -> Callable[[int, torch.Generator], tuple[Any, ...]]:
    return lambda i, g: (torch.randn(shapes[i], generator=g),)


def rnn_inputs(shapes: list[tuple[int, int]], features: int) -> Callable[[int, torch.Generator], tuple[Any, ...]]:
    return lambda i, g: (torch.randn(*shapes[i], features, generator=g),)


def mha_inputs(shapes: list[tuple[int, int]]) -> Callable[[int, torch.Generator], tuple[Any, ...]]:
    """(query, key, value, key_padding_mask) of batch b, length n (at least one key kept per row)."""
    def make(i: int, g: torch.Generator) -> tuple[Any, ...]:
        b, n = shapes[i]
        mask = torch.rand(b, n, generator=g) < 0.3
        mask[:, 0] = False
        return torch.randn(b, n, 8, generator=g), torch.randn(b, n, 8, generator=g), torch.randn(b, n, 8, generator=g), mask
    return make


def bag_inputs(lengths: list[list[int]]) -> Callable[[int, torch.Generator], tuple[Any, ...]]:
    """(indices, offsets) of bags of these lengths (an empty bag included where a length is 0)."""
    def make(i: int, g: torch.Generator) -> tuple[Any, ...]:
        sizes = lengths[i]
        offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0)[:-1].tolist()])
        return torch.randint(0, 10, (sum(sizes),), generator=g), offsets
    return make


def embedding_inputs(shapes: list[tuple[int, ...]]) -> Callable[[int, torch.Generator], tuple[Any, ...]]:
    return lambda i, g: (torch.randint(0, 10, shapes[i], generator=g),)


class Mha(nn.Module):
    """nn.MultiheadAttention called with a key_padding_mask, its attention weights returned too."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple[Any, ...]:
        return self.attn(q, k, v, key_padding_mask=mask)


class CausalEncoder(nn.Module):
    """nn.TransformerEncoderLayer with a causal mask the size of the sequence and a key padding mask."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x + k - v, src_mask=causal, src_key_padding_mask=mask)


def channels_last(shapes: list[tuple[int, ...]]) -> Callable[[int, torch.Generator], tuple[Any, ...]]:
    return lambda i, g: (torch.randn(shapes[i], generator=g).contiguous(memory_format=torch.channels_last),)


class Rnn(nn.Module):
    """An LSTM or GRU whose output and final state are returned."""

    def __init__(self, kind: str, batch_first: bool) -> None:
        super().__init__()
        self.rnn = getattr(nn, kind)(4, 5, num_layers=2, batch_first=batch_first, bidirectional=True)

    def forward(self, x: torch.Tensor) -> Any:
        return self.rnn(x)


def cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[int, torch.Generator], tuple[Any, ...]], int]]:
    """name -> (module factory, inputs of call i, calls)."""
    hw = [(2, 3, 8, 8), (2, 3, 8, 10), (2, 3, 12, 10), (1, 3, 12, 10), (2, 3, 8, 8), (3, 3, 5, 1), (3, 3, 7, 6)]
    seq = [(5, 2), (7, 2), (7, 3), (1, 3), (5, 2), (4, 1), (9, 4)]
    bn = [(4, 3, 5, 5), (4, 3, 6, 5), (2, 3, 6, 7), (4, 3, 5, 5), (3, 3, 1, 1), (5, 3, 2, 3)]
    made: dict[str, Any] = {
        "Conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1), conv_inputs([(2, 3, 8), (2, 3, 11), (1, 3, 11), (3, 3, 3),
                                                                       (2, 3, 8), (4, 3, 1)]), 6),
        "Conv2d": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU()), conv_inputs(hw), 7),
        "Conv2d+AdaptiveAvgPool2d": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d((2, 3)),
                                                           nn.Flatten()), conv_inputs(hw), 7),
        "Conv2d channels_last": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
                                 channels_last(hw), 7),
        "TransformerEncoderLayer causal+padding": (CausalEncoder, mha_inputs(seq), 7),
        "LSTM": (lambda: Rnn("LSTM", False), rnn_inputs(seq, 4), 7),
        "GRU batch_first": (lambda: Rnn("GRU", True), rnn_inputs([(b, n) for n, b in seq], 4), 7),
        "MultiheadAttention": (Mha, mha_inputs(seq), 7),
        "TransformerEncoderLayer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                    conv_inputs([(2, 5, 8), (2, 7, 8), (3, 7, 8), (1, 1, 8), (2, 5, 8), (4, 3, 8)]), 6),
        "LayerNorm": (lambda: nn.LayerNorm(6), conv_inputs([(2, 6), (3, 6), (3, 4, 6), (1, 4, 6), (5, 2, 6)]), 5),
        "GroupNorm": (lambda: nn.GroupNorm(2, 4), conv_inputs([(2, 4, 5), (2, 4, 7), (3, 4, 7), (1, 4, 1), (2, 4, 5)]), 5),
        "BatchNorm2d train": (lambda: nn.BatchNorm2d(3), conv_inputs(bn), 6),
        "BatchNorm1d train": (lambda: nn.BatchNorm1d(3), conv_inputs([(4, 3), (6, 3), (6, 3, 5), (2, 3, 5), (4, 3, 2)]),
                              5),
        "Embedding": (lambda: nn.Embedding(10, 4), embedding_inputs([(3,), (5,), (2, 5), (2, 7), (4, 7), (1, 1)]), 6),
        "EmbeddingBag offsets": (lambda: nn.EmbeddingBag(10, 4, mode="mean"),
                                 bag_inputs([[2, 3], [2, 5], [1, 1, 4], [3, 0, 2], [2, 3], [6]]), 6),
        "EmbeddingBag sum": (lambda: nn.EmbeddingBag(10, 4, mode="sum"), bag_inputs([[2, 3], [4, 1], [1, 2, 3]]), 3),
    }
    return made


def flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for v in x for t in flat(v)]
    return []


def compare(have: Any, want: Any, what: str) -> list[str]:
    """Differences between the tensors of `have` (jit) and `want` (eager), in words."""
    found = []
    hs, ws = flat(have), flat(want)
    if len(hs) != len(ws):
        return [f"{what}: {len(hs)} tensors (jit) != {len(ws)} (eager)"]
    for i, (h, w) in enumerate(zip(hs, ws, strict=True)):
        if h is None or w is None:
            if (h is None) != (w is None):
                found.append(f"{what}[{i}]: {h is None} (jit) vs {w is None} (eager) None")
            continue
        if h.shape != w.shape or h.dtype != w.dtype:
            found.append(f"{what}[{i}]: {h.dtype}{tuple(h.shape)} (jit) != {w.dtype}{tuple(w.shape)} (eager)")
            continue
        try:
            torch.testing.assert_close(h.detach(), w.detach(), equal_nan=True, **TOL)
        except AssertionError as e:
            found.append(f"{what}[{i}]: {str(e).splitlines()[0]} {str(e).splitlines()[-1]}")
    return found


def run_case(name: str, seed: int) -> list[str]:
    """The case's calls from `seed`: the differences found, and how the calls were served."""
    factory, inputs, calls = cases()[name]
    torch.manual_seed(seed)
    model = factory().train()
    ours = copy.deepcopy(model)
    jm = minijit.jit(ours)
    found = []
    for i in range(calls):
        outs = []
        for m in (model, jm):
            g = torch.Generator().manual_seed(seed * 1000 + i)
            args = inputs(i, g)
            args = tuple(a.requires_grad_() if a.is_floating_point() else a for a in args)
            try:
                out = m(*args)
            except Exception as e:
                outs.append(("raised", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", args))
                continue
            weights = [torch.randn(t.shape, generator=g) for t in flat(out)]
            loss = sum((t * w).sum() for t, w in zip(flat(out), weights, strict=True) if t.is_floating_point())
            loss.backward()
            outs.append(("returned", out, args))
        (w_kind, want, w_args), (h_kind, have, h_args) = outs
        if w_kind != h_kind:
            found.append(f"call {i}: eager {w_kind} {want if w_kind == 'raised' else ''}, jit {h_kind} "
                         f"{have if h_kind == 'raised' else ''}")
            continue
        if w_kind == "raised":
            continue
        found += [f"call {i}: {d}" for d in compare(have, want, "output")]
        found += [f"call {i}: {d}" for d in compare([a.grad for a in h_args if a.is_floating_point()],
                                                    [a.grad for a in w_args if a.is_floating_point()], "input grad")]
        found += [f"call {i}: {d}" for d in compare([p.grad for p in ours.parameters()],
                                                    [p.grad for p in model.parameters()], "parameter grads")]
        found += [f"call {i}: {d}" for d in compare(list(ours.buffers()), list(model.buffers()), "buffers")]
    info = minijit.cache_info(jm)
    found.append(f"(hits {info.hits}, misses {info.misses}, eager calls {info.eager_calls}; {info.dynamic})")
    return found


def main(repeats: int) -> None:
    warnings.simplefilter("ignore")
    for name in cases():
        for seed in range(repeats):
            found = run_case(name, seed)
            status = "ok" if len(found) == 1 else "MISMATCH"
            print(f"{name} seed {seed}: {status} {found[-1]}")
            for line in found[:-1]:
                print(f"    {line}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
