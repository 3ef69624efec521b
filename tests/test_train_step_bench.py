"""benchmarks/train_step_bench.py (the first measurement of a GPU session) runs end to end on the
CPU at a tiny size, both as the trainer is and with its A/B switches (dense mask, host data)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hotspec.training import head_forward

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import train_step_bench  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--device", "cpu", "--batch-size", "2", "--draft-vocab", "512", "--ttt", "2", "--steps", "1",
        "--layers", "6", "--records", "6", "--min-len", "12", "--max-len", "24", "--prompt-len", "4"]


@pytest.mark.parametrize("extra", [[], ["--dense-mask", "--host-data"]], ids=["trainer", "dense-host"])
def test_train_step_bench_runs(extra: list[str], capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    # --dense-mask swaps the trainer's attention module-wide: put it back after the test
    monkeypatch.setattr(head_forward, "ttt_attention", head_forward.ttt_attention)
    assert train_step_bench.main(TINY + extra) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.search(r"batch 2, draft vocab 512, TTT 2, .*: [0-9.]+ ms/step, [0-9]+ loss positions/s", line)
    assert ("dense mask, host data" in line) == bool(extra)
