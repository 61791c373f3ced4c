"""Test-session set-up shared by every test module."""

import os

import torch

# Without a GPU, Triton kernels run through Triton's CPU interpreter. Triton reads
# TRITON_INTERPRET when it is imported, and other modules (torch._inductor) may import it
# before the Triton tests run: so it is set here, for the whole session, before any test.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Every pass's trace is verified (minijit/transforms/verify.py) in the whole test session:
# a pass that breaks a trace rule fails the test that ran it, naming the pass and the line.
os.environ.setdefault("MINIJIT_CHECK_TRACES", "1")
