"""`hotspec bench-serve` end to end on the CPU with the default model: both servers come up, the
load passes every check, the vanilla server really is vanilla (no tau: with no --model, `hotspec
serve` would otherwise speculate with the shipped head) and the speculative one speculates;
greedy under load equals alone (float32). A speculative server that does not speculate is
refused before any load is sent, and a bad engine option before any server starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_utils import save_tiny_llama

from hotspec.models.loader import load_tokenizer, resolve_model_path

ENGINE = ["--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "256", "--max-model-len", "512"]
CHAIN = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]
LOAD = ["--num-requests", "6", "--concurrency", "3", "--rates", "inf", "--min-tokens", "2",
        "--max-tokens", "8", "--max-prompt-words", "20", "--disconnect-fraction", "0",
        "--verify-greedy", "2", "--timeout", "300", "--drain-timeout", "30", "--start-timeout", "300"]


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "hotspec", "bench-serve", *args, "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=900)


def test_bench_serve_compares_vanilla_with_speculative(tmp_path: Path) -> None:
    r = _bench(tmp_path, *ENGINE, *CHAIN, *LOAD, "--pinned", "2/1/3")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "bench_serve.json").read_text())
    assert out["passed"] and all(c["ok"] for c in out["checks"])
    assert "--no-default-head" in out["servers"]["vanilla"]  # the baseline runs without the head
    assert "--speculative-num-steps" not in out["servers"]["vanilla"]
    by = {rep["target"]: rep for rep in out["reports"]}
    assert set(by) == {"vanilla", "speculative", "pinned 2/1/3"}
    assert by["vanilla"]["tau_mean"] is None  # no verify pass at all
    assert by["speculative"]["tau_mean"] >= 1.0
    assert by["speculative"]["greedy_checked"] > 0 and by["speculative"]["greedy_mismatched"] == 0
    assert set(by["speculative"]["shape_steps"]) == {"3/1/4"} and by["vanilla"]["shape_steps"] == {}
    assert set(by["pinned 2/1/3"]["shape_steps"]) == {"2/1/3"}  # the same options, the shape pinned
    spec_args = out["servers"]["speculative"]
    assert out["servers"]["pinned 2/1/3"][:len(spec_args)] == spec_args
    assert by["speculative"]["engine_ttft_ms_mean"] > 0  # the engine's own, from its /metrics
    assert (tmp_path / "bench_serve.png").stat().st_size > 0
    assert (tmp_path / "serve_vanilla.log").exists()


def test_a_speculative_server_that_does_not_speculate_is_refused(tmp_path: Path) -> None:
    """A model other than the default has no shipped head: without speculative options both
    servers would be vanilla."""
    tok = load_tokenizer(resolve_model_path(None))
    model = save_tiny_llama(tmp_path / "tiny", vocab=49152, hidden=64, layers=2, std=0.3,
                            eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    tok.save_pretrained(model)
    engine = [*ENGINE[:-1], "256"]  # (--max-model-len: the tiny model's positions)
    r = _bench(tmp_path / "out", *engine, "--model", str(model), *LOAD)
    assert r.returncode == 2, r.stdout[-4000:] + r.stderr[-2000:]
    assert "the speculative server does not speculate" in r.stderr
    assert not (tmp_path / "out" / "bench_serve.json").exists()


def test_shape_shares_read_most_run_first() -> None:
    from hotspec.benchmark.load_report import shares

    assert shares({"off": 10, "3/1/4": 30}) == "3/1/4 75% off 25%" and shares({}) == "-"


def test_server_options_reach_both_servers() -> None:
    """The speculative server gets the engine options as given, the vanilla one without the
    speculative ones and with --no-default-head; --serve-args go to both."""
    from hotspec.cli.bench_serve import _server_options
    from hotspec.cli.main import build_parser

    args = build_parser().parse_args(["bench-serve", *ENGINE, *CHAIN, "--serve-args",
                                      "--max-num-seqs 7 --max-body-bytes 999"])
    spec, vanilla, float32 = _server_options(args)
    assert float32 and "--speculative-num-steps" in spec and spec[spec.index("--device") + 1] == "cpu"
    assert not any(a.startswith("--speculative") for a in vanilla) and "--no-default-head" in vanilla
    assert spec[-4:] == vanilla[-4:] == ["--max-num-seqs", "7", "--max-body-bytes", "999"]


def test_greedy_is_checked_by_default_where_outputs_do_not_depend_on_the_batch() -> None:
    """float32 and --deterministic servers get the greedy check by default; bf16 ones do not;
    --deterministic reaches both servers."""
    from hotspec.cli.bench_serve import _server_options
    from hotspec.cli.main import build_parser

    def options(*extra: str) -> tuple[list[str], list[str], bool]:
        return _server_options(build_parser().parse_args(["bench-serve", *CHAIN, *extra]))

    assert not options("--device", "cuda", "--dtype", "bfloat16")[2]
    spec, vanilla, exact = options("--device", "cuda", "--dtype", "bfloat16", "--deterministic")
    assert exact and "--deterministic" in spec and "--deterministic" in vanilla


@pytest.mark.parametrize("bad, message", [
    (["--speculative-eagle-topk", "0"], "topk must be >= 1"),
    (["--pinned", "3/1"], "--pinned: a speculation shape is 'off' or STEPS/TOPK/TOKENS"),
    (["--pinned", "off"], "--pinned: 'off' is the vanilla server already")])
def test_a_bad_option_fails_before_any_server_starts(tmp_path: Path, bad: list[str], message: str) -> None:
    r = _bench(tmp_path, "--device", "cpu", *bad, *LOAD)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "serve_vanilla.log").exists()
