"""lab/speed_table.py: the `speed` stage's decode and sweep runs of two trees side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "speed_table.py"


def _decode(ms: float) -> dict:
    return {"results": [{"batch_size": 1, "ms_per_step": ms, "tokens_per_s": 1000 / ms}]}


def _sweep(vanilla_ms: float, tau: float) -> dict:
    return {"vanilla_ms_per_step": vanilla_ms,
            "rows": [{"variant": "vanilla", "tokens_per_s": 100.0},
                     {"variant": "3/1/4", "tau_mean": tau, "tokens_per_s": 150.0, "decode_speedup": 1.4},
                     {"variant": "4/8/12", "error": "RuntimeError: boom"}]}


def test_two_trees_side_by_side(tmp_path: Path) -> None:
    for name, d in [("before_decode", _decode(4.0)), ("after_decode", _decode(3.8)),
                    ("before_sweep_b1", _sweep(0.5, 2.3)), ("after_sweep_b1", _sweep(0.5, 2.3))]:
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    (tmp_path / "after_sweep_b8.json").write_text(json.dumps(_sweep(0.7, 2.4)))  # before's failed
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[2] == "| decode | batch 1: ms a step | 4.000 | 3.800 | 0.950 |"
    assert "| sweep_b1 | 3/1/4: tau | 2.300 | 2.300 | 1.000 |" in out
    assert "| sweep_b8 | vanilla: ms a decode step |  | 0.700 |  |" in out
    assert not any("4/8/12" in line for line in out)  # a failed variant has no figures
