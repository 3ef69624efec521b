"""benchmarks/weight_layout_bench.py: its GEMV kernels compute W @ x over the row-major and the
tiled layout (and rows in turn), in Triton's interpreter on the CPU and at real shapes on the GPU;
`tiled` puts tile (p, j) where the kernel reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from script_utils import load_script

pytest.importorskip("triton")  # (conftest selects Triton's interpreter without a GPU)

ROOT = Path(__file__).resolve().parent.parent
wlb = load_script("benchmarks/weight_layout_bench.py")

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_tiled_layout_places_each_tile_contiguously() -> None:
    w = torch.arange(8 * 12, dtype=torch.float32).view(8, 12)
    t = wlb.tiled(w, 4, 3)
    assert t.shape == (2, 4, 4, 3) and t.is_contiguous()
    assert torch.equal(t[1, 2], w[4:8, 6:9])


@pytest.mark.parametrize("block_n,block_k", [(8, 512), (16, 256), (4, 1024)])
def test_kernels_match_torch(block_n: int, block_k: int) -> None:
    """Both layouts and the rows-in-turn kernel give torch's W @ x (check raises otherwise)."""
    wlb.check(32, 2048, block_n, block_k, DEV)


def test_read_only_sums_the_weights() -> None:
    w = torch.randn(16, 1024).to(torch.bfloat16).to(DEV)
    x = torch.zeros(1024, dtype=torch.bfloat16, device=DEV)
    got = wlb.run_layout(x, wlb.tiled(w, 8, 512), 8, 512, True, read_only=True).float()
    want = w.float().sum(1)
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-1)


@pytest.mark.gpu
def test_gpu_benchmark_runs() -> None:
    """The whole benchmark at one real shape: every row printed, checked against torch first."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "weight_layout_bench.py"),
                          "--shapes", "4096x4096", "--tiles", "8x512", "--rows", "4x1024"],
                         capture_output=True, text=True, check=True).stdout
    assert "tiled, read only" in out and "rows in turn" in out
