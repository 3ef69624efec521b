"""benchmarks/ab_table.py: the side-by-side table of two variants' spec_phase_bench runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, name: str, verify_ms: float) -> None:
    rows = [{"shape": "3,1,4", "bs": 1, "phase": "verify", "ms": verify_ms, "decode_ms": 1.0},
            {"shape": "3,1,4", "bs": 1, "phase": "step", "ms": verify_ms + 1, "decode_ms": 1.0}]
    (tmp / f"{name}.json").write_text(json.dumps(rows))


def test_ab_table_prints_the_fastest_rounds_ratio(tmp_path):
    _run(tmp_path, "smol_base_1", 2.0)
    _run(tmp_path, "smol_base_2", 1.6)
    _run(tmp_path, "smol_new_1", 1.2)
    _run(tmp_path, "smol_new_2", 1.4)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/ab_table.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    verify = next(line for line in out.splitlines() if " verify " in line)
    assert "2.000/1.600" in verify and "1.200/1.400" in verify and verify.endswith("0.750")
    decode = next(line for line in out.splitlines() if " decode " in line)
    assert decode.endswith("1.000")


def test_ab_table_needs_two_variants(tmp_path):
    _run(tmp_path, "smol_base_1", 2.0)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/ab_table.py"), str(tmp_path)],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "two variants expected" in res.stderr
