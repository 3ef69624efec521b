"""The style guide's "mypy clean": `python -m mypy hotspec` (configured in pyproject.toml) passes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_clean() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail('mypy is not installed; install the test extra: pip install -e ".[test]"')
    proc = subprocess.run([sys.executable, "-m", "mypy", "hotspec"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, f"mypy reported errors:\n{proc.stdout}{proc.stderr}"
