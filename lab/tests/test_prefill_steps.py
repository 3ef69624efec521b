"""lab/benchmarks/prefill_steps.py times every prefill step of a pass, vanilla and speculative, on a
tiny random target on the CPU: each prompt token is prefilled exactly once in a timed step, and
bad options fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import prefill_steps
import pytest
import torch
from engine_utils import save_tiny_llama

from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 96


def test_every_prompt_token_is_prefilled_in_a_timed_step(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    save_tiny_llama(tmp_path / "target", vocab=VOCAB, hidden=64, layers=4, std=0.2)
    mcfg = load_checkpoint(tmp_path / "target", torch.float32)[0]
    head = random_draft_checkpoint(tmp_path / "head", mcfg, "EAGLE3", seed=0, scale=0.3)
    g = torch.Generator().manual_seed(5)
    lengths = [5, 9, 3, 12, 7]
    lines = [json.dumps({"question_id": i, "category": "ab"[i % 2],
                         "prompt_token_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()})
             for i, n in enumerate(lengths)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "prefill.json"
    rc = prefill_steps.main([
        "--model", str(tmp_path / "target"), "--dtype", "float32", "--device", "cpu",
        "--skip-tokenizer-init", "--num-kv-blocks", "128", "--block-size", "4", "--max-model-len", "64",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
        "--prompts", str(tmp_path / "p.jsonl"), "--no-chat", "--max-tokens", "6",
        "--batch-size", "2", "--warmup-tokens", "2", "--profile-rows", "5", "--out", str(out)])
    assert rc == 0
    modes = json.loads(out.read_text())["modes"]
    assert set(modes) == {"vanilla", "speculative"}
    for r in modes.values():
        assert r["prompt_tokens"] == sum(lengths)
        assert sum(s["pending_tokens"] for s in r["steps"]) == sum(lengths)  # each once
        assert r["prefill_steps"] == len(r["steps"]) >= 3  # batch 2: five prompts need three
        assert all(s["ms"] > 0 and 1 <= s["requests"] <= 2 for s in r["steps"])
        assert r["generated_tokens"] == 6 * len(lengths)  # no EOS without a tokenizer
        ps = r["profiled_step"]
        assert ps["tokens"] == 7 and ps["wall_ms"] > 0 and 0 < len(ps["host_ops"]) <= 5
        assert ps["cuda_kernels"] == 0  # (on the CPU)
    table = capsys.readouterr().out
    assert "under the profiler" in table
    assert "speculative prefill / vanilla prefill" in table and "prefill steps" in table
