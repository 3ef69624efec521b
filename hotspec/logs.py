"""hotspec's log output, set up once per process (the command line, the engine process)."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str) -> None:
    """hotspec's loggers ("hotspec", "hotspec.server", ...) to stderr at `level`; other libraries'
    loggers keep Python's default (warnings and errors only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger("hotspec")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
