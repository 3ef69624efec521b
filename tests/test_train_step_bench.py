"""benchmarks/train_step_bench.py (the trainer's step cost) runs end to end on the CPU at a tiny
size."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import train_step_bench  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--device", "cpu", "--batch-size", "2", "--draft-vocab", "512", "--ttt", "2", "--steps", "1",
        "--layers", "6", "--records", "6", "--min-len", "12", "--max-len", "24", "--prompt-len", "4"]


def test_train_step_bench_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert train_step_bench.main(TINY) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.search(r"batch 2, draft vocab 512, TTT 2: [0-9.]+ ms/step, [0-9]+ loss positions/s", line)
