"""The engine in a process of its own (entrypoints/engine_process.py, `hotspec serve`'s default)
behind the HTTP server: greedy answers equal the offline API's, streamed and whole; /metrics is
the engine's; a client that hangs up is aborted; a model that cannot load fails `start` with the
engine's error; an engine process that dies fails what was open and makes /health 503."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from engine_utils import save_tiny_chat_llama

from hotspec import LLM, SamplingParams
from hotspec.config import EngineConfig
from hotspec.entrypoints.server import BackgroundServer, ProcessEngine, ServerSettings, create_process_app
from hotspec.errors import HotspecError

PROMPTS = ["The capital of France is", "def add(a, b):"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chat_llama(tmp_path_factory.mktemp("proc") / "tiny")


def _cfg(model: Path, **kw: object) -> EngineConfig:
    return EngineConfig(model=str(model), dtype="float32", device="cpu", block_size=8,
                        num_kv_blocks=64, max_model_len=256, **kw)  # type: ignore[arg-type]


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_answers_equal_offline_and_metrics_come_from_the_engine(model: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = [o.text for o in LLM(**vars(_cfg(model))).generate(PROMPTS, params)]
    client = ProcessEngine(_cfg(model), "warning")
    client.start()
    assert client.max_model_len == 256
    with BackgroundServer(create_process_app(client, ServerSettings("tiny"))) as srv:
        oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        for prompt, text in zip(PROMPTS, want):
            r = oa.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
            assert r.choices[0].text == text
        chunks = list(oa.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].text for c in chunks) == want[0]
        # a client that hangs up mid-stream: the engine aborts its request
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": PROMPTS[1], "max_tokens": 200, "stream": True,
                "ignore_eos": True}) as resp:
            next(resp.iter_lines())
        deadline = time.monotonic() + 60
        while True:
            text = httpx.get(srv.url + "/metrics").text
            drained = _metric(text, "hotspec_requests_finished_total") >= 4 \
                and _metric(text, "hotspec_kv_blocks_used") == 0  # (the gauge follows the abort)
            if drained or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert 'finish_reason="abort"' in text
        assert _metric(text, "hotspec_generated_tokens_total") >= 36
        assert _metric(text, "hotspec_kv_blocks_used") == 0
        assert httpx.get(srv.url + "/health").status_code == 200
    assert not client.is_alive  # the app stopped the engine process with it


def test_a_model_that_cannot_load_fails_start(tmp_path: Path) -> None:
    client = ProcessEngine(EngineConfig(model=str(tmp_path / "missing"), device="cpu"), "error")
    with pytest.raises(HotspecError, match="the engine could not start: .*missing"):
        client.start()
    assert not client.is_alive


def test_a_dead_engine_process_fails_open_requests_and_health(model: Path) -> None:
    client = ProcessEngine(_cfg(model), "warning")
    client.start()
    with BackgroundServer(create_process_app(client, ServerSettings("tiny"))) as srv:
        client._proc.kill()
        client._proc.join()
        deadline = time.monotonic() + 30
        while client.is_alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.get(srv.url + "/health").status_code == 503
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 4})
        assert r.status_code == 503 and "not running" in r.text


def test_the_engine_thread_reads_the_pipe_itself() -> None:
    """PipeInbox: submissions and aborts become the loop's commands, a metrics request is answered
    as it is read, an abort of an unknown request is dropped, and once the parent's end closes
    the loop gets Stop and then nothing (no spin on the closed pipe)."""
    import multiprocessing as mp
    import queue

    from hotspec.entrypoints.engine_loop import Abort, Stop, Submit
    from hotspec.entrypoints.engine_process import PipeInbox

    class Metrics:
        def render(self) -> bytes:
            return b"hotspec_x 1\n"

    cmd_r, cmd_w = mp.Pipe(duplex=False)
    res_r, res_w = mp.Pipe(duplex=False)
    handles: dict = {}
    inbox = PipeInbox(cmd_r, res_w, handles, Metrics())  # type: ignore[arg-type]
    with pytest.raises(queue.Empty):
        inbox.get_nowait()
    params = SamplingParams(max_tokens=3)
    cmd_w.send(("submit", 7, [1, 2], params))
    cmd_w.send(("metrics",))
    cmd_w.send(("abort", 99))
    cmd_w.send(("abort", 7))
    sub = inbox.get()
    assert isinstance(sub, Submit) and sub.handle.cid == 7 and sub.prompt_token_ids == [1, 2]
    ab = inbox.get_nowait()  # (the metrics answer and the unknown abort were read on the way)
    assert isinstance(ab, Abort) and ab.handle is sub.handle and not handles
    assert res_r.recv() == ("metrics", b"hotspec_x 1\n")
    cmd_w.close()
    assert isinstance(inbox.get_nowait(), Stop)
    with pytest.raises(queue.Empty):
        inbox.get_nowait()
    assert isinstance(inbox.get(), Stop)


def test_events_cross_the_pipe_whole() -> None:
    """A step's events are pickled field by field (RequestEvent.__reduce__): every field, logprobs
    included, arrives as sent."""
    import dataclasses
    import pickle

    from hotspec.core.logprobs import TokenLogprob
    from hotspec.entrypoints.request_handle import RequestEvent

    lp = TokenLogprob(5, -0.25, ((5, -0.25), (7, -1.5)))
    sent = RequestEvent(" word", [5], "stop", "why", 12, 3, [lp], [None, lp])
    got = pickle.loads(pickle.dumps(("out", [(1, sent)], 0, 0)))[1][0][1]
    assert got == sent
    assert [f.name for f in dataclasses.fields(RequestEvent)] == [
        "text", "token_ids", "finish_reason", "error", "prompt_tokens", "completion_tokens",
        "logprobs", "prompt_logprobs"]  # (the order __reduce__ passes them in)
