"""Constrained generation end to end, through the server on a tiny random model (Qwen2.5's chat
template, test_server_tools), vanilla and speculative (a random EAGLE-3 head): every json_schema
answer parses and validates against its schema, json_object answers are objects, regex and EBNF
answers match, tool_choice required / named answers are calls parsed into `tool_calls`, streamed
as whole; the request finishes ("stop", or "tool_calls") when its grammar is complete; greedy
speculative answers equal vanilla ones under the same grammar.

The engine's part (the grammar's mask on every step and tree node, the matcher advanced over the
accepted tokens, the request finished when the grammar completes) is what these tests check.
Random weights would fill JSON with whitespace or a string forever (a grammar allows both), so
the schemas bound their strings and every request pushes whitespace-only tokens down with
logit_bias (they still come where the grammar leaves nothing else)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from test_server_tools import CONTEXT, NAME, save_qwen_chat_llama

from hotspec import LLM
from hotspec.entrypoints.server import BackgroundServer, ServerSettings, create_app

pytestmark = pytest.mark.usefixtures("one_thread")

ENGINE = dict(dtype="float32", device="cpu", block_size=8, max_model_len=CONTEXT,
              num_kv_blocks=2 * CONTEXT // 8)
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=2,
            speculative_num_draft_tokens=6)
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string", "maxLength": 6}}, "required": ["tz"],
        "additionalProperties": False}}},
]
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                      "admin": {"type": "boolean"}},
     "required": ["name", "age", "admin"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                               "minItems": 1, "maxItems": 3},
                                      "kind": {"enum": ["x", "y"]}},
     "required": ["tags", "kind"], "additionalProperties": False},
]


def valid(value: Any, schema: dict[str, Any]) -> bool:
    """`value` under `schema` (jsonschema when installed; else the keywords SCHEMAS use)."""
    try:
        import jsonschema
    except ImportError:
        return _valid(value, schema)
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return isinstance(value, dict) and all(k in value for k in schema.get("required", ())) \
            and (schema.get("additionalProperties", True) is not False or set(value) <= set(props)) \
            and all(_valid(v, props[k]) for k, v in value.items() if k in props)
    if kind == "array":
        return isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get(
            "maxItems", len(value)) and all(_valid(v, schema.get("items", {})) for v in value)
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) \
            and schema.get("minimum", value) <= value <= schema.get("maximum", value)
    if kind == "boolean":
        return isinstance(value, bool)
    return True


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Qwen-template target and a random EAGLE-3 head for it."""
    from hotspec.models.draft_checkpoint import random_draft_checkpoint
    from hotspec.models.loader import load_checkpoint

    root = tmp_path_factory.mktemp("structured_e2e")
    target = save_qwen_chat_llama(root / "target", layers=4)
    random_draft_checkpoint(root / "head", load_checkpoint(target, torch.float32)[0], "EAGLE3",
                            seed=1, scale=0.1)
    return target, root / "head"


def _serve(models: tuple[Path, Path], spec: bool) -> Iterator[openai.OpenAI]:
    target, head = models
    extra = dict(SPEC, speculative_draft_model_path=str(head)) if spec else {}
    llm = LLM(model=str(target), **ENGINE, **extra)  # type: ignore[arg-type]
    with BackgroundServer(create_app(llm.engine, ServerSettings(NAME))) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    assert not llm.engine.has_unfinished()
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


@pytest.fixture(scope="module")
def vanilla(models: tuple[Path, Path]) -> Iterator[openai.OpenAI]:
    yield from _serve(models, spec=False)


@pytest.fixture(scope="module")
def speculative(models: tuple[Path, Path]) -> Iterator[openai.OpenAI]:
    yield from _serve(models, spec=True)


@pytest.fixture(params=["vanilla", "speculative"])
def oa(request: pytest.FixtureRequest) -> openai.OpenAI:
    return request.getfixturevalue(request.param)


def no_whitespace() -> dict[str, float]:
    """logit_bias pushing every whitespace-only token down."""
    from hotspec.models.loader import load_tokenizer, resolve_model_path

    tok = load_tokenizer(resolve_model_path(None))  # the tiny model's tokenizer
    return {str(i): -100.0 for i in range(len(tok)) if (t := tok.decode([i])) and not t.strip()}


@pytest.fixture(scope="module")
def kw() -> dict[str, Any]:
    """What every chat request sends."""
    return dict(model=NAME, messages=MESSAGES, max_tokens=256, logit_bias=no_whitespace())
