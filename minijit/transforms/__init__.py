"""Passes: each a function from Trace to Trace, named for what it does."""

from minijit.transforms.claim import claim_executors
from minijit.transforms.copy_analysis import write_copies_in_place
from minijit.transforms.dce import dce
from minijit.transforms.functionalize import functionalize
from minijit.transforms.verify import check_copies  # the verifier's rule 'copies settled' (invariants 1 and 2)

__all__ = ["check_copies", "claim_executors", "dce", "functionalize", "write_copies_in_place"]
