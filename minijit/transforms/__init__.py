"""Passes: each a function from Trace to Trace, named for what it does."""

from minijit.transforms.claim import claim_executors
from minijit.transforms.dce import dce

__all__ = ["claim_executors", "dce"]
