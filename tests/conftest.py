"""Test-session set-up shared by every test module."""

import os

import torch

# Without a GPU, Triton kernels run through Triton's CPU interpreter. Triton reads
# TRITON_INTERPRET when it is imported, and other modules (torch._inductor) may import it
# before the Triton tests run: so it is set here, for the whole session, before any test.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist the workers already fill the cores: each gets one intra-op thread. With more threads
# than cores, torch's thread pools spin against each other (on 2 cores, the model tests' CPU time is 4x).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
