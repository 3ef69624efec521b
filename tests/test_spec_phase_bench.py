"""benchmarks/spec_phase_bench.py runs end to end on the CPU (eager) on a small random target with
a random EAGLE-3 head: a row per (shape, batch size, phase) beside the same batch's vanilla decode
step, and bytes-read bounds that add up (the step reads the target once and the head num_steps
times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_utils import load_script

pytestmark = pytest.mark.usefixtures("one_thread")


def test_phase_rows_beside_decode_and_bounds(tmp_path: Path) -> None:
    bench = load_script("benchmarks/spec_phase_bench.py")
    out = tmp_path / "rows.json"
    bench.main(["--target", "smollm2-shape", "--target-layers", "4", "--device", "cpu",
                "--batch-sizes", "1,2", "--shapes", "3,1,4", "2,2,3", "--draft", "eagle3:512",
                "--iters", "1", "--context", "16", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert {(r["shape"], r["bs"], r["phase"]) for r in rows} == {
        (s, b, p) for s in ("3,1,4", "2,2,3") for b in (1, 2)
        for p in ("draft", "verify", "draft_extend", "step")}
    for r in rows:
        assert r["ms"] > 0 and r["decode_ms"] > 0
        assert r["x_decode"] == pytest.approx(r["ms"] / r["decode_ms"], rel=1e-2, abs=1e-3)
        assert r["of_bound"] == pytest.approx(r["bound_ms"] / r["ms"], rel=1e-2, abs=1e-3)
    for shape, steps in (("3,1,4", 3), ("2,2,3", 2)):
        b = {r["phase"]: r["bound_ms"] for r in rows if r["shape"] == shape and r["bs"] == 1}
        assert b["step"] == pytest.approx(b["verify"] + steps * b["draft_extend"], abs=3e-4)
        assert b["draft"] == pytest.approx((steps - 1) * b["draft_extend"], abs=3e-4)
