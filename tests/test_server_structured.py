"""Structured output's request side: `response_format` (json_object, json_schema) and the grammar
extension fields (vLLM's guided_json, guided_regex, guided_grammar, structural_tag; SGLang's regex
and ebnf) on chat and completions. Each field's GrammarSpec (kind, text, the field it names), the
400s: two grammar fields at once, a grammar that does not compile (naming the field, compiled in
the server so the engine never sees it; the server serves on), max_tokens or
max_completion_tokens beyond the context (with the numbers); what reaches the engine, through a
server on a tiny random model whose engine submissions are recorded (and run without the
grammar: the engine's side has tests of its own, test_server_structured_e2e.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_utils import save_tiny_chat_llama

from hotspec import LLM
from hotspec.config import EngineConfig
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.grammar_check import GrammarCheck, checkpoint_vocab_size
from hotspec.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from hotspec.entrypoints.request_handle import RequestHandle
from hotspec.entrypoints.server import (
    BackgroundServer,
    ProcessEngine,
    ServerSettings,
    create_app,
    create_process_app,
)
from hotspec.models.loader import load_tokenizer, resolve_model_path
from hotspec.sampling_params import GrammarSpec, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "tiny"
ENGINE = dict(dtype="float32", device="cpu", block_size=8, num_kv_blocks=64, max_model_len=256)
C, CHAT = "/v1/completions", "/v1/chat/completions"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
TAG = '{"type": "structural_tag", "format": {"type": "regex", "pattern": "[0-9]+"}}'


def body(path: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": NAME, "max_tokens": 2, "temperature": 0}
    prompt = {"messages": [{"role": "user", "content": "Who?"}]} if path == CHAT else {"prompt": "Who"}
    return {**base, **prompt, **extra}


# ---------------------------------------------------------------- fields -> GrammarSpec

GRAMMARS: list[tuple[dict[str, Any], GrammarSpec | None]] = [  # (request fields, the grammar)
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, GrammarSpec("json_object", field="response_format")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                  "strict": True}}},
     GrammarSpec("json_schema", json.dumps(SCHEMA), "response_format.json_schema.schema")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}},
     GrammarSpec("json_object", field="response_format")),  # no schema: any JSON object
    ({"guided_json": SCHEMA}, GrammarSpec("json_schema", json.dumps(SCHEMA), "guided_json")),
    ({"guided_json": '{"type": "array"}'}, GrammarSpec("json_schema", '{"type": "array"}', "guided_json")),
    ({"guided_regex": "[0-9]{3}"}, GrammarSpec("regex", "[0-9]{3}", "guided_regex")),
    ({"regex": "yes|no"}, GrammarSpec("regex", "yes|no", "regex")),
    ({"guided_grammar": 'root ::= "a" | "b"'}, GrammarSpec("ebnf", 'root ::= "a" | "b"', "guided_grammar")),
    ({"ebnf": 'root ::= "a"'}, GrammarSpec("ebnf", 'root ::= "a"', "ebnf")),
    ({"structural_tag": {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}},
     GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": {
         "type": "const_string", "value": "hi"}}), "structural_tag")),
    ({"structural_tag": TAG}, GrammarSpec("structural_tag", TAG, "structural_tag")),
]


@pytest.mark.parametrize("kind", [CompletionRequest, ChatCompletionRequest], ids=["completions", "chat"])
@pytest.mark.parametrize("fields,want", GRAMMARS, ids=[str(i) for i in range(len(GRAMMARS))])
def test_fields_map_to_a_grammar(kind: type[CompletionRequest | ChatCompletionRequest],
                                 fields: dict[str, Any], want: GrammarSpec | None) -> None:
    request = kind.model_validate(body(CHAT if kind is ChatCompletionRequest else C, **fields))
    assert request.sampling_params(16).grammar == want


# ---------------------------------------------------------------- the server


class Recorder:
    """Wraps an engine client's submit: records what reaches the engine (prompt ids and params)
    and submits it without its grammar."""

    def __init__(self, engine: Any) -> None:
        self.real, self.seen = engine.submit, []  # type: ignore[var-annotated]
        engine.submit = self.submit

    async def submit(self, ids: list[int], params: SamplingParams) -> RequestHandle:
        self.seen.append((ids, params))
        return await self.real(ids, dataclasses.replace(params, grammar=None))


def recorded_server(model: Path, **engine: Any) -> Iterator[tuple[str, Recorder]]:
    llm = LLM(model=str(model), **{**ENGINE, **engine})  # type: ignore[arg-type]
    app = create_app(llm.engine, ServerSettings(NAME))
    recorder = Recorder(app.state.hotspec.engine)
    with BackgroundServer(app) as srv:
        yield srv.url, recorder
    assert not llm.engine.has_unfinished()
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chat_llama(tmp_path_factory.mktemp("structured") / "tiny")


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[tuple[str, Recorder]]:
    yield from recorded_server(model)


@pytest.mark.parametrize("path", [C, CHAT])
def test_each_grammar_reaches_the_engine(server: tuple[str, Recorder], path: str) -> None:
    url, recorder = server
    for fields, want in GRAMMARS:
        r = httpx.post(url + path, json=body(path, **fields), timeout=60)
        assert r.status_code == 200, (fields, r.text)
        assert recorder.seen[-1][1].grammar == want


BAD: list[tuple[dict[str, Any], str, str]] = [  # (fields, param, message pattern)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format.json_schema.schema",
     r"^response_format\.json_schema\.schema: invalid json schema: Type should be a string"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "nope"}}}}, "guided_json",
     r"^guided_json: invalid json schema"),
    ({"guided_json": "{not json"}, "guided_json", r"^guided_json: invalid json schema: .*parse JSON"),
    ({"guided_regex": "[a-"}, "guided_regex", r"^guided_regex: invalid regex: .*Unclosed '\['"),
    ({"regex": "(ab"}, "regex", r"^regex: invalid regex"),
    ({"guided_grammar": "root ::= foo"}, "guided_grammar",
     r'^guided_grammar: invalid ebnf: .*Rule "foo" is not defined'),
    ({"ebnf": "root ::="}, "ebnf", r"^ebnf: invalid ebnf"),
    ({"structural_tag": {"type": "structural_tag"}}, "structural_tag",
     r"^structural_tag: invalid structural tag: .*must have a format field"),
]


@pytest.mark.parametrize("path", [C, CHAT])
@pytest.mark.parametrize("fields,param,pattern", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_a_grammar_that_does_not_compile_is_a_400_naming_the_field(
        server: tuple[str, Recorder], path: str, fields: dict[str, Any], param: str, pattern: str) -> None:
    url, recorder = server
    before = len(recorder.seen)
    r = httpx.post(url + path, json=body(path, **fields), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["type"]) == (param, "invalid_request_error"), err
    assert re.search(pattern, err["message"]), err
    assert len(recorder.seen) == before  # refused in the server: nothing reached the engine
    ok = httpx.post(url + path, json=body(path, guided_regex="[a-z]+"), timeout=60)  # the server serves on
    assert ok.status_code == 200 and len(recorder.seen) == before + 1, ok.text


REFUSED: list[tuple[dict[str, Any], str | None, str]] = [  # refused by the schema or the protocol
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex",
     r"^response_format and guided_regex each constrain the output; send at most one of them$"),
    ({"guided_json": SCHEMA, "regex": "a", "ebnf": "root ::= \"a\""}, "regex",
     r"^guided_json and regex and ebnf each constrain"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
      "structural_tag": "{}"}, "structural_tag", r"^response_format and structural_tag each"),
    ({"response_format": {"type": "json_schema"}}, "response_format",
     r"response_format: Value error, type json_schema needs the json_schema object"),
    ({"response_format": {"type": "xml"}}, "response_format.type", r"Input should be 'text', 'json_object'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name", r"Field required"),
    ({"guided_regex": ""}, "guided_regex", r"guided_regex: String should have at least 1 character"),
    ({"guided_regex": 5}, "guided_regex", r"guided_regex: Input should be a valid string"),
]


@pytest.mark.parametrize("path", [C, CHAT])
@pytest.mark.parametrize("fields,param,pattern", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_refused_grammar_fields(server: tuple[str, Recorder], path: str, fields: dict[str, Any],
                                param: str | None, pattern: str) -> None:
    r = httpx.post(server[0] + path, json=body(path, **fields), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and re.search(pattern, err["message"]), err


def test_max_tokens_beyond_the_context_is_a_400_with_the_numbers(server: tuple[str, Recorder]) -> None:
    url, recorder = server
    chat_prompt = httpx.post(url + CHAT, json=body(CHAT), timeout=60).json()["usage"]["prompt_tokens"]
    before = len(recorder.seen)
    for path, prompt, field in [(C, 1, "max_tokens"), (CHAT, chat_prompt, "max_tokens"),
                                (CHAT, chat_prompt, "max_completion_tokens")]:
        fields = {"prompt": [5]} if path == C else {}
        r = httpx.post(url + path, json={**body(path, **fields), "max_tokens": None, field: 1000}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "max_tokens" and err["message"] == (
            f"This model's maximum context length is 256 tokens. However, you requested "
            f"{prompt + 1000} tokens ({prompt} in the prompt, 1000 for the completion). Reduce the "
            "prompt or max_tokens."), err
        fits = {**body(path, **fields), "max_tokens": None, field: 256 - prompt}
        ok = httpx.post(url + path, json=fits, timeout=60)  # exactly what the context leaves
        assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] <= 256, ok.text
    assert len(recorder.seen) == before + 3


# ---------------------------------------------------------------- the grammar check


def test_the_grammar_check_compiles_once_per_server_off_the_event_loop(model: Path) -> None:
    tok = load_tokenizer(model)
    widths: list[int] = []
    check = GrammarCheck(tok, lambda: widths.append(49152) or 49152)
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), "guided_json")

    async def two_at_once() -> None:
        await asyncio.gather(check.check(spec), check.check(GrammarSpec("regex", "a+", "regex")))

    asyncio.run(two_at_once())
    assert widths == [49152] and check.compiler().vocab == 49152  # built once, lazily
    assert check.compiler().compile(spec) is check.compiler().compile(spec)  # cached
    with pytest.raises(APIError) as e:
        asyncio.run(GrammarCheck(None, lambda: 49152).check(spec))
    assert e.value.status == 400 and e.value.param == "guided_json" and "needs a tokenizer" in e.value.message


def test_the_vocabulary_width_comes_from_the_checkpoint(model: Path) -> None:
    assert checkpoint_vocab_size(str(model)) == 49152  # config.json
    assert checkpoint_vocab_size(None) == 49152  # the default model's GGUF metadata
    assert str(resolve_model_path(None)).endswith(".gguf")


def test_hotspec_serve_checks_grammars_in_the_server_process(model: Path) -> None:
    client = ProcessEngine(EngineConfig(model=str(model), **ENGINE), "warning")  # type: ignore[arg-type]
    client.start()
    with BackgroundServer(create_process_app(client, ServerSettings(NAME))) as srv:
        r = httpx.post(srv.url + CHAT, json=body(CHAT, **BAD[0][0]), timeout=120)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "response_format.json_schema.schema", r.text
        assert httpx.post(srv.url + CHAT, json=body(CHAT), timeout=120).status_code == 200
