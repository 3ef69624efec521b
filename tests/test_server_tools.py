"""Tool calling's request and response sides (chat): `tools`, `tool_choice`, `parallel_tool_calls`
and the messages that carry earlier calls, rendered with a chat template that defines tool calls
(Qwen2.5's, given to a tiny random model); the grammar tool_choice required or named sets (a
GrammarMatcher takes a valid call's tokens and refuses invalid ones); the 400s (a template without
tools, a tool_choice that fits no tool, two grammars); and the answer's `tool_calls`, whole and
streamed, built from given text (the random model's own text is no call) and read back by the
`openai` client's types."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from engine_utils import save_tiny_chat_llama, save_tiny_llama
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from test_server_logprobs import META
from test_server_structured import Recorder, recorded_server

from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.protocol import ChatCompletionRequest
from hotspec.entrypoints.request_handle import RequestEvent
from hotspec.models.loader import load_tokenizer
from hotspec.runtime.grammar import GrammarCompiler
from hotspec.sampling_params import GrammarSpec

pytestmark = pytest.mark.usefixtures("one_thread")

# Qwen2.5-Instruct's chat template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct)
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501

NAME = "tiny"
CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: any object
TOOLS = [WEATHER, TIME]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


CONTEXT = 1024  # the tools' system prompt alone is ~200 tokens


def save_qwen_chat_llama(path: Path, layers: int = 2) -> Path:
    """The tiny chat model (engine_utils.save_tiny_chat_llama, with `layers` layers) with Qwen2.5's
    chat template and a context of CONTEXT tokens."""
    save_tiny_chat_llama(path)
    if layers != 2:
        eos = json.loads((path / "config.json").read_text())["eos_token_id"]
        save_tiny_llama(path, vocab=49152, hidden=64, layers=layers, std=0.3, eos_token_id=eos,
                        tie_word_embeddings=True)
    tok = load_tokenizer(path)
    tok.chat_template = QWEN25_TEMPLATE
    tok.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return path


def body(**extra: Any) -> dict[str, Any]:
    return {"model": NAME, "max_tokens": 2, "temperature": 0, "messages": MESSAGES, **extra}


# ---------------------------------------------------------------- the request fields


def request(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(body(**extra))


def test_tool_choice_defaults_and_which_answers_are_parsed() -> None:
    assert request().effective_tool_choice == "none" and not request().parses_tool_calls
    assert request(tools=[]).template_tools() is None and not request(tools=[]).parses_tool_calls
    assert request(tools=TOOLS).effective_tool_choice == "auto" and request(tools=TOOLS).parses_tool_calls
    assert not request(tools=TOOLS, tool_choice="none").parses_tool_calls
    assert request(tools=TOOLS).template_tools() == TOOLS  # as sent (strict/None fields dropped)
    for choice in ("auto", "none"):  # neither constrains the output
        fields = dict(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
        assert request(**fields).sampling_params(8).grammar is None


def test_earlier_calls_reach_the_template_with_object_arguments() -> None:
    message = request(messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"type": "function", "function": {"name": "g", "arguments": "not json"}}]}]).messages[0]
    assert message.as_template_input() == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
        {"type": "function", "function": {"name": "g", "arguments": "not json"}}]}
    tool = request(messages=[{"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]).messages[0]
    assert tool.as_template_input() == {"role": "tool", "content": "22 C", "tool_call_id": "call_1"}


# ---------------------------------------------------------------- the grammar of required / named


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_qwen_chat_llama(tmp_path_factory.mktemp("tools") / "qwen")


@pytest.fixture(scope="module")
def tok(model: Path) -> Any:
    return load_tokenizer(model)


@pytest.fixture(scope="module")
def compiler(tok: Any) -> GrammarCompiler:
    return GrammarCompiler(tok, 49152)


def matches(compiler: GrammarCompiler, tok: Any, spec: GrammarSpec, text: str) -> bool:
    """Whether a GrammarMatcher takes `text`'s tokens and then the end of the output."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(compiler.compile(spec))
    return all(matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) \
        and matcher.accept_token(tok.eos_token_id) and matcher.is_terminated()


