"""The OpenAI `logprobs` fields over HTTP: chat's `logprobs`/`top_logprobs` and completions'
legacy `logprobs`. The formatting from hand-made TokenLogprob entries (whole answers, streamed
chunks, text offsets, values JSON cannot carry), the request fields' checks (400s that name the
field), and answers through the server and the `openai` client on a tiny random model: one entry
per generated token, logprobs <= 0, the asked number of alternatives, most likely first, and under
greedy decoding the chosen token is the most likely one."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from engine_utils import save_tiny_chat_llama

from hotspec import LLM
from hotspec.config import EngineConfig
from hotspec.core.logprobs import TokenLogprob
from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.logprobs_format import ChatLogprobs, CompletionLogprobs, token_texts
from hotspec.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from hotspec.entrypoints.request_handle import RequestEvent
from hotspec.entrypoints.server import (
    BackgroundServer,
    ProcessEngine,
    ServerSettings,
    create_app,
    create_process_app,
)
from hotspec.models.loader import load_tokenizer, resolve_model_path

NAME = "tiny"
META = fmt.Meta("x-1", 0, NAME)
TEXTS = {1: "He", 2: "llo", 3: " wörld", 4: "!", 5: "<eos>", 6: "\ufffd", 7: "Hi"}
ENGINE = dict(dtype="float32", device="cpu", block_size=8, num_kv_blocks=64, max_model_len=256)

pytestmark = pytest.mark.usefixtures("one_thread")


def lp(token_id: int, logprob: float, *top: tuple[int, float]) -> TokenLogprob:
    return TokenLogprob(token_id, logprob, tuple(top))


def ev(text: str, *entries: TokenLogprob, finish: str | None = None) -> RequestEvent:
    return RequestEvent(text, [e.token_id for e in entries], finish, logprobs=list(entries))


# "Hello" in one event of two tokens, " wörld" alone, a stop token with no text at the end
EVENTS = [ev("Hello", lp(1, -0.5, (1, -0.5), (7, -1.5), (2, -3.0)), lp(2, -0.25, (2, -0.25), (4, -2.0))),
          ev(" wörld", lp(3, -2.0, (4, -1.0), (2, -1.75), (3, -2.0))),
          ev("", lp(5, -math.inf, (5, -math.inf)), finish="stop")]


# ---------------------------------------------------------------- formatting


def test_chat_logprobs_shape() -> None:
    out = ChatLogprobs(TEXTS.__getitem__, 2)(EVENTS, 0)
    assert out is not None and list(out) == ["content"] and len(out["content"]) == 4
    first, world, stop = out["content"][0], out["content"][2], out["content"][3]
    assert first == {"token": "He", "logprob": -0.5, "bytes": [72, 101], "top_logprobs": [
        {"token": "He", "logprob": -0.5, "bytes": [72, 101]},
        {"token": "Hi", "logprob": -1.5, "bytes": [72, 105]}]}  # two of the three alternatives
    assert world["bytes"] == list(" wörld".encode()) and world["logprob"] == -2.0
    assert [t["token"] for t in world["top_logprobs"]] == ["!", "llo"]
    assert stop["logprob"] == -9999.0 and stop["top_logprobs"][0]["logprob"] == -9999.0  # no -inf in JSON
    assert ChatLogprobs(TEXTS.__getitem__, 0)(EVENTS, 0)["content"][0]["top_logprobs"] == []  # type: ignore[index]
    json.dumps(out, allow_nan=False)


def test_completion_logprobs_shape_and_text_offset() -> None:
    out = CompletionLogprobs(TEXTS.__getitem__, 2)(EVENTS, 0)
    assert out == {
        "tokens": ["He", "llo", " wörld", "<eos>"],
        "token_logprobs": [-0.5, -0.25, -2.0, -9999.0],
        # the top 2, plus the chosen token when it is not among them (OpenAI: up to n + 1)
        "top_logprobs": [{"He": -0.5, "Hi": -1.5}, {"llo": -0.25, "!": -2.0},
                         {"!": -1.0, "llo": -1.75, " wörld": -2.0}, {"<eos>": -9999.0}],
        # "Hello wörld": the stop token sits at the end of the text
        "text_offset": [0, 2, 5, 11]}
    assert CompletionLogprobs(TEXTS.__getitem__, 0)(EVENTS, 0)["top_logprobs"][1] == {"llo": -0.25}  # type: ignore[index]
    # offsets count from `start`, never past the event's text (a token whose text is held back)
    held = [ev("", lp(6, -1.0)), ev("é!", lp(6, -1.0), lp(4, -0.5))]
    assert CompletionLogprobs(TEXTS.__getitem__, 1)(held, 7)["text_offset"] == [7, 7, 8]  # type: ignore[index]


def test_whole_answers_carry_logprobs_only_when_asked() -> None:
    chat = fmt.chat_completion(META, EVENTS, ChatLogprobs(TEXTS.__getitem__, 1))["choices"][0]
    assert chat["message"]["content"] == "Hello wörld" and len(chat["logprobs"]["content"]) == 4
    cmpl = fmt.completion(META, EVENTS, CompletionLogprobs(TEXTS.__getitem__, 1))["choices"][0]
    assert cmpl["text"] == "Hello wörld" and cmpl["logprobs"]["text_offset"] == [0, 2, 5, 11]
    assert fmt.chat_completion(META, EVENTS, None)["choices"][0]["logprobs"] is None
    assert fmt.completion(META, EVENTS)["choices"][0]["logprobs"] is None
    # an engine that does not fill the entries: null, not a wrong list
    unfilled = [RequestEvent("Hello", [1, 2]), RequestEvent("", [], "stop")]
    cmpl = fmt.completion(META, unfilled, CompletionLogprobs(TEXTS.__getitem__, 1))["choices"][0]
    assert cmpl["text"] == "Hello" and cmpl["logprobs"] is None
    assert ChatLogprobs(TEXTS.__getitem__, 1)(unfilled, 0) is None


def test_streamed_chunks_carry_their_own_tokens() -> None:
    chat = fmt.chat_chunks(META, False, ChatLogprobs(TEXTS.__getitem__, 1))
    assert chat.start()[0]["choices"][0]["logprobs"] is None  # the role chunk has no tokens
    choices = [c["choices"][0] for batch in ([EVENTS[0]], EVENTS[1:]) for c in chat.step(batch)]
    assert [c["delta"] for c in choices] == [{"content": "Hello"}, {"content": " wörld"}]
    assert [[t["token"] for t in c["logprobs"]["content"]] for c in choices] == [
        ["He", "llo"], [" wörld", "<eos>"]]
    assert choices[-1]["finish_reason"] == "stop"

    cmpl = fmt.completion_chunks(META, True, CompletionLogprobs(TEXTS.__getitem__, 1))
    out = [c for e in EVENTS for c in cmpl.step([e])]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in out[:3]] == [[0, 2], [5], [11]]
    assert out[2]["choices"][0]["text"] == "" and out[3]["usage"]["completion_tokens"] == 0
    # tokens with no text yet: a chunk with logprobs, only when they were asked for
    assert fmt.completion_chunks(META, False).step([ev("", lp(6, -1.0))]) == []
    [chunk] = fmt.completion_chunks(META, False, CompletionLogprobs(TEXTS.__getitem__, 0)).step(
        [ev("", lp(6, -1.0))])
    assert chunk["choices"][0]["logprobs"]["tokens"] == ["\ufffd"]


def test_token_texts() -> None:
    assert token_texts(None)(42) == "token_id:42"  # skip_tokenizer_init, as vLLM writes it
    tok = load_tokenizer(resolve_model_path(None))
    ids = tok.encode("Hello world")
    assert [token_texts(tok)(i) for i in ids] == [tok.decode([i]) for i in ids]


def test_request_fields_map_to_sampling_params() -> None:
    chat: dict[str, Any] = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}
    for extra, want in [({}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5),
                        ({"logprobs": False}, None), ({"top_logprobs": 0}, None),
                        ({"logprobs": None, "top_logprobs": None}, None)]:
        body = ChatCompletionRequest.model_validate({**chat, **extra})
        assert body.sampling_params(16).logprobs == want, extra
    for n in (None, 0, 20):
        assert CompletionRequest.model_validate({"model": NAME, "prompt": "a", "logprobs": n}
                                                ).sampling_params(16).logprobs == n


# ---------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chat_llama(tmp_path_factory.mktemp("logprobs") / "tiny")


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[str]:
    llm = LLM(model=str(model), **ENGINE)  # type: ignore[arg-type]
    with BackgroundServer(create_app(llm.engine, ServerSettings(NAME))) as srv:
        yield srv.url


CHAT = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BAD = [  # (path, body, param, message pattern)
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs=true"),
    ("/v1/chat/completions", {**CHAT, "logprobs": False, "top_logprobs": 2}, "top_logprobs",
     "needs logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
     r"top_logprobs must be an int in \[0, 20\].*got 21"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs", "got -1"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 1}, "logprobs", "valid boolean"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "logprobs": 21}, "logprobs",
     r"logprobs must be an int in \[0, 20\].*got 21"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "logprobs": True}, "logprobs", "valid integer"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "logprobs": 2, "max_tokens": 0}, "max_tokens",
     r"max_tokens must be an int >= 1, got 0 \(0 needs echo=true"),  # scoring a prompt needs echo
]


@pytest.mark.parametrize("path,body,param,pattern", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_logprobs_fields_get_a_400_naming_the_field(server: str, path: str, body: dict[str, Any],
                                                        param: str, pattern: str) -> None:
    r = httpx.post(server + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert re.search(pattern, err["message"]), err["message"]


def _check_chat(content: list[Any], n: int, top: int) -> None:
    assert len(content) == n
    for t in content:
        assert t.logprob <= 0 and t.bytes == list(t.token.encode())
        alts = [a.logprob for a in t.top_logprobs]
        assert len(alts) == top and alts == sorted(alts, reverse=True) and all(a <= 0 for a in alts)
        if top:  # greedy: the chosen token is the most likely one
            assert (t.token, t.logprob) == (t.top_logprobs[0].token, pytest.approx(alts[0]))


def _check_completion(lp: Any, text: str, n: int, top: int) -> None:
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(0 <= o <= len(text) for o in lp.text_offset)
    for token, logprob, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        values = list(alts.values())
        assert logprob <= 0 and len(alts) == top and values == sorted(values, reverse=True)
        assert next(iter(alts)) == token and alts[token] == pytest.approx(logprob)  # greedy


def test_chat_logprobs_through_the_openai_client(server: str) -> None:
    oa = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120)
    kw: dict[str, Any] = dict(model=NAME, messages=[{"role": "user", "content": "Name a colour."}],
                              max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    r = oa.chat.completions.create(**kw, logprobs=True, top_logprobs=3)
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    _check_chat(r.choices[0].logprobs.content, r.usage.completion_tokens, 3)  # type: ignore[union-attr]
    chunks = list(oa.chat.completions.create(**kw, logprobs=True, top_logprobs=3, stream=True,
                                             stream_options={"include_usage": True}))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content or []]
    _check_chat(streamed, chunks[-1].usage.completion_tokens, 3)  # type: ignore[union-attr]
    assert [t.token for t in streamed] == [t.token for t in r.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    plain = oa.chat.completions.create(**kw, logprobs=True)  # no alternatives
    _check_chat(plain.choices[0].logprobs.content, 10, 0)  # type: ignore[union-attr,arg-type]
    assert oa.chat.completions.create(**kw).choices[0].logprobs is None  # not asked: null


def test_completion_logprobs_through_the_openai_client(server: str) -> None:
    oa = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120)
    kw: dict[str, Any] = dict(model=NAME, prompt="The capital of France is", max_tokens=10,
                              temperature=0, extra_body={"ignore_eos": True})
    r = oa.completions.create(**kw, logprobs=4)
    _check_completion(r.choices[0].logprobs, r.choices[0].text, r.usage.completion_tokens, 4)  # type: ignore[union-attr]
    chunks = list(oa.completions.create(**kw, logprobs=4, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    whole = r.choices[0].logprobs
    assert whole is not None
    for field in ("tokens", "token_logprobs", "text_offset"):  # chunk by chunk, the same lists
        assert [x for p in parts for x in getattr(p, field)] == pytest.approx(getattr(whole, field))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert oa.completions.create(**kw).choices[0].logprobs is None


def test_logprobs_cross_the_engine_process(model: Path) -> None:
    """`hotspec serve`'s engine runs in a process of its own: the entries (the prompt's too, with
    echo) come back over its pipe."""
    client = ProcessEngine(EngineConfig(model=str(model), **ENGINE), "warning")  # type: ignore[arg-type]
    client.start()
    with BackgroundServer(create_process_app(client, ServerSettings(NAME))) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=120, json={
            "model": NAME, "prompt": "a", "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "logprobs": 2}).json()
        echo = httpx.post(srv.url + "/v1/completions", timeout=120, json={
            "model": NAME, "prompt": [5, 6, 7], "max_tokens": 0, "echo": True, "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 5 and all(len(d) == 2 for d in lp["top_logprobs"])
    values = echo["choices"][0]["logprobs"]["token_logprobs"]
    assert len(values) == 3 and values[0] is None and all(v <= 0 for v in values[1:]), echo
