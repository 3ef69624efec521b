"""benchmarks/persistent_chain_bench.py: the persistent kernel computes the four-phase chain (one
program in Triton's interpreter on the CPU: its grid barriers open at once), and on the GPU the
benchmark checks both variants against torch and times them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from script_utils import load_script

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
pcb = load_script("benchmarks/persistent_chain_bench.py")

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("pipe", [1, 2])
def test_persistent_layer_matches_the_reference_chain(pipe: int) -> None:
    """Small phases with ragged row blocks and K tails; each phase reads the first K of the one
    before; the three barrier counters end at the program count."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    shapes = [(40, 72), (100, 40), (24, 90), (30, 24)]
    ws = [(torch.randn(n, k, generator=gen, device=DEV) * 0.1).to(torch.bfloat16) for n, k in shapes]
    x = torch.randn(1, 72, generator=gen, device=DEV).to(torch.bfloat16)
    outs = [torch.empty(1, n, dtype=torch.bfloat16, device=DEV) for n, _ in shapes]
    cnt = torch.zeros(3, dtype=torch.int32, device=DEV)
    programs = 1 if DEV.type == "cpu" else 3  # the interpreter runs programs one after another
    pcb.persistent_layer(x, ws, outs, cnt, programs, block_n=16, block_k=32, pipe=pipe)
    want = pcb.reference_layer(x, ws)
    torch.testing.assert_close(outs[3].float(), want.float(), rtol=2e-2, atol=2e-2)
    assert cnt.tolist() == [programs] * 3


@pytest.mark.gpu
def test_gpu_persistent_chain_bench_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "persistent_chain_bench.py"),
                          "--layers", "2", "--programs-per-sm", "2", "--iters", "3", "--pipe", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = out.stdout.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["chain", "persistent,"]
    assert all(float(r.split()[-2]) > 0 for r in rows)
