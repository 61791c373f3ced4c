"""Test-session set-up shared by every test module."""

import os

# Triton reads TRITON_INTERPRET when it is imported, and other modules (torch._inductor) may
# import it before the Triton tests run: set it for the whole session, before any import.
os.environ.setdefault("TRITON_INTERPRET", "1")
