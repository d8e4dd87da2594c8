"""The ``cuquant`` command (`main`), its demo (`demo`) and its console output
(`console`)."""

from .main import main

__all__ = ["main"]
