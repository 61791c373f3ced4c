"""Capture: run the user's function on proxies and record a trace."""

from minijit.frontend.interpreter import interpret

__all__ = ["interpret"]
