"""`python -m hotspec ...` is the `hotspec` command (for machines where it is not installed)."""

import sys

from hotspec.entrypoints.cli import main

sys.exit(main())
