"""`hotspec bench-serve --target` against a running tiny server: a clean run passes every check
(exit 0), and an engine that fails steps makes it report FAIL (exit 1); the JSON report and the
plot are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_utils import save_tiny_llama

from hotspec import LLM
from hotspec.cli.main import main
from hotspec.entrypoints.server import BackgroundServer, ServerSettings, create_app
from hotspec.models.loader import load_tokenizer, resolve_model_path

ARGS = ["--num-requests", "12", "--concurrency", "4", "--rates", "inf", "--min-tokens", "2",
        "--max-tokens", "12", "--max-prompt-words", "30", "--disconnect-fraction", "0.25",
        "--timeout", "60", "--drain-timeout", "10"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    tok = load_tokenizer(resolve_model_path(None))  # a real chat template: the load test chats
    path = save_tiny_llama(tmp_path_factory.mktemp("load") / "tiny", vocab=49152, hidden=64, layers=2,
                           std=0.3, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    tok.save_pretrained(path)
    return LLM(model=str(path), dtype="float32", device="cpu", block_size=8, num_kv_blocks=64,
               max_model_len=256)


def test_clean_run_passes(llm: LLM, tmp_path: Path) -> None:
    with BackgroundServer(create_app(llm.engine, ServerSettings("tiny"))) as srv:
        rc = main(["bench-serve", "--target", f"t={srv.url}", *ARGS, "--verify-greedy", "-1",
                   "--out", str(tmp_path)])
    out = json.loads((tmp_path / "bench_serve.json").read_text())
    assert rc == 0 and out["passed"], out["checks"]
    assert (tmp_path / "bench_serve.png").stat().st_size > 0
    (report,) = out["reports"]
    assert report["disconnected"] == report["server_aborts"] == 3
    assert report["completed"] == 9 and report["greedy_checked"] > 0 and report["drained"]


def test_failed_steps_fail_the_run(llm: LLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    worker = llm.engine.worker
    real_step, calls = worker.step, [0]

    def flaky_step(reqs: list) -> list[list[int]]:
        calls[0] += 1
        if calls[0] % 5 == 0:
            raise RuntimeError("injected step failure")
        return real_step(reqs)

    monkeypatch.setattr(worker, "step", flaky_step)
    with BackgroundServer(create_app(llm.engine, ServerSettings("tiny"))) as srv:
        with pytest.raises(SystemExit) as exit_:
            main(["bench-serve", "--target", f"t={srv.url}", *ARGS, "--verify-greedy", "0",
                  "--out", str(tmp_path)])
    out = json.loads((tmp_path / "bench_serve.json").read_text())
    assert exit_.value.code == 1 and not out["passed"]
    (report,) = out["reports"]
    assert report["http_5xx"] > 0 and report["step_errors"] > 0 and report["drained"]


def test_a_kernel_compiled_while_serving_fails_the_run(llm: LLM, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """The engine's count of Triton compiles after start-up (/metrics) rising during a run is a
    FAIL: each compile held every running request."""
    from hotspec.runtime import compile_watch

    worker = llm.engine.worker
    real_step = worker.step

    def compiling_step(reqs: list) -> list[list[int]]:
        compile_watch._state["count"] += 1  # (as the Triton hook counts a compile)
        return real_step(reqs)

    monkeypatch.setitem(compile_watch._state, "count", compile_watch._state["count"])
    monkeypatch.setattr(worker, "step", compiling_step)
    with BackgroundServer(create_app(llm.engine, ServerSettings("tiny"))) as srv:
        with pytest.raises(SystemExit) as exit_:
            main(["bench-serve", "--target", f"t={srv.url}", *ARGS, "--verify-greedy", "0",
                  "--out", str(tmp_path)])
    out = json.loads((tmp_path / "bench_serve.json").read_text())
    assert exit_.value.code == 1 and not out["passed"]
    (report,) = out["reports"]
    assert report["kernel_compiles"] > 0 and report["failed"] == 0
    assert any("Triton kernels compiled while serving" in c["check"] and not c["ok"]
               for c in out["checks"]), out["checks"]
