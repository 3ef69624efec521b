"""benchmarks/spec_sweep.py (the tree-shape / fused-step / token-map comparison on the GPU) runs
end to end on the CPU on a tiny random target: one row per variant, greedy outputs identical to
vanilla for every variant (lossless), and bad variants are refused before anything loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from engine_utils import save_tiny_llama

from hotspec.errors import HotspecError
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import spec_sweep  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 96


def test_sweep_rows_and_losslessness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_tiny_llama(tmp_path / "target", vocab=VOCAB, hidden=64, layers=4, std=0.2)
    mcfg = load_checkpoint(tmp_path / "target", torch.float32)[0]
    head = random_draft_checkpoint(tmp_path / "head", mcfg, "EAGLE3", seed=0, scale=0.3)
    g = torch.Generator().manual_seed(3)
    lines = [json.dumps({"question_id": i, "category": "ab"[i % 2],
                         "prompt_token_ids": torch.randint(0, VOCAB, (5 + i,), generator=g).tolist()})
             for i in range(4)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "sweep.json"
    rc = spec_sweep.main([
        "--model", str(tmp_path / "target"), "--dtype", "float32", "--device", "cpu",
        "--skip-tokenizer-init", "--num-kv-blocks", "128", "--block-size", "4", "--max-model-len", "128",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
        "--prompts", str(tmp_path / "p.jsonl"), "--no-chat", "--max-tokens", "10", "--batch-size", "2",
        "--warmup-tokens", "2", "--variants", "3/2/6:unfused", "3/2/6:fused:profile", "2/1/3",
        "3/2/6:overlap", "--out", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["vanilla", "3/2/6:unfused", "3/2/6:fused:profile", "2/1/3",
                                            "3/2/6:overlap"]
    assert rows[4]["engine_overrides"]["overlap_schedule"] is True
    for r in rows[1:]:
        assert r["greedy_identical"] == "4/4"  # lossless in every configuration
        assert r["tau_total"] >= 1 and r["speedup"] > 0 and r["ms_per_spec_step"] > 0
    assert rows[1]["engine_overrides"]["fuse_spec_step"] is False
    assert rows[2]["engine_overrides"]["fuse_spec_step"] is True
    assert "fuse_spec_step" not in rows[3]["engine_overrides"]  # the engine default (fused)
    assert set(rows[1]["per_category"]) == {"all"}  # batch 2: one stream, so batches stay full
    assert all(e["tau_mean"] >= 1 for e in rows[1]["per_category"].values())
    assert all("tau_ci95" in e for e in rows[1]["per_category"].values())
    assert rows[1]["tau_ci95"] is not None and rows[1]["acceptance_by_depth"]
    assert rows[3]["engine_overrides"]["speculative_num_steps"] == 2
    assert "step" in rows[2]["phases"]["phases"] or "draft" in rows[2]["phases"]["phases"]
    table = capsys.readouterr().out
    assert "3/2/6:fused:profile" in table and "profiled ms/call" in table
    assert "+-95%" in table and "accepted at draft depth: d1" in table
    assert "4 prompts in one stream" in table

    rc = spec_sweep.main([
        "--model", str(tmp_path / "target"), "--dtype", "float32", "--device", "cpu",
        "--skip-tokenizer-init", "--num-kv-blocks", "128", "--block-size", "4", "--max-model-len", "128",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
        "--prompts", str(tmp_path / "p.jsonl"), "--no-chat", "--max-tokens", "6", "--batch-size", "2",
        "--by-category", "--warmup-tokens", "2", "--variants", "2/1/3", "--out", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows[1]["per_category"]) == {"a", "b"}  # file order: categories a and b
    assert rows[1]["greedy_identical"] == "4/4"


def test_variant_options_map_to_engine_settings() -> None:
    over, profile = spec_sweep.parse_variant("6/8/16:unfused:map=m.pt:draft=heads/new:profile")
    assert profile and over == {"speculative_num_steps": 6, "speculative_eagle_topk": 8,
                                "speculative_num_draft_tokens": 16, "fuse_spec_step": False,
                                "speculative_token_map": "m.pt", "speculative_draft_model_path": "heads/new"}
    over, _ = spec_sweep.parse_variant("4/8/12:overlap")
    assert over["overlap_schedule"] is True
    over, _ = spec_sweep.parse_variant("4/8/12:draft=default:map=none:plain")
    assert over["overlap_schedule"] is False
    assert over["speculative_draft_model_path"] is None and over["speculative_token_map"] is None
    over, _ = spec_sweep.parse_variant("adaptive:draft=heads/new")
    assert over == {"speculative_adaptive": True, "speculative_draft_model_path": "heads/new"}
    assert spec_sweep.parse_variant("3/1/4")[1] is None
    assert spec_sweep.parse_variant("3/1/4:profile")[1] == spec_sweep.PROFILE_ALL
    assert spec_sweep.parse_variant("3/1/4:profile=8:map=m.pt")[1] == 8


def test_profiled_pass_of_the_first_prompts() -> None:
    groups = {"a": [[1], [2]], "b": [[3], [4], [5]]}
    assert spec_sweep.first_prompts(groups, 3) == {"a": [[1], [2]], "b": [[3]]}
    assert spec_sweep.first_prompts(groups, 1) == {"a": [[1]]}
    assert spec_sweep.first_prompts(groups, spec_sweep.PROFILE_ALL) == groups


@pytest.mark.parametrize("bad", ["6/8", "6/8/16:fast", "a/b/c", "3/1/4:profile=0", "3/1/4:profile=x"])
def test_bad_variant_is_refused(bad: str) -> None:
    with pytest.raises(HotspecError, match="variant"):
        spec_sweep.parse_variant(bad)


def test_variant_with_bad_engine_options_is_refused_before_loading(tmp_path: Path) -> None:
    """A tree of 100 tokens cannot come from 1 step of top-8: refused by the shape's check before
    the (here nonexistent) model is read."""
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"question_id": 0, "category": "a", "prompt_token_ids": [1, 2]}) + "\n")
    with pytest.raises(HotspecError, match="num_draft_tokens=100 must be in"):
        spec_sweep.main(["--model", str(tmp_path / "missing"), "--device", "cpu",
                         "--speculative-algorithm", "EAGLE3", "--prompts", str(p),
                         "--variants", "3/1/4", "1/8/100"])
