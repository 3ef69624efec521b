"""How the benchmark scripts exit: main's return code, or 2 with a one-line error for bad input."""

from __future__ import annotations

import sys
from collections.abc import Callable

from hotspec.errors import HotspecError


def run_script(main: Callable[[], int]) -> None:
    """`sys.exit(main())`, with a HotspecError (bad options, files, checkpoints) printed as
    `error: ...` on stderr and exit status 2 instead of a traceback."""
    try:
        sys.exit(main())
    except HotspecError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
