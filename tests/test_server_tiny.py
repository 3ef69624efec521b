"""The server on a tiny random model (the default model's tokenizer, so text works): a bounded load
test (concurrent streaming clients, mixed settings, disconnects, preemption, chunked prefill),
failures inside the engine contained to the requests they hit, and `hotspec serve` end to end."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.engine.engine import Engine
from hotspec.entrypoints.async_engine import AsyncEngine, EngineDeadError
from hotspec.entrypoints.server import BackgroundServer, ServerSettings, create_app
from hotspec.errors import InvalidRequestError

NAME = "tiny"
ENGINE = dict(dtype="float32", device="cpu", block_size=8, max_model_len=256, max_num_seqs=12)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random 3-layer Llama with the default model's vocabulary (49152) and its tokenizer saved
    next to it; plus a random EAGLE-3 head for the speculative runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hotspec.models.draft_checkpoint import random_draft_checkpoint
    from hotspec.models.loader import load_checkpoint, load_tokenizer, resolve_model_path

    root = tmp_path_factory.mktemp("tiny_server")
    tok = load_tokenizer(resolve_model_path(None))
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # decisive argmax: batch-size rounding differences never flip a token
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    hf.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    mcfg = load_checkpoint(root / "target", torch.float32)[0]
    random_draft_checkpoint(root / "head", mcfg, "EAGLE3", seed=1, scale=0.1)
    return root


def make_llm(tiny_dir: Path, spec: bool, **kwargs: Any) -> LLM:
    extra: dict[str, Any] = {}
    if spec:
        extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(tiny_dir / "head"),
                     speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    return LLM(model=str(tiny_dir / "target"), **{**ENGINE, **extra, **kwargs})


@pytest.fixture(scope="module")
def llm(tiny_dir: Path) -> LLM:
    return make_llm(tiny_dir, spec=False, num_kv_blocks=64)


def serve(engine: Engine, **settings: Any) -> BackgroundServer:
    return BackgroundServer(create_app(engine, ServerSettings(NAME, **settings)))


def assert_idle(engine: Engine) -> None:
    assert not engine.has_unfinished()
    assert engine.allocator.num_free == engine.allocator.num_blocks


# ---------------------------------------------------------------- load


@dataclass
class Job:
    prompt: str | list[int]
    params: dict[str, Any]
    disconnect_after: int | None = None  # chunks to read before hanging up
    expected: str | None = None  # deterministic requests: the text when run alone
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None


def make_jobs(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "river", "stone", "seven", "blue", "quiet", "engine", "light"]
    jobs = []
    for i in range(n):
        if rng.random() < 0.5:
            prompt: str | list[int] = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
        else:
            prompt = [rng.randrange(49152) for _ in range(rng.randint(1, 120))]
        kind = rng.choice(["greedy", "seeded", "sampled"])
        params: dict[str, Any] = {"max_tokens": rng.randint(1, 40), "ignore_eos": rng.random() < 0.5}
        if kind == "greedy":
            params["temperature"] = 0.0
        else:
            params.update(temperature=rng.choice([0.7, 1.0]), top_p=rng.choice([1.0, 0.9]),
                          top_k=rng.choice([-1, 40]))
            if kind == "seeded":
                params["seed"] = i
        if rng.random() < 0.15:
            params["stop"] = [rng.choice(["a", "e", " the"])]
        job = Job(prompt, params)
        if i % 10 == 3:  # 10% hang up mid-stream (long enough that they are still running;
            # a short prompt, so that prompt + max_tokens fit every engine's context)
            job.prompt = [rng.randrange(49152) for _ in range(16)]
            job.params.update(max_tokens=120, ignore_eos=True)
            job.params.pop("stop", None)
            job.disconnect_after = rng.randint(1, 4)
        jobs.append(job)
    return jobs


def run_alone(llm: LLM, jobs: list[Job]) -> None:
    """Reference: each deterministic request alone in the engine (before the server owns it)."""
    for job in jobs:
        if job.disconnect_after is not None or (job.params.get("temperature") and "seed" not in job.params):
            continue
        sp = SamplingParams(**job.params)
        if isinstance(job.prompt, str):
            out = llm.generate([job.prompt], sp)[0]
        else:
            out = llm.generate(prompt_token_ids=[job.prompt], sampling_params=sp)[0]
        job.expected = out.text


async def drive(url: str, jobs: list[Job], clients: int) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    todo: asyncio.Queue[Job] = asyncio.Queue()
    for job in jobs:
        todo.put_nowait(job)

    async def worker() -> None:
        while not todo.empty():
            job = todo.get_nowait()
            p = dict(job.params)
            extra = {k: p.pop(k) for k in ("top_k", "ignore_eos") if k in p}
            stream = await client.completions.create(model=NAME, prompt=job.prompt, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body=extra, **p)
            chunks = 0
            async for chunk in stream:
                if chunk.usage is not None:
                    job.completion_tokens = chunk.usage.completion_tokens
                if not chunk.choices:
                    continue
                job.text.append(chunk.choices[0].text)
                job.finish_reason = chunk.choices[0].finish_reason or job.finish_reason
                chunks += 1
                if job.disconnect_after is not None and chunks >= job.disconnect_after:
                    await stream.close()
                    break

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(clients))), timeout=240)
    await client.close()


@pytest.mark.parametrize("spec,overlap,n,blocks", [(False, False, 48, 72), (True, False, 24, 22),
                                                   (False, True, 32, 48), (True, True, 24, 22)],
                         ids=["vanilla", "eagle3", "vanilla-overlap", "eagle3-overlap"])
def test_concurrent_streaming_load(tiny_dir: Path, spec: bool, overlap: bool, n: int, blocks: int) -> None:
    """16 streaming clients; a KV cache too small for all of them (preemption and recompute) and
    a prefill budget below the longest prompts (chunked prefill); plain and overlapped schedules.
    No 5xx (any would raise), no stuck request (timeout), every block free afterwards, and
    deterministic requests (greedy and seeded) produce exactly what they produce alone."""
    llm = make_llm(tiny_dir, spec, num_kv_blocks=blocks, max_prefill_tokens=48, overlap_schedule=overlap)
    engine = llm.engine
    jobs = make_jobs(n, seed=7 + spec)
    run_alone(llm, jobs)
    preemptions = []
    preempt = engine._preempt
    engine._preempt = lambda r: (preemptions.append(r.rid), preempt(r))  # type: ignore[method-assign]
    t0 = time.monotonic()
    with serve(engine) as srv:
        asyncio.run(drive(srv.url, jobs, clients=16))
        metrics = httpx.get(srv.url + "/metrics").text
    elapsed = time.monotonic() - t0
    assert_idle(engine)
    assert "hotspec_kv_blocks_used 0.0" in metrics
    assert "hotspec_overlap_dropped_rows_total" in metrics
    deterministic = 0
    for job in jobs:
        if job.disconnect_after is not None:
            assert job.finish_reason is None  # hung up before the end
            continue
        assert job.finish_reason in ("stop", "length")
        assert job.completion_tokens is not None and 1 <= job.completion_tokens <= job.params["max_tokens"]
        # Speculative + seeded sampling is deterministic only without preemption: the recompute
        # samples the next token with the plain sampler, where the uninterrupted run draws it by
        # tree rejection sampling (same distribution, another draw). Greedy is exact either way.
        if job.expected is not None and not (spec and job.params["temperature"] > 0):
            assert "".join(job.text) == job.expected, job
            deterministic += 1
    assert deterministic >= n // 6
    assert preemptions, "the cache was meant to be too small for the load"
    if spec:
        assert 'hotspec_request_tau_count' in metrics and "hotspec_hot_set_coverage" in metrics
        assert 'hotspec_spec_draft_tokens_total' in metrics and 'hotspec_spec_steps_total{shape="' in metrics
        assert float(metrics.split("hotspec_request_tau_count ")[1].split()[0]) > 0
    print(f"{n} requests in {elapsed:.1f}s, {len(preemptions)} preemptions")


# ---------------------------------------------------------------- failures stay contained


class Faults:
    """Wraps a worker's prefill/step to raise on demand: the test thread sets how many of the next
    calls fail, the engine thread counts them down."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.prefill = 0  # failing prefills left
        self.step = 0  # failing decode steps left
        worker = engine.worker
        real_prefill, real_step = worker.prefill, worker.step

        def prefill(reqs: list, chunks: list[int] | None = None, **kw: object) -> list[list[int]]:
            if self.prefill > 0:
                self.prefill -= 1
                raise RuntimeError("injected prefill failure")
            return real_prefill(reqs, chunks, **kw)

        def step(reqs: list) -> list[list[int]]:
            if self.step > 0:
                self.step -= 1
                raise RuntimeError("injected step failure")
            return real_step(reqs)

        monkeypatch.setattr(worker, "prefill", prefill)
        monkeypatch.setattr(worker, "step", step)


