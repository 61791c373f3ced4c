"""Debugging with minijit: why does my function trace again, and what did each pass do?

Run: python examples/debugging.py
"""

import warnings

import torch

import minijit


def scaled_softmax(x, temperature):
    logits = x / temperature
    logits = logits - logits.amax(dim=-1, keepdim=True)
    e = logits.exp()
    return e / e.sum(dim=-1, keepdim=True)


def main() -> None:
    torch.manual_seed(0)

    print("1. Each new input shape or Python value traces again. cache_info says why, in words.")
    jf = minijit.jit(scaled_softmax)
    jf(torch.randn(4, 16), 2.0)
    jf(torch.randn(8, 16), 2.0)   # another batch size
    jf(torch.randn(8, 16), 0.5)   # another temperature
    jf(torch.randn(8, 16), 0.5)   # same as before: a cache hit
    print(minijit.cache_info(jf), "\n")

    print("2. Warn on every re-trace after the first N (or set MINIJIT_WARN_RETRACES=N).")
    jw = minijit.jit(scaled_softmax, warn_retraces_after=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4):
            jw(torch.randn(n, 16), 1.0)
    for w in caught:
        print("  warning:", w.message)
    print()

    print("3. cache='symbolic values' traces sizes and Python numbers: one trace serves them all.")
    js = minijit.jit(scaled_softmax, cache="symbolic values")
    for n, t in [(4, 2.0), (8, 0.5), (32, 1.5)]:
        x = torch.randn(n, 16)
        torch.testing.assert_close(js(x, t), scaled_softmax(x, t))
    print(minijit.cache_info(js))
    print("  The checks a call must pass to reuse that trace (its prologue):")
    minijit.show(js, "prologue")
    print()

    print("4. Every pass leaves a trace; show() prints one, show_diff() what a pass changed.")
    minijit.show(jf, "capture")
    minijit.show_diff(jf, "capture", "claim executors")
    print("  The final trace, as it runs:")
    minijit.show(jf)


if __name__ == "__main__":
    main()
