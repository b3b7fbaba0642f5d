"""Structured ``key=value`` logging for the worker process."""

from __future__ import annotations

import logging
import sys


def setup(level: str = "INFO", name: str = "local") -> None:
    """Log to stderr as ``ts level logger worker=<name> event=...`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s level=%(levelname)s logger=%(name)s worker={name} %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
