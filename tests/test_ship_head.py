"""scripts/ship_head.py: a trained head becomes the default model's head with a compact report
(per-step histories as means over 100 steps); a head of another target is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_utils import load_script

ship = load_script("scripts/ship_head.py")


def _head(tmp_path: Path, target: str, steps: int) -> Path:
    head = tmp_path / "trained"
    head.mkdir()
    (head / "config.json").write_text('{"draft_vocab_size": 8192}')
    (head / "model.safetensors").write_bytes(b"weights")
    training = {"steps": steps, "loss": [float(i) for i in range(steps)],
                "step_acc": [[0.5, 0.25]] * steps, "lr": [1e-3] * steps, "final_loss": 1.0}
    (head / "train_report.json").write_text(json.dumps({"target": target, "training": training}))
    return head


def test_ship_copies_the_head_and_compacts_its_report(tmp_path: Path) -> None:
    head = _head(tmp_path, "default (SmolLM2-135M-Instruct)", 250)
    into = tmp_path / "asset"
    ship.main([str(head), "--into", str(into), "--note", "how it was trained"])
    assert (into / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((into / "config.json").read_text()) == {"draft_vocab_size": 8192}
    report = json.loads((into / "train_report.json").read_text())
    t = report["training"]
    assert "loss" not in t and "step_acc" not in t and "lr" not in t
    assert t["loss_mean_per_100_steps"] == [49.5, 149.5, 224.5]  # 0-99, 100-199, 200-249
    assert t["step_acc_mean_per_100_steps"] == [[0.5, 0.25]] * 3
    assert t["final_loss"] == 1.0 and t["steps"] == 250
    assert report["note"] == "how it was trained"


def test_ship_refuses_a_head_of_another_target(tmp_path: Path) -> None:
    head = _head(tmp_path, "Qwen2.5-Coder-0.5B-Instruct", 10)
    with pytest.raises(SystemExit, match="not the default model"):
        ship.main([str(head), "--into", str(tmp_path / "asset")])
    assert not (tmp_path / "asset" / "model.safetensors").exists()
