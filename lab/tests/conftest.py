"""The lab's tests (`python -m pytest lab/tests`; CI's run of tests/ leaves them out): the
repository's test helpers (tests/engine_utils.py, tests/script_utils.py) and the lab's benchmarks
importable, and tests/conftest.py's setup (Triton's interpreter without a GPU, `gpu` tests
skipped without one, its fixtures), taken from there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

LAB = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(LAB.parent / "tests"))
sys.path.insert(0, str(LAB / "benchmarks"))

_spec = importlib.util.spec_from_file_location("hotspec_tests_conftest", LAB.parent / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
pytest_collection_modifyitems = _base.pytest_collection_modifyitems
one_thread = _base.one_thread
default_gguf = _base.default_gguf
