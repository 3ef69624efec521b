"""/v1/completions' `echo`: the answer starts with the prompt's text and, with `logprobs`, the
prompt tokens' entries (the first null), streamed and whole; `max_tokens: 0` with echo scores the
prompt alone. The formatting from hand-made events, the request fields (SamplingParams.
prompt_logprobs, 400s that name the field), and answers through the server and the `openai` client
on a tiny random model, prompt logprobs checked against the ones the model reports for the same
tokens when it generates them."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from engine_utils import save_tiny_chat_llama
from test_server_logprobs import ENGINE, EVENTS, META, NAME, TEXTS, ev, lp

from hotspec import LLM
from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.logprobs_format import CompletionLogprobs
from hotspec.entrypoints.protocol import CompletionRequest, InvalidParameterError
from hotspec.entrypoints.request_handle import RequestEvent
from hotspec.entrypoints.server import BackgroundServer, ServerSettings, create_app
from hotspec.models.loader import load_tokenizer, resolve_model_path
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

# the prompt "Hi!" as tokens 7, 4; the engine scores "!" after "Hi"
PROMPT_IDS, PROMPT_TEXT = [7, 4], "Hi!"
PROMPT_LP = [None, lp(4, -1.0, (2, -0.5), (4, -1.0))]
SCORED = [dataclasses.replace(EVENTS[0], prompt_logprobs=PROMPT_LP), *EVENTS[1:]]
ECHOED = {  # "Hi!" + "Hello wörld" (test_server_logprobs' EVENTS), top 2
    "tokens": ["Hi", "!", "He", "llo", " wörld", "<eos>"],
    "token_logprobs": [None, -1.0, -0.5, -0.25, -2.0, -9999.0],
    "top_logprobs": [None, {"llo": -0.5, "!": -1.0}, {"He": -0.5, "Hi": -1.5}, {"llo": -0.25, "!": -2.0},
                     {"!": -1.0, "llo": -1.75, " wörld": -2.0}, {"<eos>": -9999.0}],
    "text_offset": [0, 2, 3, 5, 8, 14]}


def echo(text: str = PROMPT_TEXT, top: int | None = 2) -> fmt.Echo:
    """An Echo as the route builds it, over TEXTS."""
    if top is None:
        return fmt.Echo(text)
    prompt_part = CompletionLogprobs(TEXTS.__getitem__, top).prompt
    return fmt.Echo(text, functools.partial(prompt_part, PROMPT_IDS, text))


def streamed(events: list[RequestEvent], top: int | None = 2, usage: bool = False) -> list[dict[str, Any]]:
    """The completion chunks for `events`, one batch each, with echo."""
    lp_format = None if top is None else CompletionLogprobs(TEXTS.__getitem__, top)
    writer = fmt.completion_chunks(META, usage, lp_format, echo(top=top))
    return [c for e in events for c in writer.step([e])]


def concat(chunks: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The chunks' logprobs lists, chunk after chunk."""
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    return {key: [x for p in parts for x in p[key]] for key in ECHOED}


# ---------------------------------------------------------------- formatting


def test_echo_whole_answer_starts_with_the_prompt() -> None:
    choice = fmt.completion(META, SCORED, CompletionLogprobs(TEXTS.__getitem__, 2), echo())["choices"][0]
    assert choice["text"] == "Hi!Hello wörld" and choice["finish_reason"] == "stop"
    # prompt tokens first (the first null), text_offset over the whole text: the completion from 3
    assert choice["logprobs"] == ECHOED
    plain = fmt.completion(META, SCORED, None, echo(top=None))["choices"][0]
    assert plain["text"] == "Hi!Hello wörld" and plain["logprobs"] is None