def call(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


NO_CITY, BAD_DAYS = call("get_weather", {"days": 2}), call("get_weather", {"city": "Paris", "days": "two"})
UNKNOWN, TEXT = call("get_news", {}), "It is sunny in Paris."
GRAMMARS: list[tuple[dict[str, Any], str, dict[str, bool]]] = [  # (fields, GrammarSpec.field, {text: ok})
    ({"tool_choice": "required"}, "tools", {
        WEATHER_CALL: True, TIME_CALL: True, WEATHER_CALL + "\n" + TIME_CALL + "\n" + TIME_CALL: True,
        call("get_weather", {"city": "Oslo"}): True, TEXT: False, "": False, WEATHER_CALL + TEXT: False,
        TEXT + WEATHER_CALL: False, NO_CITY: False, BAD_DAYS: False, UNKNOWN: False}),
    ({"tool_choice": "required", "parallel_tool_calls": False}, "tools", {
        WEATHER_CALL: True, TIME_CALL: True, WEATHER_CALL + "\n" + TIME_CALL: False, TEXT: False,
        NO_CITY: False}),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tools.0.function.parameters", {
        WEATHER_CALL: True, TIME_CALL: False, WEATHER_CALL + "\n" + WEATHER_CALL: False, TEXT: False,
        BAD_DAYS: False}),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tools.1.function.parameters", {
        TIME_CALL: True, call("get_time", {"tz": "UTC"}): True, WEATHER_CALL: False,
        '<tool_call>\n{"name": "get_time", "arguments": []}\n</tool_call>': False}),
]


@pytest.mark.parametrize("fields,field,texts", GRAMMARS, ids=[str(i) for i in range(len(GRAMMARS))])
def test_required_and_named_choices_constrain_the_output_to_calls(
        compiler: GrammarCompiler, tok: Any, fields: dict[str, Any], field: str,
        texts: dict[str, bool]) -> None:
    spec = request(tools=TOOLS, **fields).sampling_params(64).grammar
    assert spec is not None and (spec.kind, spec.field) == ("structural_tag", field)
    assert {text: matches(compiler, tok, spec, text) for text in texts} == texts


# ---------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[tuple[str, Recorder]]:
    yield from recorded_server(model, max_model_len=CONTEXT, num_kv_blocks=2 * CONTEXT // 8)


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Recorder]]:
    """The same tiny model with the default model's (SmolLM2's) template, which has no tools."""
    yield from recorded_server(save_tiny_chat_llama(tmp_path_factory.mktemp("smol") / "tiny"))


def prompt_of(recorder: Recorder, tok: Any) -> str:
    return str(tok.decode(recorder.seen[-1][0]))


def test_tools_and_earlier_calls_are_rendered_by_the_template(server: tuple[str, Recorder], tok: Any) -> None:
    url, recorder = server
    r = httpx.post(url + CHAT, json=body(tools=TOOLS), timeout=60)
    assert r.status_code == 200, r.text
    want = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert recorder.seen[-1][0] == tok.encode(want, add_special_tokens=False)  # as LLM.chat renders
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "The ' \
        'weather in a city", "parameters": ' in prompt_of(recorder, tok)
    earlier = {"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turns = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [earlier]},
             {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
    assert httpx.post(url + CHAT, json=body(tools=TOOLS, messages=turns), timeout=60).status_code == 200
    assert prompt_of(recorder, tok).endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert httpx.post(url + CHAT, json=body(tools=TOOLS, tool_choice="none"), timeout=60).status_code == 200
    assert "<tools>" in prompt_of(recorder, tok)  # none: the tools are context still (as vLLM)


def test_the_tool_grammar_reaches_the_engine(server: tuple[str, Recorder]) -> None:
    url, recorder = server
    for fields, _, _ in GRAMMARS:
        r = httpx.post(url + CHAT, json=body(tools=TOOLS, **fields), timeout=60)
        assert r.status_code == 200, r.text
        assert recorder.seen[-1][1].grammar == request(tools=TOOLS, **fields).sampling_params(64).grammar
    for choice in ("auto", "none"):
        r = httpx.post(url + CHAT, json=body(tools=TOOLS, tool_choice=choice), timeout=60)
        assert r.status_code == 200 and recorder.seen[-1][1].grammar is None, r.text


REFUSED: list[tuple[dict[str, Any], str | None, str]] = [  # (fields, param, message pattern)
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice",
     r"^tool_choice names the function 'get_news', which is not in tools \('get_weather', 'get_time'\)$"),
    ({"tool_choice": "required"}, "tool_choice", r"^tool_choice 'required' needs tools"),
    ({"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
     r"^tool_choice function 'f' needs tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools",
     r"^response_format and tools each constrain the output; send at most one of them$"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
      "tool_choice": "required"}, "tools", r"^tools: invalid structural tag: .*Type should be a string"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools.0.function.parameters",
     r"^tools\.0\.function\.parameters: invalid structural tag"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice.literal['none','auto','required']",
     r"Input should be 'none', 'auto' or 'required'"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type", r"Input should be 'function'"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name",
     r"Field required"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", r"valid boolean"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": {"a": 1}}}]}]}, "messages.0.tool_calls.0.function.arguments",
     r"Input should be a valid string"),  # OpenAI's arguments are JSON text
]


