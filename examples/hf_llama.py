"""A tiny Hugging Face Llama (random weights, no download) trained for a few steps under minijit.jit,
side by side with the same model in eager PyTorch: the losses match at every step.

Run: python examples/hf_llama.py [--steps N] [--lines N]
Needs transformers (`pip install transformers`; the test extra pins the tested version).
"""

from __future__ import annotations

import argparse
import copy
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from a config: nothing to download

from transformers import LlamaConfig, LlamaForCausalLM

import minijit


def tiny_llama() -> LlamaForCausalLM:
    """A 2-layer Llama with hidden size 64 and grouped-query attention, randomly initialised."""
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


def batch(size: int = 4, seq: int = 32, vocab: int = 256) -> dict[str, torch.Tensor]:
    """Random token ids, left-padded to a common length: attention_mask 0 and labels -100 on the padding."""
    ids = torch.randint(3, vocab, (size, seq))
    mask = torch.ones(size, seq, dtype=torch.long)
    for row in range(1, size):
        mask[row, : 3 * row] = 0
    ids[mask == 0] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def train(steps: int = 4, verbose: bool = True) -> tuple[list[float], list[float], minijit.JitModule]:
    """Train an eager Llama and a jitted copy with AdamW on the same batches; returns both losses per step."""
    torch.manual_seed(0)
    eager = tiny_llama().train()
    jitted_model = copy.deepcopy(eager)
    jmodel = minijit.jit(jitted_model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (eager, jitted_model)]
    eager_losses: list[float] = []
    jit_losses: list[float] = []
    for step in range(steps):
        inputs = batch()
        for model, opt, losses in ((eager, optimizers[0], eager_losses), (jmodel, optimizers[1], jit_losses)):
            loss = model(**inputs).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if verbose:
            print(f"step {step}: loss eager {eager_losses[-1]:.6f}  minijit {jit_losses[-1]:.6f}")
    return eager_losses, jit_losses, jmodel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lines", type=int, default=25, help="how many lines of the final trace to print")
    opts = parser.parse_args()
    eager_losses, jit_losses, jmodel = train(opts.steps)
    torch.testing.assert_close(jit_losses, eager_losses, rtol=1e-4, atol=1e-5)
    final = str(minijit.last_traces(jmodel)[-1]).splitlines()
    print(f"\nthe final forward trace ({len(final)} lines), its first {opts.lines}:")
    print("\n".join(final[: opts.lines]))
    print(f"\n{minijit.cache_info(jmodel)}")
    print("hf_llama: the losses equal eager PyTorch's at every step")


if __name__ == "__main__":
    main()