def test_echo_prompt_entries_are_null_when_the_engine_has_none() -> None:
    for got in (None, PROMPT_LP[:1]):  # not filled, or a count that does not match the prompt
        events = [dataclasses.replace(EVENTS[0], prompt_logprobs=got), *EVENTS[1:]]
        out = fmt.completion(META, events, CompletionLogprobs(TEXTS.__getitem__, 2), echo())
        logprobs = out["choices"][0]["logprobs"]
        assert logprobs["tokens"] == ECHOED["tokens"] and logprobs["text_offset"] == ECHOED["text_offset"]
        assert logprobs["token_logprobs"][:3] == [None, None, -0.5]
        assert logprobs["top_logprobs"][:2] == [None, None]
    # completion entries the engine does not fill: the whole part null, as without echo
    unfilled = [RequestEvent("Hello", [1, 2], prompt_logprobs=PROMPT_LP), RequestEvent("", [], "stop")]
    out = fmt.completion(META, unfilled, CompletionLogprobs(TEXTS.__getitem__, 2), echo())["choices"][0]
    assert out["text"] == "Hi!Hello" and out["logprobs"] is None


def test_echo_streamed_prompt_comes_with_the_first_chunk() -> None:
    chunks = streamed(SCORED, usage=True)
    first = chunks[0]["choices"][0]
    assert first["text"] == "Hi!Hello"  # the prompt, then the first completion text
    assert first["logprobs"]["tokens"] == ["Hi", "!", "He", "llo"]
    assert first["logprobs"]["text_offset"] == [0, 2, 3, 5]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Hi!Hello wörld"
    assert concat(chunks) == ECHOED  # chunk by chunk, the whole answer's lists
    assert chunks[-1]["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert [c["choices"][0]["text"] for c in streamed(SCORED, top=None)] == ["Hi!Hello", " wörld", ""]
    assert all(c["choices"][0]["logprobs"] is None for c in streamed(SCORED, top=None))
    # a first event with tokens but no text yet: the prompt goes out anyway, its tokens with it
    held = [ev("", lp(6, -1.0)), ev("é!", lp(6, -1.0), lp(4, -0.5))]
    held[0].prompt_logprobs = PROMPT_LP
    chunks = streamed(held)
    assert [c["choices"][0]["text"] for c in chunks] == ["Hi!", "é!"]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in chunks] == [[0, 2, 3], [3, 4]]


def test_echo_with_max_tokens_0_is_the_prompt_alone() -> None:
    # what the engine sends for max_tokens 0: one event, no tokens, the prompt's entries
    only = [RequestEvent("", [], "length", prompt_tokens=2, completion_tokens=0, prompt_logprobs=PROMPT_LP)]
    out = fmt.completion(META, only, CompletionLogprobs(TEXTS.__getitem__, 2), echo())
    assert out["choices"][0] == {"index": 0, "text": "Hi!", "finish_reason": "length", "logprobs": {
        key: value[:2] for key, value in ECHOED.items()}}
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}
    chunks = streamed(only, usage=True)
    assert len(chunks) == 2 and chunks[1]["usage"]["completion_tokens"] == 0
    assert chunks[0]["choices"][0]["text"] == "Hi!" and chunks[0]["choices"][0]["finish_reason"] == "length"
    assert concat(chunks) == {key: value[:2] for key, value in ECHOED.items()}
    assert fmt.completion(META, only, None, echo(top=None))["choices"][0]["logprobs"] is None


def params(**fields: Any) -> SamplingParams:
    return CompletionRequest.model_validate({"model": NAME, "prompt": "a", **fields}).sampling_params(16)


def test_echo_fields_map_to_sampling_params() -> None:
    for fields, prompt_logprobs, max_tokens in [
            ({}, None, 16), ({"echo": True}, None, 16), ({"echo": None, "logprobs": 3}, None, 16),
            ({"echo": False, "logprobs": 3}, None, 16), ({"echo": True, "logprobs": 3}, 3, 16),
            ({"echo": True, "logprobs": 0, "max_tokens": 5}, 0, 5),
            ({"echo": True, "max_tokens": 0}, 0, 0),  # scored for the engine, not reported
            ({"echo": True, "logprobs": 20, "max_tokens": 0}, 20, 0)]:
        p = params(**fields)
        assert (p.prompt_logprobs, p.max_tokens) == (prompt_logprobs, max_tokens), fields
    for fields, pattern in [
            ({"max_tokens": 0}, r"^max_tokens must be an int >= 1, got 0 \(0 needs echo=true"),
            ({"max_tokens": 0, "echo": False, "logprobs": 2}, "needs echo=true"),
            ({"max_tokens": -1}, r"^max_tokens must be an int >= 1, got -1$"),
            ({"max_tokens": -1, "echo": True}, r"^max_tokens must be an int >= 0 with echo")]:
        with pytest.raises(InvalidParameterError, match=pattern) as e:
            params(**fields)
        assert e.value.param == "max_tokens"


