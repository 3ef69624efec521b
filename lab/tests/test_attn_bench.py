"""lab/benchmarks/attn_bench.py (the attention kernel timed per phase and tile choice) runs end to end
on the CPU in Triton's interpreter at tiny shapes: every phase shape and variant agrees with the
torch reference backend, and the table lists them all. (Its timings only mean something on the
GPU.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LAB = Path(__file__).resolve().parent.parent


def test_attn_bench_checks_every_variant_against_the_reference() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [sys.executable, str(LAB / "benchmarks" / "attn_bench.py"), "--model", "tiny", "--context", "40",
         "--static-kv", "128", "--batch-sizes", "2", "--copies", "1", "--iters", "1",
         "--variants", "auto,bits,bytes,n32,n128,m16,s8,real-kv"],
        capture_output=True, text=True, env=env, timeout=300, cwd=LAB.parent)
    assert out.returncode == 0, out.stderr[-3000:]  # 1 would mean a variant disagreed
    table = out.stdout.splitlines()
    assert "auto" in table[1] and "real-kv" in table[1]
    phases = [line.split()[1] for line in table[2:]]
    assert phases == ["decode", "verify", "verify-4", "verify-16", "verify-causal", "draft",
                      "draft-causal", "draft_extend"]


def test_unknown_variant_is_refused() -> None:
    out = subprocess.run([sys.executable, str(LAB / "benchmarks" / "attn_bench.py"), "--variants", "m7"],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="1"),
                         timeout=120, cwd=LAB.parent)
    assert out.returncode == 2 and "unknown phase or variant 'm7'" in out.stderr