@pytest.mark.parametrize("fields,param,pattern", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_refused_tool_fields(server: tuple[str, Recorder], fields: dict[str, Any], param: str | None,
                             pattern: str) -> None:
    r = httpx.post(server[0] + CHAT, json=body(**fields), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and re.search(pattern, err["message"]), err


def test_a_template_without_tools_refuses_them(smol_server: tuple[str, Recorder]) -> None:
    url, recorder = smol_server
    before = len(recorder.seen)
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}):
        r = httpx.post(url + CHAT, json=body(tools=TOOLS, tool_choice=choice), timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tools" and err["message"].startswith(
            "this model's chat template does not support tools"), err
    assert len(recorder.seen) == before
    for fields in ({"tools": TOOLS, "tool_choice": "none"}, {"tools": []}, {}):  # nothing to render
        assert httpx.post(url + CHAT, json=body(**fields), timeout=60).status_code == 200
        assert recorder.seen[-1][1].grammar is None


def test_the_openai_client_reads_answers_with_tools(server: tuple[str, Recorder]) -> None:
    """The random model writes no call: content, no tool_calls; streamed the same."""
    oa = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=120)
    kw: dict[str, Any] = dict(model=NAME, messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0)
    whole = oa.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    chunks = list(oa.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (choice.message.content or "")


# ---------------------------------------------------------------- the answer's tool_calls


ANSWER = "Let me check.\n" + WEATHER_CALL + "\n" + TIME_CALL


def events(*texts: str, finish: str = "stop") -> list[RequestEvent]:
    out = [RequestEvent(t, [1]) for t in texts]
    out[-1].finish_reason = finish
    for e in out:
        e.prompt_tokens, e.completion_tokens = 3, len(out)
    return out


def test_a_whole_answer_has_its_calls_parsed() -> None:
    answer = ChatCompletion.model_validate(fmt.chat_completion_choices(META, [events(ANSWER)], tools=True))
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        ("function", "get_weather", {"city": "Paris", "days": 2}), ("function", "get_time", {})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    plain = fmt.chat_completion_choices(META, [events(ANSWER)])["choices"][0]  # no tools: text as is
    assert plain["message"] == {"role": "assistant", "content": ANSWER} and plain["finish_reason"] == "stop"
    only = fmt.chat_completion_choices(META, [events(WEATHER_CALL)], tools=True)["choices"][0]["message"]
    assert only["content"] is None and len(only["tool_calls"]) == 1


def streamed(pieces: list[str], logprobs: Any = None) -> list[ChatCompletionChunk]:
    writer = fmt.chat_chunks(META, False, logprobs, tools=True)
    out = writer.start() + [c for e in events(*pieces) for c in writer.step([e])]
    return [ChatCompletionChunk.model_validate(c) for c in out]


def accumulate(chunks: list[ChatCompletionChunk]) -> tuple[str, list[tuple[int, str, dict]], str | None]:
    """What a client assembles: the content, the calls by index (name, arguments), the finish."""
    content, calls = "", {}  # type: ignore[var-annotated]
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""  # type: ignore[union-attr]
            entry["arguments"] += tc.function.arguments or ""  # type: ignore[union-attr]
    return content, [(i, c["name"], json.loads(c["arguments"])) for i, c in sorted(calls.items())], \
        chunks[-1].choices[0].finish_reason


def test_a_streamed_answer_gives_the_same_calls_for_any_split() -> None:
    calls = [(0, "get_weather", {"city": "Paris", "days": 2}), (1, "get_time", {})]
    want = ("Let me check.", calls, "tool_calls")
    for cut in range(1, len(ANSWER)):
        assert accumulate(streamed([ANSWER[:cut], ANSWER[cut:]])) == want, cut
    chunks = streamed(list(ANSWER))  # a character at a time
    assert accumulate(chunks) == want
    first = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]  # type: ignore[index]
    assert [(tc.index, tc.type, tc.id is not None and tc.id.startswith("call_")) for tc in first] == [
        (0, "function", True), (1, "function", True)]  # each call whole in one delta
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1
    text_only = streamed(["Sure, ", "<tool", " is a word"])  # a partial tag that is text after all
    assert accumulate(text_only) == ("Sure, <tool is a word", [], "stop")


def test_streamed_tool_chunks_carry_every_tokens_logprobs() -> None:
    from hotspec.core.logprobs import TokenLogprob
    from hotspec.entrypoints.logprobs_format import ChatLogprobs

    lp = ChatLogprobs(lambda i: f"t{i}", 0)
    pieces = ["Hi ", "<tool_", "call>", '{"name": "f", "arguments": {}}', "</tool_call>"]
    writer = fmt.chat_chunks(META, False, lp, tools=True)
    evs = events(*pieces)
    for i, e in enumerate(evs):
        e.token_ids, e.logprobs = [i], [TokenLogprob(i, -1.0, ())]
    chunks = [c for e in evs for c in writer.step([e])]
    assert len(chunks) == len(pieces)  # text held back: the chunk still carries its token's logprob
    assert [t["token"] for c in chunks for t in c["choices"][0]["logprobs"]["content"]] == [
        f"t{i}" for i in range(len(pieces))]
