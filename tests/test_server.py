"""The OpenAI-compatible server on the default model, through the real HTTP stack (uvicorn on a
loopback port) and the `openai` client: greedy results equal the offline `LLM` API's, bad requests
get a 4xx in OpenAI's error shape and leave the server serving, a client that disconnects cancels
its request, and `hotspec serve` parses its options."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hotspec import LLM, RequestOutput, SamplingParams
from hotspec.cli.main import build_parser, engine_config
from hotspec.cli.serve import served_model_name
from hotspec.core.spec_shape import SpecShape
from hotspec.entrypoints.server import BackgroundServer, ServerSettings, create_app

KEY = "sk-test"
NAME = "smol"
MAX_BODY = 64 * 1024
MAX_TOKENS = 12
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]]
AUTH = {"Authorization": f"Bearer {KEY}"}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def offline(smol_llm: LLM) -> dict[str, list[RequestOutput]]:
    """References from the offline API, computed before the server's thread owns the engine."""
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return {"generate": smol_llm.generate(PROMPTS, greedy),
            "chat": [smol_llm.chat(c, greedy)[0] for c in CHATS]}


@pytest.fixture(scope="module")
def server(smol_llm: LLM, offline: dict[str, list[RequestOutput]]) -> Iterator[BackgroundServer]:
    app = create_app(smol_llm.engine, ServerSettings(NAME, api_key=KEY, max_body_bytes=MAX_BODY))
    with BackgroundServer(app) as srv:
        yield srv
    engine = smol_llm.engine  # the server is gone: the engine is idle and every block is free
    assert not engine.has_unfinished()
    assert engine.allocator.num_free == engine.allocator.num_blocks


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def metric(server: BackgroundServer, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def wait_idle(server: BackgroundServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(server, "hotspec_num_requests_running") == 0 and \
                metric(server, "hotspec_kv_blocks_used") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the engine still holds requests or blocks")


# ---------------------------------------------------------------- same results as the offline API


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_completions_equal_offline_generate(client: openai.OpenAI, offline: Any, i: int) -> None:
    ref = offline["generate"][i]
    r = client.completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0)
    assert r.object == "text_completion" and r.model == NAME and len(r.choices) == 1
    assert (r.choices[0].text, r.choices[0].finish_reason) == (ref.text, ref.finish_reason)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(ref.prompt_token_ids), len(ref.token_ids), len(ref.prompt_token_ids) + len(ref.token_ids))

    chunks = list(client.completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.text
    assert len([c for c in chunks if c.choices]) > 1  # streamed, not one block at the end
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_prompt_as_token_ids(client: openai.OpenAI, offline: Any) -> None:
    ref = offline["generate"][0]
    r = client.completions.create(model=NAME, prompt=ref.prompt_token_ids, max_tokens=MAX_TOKENS,
                                  temperature=0)
    assert r.choices[0].text == ref.text


@pytest.mark.parametrize("i", range(len(CHATS)))
def test_chat_equals_offline_chat(client: openai.OpenAI, offline: Any, i: int) -> None:
    ref = offline["chat"][i]
    r = client.chat.completions.create(model=NAME, messages=CHATS[i], max_tokens=MAX_TOKENS,
                                       temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (ref.text, ref.finish_reason)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_token_ids),
                                                                  len(ref.token_ids))
    chunks = list(client.chat.completions.create(model=NAME, messages=CHATS[i], max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_stop_string_and_seeded_sampling(client: openai.OpenAI, offline: Any) -> None:
    ref = offline["generate"][0].text
    stop = ref.strip().split()[1]  # a word from the middle of the greedy continuation
    r = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                  temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == ref[: ref.index(stop)]
    kw = dict(model=NAME, prompt=PROMPTS[1], max_tokens=8, temperature=1.0, top_p=0.9,
              extra_body={"top_k": 50})
    a = client.completions.create(seed=11, **kw).choices[0].text
    assert client.completions.create(seed=11, **kw).choices[0].text == a


def test_models_health_metrics(server: BackgroundServer, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    good_request(server)
    text = httpx.get(server.url + "/metrics").text
    assert metric(server, "hotspec_generated_tokens_total") > 0
    assert metric(server, "hotspec_kv_blocks_total") > 0
    assert 'hotspec_cuda_graph_batch_sizes{phase="decode",status="eager"}' in text
    assert "hotspec_num_requests_waiting" in text and "hotspec_request_tau_count" in text
    # the engine's own time to first token: one observation per request that got a token
    firsts = metric(server, "hotspec_time_to_first_token_seconds_count")
    assert firsts > 0 and metric(server, "hotspec_time_to_first_token_seconds_sum") > 0
    good_request(server)
    assert metric(server, "hotspec_time_to_first_token_seconds_count") == firsts + 1


# ---------------------------------------------------------------- bad requests: 4xx, then serving on


def good_request(server: BackgroundServer) -> None:
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=60,
                   json={"model": NAME, "prompt": "Hi", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


C, CHAT = "/v1/completions", "/v1/chat/completions"
BAD: list[tuple[str, str, Any, dict[str, str], int, str]] = [
    # (id, path, json body or raw bytes, headers, status, message pattern)
    ("malformed-json", C, b'{"model": "smol", "prompt": ', AUTH, 400, r"not valid JSON"),
    ("not-an-object", C, b"[1, 2]", AUTH, 400, r"must be a JSON object"),
    ("max-tokens-string", C, {"model": NAME, "prompt": "x", "max_tokens": "ten"}, AUTH, 400,
     r"max_tokens: Input should be a valid integer \(got 'ten'\)"),
    ("temperature-string", C, {"model": NAME, "prompt": "x", "temperature": "hot"}, AUTH, 400,
     r"temperature: Input should be a valid number"),
    ("stream-string", CHAT, {"model": NAME, "messages": CHATS[0], "stream": "yes"}, AUTH, 400,
     r"stream: Input should be a valid boolean"),
    ("prompt-wrong-type", C, {"model": NAME, "prompt": {"text": "x"}}, AUTH, 400, r"prompt"),
    ("missing-prompt", C, {"model": NAME, "max_tokens": 3}, AUTH, 400, r"prompt: Field required"),
    ("missing-messages", CHAT, {"model": NAME}, AUTH, 400, r"messages: Field required"),
    ("missing-model", C, {"prompt": "x"}, AUTH, 400, r"model: Field required"),
    ("empty-messages", CHAT, {"model": NAME, "messages": []}, AUTH, 400, r"messages: List should have"),
    ("bad-role", CHAT, {"model": NAME, "messages": [{"role": "robot", "content": "x"}]}, AUTH, 400,
     r"messages\.0\.role"),
    ("negative-max-tokens", C, {"model": NAME, "prompt": "x", "max_tokens": -1}, AUTH, 400,
     r"^max_tokens must be an int >= 1, got -1$"),
    ("negative-temperature", CHAT, {"model": NAME, "messages": CHATS[0], "temperature": -1}, AUTH, 400,
     r"^temperature must be a finite number >= 0"),
    ("top-p-zero", C, {"model": NAME, "prompt": "x", "top_p": 0}, AUTH, 400, r"^top_p must be"),
    ("n-17", C, {"model": NAME, "prompt": "x", "n": 17}, AUTH, 400,
     r"^n must be an int in \[1, 16\] \(choices per request\), got 17$"),
    ("top-logprobs-without-logprobs", CHAT, {"model": NAME, "messages": CHATS[0], "top_logprobs": 2},
     AUTH, 400, r"^top_logprobs needs logprobs=true"),
    ("batch-of-prompts", C, {"model": NAME, "prompt": ["a", "b"]}, AUTH, 400, r"batch of 2 prompts"),
    ("empty-prompt", C, {"model": NAME, "prompt": ""}, AUTH, 400, r"empty prompt"),
    ("ids-outside-vocab", C, {"model": NAME, "prompt": [1, 2, 10**7]}, AUTH, 400,
     r"outside the vocabulary"),
    ("prompt-over-context", C, {"model": NAME, "prompt": [5] * 9000}, AUTH, 400,
     r"prompt of 9000 tokens does not fit the context of 8192 tokens"),
    ("unknown-model", C, {"model": "gpt-4", "prompt": "x"}, AUTH, 404, r"the model 'gpt-4' does not exist"),
    ("body-over-limit", C, {"model": NAME, "prompt": "x" * (MAX_BODY + 1)}, AUTH, 413,
     rf"larger than the server's limit of {MAX_BODY} bytes"),
    ("wrong-api-key", C, {"model": NAME, "prompt": "x"}, {"Authorization": "Bearer nope"}, 401,
     r"incorrect API key"),
    ("missing-api-key", CHAT, {"model": NAME, "messages": CHATS[0]}, {}, 401, r"missing API key"),
]


@pytest.mark.parametrize("path,body,headers,status,pattern", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_gets_a_clear_4xx_and_the_server_goes_on(
        server: BackgroundServer, path: str, body: Any, headers: dict[str, str], status: int,
        pattern: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, timeout=60,
                   headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert re.search(pattern, err["message"]), err["message"]
    good_request(server)


def test_body_over_limit_without_content_length(server: BackgroundServer) -> None:
    def chunks() -> Iterator[bytes]:  # chunked transfer: the size is only known while reading
        yield b'{"model": "smol", "prompt": "'
        for _ in range(MAX_BODY // 1000 + 1):
            yield b"x" * 1000
        yield b'"}'

    r = httpx.post(server.url + C, content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    good_request(server)


def test_openai_client_raises_typed_errors(server: BackgroundServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens must be an int >= 1"):
        client.completions.create(model=NAME, prompt="x", max_tokens=-5)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=CHATS[0])
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(server.url + C).status_code == 405  # wrong method, still OpenAI's shape
    assert httpx.get(server.url + "/v2/nothing").json()["error"]["type"] == "not_found_error"
    good_request(server)


# ---------------------------------------------------------------- disconnects cancel


def test_client_disconnect_mid_stream_aborts_the_request(server: BackgroundServer) -> None:
    aborted = metric(server, 'hotspec_requests_finished_total{finish_reason="abort"}') \
        if 'finish_reason="abort"' in httpx.get(server.url + "/metrics").text else 0.0
    body = {"model": NAME, "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    with httpx.stream("POST", server.url + C, json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
    # 4000 tokens would take minutes on a CPU: the request was aborted, its blocks freed.
    wait_idle(server)
    assert time.monotonic() - t0 < 60
    assert metric(server, 'hotspec_requests_finished_total{finish_reason="abort"}') == aborted + 1
    good_request(server)


def test_client_disconnect_while_waiting_for_a_whole_completion(server: BackgroundServer) -> None:
    body = {"model": NAME, "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + C, json=body, headers=AUTH, timeout=httpx.Timeout(60, read=1.0))
    wait_idle(server)
    good_request(server)


# ---------------------------------------------------------------- the `hotspec serve` command


def test_serve_cli_options() -> None:
    args = build_parser().parse_args([
        "serve", "--host", "0.0.0.0", "--port", "8123", "--api-key", "k", "--served-model-name", "m",
        "--max-body-bytes", "1000", "--max-num-seqs", "8", "--max-prefill-tokens", "512",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/heads/h",
        "--speculative-num-steps", "4"])
    assert (args.host, args.port, args.api_key, args.max_body_bytes) == ("0.0.0.0", 8123, "k", 1000)
    assert served_model_name(args) == "m"
    cfg = engine_config(args)
    assert (cfg.max_num_seqs, cfg.max_prefill_tokens, cfg.speculative_algorithm) == (8, 512, "EAGLE3")
    assert cfg.spec_shape == SpecShape(4, 1, 5)
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.host, defaults.port, defaults.api_key) == ("127.0.0.1", 30000, None)
    assert served_model_name(defaults) == "SmolLM2-135M-Instruct"
    assert served_model_name(build_parser().parse_args(["serve", "--model", "/m/Qwen3-8B"])) == "Qwen3-8B"
    assert served_model_name(build_parser().parse_args(["serve", "--model", "/m/x.Q4.gguf"])) == "x.Q4"
    for bad in (["--port", "70000"], ["--max-body-bytes", "0"], ["--port", "http"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])


# ---------------------------------------------------------------- `hotspec serve` with no model


def test_serve_default_speculates_with_the_shipped_head(offline: Any) -> None:
    """The engine `hotspec serve` builds with no model and no option: the default model with its
    shipped EAGLE-3 head. Greedy chat and completions over HTTP equal the offline vanilla API's,
    and /metrics shows speculative requests and the head's hot-set coverage."""
    from hotspec.engine.engine import Engine

    args = build_parser().parse_args(["serve", "--dtype", "float32", "--device", "cpu"])
    cfg = engine_config(args, args.default_head)
    assert cfg.speculative_algorithm == "EAGLE3"
    engine = Engine(cfg)
    assert engine.draft is not None and engine.draft.draft_vocab_size == 8192
    app = create_app(engine, ServerSettings(NAME, api_key=KEY, max_body_bytes=MAX_BODY))
    with BackgroundServer(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        for prompt, ref in zip(PROMPTS, offline["generate"]):
            r = client.completions.create(model=NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
            assert r.choices[0].text == ref.text
        ref = offline["chat"][0]
        chunks = list(client.chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
        wait_idle(srv)
        assert metric(srv, "hotspec_request_tau_count") == 3
        assert metric(srv, "hotspec_request_tau_sum") > 3  # the head's drafts are accepted
        assert 0.5 < metric(srv, "hotspec_hot_set_coverage") <= 1.0
    assert engine.allocator.num_free == engine.allocator.num_blocks
