"""benchmarks/graph_gap_bench.py (CUDA only): every variant captures, replays and is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.gpu
def test_gpu_graph_gap_bench_times_every_variant() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "graph_gap_bench.py"), "--kernels",
                          "20", "--replays", "5", "--body", "torch"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert len(rows) == 8 and all(r[0] == "torch" for r in rows)
    assert all(float(r[-1]) > 0 and float(r[-2]) > 0 for r in rows)


@pytest.mark.gpu
def test_gpu_graph_gap_bench_pair() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "graph_gap_bench.py"), "--kernels",
                          "20", "--replays", "5", "--pair"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split()[2] for line in lines] == ["B", "A", "B", "A"]


@pytest.mark.gpu
def test_gpu_graph_gap_bench_study() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "graph_gap_bench.py"), "--kernels",
                          "20", "--replays", "5", "--study"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert [r[0] for r in rows][:2] == ["alone", "after-dummy"] and len(rows) == 6
    assert all(float(r[1]) > 0 for r in rows)
