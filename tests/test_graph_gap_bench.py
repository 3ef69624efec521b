"""benchmarks/graph_gap_bench.py (CUDA only): every variant captures, replays and is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args: str) -> list[str]:
    """The benchmark's stdout lines at a small size (20 kernels, 5 replays), after it succeeded."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "graph_gap_bench.py"), "--kernels",
                          "20", "--replays", "5", *args], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


@pytest.mark.gpu
def test_gpu_graph_gap_bench_times_every_variant() -> None:
    rows = [line.split() for line in _bench("--body", "torch")[2:]]
    assert len(rows) == 8 and all(r[0] == "torch" for r in rows)
    assert all(float(r[-1]) > 0 and float(r[-2]) > 0 for r in rows)


@pytest.mark.gpu
def test_gpu_graph_gap_bench_pair() -> None:
    lines = _bench("--pair")
    assert [line.split()[2] for line in lines] == ["B", "A", "B", "A"]


@pytest.mark.gpu
def test_gpu_graph_gap_bench_study() -> None:
    rows = [line.split() for line in _bench("--study")[1:]]
    assert [r[0] for r in rows] == [
        "alone", "after-dummy", "after-dummy-kept", "after-dummy-unreplayed", "after-dummy-priority",
        "after-dummy-shared-pool", "after-big", "after-big-kept", "after-big-unreplayed"]
    assert all(float(r[1]) > 0 for r in rows)
