"""`hotspec bench` end to end on a tiny random target with a random EAGLE-3 head (CPU).

The tiny target has no tokenizer, so the prompt file gives `prompt_token_ids` and the engine runs
with --skip-tokenizer-init --no-chat. One run covers both modes and the transformers baseline:
bench.json has one entry per category of the prompt file (in file order), greedy outputs equal
between modes (and equal transformers' own greedy outputs on the same weights), tau >= 1, the
acceptance histogram counts every verify pass, the phase breakdown covers every speculative
phase, and bench.png is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_utils import save_tiny_llama
from script_utils import load_script

from hotspec.benchmark.prompts import read_bench_prompts
from hotspec.cli.main import main
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 96
MAX_TOKENS = 12
CATEGORIES = {"alpha": 3, "beta": 2}  # file order, prompts per category


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    save_tiny_llama(root / "target", vocab=VOCAB, hidden=64, layers=4, std=0.2)
    mcfg = load_checkpoint(root / "target", torch.float32)[0]
    head = random_draft_checkpoint(root / "head", mcfg, "EAGLE3", seed=0, scale=0.3)
    g = torch.Generator().manual_seed(1)
    lines, qid = [], 0
    for cat, n in CATEGORIES.items():
        for _ in range(n):
            ids = torch.randint(0, VOCAB, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g)
            lines.append(json.dumps({"question_id": qid, "category": cat, "prompt_token_ids": ids.tolist()}))
            qid += 1
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    return root / "target", head, prompts


def _engine_args(target: Path, head: Path) -> list[str]:
    return ["--model", str(target), "--dtype", "float32", "--device", "cpu", "--skip-tokenizer-init",
            "--num-kv-blocks", "128", "--block-size", "4", "--max-model-len", "128",
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
            "--speculative-num-draft-tokens", "6"]


@pytest.fixture(scope="module")
def bench(tiny: tuple[Path, Path, Path],
          tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    target, head, prompts = tiny
    out = tmp_path_factory.mktemp("out")
    rc = main(["bench", *_engine_args(target, head), "--prompts", str(prompts), "--batch-size", "2",
               "--max-tokens", str(MAX_TOKENS), "--no-chat", "--ignore-eos", "--warmup-tokens", "4",
               "--vs-hf", "--out", str(out)])
    assert rc == 0
    return out, json.loads((out / "bench.json").read_text())


def test_categories_and_greedy_identity(bench: tuple[Path, dict[str, Any]]) -> None:
    _, report = bench
    assert list(report["categories"]) == list(CATEGORIES)
    n_total = sum(CATEGORIES.values())
    for cat, n in CATEGORIES.items():
        e = report["categories"][cat]
        assert e["num_prompts"] == n
        assert e["vanilla"]["generated_tokens"] == e["speculative"]["generated_tokens"] == n * MAX_TOKENS
        assert e["greedy_identical"] == n and e["greedy_mismatches"] == 0
        assert e["vanilla"]["tokens_per_s"] > 0 and e["speculative"]["tokens_per_s"] > 0
        assert e["speedup"] == pytest.approx(e["speculative"]["tokens_per_s"] / e["vanilla"]["tokens_per_s"])
    o = report["overall"]
    assert o["num_prompts"] == n_total and o["greedy_mismatches"] == 0
    assert [r["category"] for r in report["requests"]] == [c for c, n in CATEGORIES.items() for _ in range(n)]
    assert all(r["first_mismatch"] is None for r in report["requests"])
    # transformers' own greedy decoding on the same weights produces the same tokens
    assert o["hf"]["identical_to_vanilla"] == n_total
    assert o["hf"]["generated_tokens"] == n_total * MAX_TOKENS and o["hf"]["tokens_per_s"] > 0


def test_tau_histogram_phases(bench: tuple[Path, dict[str, Any]]) -> None:
    _, report = bench
    for e in [*report["categories"].values(), report["overall"]]:
        s = e["speculative"]
        assert s["tau_mean"] >= 1 and s["tau_total"] >= 1
        assert s["tau_total"] == pytest.approx(s["generated_tokens"] / s["verify_steps"])
        hist = {int(k): v for k, v in s["accept_hist"].items()}
        assert sum(hist.values()) == s["verify_steps"]  # one entry per request per verify pass
        assert min(hist) >= 1 and max(hist) <= 3 + 1  # at most num_steps drafts + the bonus
        assert s["hot_coverage"] == 1.0  # no token map: the draft vocabulary is the target's
        pb = e["phase_breakdown"]
        assert set(pb["phases"]) == {"draft", "verify", "draft_extend"}
        assert all(p["calls"] > 0 and p["seconds"] > 0 for p in pb["phases"].values())
        assert pb["phases"]["verify"]["calls"] == pb["phases"]["draft"]["calls"]
        assert pb["source"].startswith("timed pass")  # CPU: the timed pass itself is profiled
        # acceptance at each draft depth, from the same histogram: depth d reached by passes of
        # length >= d, accepted by those of length >= d + 1; depth 1 always has its row
        by_depth = s["acceptance_by_depth"]
        assert [r["depth"] for r in by_depth] == list(range(1, max(max(hist), 2)))
        for r in by_depth:
            assert r["reached"] == sum(v for a, v in hist.items() if a >= r["depth"])
            assert r["accepted"] == sum(v for a, v in hist.items() if a > r["depth"])
            assert r["rate"] == pytest.approx(r["accepted"] / r["reached"])
    per_request = [r["tau"] for r in report["requests"]]
    o = report["overall"]["speculative"]
    assert o["tau_mean"] == pytest.approx(sum(per_request) / len(per_request))
    mean = o["tau_mean"]
    sd = (sum((t - mean) ** 2 for t in per_request) / (len(per_request) - 1)) ** 0.5
    assert o["tau_ci95"] == pytest.approx(1.96 * sd / len(per_request) ** 0.5)


def test_metadata_and_plot(bench: tuple[Path, dict[str, Any]]) -> None:
    out, report = bench
    assert report["device_type"] == "cpu" and report["torch"] == torch.__version__
    assert report["engine_config"]["speculative_algorithm"] == "EAGLE3"
    assert report["engine_config"]["max_num_seqs"] == 2
    assert report["vanilla_engine_config"]["speculative_algorithm"] is None
    assert report["command"].startswith("hotspec bench ") and "--batch-size 2" in report["command"]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_printed_table(tiny: tuple[Path, Path, Path], tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    target, head, prompts = tiny
    rc = main(["bench", *_engine_args(target, head), "--prompts", str(prompts), "--num-prompts", "2",
               "--max-tokens", "4", "--no-chat", "--warmup-tokens", "0", "--out", str(tmp_path)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads((tmp_path / "bench.json").read_text())
    assert list(report["categories"]) == ["alpha", "beta"]  # round-robin: one prompt of each
    assert any(line.startswith("overall") for line in lines)
    assert lines[-1].startswith("greedy outputs identical to vanilla: 2/2")


def test_needs_speculative_options(tiny: tuple[Path, Path, Path], tmp_path: Path) -> None:
    target, _, prompts = tiny
    rc = main(["bench", "--model", str(target), "--skip-tokenizer-init", "--prompts", str(prompts),
               "--no-chat", "--out", str(tmp_path)])
    assert rc == 2 and not (tmp_path / "bench.json").exists()


def test_round_robin_subset(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    rows = [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1"), ("c", "c2")]
    f.write_text("".join(json.dumps({"category": c, "turns": [t, "second turn"]}) + "\n" for c, t in rows))
    picked = read_bench_prompts(f, 5)
    assert [p.text for p in picked] == ["a1", "b1", "c1", "a2", "c2"]
    assert [p.question_id for p in picked] == [0, 3, 4, 1, 5]  # default: the record's index
    assert len(read_bench_prompts(f)) == 6


def test_decode_bench_imports_the_moved_baseline() -> None:
    from hotspec.benchmark.hf_baseline import hf_generate_tokens_per_s

    module = load_script("benchmarks/decode_bench.py", register=True)
    assert module.hf_generate_tokens_per_s is hf_generate_tokens_per_s
    assert module.parse_args(["--vs-hf"]).vs_hf
    assert module.parse_args(["--timeline", "5"]).timeline == 5 and module.parse_args([]).timeline == 0