def stream_text(client: openai.OpenAI, on_first: Callable[[], None], **kw: Any) -> str:
    parts = []
    for chunk in client.completions.create(model=NAME, stream=True, **kw):
        if not parts:
            on_first()
        parts.append(chunk.choices[0].text)
    return "".join(parts)


def test_prefill_failure_fails_only_the_requests_in_it(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = llm.engine
    long_run = dict(prompt="alpha beta gamma", max_tokens=150, temperature=0,
                    extra_body={"ignore_eos": True})
    alone = llm.generate(["alpha beta gamma"], SamplingParams(temperature=0, max_tokens=150,
                                                             ignore_eos=True))[0].text
    faults = Faults(engine, monkeypatch)
    with serve(engine) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        errors: list[BaseException] = []

        def intruder() -> None:  # arrives while the long request decodes; its prefill fails
            faults.prefill = 1
            try:
                client.completions.create(model=NAME, prompt="river stone", max_tokens=5)
            except BaseException as e:  # noqa: BLE001 - inspected below
                errors.append(e)

        thread = threading.Thread(target=intruder)
        text = stream_text(client, thread.start, **long_run)
        thread.join()
        assert text == alone  # the request decoding meanwhile never noticed
        assert len(errors) == 1 and isinstance(errors[0], openai.InternalServerError)
        assert "internal error in the engine: RuntimeError: injected prefill failure" in str(errors[0])
        assert client.completions.create(model=NAME, prompt="river stone", max_tokens=5).choices
        assert httpx.get(srv.url + "/health").status_code == 200
        assert "hotspec_engine_step_errors_total 1.0" in httpx.get(srv.url + "/metrics").text
    assert_idle(engine)


def test_step_failure_mid_stream_and_health(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = llm.engine
    faults = Faults(engine, monkeypatch)
    with serve(engine) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)

        def fail_next_step() -> None:
            faults.step = 1

        with pytest.raises(openai.APIError, match="injected step failure"):  # an error event
            stream_text(client, fail_next_step, prompt="seven blue", max_tokens=100, temperature=0,
                        extra_body={"ignore_eos": True})
        faults.prefill = 3  # three failed steps in a row: the device is probably gone
        for _ in range(3):
            with pytest.raises(openai.InternalServerError, match="injected prefill failure"):
                client.completions.create(model=NAME, prompt="quiet", max_tokens=3)
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and health.json() == {"status": "unhealthy"}
        out = client.completions.create(model=NAME, prompt="quiet", max_tokens=3, temperature=0)
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
        assert httpx.get(srv.url + "/health").status_code == 200  # a good step: healthy again
    assert_idle(engine)


def test_unexpected_error_while_queueing(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = llm.engine
    real = engine.add_request

    def add_request(ids: list[int], params: SamplingParams, **kw: Any) -> Any:
        if params.max_tokens == 13:
            raise KeyError("injected")
        return real(ids, params, **kw)

    monkeypatch.setattr(engine, "add_request", add_request)
    with serve(engine) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": NAME, "prompt": "x", "max_tokens": 13})
        assert r.status_code == 500 and "internal error while queueing" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": NAME, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200
    assert_idle(engine)


def test_async_engine_shutdown_fails_what_is_left_and_frees_it(llm: LLM) -> None:
    engine = llm.engine
    long_run = SamplingParams(temperature=0, max_tokens=250, ignore_eos=True)

    async def main() -> None:
        ae = AsyncEngine(engine)
        ae.start()
        with pytest.raises(InvalidRequestError, match="empty prompt"):
            await ae.submit([], long_run)
        handle = await ae.submit([5, 6, 7], long_run)
        first = (await anext(handle.stream()))[0]  # decoding now
        assert first.finish_reason is None and len(first.token_ids) == 1
        await asyncio.to_thread(ae.shutdown)
        events = [e async for batch in handle.stream() for e in batch]
        assert events[-1].finish_reason == "error" and "shutting down" in (events[-1].error or "")
        assert events[-1].completion_tokens < 250
        with pytest.raises(EngineDeadError):
            await ae.submit([5, 6, 7], long_run)

    asyncio.run(main())
    assert_idle(engine)  # the engine can be driven directly again
    assert llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=long_run)[0].finish_reason == "length"


def test_no_tokenizer_needs_token_ids(tiny_dir: Path) -> None:
    llm = make_llm(tiny_dir, spec=False, num_kv_blocks=16, skip_tokenizer_init=True)
    with serve(llm.engine) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"model": NAME, "prompt": "text"})
        assert r.status_code == 400 and "list of token ids" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/chat/completions",
                       json={"model": NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": NAME, "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


# ---------------------------------------------------------------- malformed requests, one connection

DEEP = b'{"model": "tiny", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"  # ~10 KB
MALFORMED: list[tuple[str, str, bytes, str | None, str]] = [
    # (id, path, raw body, param, message pattern)
    ("lone-surrogate", "/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 2}',
     "prompt", r"^prompt contains a lone UTF-16 surrogate"),
    ("lone-surrogate-chat", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfffx"}]}',
     "messages.0.content", r"^messages\.0\.content contains a lone UTF-16 surrogate"),
    ("lone-surrogate-key", "/v1/completions", b'{"model": "tiny", "prompt": "a", "\\ud800": 1}',
     None, r"^the body contains a lone UTF-16 surrogate"),
    ("nested-5000", "/v1/completions", DEEP, None, r"nests JSON deeper than 32 levels"),
    ("nested-100", "/v1/chat/completions",
     b'{"model": "tiny", "messages": ' + b"[" * 100 + b"]" * 100 + b"}", None, r"deeper than 32"),
    ("int-of-5000-digits", "/v1/completions", b'{"model": "tiny", "prompt": "a", "seed": ' + b"7" * 5000
     + b"}", None, r"an integer of more than 4300 digits"),
    ("not-json", "/v1/completions", b"{'model': 'tiny'}", None, r"not valid JSON"),
    ("invalid-utf8", "/v1/completions", b'{"model": "tiny", "prompt": "\xff"}', None, r"not valid JSON"),
    ("array-body", "/v1/completions", b"[]", None, r"must be a JSON object, got list"),
    ("messages-string", "/v1/chat/completions", b'{"model": "tiny", "messages": "hi"}', "messages",
     r"messages: Input should be a valid list"),
    ("empty-messages", "/v1/chat/completions", b'{"model": "tiny", "messages": []}', "messages",
     r"messages: List should have at least 1 item"),
    ("message-not-object", "/v1/chat/completions", b'{"model": "tiny", "messages": [7]}', "messages.0",
     r"messages\.0: Input should be a valid dictionary"),
    ("image-part", "/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": '
     b'[{"type": "image_url", "image_url": {"url": "x"}}]}]}', "messages.0.content.0.type",
     r"content parts of type 'image_url' are not supported; send text parts"),
    ("part-without-text", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text"}]}]}',
     "messages.0.content.str", r"messages\.0\.content\.list\[TextPart\]\.0\.text: Field required"),
    ("top-k-over-int64", "/v1/completions",
     b'{"model": "tiny", "prompt": "a", "temperature": 1, "top_k": ' + str(2**70).encode() + b"}",
     "top_k", r"^top_k must be an int in \[-1, 2\*\*63\)"),
    ("max-tokens-float", "/v1/completions", b'{"model": "tiny", "prompt": "a", "max_tokens": 2.0}',
     "max_tokens", r"max_tokens: Input should be a valid integer"),
    ("max-tokens-over-context", "/v1/completions",
     b'{"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1000000000}', "max_tokens",
     r"maximum context length is 256 tokens\. However, you requested 1000000003 tokens \(3 in the "
     r"prompt, 1000000000 for the completion\)"),
    ("max-tokens-over-context-chat", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 254}',
     "max_tokens", r"maximum context length is 256 tokens\. However, you requested \d+ tokens"),
]
# Fields of OpenAI's API this server does not implement: each refused by name, not ignored.
UNSUPPORTED: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}),  # the legacy form of tools
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}),
    ("/v1/chat/completions", {"prediction": {"type": "content", "content": "x"}}),
    ("/v1/chat/completions", {"prompt": "a"}),  # a completions field
    ("/v1/completions", {"suffix": "end"}),
    ("/v1/completions", {"max_completion_tokens": 3}),  # a chat field
    ("/v1/completions", {"typo_temperature": 0.5}),  # unknown to OpenAI too
]
# What clients send by default, or send to mean "off": accepted.
NEUTRAL: dict[str, Any] = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False,
                           "logit_bias": {}, "best_of": None, "tools": [], "user": "u-1",
                           "metadata": {"k": "v"}, "store": False, "response_format": {"type": "text"}}


