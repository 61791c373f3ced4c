"""Executors: plugins written against `minijit.extend` (torch, triton, nvfuser, ...)."""
