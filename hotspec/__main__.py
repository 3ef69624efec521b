"""`python -m hotspec ...` is the `hotspec` command (for machines where it is not installed)."""

import sys

from hotspec.cli.main import main

sys.exit(main())
