"""The OpenAI request fields for logits processing (presence_penalty, frequency_penalty,
logit_bias; vLLM's repetition_penalty and min_tokens) and `n` choices (completions' best_of only
equal to n). Each field's mapping to SamplingParams, the 400s that name a bad value's field, the
n-choice formatting from hand-made events (index, usage, interleaved chunks), the submission of n
requests (one refused: the others cancelled), and answers through the server and the `openai`
client on a tiny random model: logit_bias forces a token, the penalties change a greedy answer,
min_tokens holds back a pushed EOS, n seeded choices are reproducible and streamed equal whole,
a client that goes away cancels every choice."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from test_server_echo import model, tok  # noqa: F401 - the tiny model and its tokenizer
from test_server_logprobs import META, NAME, ev, lp

from hotspec import LLM
from hotspec.config import EngineConfig
from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.protocol import ChatCompletionRequest, CompletionRequest, choice_params
from hotspec.entrypoints.request_handle import RequestEvent, RequestHandle
from hotspec.entrypoints.server import (
    BackgroundServer,
    ProcessEngine,
    ServerSettings,
    create_app,
    create_process_app,
)
from hotspec.entrypoints.submission import submit_choices
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

# room for 3 choices of a whole context each, so nothing is preempted
ENGINE = dict(dtype="float32", device="cpu", block_size=8, num_kv_blocks=128, max_model_len=256)
C, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]
ABORTED = 'hotspec_requests_finished_total{finish_reason="abort"}'


def body(path: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": NAME, "max_tokens": 2, "temperature": 0}
    return {**base, **({"messages": MESSAGES} if path == CHAT else {"prompt": PROMPT}), **extra}


# ---------------------------------------------------------------- fields -> SamplingParams

MAPPING: list[tuple[dict[str, Any], str, Any]] = [  # (request fields, SamplingParams field, value)
    ({}, "presence_penalty", 0.0), ({"presence_penalty": 0.5}, "presence_penalty", 0.5),
    ({"presence_penalty": None}, "presence_penalty", 0.0), ({"presence_penalty": -2}, "presence_penalty", -2),
    ({}, "frequency_penalty", 0.0), ({"frequency_penalty": -1.5}, "frequency_penalty", -1.5),
    ({"frequency_penalty": 2}, "frequency_penalty", 2),
    ({}, "repetition_penalty", 1.0), ({"repetition_penalty": 1.3}, "repetition_penalty", 1.3),
    ({"repetition_penalty": 0.5}, "repetition_penalty", 0.5),
    ({}, "logit_bias", None), ({"logit_bias": {}}, "logit_bias", None),
    ({"logit_bias": {"5": 10, "49151": -100.0, "0": 0.5}}, "logit_bias", {5: 10, 49151: -100, 0: 0.5}),
    ({}, "min_tokens", 0), ({"min_tokens": 3}, "min_tokens", 3), ({"min_tokens": None}, "min_tokens", 0),
    ({"min_tokens": 16, "max_tokens": 16}, "min_tokens", 16),
]


@pytest.mark.parametrize("kind", [CompletionRequest, ChatCompletionRequest], ids=["completions", "chat"])
@pytest.mark.parametrize("fields,name,want", MAPPING, ids=[f"{m[1]}-{i}" for i, m in enumerate(MAPPING)])
def test_fields_map_to_sampling_params(kind: type[CompletionRequest | ChatCompletionRequest],
                                       fields: dict[str, Any], name: str, want: Any) -> None:
    base = body(CHAT if kind is ChatCompletionRequest else C)
    del base["max_tokens"]  # 16 by default
    got = getattr(kind.model_validate({**base, **fields}).sampling_params(16), name)
    assert (dict(got) if name == "logit_bias" and got is not None else got) == want


def test_n_maps_to_choices_with_consecutive_seeds() -> None:
    assert CompletionRequest.model_validate(body(C)).num_choices == 1
    assert ChatCompletionRequest.model_validate(body(CHAT, n=4)).num_choices == 4
    seeded = SamplingParams(temperature=1.0, seed=7, logit_bias={3: 1.0}, min_tokens=1)
    params = choice_params(seeded, 3)
    assert [p.seed for p in params] == [7, 8, 9]
    assert all(p == SamplingParams(temperature=1.0, seed=p.seed, logit_bias={3: 1.0}, min_tokens=1)
               for p in params)
    assert [p.seed for p in choice_params(SamplingParams(), 2)] == [None, None]  # each draws its own


# ---------------------------------------------------------------- bad values: 400 naming the field

BAD: list[tuple[dict[str, Any], str, str]] = [  # (fields, param, message pattern); both endpoints
    ({"presence_penalty": 2.5}, "presence_penalty", r"^presence_penalty must be a number in \[-2, 2\]"),
    ({"presence_penalty": -2.01}, "presence_penalty", r"got -2\.01"),
    ({"presence_penalty": "high"}, "presence_penalty", r"valid number"),
    ({"frequency_penalty": 3}, "frequency_penalty", r"^frequency_penalty must be a number in \[-2, 2\]"),
    ({"repetition_penalty": 0}, "repetition_penalty", r"^repetition_penalty must be a finite number > 0"),
    ({"repetition_penalty": -1.0}, "repetition_penalty", r"got -1\.0"),
    ({"logit_bias": {"a": 1}}, "logit_bias", r"^logit_bias keys must be token ids \(strings of ints\), got"),
    ({"logit_bias": {"1.5": 1}}, "logit_bias", r"keys must be token ids"),
    ({"logit_bias": {"5": 101}}, "logit_bias", r"^logit_bias values must be numbers in \[-100, 100\], got 1"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias", r"got -100\.5 for token 5"),
    ({"logit_bias": {"-1": 5}}, "logit_bias", r"^logit_bias token ids \[-1\] are outside the vocabulary"),
    ({"logit_bias": {"49152": 5}}, "logit_bias",  # the engine's check, at submission
     r"^logit_bias token ids \[49152\] are outside the vocabulary \[0, 49152\)"),
    ({"logit_bias": {"10000000": 5}, "n": 3}, "logit_bias", r"outside the vocabulary"),  # all n refused
    ({"logit_bias": [5]}, "logit_bias", r"valid dictionary"),
    ({"min_tokens": -1}, "min_tokens", r"^min_tokens must be an int in \[0, max_tokens=2\], got -1"),
    ({"min_tokens": 3}, "min_tokens", r"^min_tokens must be an int in \[0, max_tokens=2\], got 3"),
    ({"min_tokens": 1.0}, "min_tokens", r"valid integer"),
    ({"n": 17}, "n", r"^n must be an int in \[1, 16\] \(choices per request\), got 17$"),
    ({"n": 0}, "n", r"got 0$"),
    ({"n": 2.0}, "n", r"valid integer"),
]
BAD_COMPLETIONS: list[tuple[dict[str, Any], str, str]] = [
    ({"best_of": 3}, "best_of", r"^best_of > n is not supported \(got best_of=3, n=1\)"),
    ({"best_of": 3, "n": 2}, "best_of", r"best_of > n is not supported \(got best_of=3, n=2\)"),
    ({"best_of": 1, "n": 2}, "best_of", r"^best_of must be >= n"),
]
CASES = [(path, *b) for b in BAD for path in (C, CHAT)] + [(C, *b) for b in BAD_COMPLETIONS]


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[str]:  # noqa: F811 - the fixture imported above
    llm = LLM(model=str(model), **ENGINE)  # type: ignore[arg-type]
    with BackgroundServer(create_app(llm.engine, ServerSettings(NAME))) as srv:
        yield srv.url
    assert not llm.engine.has_unfinished()
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


@pytest.fixture(scope="module")
def oa(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.mark.parametrize("path,fields,param,pattern", CASES,
                         ids=[f"{c[0].split('/')[-1]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_bad_values_get_a_400_naming_the_field(server: str, path: str, fields: dict[str, Any],
                                               param: str, pattern: str) -> None:
    r = httpx.post(server + path, json=body(path, **fields), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert re.search(pattern, err["message"]), err["message"]


def test_off_values_and_best_of_equal_to_n_are_accepted(server: str) -> None:
    off = dict(n=1, presence_penalty=0, frequency_penalty=0.0, repetition_penalty=1, logit_bias={},
               min_tokens=0)
    for path in (C, CHAT):
        assert httpx.post(server + path, json=body(path, **off), timeout=60).status_code == 200
    r = httpx.post(server + C, json=body(C, n=2, best_of=2), timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
    r = httpx.post(server + CHAT, json=body(CHAT, best_of=1), timeout=60)  # chat's "off" value
    assert r.status_code == 200, r.text
    r = httpx.post(server + CHAT, json=body(CHAT, best_of=2), timeout=60)  # chat has no best_of
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter", r.text


# ---------------------------------------------------------------- n choices: formatting, submission


def done(text: str, *ids: int, finish: str | None = None, completion: int = 0) -> RequestEvent:
    e = ev(text, *(lp(i, -1.0) for i in ids), finish=finish)
    e.prompt_tokens, e.completion_tokens = 4, completion
    return e


A = [done("Hel", 1), done("lo", 2, finish="stop", completion=2)]
B = [done("Bye", 3, 4, 5), done("", finish="length", completion=3)]


def test_whole_answers_have_a_choice_each() -> None:
    out = fmt.completion_choices(META, [A, B], echo=fmt.Echo("Hi "))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in out["choices"]] == [
        (0, "Hi Hello", "stop"), (1, "Hi Bye", "length")]  # echo: each choice starts with the prompt
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}  # prompt once
    chat = fmt.chat_completion_choices(META, [A, B])
    assert [c["message"]["content"] for c in chat["choices"]] == ["Hello", "Bye"]
    assert chat["usage"] == out["usage"] and fmt.chat_completion(META, A)["usage"]["completion_tokens"] == 2


def test_streamed_choices_interleave_and_usage_comes_once_at_the_end() -> None:
    writer = fmt.chat_chunks(META, True, n=2)
    assert [c["choices"][0]["index"] for c in writer.start()] == [0, 1]  # a role chunk each
    out = writer.step(B[:1], 1) + writer.step(A[:1], 0) + writer.step(A[1:], 0)
    assert [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in out] == [
        (1, None), (0, None), (0, "stop")]
    assert all(c["usage"] is None for c in out)  # choice 1 not finished: no counts yet
    assert [c["choices"] for c in writer.step(B[1:], 1)] == [
        [{"index": 1, "delta": {}, "logprobs": None, "finish_reason": "length"}], []]
    cmpl = fmt.completion_chunks(META, True, echo=fmt.Echo("Hi "), n=2)
    steps = cmpl.step(B, 1) + cmpl.step(A[:1], 0) + cmpl.step(A[1:], 0)
    assert [c["choices"][0]["text"] if c["choices"] else c["usage"] for c in steps] == [
        "Hi Bye", "Hi Hel", "lo", {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}]


class FakeEngine:
    """Accepts every submission but the `refuse`-th; records aborts."""

    def __init__(self, refuse: int | None) -> None:
        self.refuse, self.seeds, self.aborted = refuse, [], []  # type: ignore[var-annotated]

    async def submit(self, ids: list[int], params: SamplingParams) -> RequestHandle:
        self.seeds.append(params.seed)
        index = len(self.seeds) - 1
        await asyncio.sleep(0)  # the submissions overlap
        if index == self.refuse:
            raise InvalidRequestError("logit_bias token ids [9] are outside the vocabulary [0, 8)")
        return RequestHandle(asyncio.get_running_loop())

    def abort(self, handle: RequestHandle) -> None:
        self.aborted.append(handle)


def test_a_refused_choice_cancels_the_others() -> None:
    params = choice_params(SamplingParams(seed=5), 3)
    ok = FakeEngine(None)
    handles = asyncio.run(submit_choices(ok, [1, 2], params))  # type: ignore[arg-type]
    assert len(handles) == 3 and ok.seeds == [5, 6, 7] and ok.aborted == []
    bad = FakeEngine(1)
    with pytest.raises(APIError) as e:
        asyncio.run(submit_choices(bad, [1, 2], params))  # type: ignore[arg-type]
    assert (e.value.status, e.value.param) == (400, "logit_bias") and len(bad.aborted) == 2


# ---------------------------------------------------------------- through the server


def test_logit_bias_forces_a_token(oa: openai.OpenAI, tok: Tokenizer) -> None:  # noqa: F811
    [cat] = tok.encode(" cat")
    kw: dict[str, Any] = dict(model=NAME, max_tokens=6, temperature=0, logit_bias={str(cat): 100},
                              extra_body={"ignore_eos": True})
    r = oa.completions.create(prompt=PROMPT, **kw)
    assert r.choices[0].text == " cat" * 6 and r.usage is not None and r.usage.completion_tokens == 6
    chat = oa.chat.completions.create(messages=MESSAGES, **kw)  # type: ignore[arg-type]
    assert chat.choices[0].message.content == " cat" * 6


def test_penalties_change_a_greedy_answer(oa: openai.OpenAI, tok: Tokenizer) -> None:  # noqa: F811
    """Token X, the greedy answer's first, repeated by a logit_bias just large enough that X wins
    every step by at least 1 (margins from the raw logprobs, which the bias leaves alone): the
    tightest step flips under presence_penalty 2 (X's logit - 2 once it occurred) and
    frequency_penalty 2 (- 2 per occurrence); repetition_penalty 100 flips the second token."""
    kw: dict[str, Any] = dict(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0,
                              extra_body={"ignore_eos": True})
    x_text = oa.completions.create(**{**kw, "max_tokens": 1}).choices[0].text
    ids = tok.encode(x_text)
    assert len(ids) == 1 and tok.decode(ids) == x_text, (x_text, ids)
    x = str(ids[0])
    forced = oa.completions.create(**kw, logit_bias={x: 100}, logprobs=2).choices[0].logprobs
    assert forced is not None and forced.tokens == [x_text] * 8 and forced.top_logprobs is not None
    needs = [max(v for k, v in alts.items() if k != x_text) - alts[x_text]
             for alts in forced.top_logprobs[1:]]
    bias = max(needs) + 1.0  # X is the raw argmax at the first step: no bias needed there
    plain = oa.completions.create(**kw, logit_bias={x: bias}).choices[0].text
    assert plain == x_text * 8
    for penalty in ("presence_penalty", "frequency_penalty"):
        r = oa.completions.create(**kw, logit_bias={x: bias}, **{penalty: 2.0})
        assert r.choices[0].text != plain and r.choices[0].text.startswith(x_text), penalty
        assert oa.completions.create(**kw, logit_bias={x: bias}, **{penalty: 0.0}).choices[0].text == plain
    extra = {**kw["extra_body"], "repetition_penalty": 100.0}
    strong = oa.completions.create(**{**kw, "extra_body": extra}, logit_bias={x: bias})
    assert not strong.choices[0].text.startswith(x_text * 2)


def test_min_tokens_holds_back_a_pushed_eos(oa: openai.OpenAI, tok: Tokenizer) -> None:  # noqa: F811
    kw: dict[str, Any] = dict(model=NAME, max_tokens=16, temperature=0,
                              logit_bias={str(tok.eos_token_id): 100})
    r = oa.completions.create(prompt=PROMPT, **kw)
    assert r.usage is not None and r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    r = oa.completions.create(prompt=PROMPT, **kw, extra_body={"min_tokens": 4})
    assert r.usage is not None and r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "stop"
    chat = oa.chat.completions.create(messages=MESSAGES, **kw, extra_body={"min_tokens": 4})  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert chat.choices[0].finish_reason == "stop"


SAMPLED: dict[str, Any] = dict(model=NAME, max_tokens=8, temperature=1.0, seed=42,
                               extra_body={"ignore_eos": True})


def test_n_seeded_choices_are_reproducible(oa: openai.OpenAI, tok: Tokenizer) -> None:  # noqa: F811
    r = oa.completions.create(prompt=PROMPT, n=3, **SAMPLED)
    again = oa.completions.create(prompt=PROMPT, n=3, **SAMPLED)
    texts = [c.text for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and texts == [c.text for c in again.choices]
    assert len(set(texts)) > 1 and all(c.finish_reason == "length" for c in r.choices)
    assert r.usage is not None and r.usage.prompt_tokens == len(tok.encode(PROMPT))
    assert r.usage.completion_tokens == 24 and r.usage.total_tokens == r.usage.prompt_tokens + 24
    # choice i is the request with seed 42 + i
    assert oa.completions.create(prompt=PROMPT, **{**SAMPLED, "seed": 43}).choices[0].text == texts[1]
    chat = oa.chat.completions.create(messages=MESSAGES, n=2, **SAMPLED)  # type: ignore[arg-type]
    chat2 = oa.chat.completions.create(messages=MESSAGES, n=2, **SAMPLED)  # type: ignore[arg-type]
    assert [c.message.content for c in chat.choices] == [c.message.content for c in chat2.choices]
    assert [c.index for c in chat.choices] == [0, 1] and chat.usage.completion_tokens == 16  # type: ignore[union-attr]
    echo = oa.completions.create(prompt=PROMPT, n=3, echo=True, **SAMPLED)
    assert [c.text for c in echo.choices] == [PROMPT + t for t in texts]  # each choice echoes it


def test_n_streamed_equals_whole(oa: openai.OpenAI) -> None:
    whole = oa.completions.create(prompt=PROMPT, n=3, **SAMPLED)
    chunks = list(oa.completions.create(prompt=PROMPT, n=3, stream=True,
                                        stream_options={"include_usage": True}, **SAMPLED))
    *body_chunks, last = chunks
    assert last.choices == [] and last.usage == whole.usage  # one usage chunk, at the end
    assert all(c.usage is None and len(c.choices) == 1 for c in body_chunks)
    assert {c.choices[0].index for c in body_chunks} == {0, 1, 2}  # in the order they arrive
    for choice in whole.choices:
        mine = [c.choices[0] for c in body_chunks if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]  # its own finish chunk
    chat_kw: dict[str, Any] = dict(messages=MESSAGES, n=3, **SAMPLED)
    chat = oa.chat.completions.create(**chat_kw)
    streamed = list(oa.chat.completions.create(**chat_kw, stream=True))
    for choice in chat.choices:
        mine = [c.choices[0] for c in streamed if c.choices[0].index == choice.index]
        assert mine[0].delta.role == "assistant" and [c.finish_reason for c in mine][-1] == "length"
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content


def test_n_with_logprobs_gives_each_choice_its_own(oa: openai.OpenAI) -> None:
    r = oa.completions.create(prompt=PROMPT, n=2, logprobs=2, **SAMPLED)
    for c in r.choices:
        assert c.logprobs is not None and c.logprobs.tokens is not None and len(c.logprobs.tokens) == 8
        assert "".join(c.logprobs.tokens) == c.text and all(len(a) in (2, 3) for a in c.logprobs.top_logprobs)  # type: ignore[union-attr]
    assert r.choices[0].logprobs.tokens != r.choices[1].logprobs.tokens  # type: ignore[union-attr]
    chat = oa.chat.completions.create(messages=MESSAGES, n=2, logprobs=True, top_logprobs=2, **SAMPLED)  # type: ignore[arg-type]
    for c in chat.choices:
        assert c.logprobs is not None and c.logprobs.content is not None and len(c.logprobs.content) == 8
        assert "".join(t.token for t in c.logprobs.content) == c.message.content


def metric(server: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(server + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_idle(server: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(server, "hotspec_num_requests_running") or metric(server, "hotspec_kv_blocks_used"):
        assert time.monotonic() < deadline, "the engine still holds requests or blocks"
        time.sleep(0.05)


def test_a_client_that_goes_away_cancels_every_choice(server: str) -> None:
    aborted = metric(server, ABORTED)
    long = body(C, n=3, max_tokens=240, temperature=1.0, ignore_eos=True)
    with httpx.stream("POST", server + C, json={**long, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
    wait_idle(server)
    assert metric(server, ABORTED) == aborted + 3
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + C, json=long, timeout=httpx.Timeout(60, read=0.5))
    wait_idle(server)
    assert metric(server, ABORTED) == aborted + 6


# ---------------------------------------------------------------- `hotspec serve`'s engine process


@pytest.fixture(scope="module")
def process_server(model: Path) -> Iterator[str]:  # noqa: F811
    client = ProcessEngine(EngineConfig(model=str(model), **ENGINE), "warning")  # type: ignore[arg-type]
    client.start()
    with BackgroundServer(create_process_app(client, ServerSettings(NAME))) as srv:
        yield srv.url


def test_n_crosses_the_engine_process(process_server: str) -> None:
    r = httpx.post(process_server + C, json=body(C, n=2, seed=1, temperature=1.0, min_tokens=2,
                                                 presence_penalty=1.0), timeout=120)
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1], r.text


def test_logit_bias_crosses_the_engine_process(process_server: str) -> None:
    r = httpx.post(process_server + C, json=body(C, logit_bias={"5": 100}, ignore_eos=True), timeout=120)
    assert r.status_code == 200, r.text
