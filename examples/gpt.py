"""A small GPT trained for a few steps under minijit.jit; loss and logits match eager at every step.

Run: python examples/gpt.py [--steps N] [--executors triton]
"""

from __future__ import annotations

import argparse
import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import minijit
from minijit.testing import tolerance


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _, t = idx.size()
        assert t <= self.config.block_size, f"sequence of length {t} is longer than {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def train(steps: int = 3, executors: list[str] | None = None, config: GPTConfig | None = None,
          batch: int = 4, seq: int = 16, verbose: bool = True, device: str = "cpu") -> None:
    """Train an eager GPT and a jitted copy side by side on `device`; assert equal logits and losses at each
    step, within rounding (`minijit.testing.tolerance`: the longest sums are the weight gradients', over the
    batch x seq tokens, which a fusion executor may add in another order)."""
    torch.manual_seed(0)
    config = config or GPTConfig()
    tol = tolerance(torch.float32, reduction_length=batch * seq)
    eager = GPT(config).to(device)
    jitted_model = copy.deepcopy(eager)
    jmodel = minijit.jit(jitted_model, executors=executors)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_j = torch.optim.AdamW(jitted_model.parameters(), lr=1e-2)
    for step in range(steps):
        idx = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
        targets = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
        logits_e, loss_e = eager(idx, targets)
        logits_j, loss_j = jmodel(idx, targets)
        torch.testing.assert_close(logits_j, logits_e, **tol)
        torch.testing.assert_close(loss_j, loss_e, **tol)
        for opt, loss in ((opt_e, loss_e), (opt_j, loss_j)):
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if verbose:
            print(f"step {step}: loss eager {loss_e.item():.5f}  jit {loss_j.item():.5f}")
    info = minijit.cache_info(jmodel)
    if verbose:
        print(f"cache: {info.hits} hit(s), {info.misses} miss(es)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--executors", nargs="*", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    opts = parser.parse_args()
    train(opts.steps, opts.executors, device=opts.device)
    print("gpt: logits and losses equal eager PyTorch at every step")


if __name__ == "__main__":
    main()
