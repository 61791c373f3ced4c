"""minijit in one page: jit a function and a small MLP, check them against eager, print their traces.

Run: python examples/quickstart.py
"""

import torch

import minijit


def f(x, w, b):
    y = torch.nn.functional.linear(x, w, b)
    return torch.nn.functional.gelu(y).sum(dim=-1) * 2


class MLP(torch.nn.Module):
    """Two linear layers with a GELU between them."""

    def __init__(self, d_in: int = 16, d_hidden: int = 64, d_out: int = 8):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def mlp_forward(x, w1, b1, w2, b2):
    """The MLP as a plain function of its weights."""
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
    return torch.nn.functional.linear(h, w2, b2)


def main() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)

    jf = minijit.jit(f)
    out = jf(x, w, b)
    torch.testing.assert_close(out, f(x, w, b))
    print("f: the final trace, as minijit runs it")
    print(minijit.last_traces(jf)[-1])

    jf(x, w, b)
    info = minijit.cache_info(jf)
    print(f"cache: {info.hits} hit(s), {info.misses} miss(es)\n")

    mlp = MLP()
    params = (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias)
    jmlp = minijit.jit(mlp_forward)
    with torch.no_grad():
        out = jmlp(x, *params)
        torch.testing.assert_close(out, mlp(x))
    print("two-layer MLP: the final trace")
    print(minijit.last_traces(jmlp)[-1])
    print("quickstart: all results equal eager PyTorch")


if __name__ == "__main__":
    main()