# ---------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(resolve_model_path(None))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, tok: Tokenizer) -> Path:
    return save_tiny_chat_llama(tmp_path_factory.mktemp("echo") / "tiny")


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[str]:
    llm = LLM(model=str(model), **ENGINE)  # type: ignore[arg-type]
    with BackgroundServer(create_app(llm.engine, ServerSettings(NAME))) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def oa(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120)


TEXT = "The capital of France is"
KW: dict[str, Any] = dict(model=NAME, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})


@pytest.mark.parametrize("body,status,param,pattern", [
    ({"max_tokens": 0}, 400, "max_tokens", r"max_tokens must be an int >= 1, got 0 \(0 needs echo=true"),
    ({"max_tokens": -2, "echo": True}, 400, "max_tokens", r"max_tokens must be an int >= 0 with echo"),
    ({"echo": "yes"}, 400, "echo", "valid boolean"),
    ({"echo": None, "max_tokens": 1}, 200, None, ""),  # null: not asked
], ids=["max-tokens-0", "negative-with-echo", "echo-string", "echo-null"])
def test_echo_request_checks(server: str, body: dict[str, Any], status: int, param: str | None,
                             pattern: str) -> None:
    r = httpx.post(server + "/v1/completions", json={"model": NAME, "prompt": "a", **body}, timeout=60)
    assert r.status_code == status, r.text
    if status != 200:
        err = r.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error", err
        assert re.search(pattern, err["message"]), err["message"]


def test_chat_has_no_echo(server: str) -> None:
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": [{"role": "user", "content": "hi"}], "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text


def test_echo_text_through_the_openai_client(oa: openai.OpenAI, tok: Tokenizer) -> None:
    ids = tok.encode("Hello, world")
    for prompt, text in [(TEXT, TEXT), (ids, tok.decode(ids))]:  # as sent; token ids decoded
        plain = oa.completions.create(prompt=prompt, **KW)
        r = oa.completions.create(prompt=prompt, echo=True, **KW)
        assert r.choices[0].text == text + plain.choices[0].text and r.choices[0].logprobs is None
        assert r.usage == plain.usage and r.choices[0].finish_reason == "length"
        chunks = list(oa.completions.create(prompt=prompt, echo=True, stream=True, **KW))
        assert chunks[0].choices[0].text.startswith(text)  # the prompt comes first, in one chunk
        assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_echo_logprobs_cover_the_prompt_then_the_completion(oa: openai.OpenAI, tok: Tokenizer) -> None:
    for prompt in (TEXT, tok.encode("Once upon a time")):
        text = prompt if isinstance(prompt, str) else tok.decode(prompt)
        ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
        n = len(ids)
        plain = oa.completions.create(prompt=prompt, logprobs=3, **KW)
        r = oa.completions.create(prompt=prompt, logprobs=3, echo=True, **KW)
        got, want = r.choices[0].logprobs, plain.choices[0].logprobs
        assert got is not None and want is not None and r.usage is not None
        assert r.usage.prompt_tokens == n and len(got.tokens) == n + r.usage.completion_tokens  # type: ignore[arg-type]
        assert got.tokens[:n] == [tok.decode([i]) for i in ids]  # type: ignore[index]
        assert got.token_logprobs[0] is None and got.top_logprobs[0] is None  # type: ignore[index]
        # the completion's part: as without echo, its offsets after the prompt's text
        assert got.tokens[n:] == want.tokens and got.token_logprobs[n:] == pytest.approx(want.token_logprobs)  # type: ignore[index]
        assert got.top_logprobs[n:] == want.top_logprobs  # type: ignore[index]
        assert got.text_offset[n:] == [o + len(text) for o in want.text_offset]  # type: ignore[index,union-attr]
        assert got.text_offset[0] == 0 and got.text_offset == sorted(got.text_offset)  # type: ignore[index]
        chunks = list(oa.completions.create(prompt=prompt, logprobs=3, echo=True, stream=True, **KW))
        first = chunks[0].choices[0]
        assert first.text.startswith(text) and first.logprobs.tokens[:n] == got.tokens[:n]  # type: ignore[union-attr,index]
        parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [x for p in parts for x in getattr(p, field)] == getattr(got, field), field