SAMPLING = [dict(temperature=0), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_p=0.9, seed=4)]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "tags"])
def test_json_schema_answers_validate(oa: openai.OpenAI, kw: dict[str, Any], schema: dict[str, Any]) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    for sampling in SAMPLING:
        r = oa.chat.completions.create(**kw, **sampling, response_format=fmt)  # type: ignore[call-overload]
        choice = r.choices[0]
        assert choice.finish_reason == "stop", (sampling, choice)  # the grammar completed
        assert valid(json.loads(choice.message.content or ""), schema), (sampling, choice.message.content)
    completion = oa.completions.create(model=NAME, prompt="JSON:", max_tokens=256, temperature=0,
                                       logit_bias=kw["logit_bias"], extra_body={"guided_json": schema})
    assert valid(json.loads(completion.choices[0].text), schema)
    streamed = oa.chat.completions.create(**kw, temperature=0, response_format=fmt, stream=True)  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    whole = oa.chat.completions.create(**kw, temperature=0, response_format=fmt)  # type: ignore[call-overload]
    assert text == whole.choices[0].message.content


def test_json_object_answers_are_objects(oa: openai.OpenAI, kw: dict[str, Any]) -> None:
    """Any JSON object: random weights may write one key forever, so an answer cut by max_tokens
    must be a prefix of one (a matcher of JSON takes its tokens), a finished one must parse."""
    import xgrammar

    from hotspec.models.loader import load_tokenizer, resolve_model_path
    from hotspec.runtime.grammar import GrammarCompiler
    from hotspec.sampling_params import GrammarSpec

    tok = load_tokenizer(resolve_model_path(None))
    compiled = GrammarCompiler(tok, 49152).compile(GrammarSpec("json_object"))
    for sampling in SAMPLING:
        r = oa.chat.completions.create(**dict(kw, max_tokens=96), **sampling,  # type: ignore[call-overload]
                                       response_format={"type": "json_object"})
        text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert finish == "length" and text.startswith("{"), (finish, text)
            matcher = xgrammar.GrammarMatcher(compiled)
            assert all(matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False)), text


def test_regex_and_ebnf_answers_match(oa: openai.OpenAI, kw: dict[str, Any]) -> None:
    for sampling in SAMPLING:
        r = oa.chat.completions.create(**kw, **sampling, extra_body={"guided_regex": r"[0-9]{3}-[a-z]{2,4}"})  # type: ignore[call-overload]
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", r.choices[0].message.content or ""), r.choices[0]
        r = oa.completions.create(model=NAME, prompt="Answer:", max_tokens=16, **sampling,
                                  logit_bias=kw["logit_bias"],
                                  extra_body={"guided_grammar": 'root ::= "yes" | "no" | "maybe"'})
        assert r.choices[0].text in ("yes", "no", "maybe") and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_are_parsed(oa: openai.OpenAI, kw: dict[str, Any], choice: Any) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    kw = dict(kw, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
              tool_choice=choice)
    for sampling in SAMPLING:
        r = oa.chat.completions.create(**kw, **sampling)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
        for call in c.message.tool_calls:
            name = call.function.name  # type: ignore[union-attr]
            assert name in schemas and valid(json.loads(call.function.arguments), schemas[name])  # type: ignore[union-attr]
        if isinstance(choice, dict):
            assert [t.function.name for t in c.message.tool_calls] == ["get_weather"]  # type: ignore[union-attr]
    whole = oa.chat.completions.create(**kw, temperature=0)
    chunks = list(oa.chat.completions.create(**kw, temperature=0, stream=True))
    streamed = [(d.function.name, d.function.arguments) for c in chunks if c.choices  # type: ignore[union-attr]
                for d in c.choices[0].delta.tool_calls or []]
    calls = whole.choices[0].message.tool_calls or []
    assert streamed == [(t.function.name, t.function.arguments) for t in calls]  # type: ignore[union-attr]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_greedy_speculative_equals_vanilla_under_a_grammar(vanilla: openai.OpenAI, speculative: openai.OpenAI,
                                                            kw: dict[str, Any]) -> None:
    requests: list[dict[str, Any]] = [
        dict(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[0]}}),
        dict(response_format={"type": "json_object"}),
        dict(extra_body={"guided_regex": r"[a-z ]{5,40}\."}),
        dict(messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS, tool_choice="required"),
    ]
    for extra in requests:
        request = dict(kw, temperature=0, logprobs=True, **extra)
        a, b = (oa.chat.completions.create(**request).choices[0] for oa in (vanilla, speculative))
        assert (a.message.content, a.finish_reason) == (b.message.content, b.finish_reason), extra
        assert [(t.function.name, t.function.arguments) for t in a.message.tool_calls or []] == \
            [(t.function.name, t.function.arguments) for t in b.message.tool_calls or []]  # type: ignore[union-attr]
        assert [t.token for t in a.logprobs.content] == [t.token for t in b.logprobs.content]  # type: ignore[union-attr]
