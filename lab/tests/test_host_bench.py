"""lab/benchmarks/host_bench.py splits each decode step's wall time into the graph runner's `run`,
the wait for the device and the host's other work; on the CPU it runs end to end on a tiny model,
vanilla and speculative, and the parts add up to the step."""

from __future__ import annotations

import json

import host_bench
import pytest
import torch
from engine_utils import save_tiny_llama


@pytest.mark.parametrize("spec", [False, True], ids=["vanilla", "eagle3"])
def test_host_bench_parts_add_up(tmp_path, capsys, spec):
    from hotspec.models.draft_checkpoint import random_draft_checkpoint
    from hotspec.models.loader import load_checkpoint

    path = save_tiny_llama(tmp_path / "tiny", vocab=96, hidden=64, layers=4, std=0.2)
    argv = ["--model", str(path), "--device", "cpu", "--dtype", "float32", "--skip-tokenizer-init",
            "--batch-sizes", "1,3", "--prompt-len", "8", "--max-tokens", "6",
            "--out", str(tmp_path / "h.json")]
    if spec:
        cfg, _ = load_checkpoint(path, torch.float32)
        head = random_draft_checkpoint(tmp_path / "head", cfg, "EAGLE3", seed=1)
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head)]
    assert host_bench.main(argv) == 0
    assert ("EAGLE3" if spec else "vanilla") in capsys.readouterr().out
    rows = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["steps"] >= 1 and r["tokens"] == r["batch"] * 5  # the first token is prefill's
        assert r["ms_run"] > 0 and r["ms_other"] > 0
        assert r["ms_run"] + r["ms_wait"] <= r["ms_step"] * 1.5  # medians of parts, roughly
