"""benchmarks/batch_bench.py (the shape by batch size under steady load) runs end to end on the
CPU on a tiny random target: every engine at every batch size, greedy outputs identical to
vanilla for each (lossless), adaptive against the best fixed shape, its steps per shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from engine_utils import save_tiny_llama

from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import batch_bench  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 96


@pytest.mark.parametrize("interleave", [False, True])
def test_every_engine_at_every_batch_size(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          interleave: bool) -> None:
    """One engine after the other, or all built at once taking turns batch by batch."""
    save_tiny_llama(tmp_path / "target", vocab=VOCAB, hidden=64, layers=4, std=0.2)
    mcfg = load_checkpoint(tmp_path / "target", torch.float32)[0]
    head = random_draft_checkpoint(tmp_path / "head", mcfg, "EAGLE3", seed=0, scale=0.3)
    g = torch.Generator().manual_seed(3)
    lines = [json.dumps({"question_id": i, "category": "abc"[i % 3],
                         "prompt_token_ids": torch.randint(0, VOCAB, (5 + i,), generator=g).tolist()})
             for i in range(5)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "batch.json"
    rc = batch_bench.main([
        "--model", str(tmp_path / "target"), "--dtype", "float32", "--device", "cpu",
        "--skip-tokenizer-init", "--num-kv-blocks", "256", "--block-size", "4", "--max-model-len", "128",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
        "--speculative-candidates", "off", "2/1/3", "3/4/8",
        "--prompts", str(tmp_path / "p.jsonl"), "--max-tokens", "10", "--batch-sizes", "3", "1",
        "--rounds", "2", "--min-prompts", "4", "--out", str(out)] + ["--interleave"] * interleave)
    assert rc == 0
    d = json.loads(out.read_text())
    assert list(d["results"]) == ["vanilla", "2/1/3", "3/4/8", "adaptive", "adaptive w/o off"]
    s = d["summary"]
    assert sorted(s) == ["1", "3"] and s["3"]["prompts"] == 6 and s["1"]["prompts"] == 4
    for b in ("1", "3"):
        assert s[b]["identical"] == {n: s[b]["prompts"]
                                     for n in ("2/1/3", "3/4/8", "adaptive", "adaptive w/o off")}
        assert s[b]["best_fixed"] in ("2/1/3", "3/4/8")
        ratio = s[b]["x_vanilla"]
        assert s[b]["adaptive_x_best"] == pytest.approx(ratio["adaptive"] / ratio[s[b]["best_fixed"]])
        assert sum(s[b]["adaptive_steps"].values()) > 0
        assert set(s[b]["adaptive_steps"]) <= {"off", "2/1/3", "3/4/8"}
    assert 0 < d["results"]["vanilla"]["1"]["tokens"] <= 4 * 10  # (a request may stop on EOS)
    assert "off" not in d["results"]["adaptive w/o off"]["3"]["steps_per_shape"]
    assert d["results"]["adaptive"]["3"]["catch_ups"] >= 0
    table = capsys.readouterr().out
    assert "adaptive/best" in table and "prompts per batch size: 1: 4, 3: 6" in table