def body_for(path: str, extra: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {"model": NAME, "max_tokens": 2, "temperature": 0}
    if path.endswith("chat/completions"):
        return {**base, "messages": [{"role": "user", "content": "hi"}], **extra}
    return {**base, "prompt": "alpha", **extra}


@pytest.fixture
def keep_alive(llm: LLM, caplog: pytest.LogCaptureFixture) -> Iterator[Callable[..., httpx.Response]]:
    """post(path, body): over ONE keep-alive connection; each answer is checked to come back on
    that connection, and the server's log to hold exactly one line per request, no traceback."""
    uvicorn_log = logging.getLogger("uvicorn")  # does not propagate: tracebacks would be missed
    uvicorn_log.addHandler(caplog.handler)
    with caplog.at_level(logging.INFO), serve(llm.engine) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        ports: set[int] = set()

        def post(path: str, content: bytes, status: int) -> httpx.Response:
            caplog.clear()
            r = client.post(path, content=content, headers={"Content-Type": "application/json"})
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            assert r.status_code == status, r.text
            assert r.headers.get("connection") != "close"
            lines = [rec for rec in caplog.records if not rec.name.startswith("httpx")]
            assert not any(rec.exc_info for rec in lines) and "Traceback" not in caplog.text
            if status != 200:
                assert [rec.levelno for rec in lines] == [logging.INFO], caplog.text
                assert lines[0].getMessage() == f"POST {path} -> {status}: {r.json()['error']['message']}"
            return r

        yield post
        assert len(ports) == 1, "the server closed the connection"
    uvicorn_log.removeHandler(caplog.handler)
    assert_idle(llm.engine)


def ok(post: Callable[..., httpx.Response], path: str = "/v1/completions") -> None:
    r = post(path, json.dumps(body_for(path, {})).encode(), 200)
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path,body,param,pattern", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_request_gets_400_and_the_connection_serves_on(
        keep_alive: Callable[..., httpx.Response], path: str, body: bytes, param: str | None,
        pattern: str) -> None:
    err = keep_alive(path, body, 400).json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert re.search(pattern, err["message"]), err["message"]
    assert err["param"] == param
    ok(keep_alive, path)


