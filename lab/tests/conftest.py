"""The lab's tests (`python -m pytest lab/tests`; CI's run of tests/ leaves them out): the
repository's test helpers (tests/engine_utils.py, tests/script_utils.py) and the lab's benchmarks
importable, Triton's interpreter without a GPU, `gpu` tests skipped without one, and the
`one_thread` fixture of tests/conftest.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

LAB = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(LAB.parent / "tests"))
sys.path.insert(0, str(LAB / "benchmarks"))

if not torch.cuda.is_available():  # before anything imports triton (see tests/conftest.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run lab/gpu_job.sh on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module's tests: tiny matmuls gain nothing from intra-op threads."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