def test_echo_prompt_logprobs_have_values(oa: openai.OpenAI, tok: Tokenizer) -> None:
    r = oa.completions.create(prompt=TEXT, logprobs=3, echo=True, **KW)
    got = r.choices[0].logprobs
    assert got is not None and got.token_logprobs is not None and got.top_logprobs is not None
    n = len(tok.encode(TEXT))
    for token, logprob, alts in zip(got.tokens[1:n], got.token_logprobs[1:n], got.top_logprobs[1:n]):  # type: ignore[index]
        assert logprob is not None and logprob <= 0 and alts is not None
        values = list(alts.values())
        assert len(alts) in (3, 4) and alts[token] == pytest.approx(logprob)  # the top 3 and the token
        assert values[:3] == sorted(values[:3], reverse=True) and all(v <= 0 for v in values)


def test_max_tokens_0_with_echo_scores_the_prompt_alone(oa: openai.OpenAI, tok: Tokenizer) -> None:
    n = len(tok.encode(TEXT))
    kw: dict[str, Any] = dict(model=NAME, prompt=TEXT, max_tokens=0, echo=True)
    r = oa.completions.create(**kw, logprobs=2)
    got = r.choices[0].logprobs
    assert r.choices[0].text == TEXT and r.choices[0].finish_reason == "length"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (n, 0)
    assert got is not None and got.token_logprobs is not None and len(got.token_logprobs) == n
    assert got.token_logprobs[0] is None and all(x is not None and x <= 0 for x in got.token_logprobs[1:])
    plain = oa.completions.create(**kw)  # echo alone: the text, no logprobs
    assert plain.choices[0].text == TEXT and plain.choices[0].logprobs is None
    assert plain.usage is not None and plain.usage.completion_tokens == 0
    chunks = list(oa.completions.create(**kw, logprobs=2, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == TEXT
    assert chunks[-1].choices[0].finish_reason == "length"
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [x for p in parts for x in p.token_logprobs] == got.token_logprobs  # type: ignore[union-attr]


def test_prompt_logprobs_equal_the_generated_tokens_logprobs(model: Path, oa: openai.OpenAI,
                                                            tok: Tokenizer) -> None:
    """Greedy tokens G after prompt P, with their logprobs; P + G sent back with echo and
    max_tokens 0: G's prompt entries are the logprobs G had when generated (token ids throughout,
    so nothing is tokenized twice)."""
    prompt = tok.encode(TEXT)
    offline = LLM(model=str(model), **ENGINE)  # type: ignore[arg-type]
    [out] = offline.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True))
    generated = out.token_ids
    r = oa.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=0, logprobs=2,
                              extra_body={"ignore_eos": True})
    want = r.choices[0].logprobs
    assert want is not None and want.token_logprobs is not None and len(want.token_logprobs) == 8
    scored = oa.completions.create(model=NAME, prompt=prompt + generated, max_tokens=0, echo=True,
                                   logprobs=2).choices[0].logprobs
    assert scored is not None and scored.token_logprobs is not None and scored.tokens is not None
    assert scored.tokens[len(prompt):] == want.tokens  # the same tokens as the server generated
    assert scored.token_logprobs[len(prompt):] == pytest.approx(want.token_logprobs, abs=1e-4)
    assert scored.top_logprobs is not None and want.top_logprobs is not None
    for a, b in zip(scored.top_logprobs[len(prompt):], want.top_logprobs):
        assert a is not None and a.keys() == b.keys()
        assert list(a.values()) == pytest.approx(list(b.values()), abs=1e-4)