def test_unsupported_fields_are_refused_by_name(keep_alive: Callable[..., httpx.Response]) -> None:
    for path, extra in UNSUPPORTED:
        (name, value), = extra.items()
        err = keep_alive(path, json.dumps(body_for(path, extra)).encode(), 400).json()["error"]
        assert err["param"] == name and err["code"] == "unsupported_parameter", (name, err)
        assert err["message"].startswith(f"{name} is not supported by this server (got "), err
    two = body_for("/v1/completions", {"tools": [{"type": "function"}], "suffix": "end"})
    err = keep_alive("/v1/completions", json.dumps(two).encode(), 400).json()["error"]
    assert "tools is not supported" in err["message"] and "suffix is not supported" in err["message"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        neutral = {k: v for k, v in NEUTRAL.items() if k != "logprobs" or path.endswith("chat/completions")}
        assert keep_alive(path, json.dumps(body_for(path, neutral)).encode(), 200).json()["choices"]
    message = {"role": "user", "content": "hi", "name": "ann", "audio": {"id": "a"}}
    err = keep_alive("/v1/chat/completions", json.dumps(body_for("/v1/chat/completions", {
        "messages": [message]})).encode(), 400).json()["error"]
    assert err["param"] == "messages.0.audio" and "messages.0.audio is not supported" in err["message"]


def test_unexpected_error_is_a_500_with_one_traceback(llm: LLM, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An exception nobody foresaw: a 500 in OpenAI's shape, its traceback logged once, and the
    connection kept for the next request."""
    from hotspec.entrypoints import routes_completions

    async def broken(engine: Engine, prompt: str | list[int]) -> list[int]:
        raise TypeError("injected")

    monkeypatch.setattr(routes_completions, "_tokenize", broken)
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO), serve(llm.engine) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as client:
            r = client.post("/v1/completions", json=body_for("/v1/completions", {}))
            assert r.status_code == 500 and r.json()["error"]["message"] == "internal server error: TypeError"
            tracebacks = [rec for rec in caplog.records if rec.exc_info]
            assert len(tracebacks) == 1 and "POST /v1/completions -> 500" in tracebacks[0].getMessage()
            r = client.post("/v1/chat/completions", json=body_for("/v1/chat/completions", {}))
            assert r.status_code == 200 and r.headers.get("connection") != "close"
    finally:
        uvicorn_log.removeHandler(caplog.handler)


# ---------------------------------------------------------------- `hotspec serve`, as a process


def test_hotspec_serve_process(tiny_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "hotspec.cli.main", "serve", "--model", str(tiny_dir / "target"),
           "--port", str(port), "--api-key", "k", "--served-model-name", NAME, "--dtype", "float32",
           "--device", "cpu", "--num-kv-blocks", "32", "--max-model-len", "128"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "hotspec serve did not come up"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60)
        r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 0
        assert httpx.get(url + "/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
