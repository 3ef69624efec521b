"""Tool calls read back from generated text (hotspec/entrypoints/tool_parser.py): calls with text
before, between and after them, blocks that are not calls left as text, and the streaming parser
fed the same text split at every character boundary giving what the whole text gives."""

from __future__ import annotations

import json

import pytest

from hotspec.entrypoints.tool_parser import (
    ParsedCall,
    Piece,
    ToolCallParser,
    chat_message,
    parse_tool_calls,
    read_call,
    split_pieces,
)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
BAD_JSON = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'
NOT_A_CALL = '<tool_call>\n["get_weather"]\n</tool_call>'
STRING_ARGS = '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>'
CUT = '<tool_call>\n{"name": "cut'


def calls_of(text: str) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parse_tool_calls(text)[1]]


CASES: list[tuple[str, str | None, list[tuple[str, dict]]]] = [  # (text, content, calls)
    ("Hello there.", "Hello there.", []),
    ("", None, []),
    (WEATHER, None, [("get_weather", {"city": "Paris", "days": 3})]),
    (WEATHER + "\n" + TIME, None, [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    ("Let me check.\n" + WEATHER, "Let me check.", [("get_weather", {"city": "Paris", "days": 3})]),
    (WEATHER + "\nDone.", "\nDone.", [("get_weather", {"city": "Paris", "days": 3})]),
    ("A " + TIME + " B " + TIME + " C", "A B C", [("get_time", {}), ("get_time", {})]),
    (TIME + "\n", None, [("get_time", {})]),  # the whitespace that ends the text after a call
    ('<tool_call>{"name":"f","arguments":{"x":[1,{"y":"</"}]}}</tool_call>', None,
     [("f", {"x": [1, {"y": "</"}]})]),
    (BAD_JSON, BAD_JSON, []),  # malformed JSON: left as content
    ("Hi\n" + BAD_JSON + "\n" + TIME, "Hi\n" + BAD_JSON, [("get_time", {})]),
    (NOT_A_CALL, NOT_A_CALL, []),  # JSON, but not {"name", "arguments"}
    (STRING_ARGS, STRING_ARGS, []),  # arguments must be an object
    (TIME + "\n" + CUT, "\n" + CUT, [("get_time", {})]),  # an unclosed block: text
    ("a <tool_c", "a <tool_c", []),  # a partial tag at the end is text
    ("x < y and <tool> is not <tool_call", "x < y and <tool> is not <tool_call", []),
    ("  padded  ", "  padded  ", []),
]


@pytest.mark.parametrize("text,content,calls", CASES, ids=[str(i) for i in range(len(CASES))])
def test_whole_text(text: str, content: str | None, calls: list[tuple[str, dict]]) -> None:
    got_content, got_calls = parse_tool_calls(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


def test_a_call_has_an_id_and_the_api_shape() -> None:
    _, [a, b] = parse_tool_calls(WEATHER + TIME)
    assert a.id.startswith("call_") and len(a.id) > 10 and a.id != b.id
    assert a.as_dict() == {"id": a.id, "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}
    call = read_call('{"name": "f", "arguments": {"s": "é"}}')
    assert call is not None and (call.name, call.arguments) == ("f", '{"s": "é"}')  # not \u-escaped
    assert read_call("{}") is None and read_call("nope") is None


def streamed(text: str, cuts: list[int]) -> tuple[str, list[ParsedCall]]:
    parser, pieces = ToolCallParser(), []
    bounds = [0, *cuts, len(text)]
    for lo, hi in zip(bounds, bounds[1:]):
        pieces += parser.feed(text[lo:hi])
    pieces += parser.finish()
    return split_pieces(pieces)


def key(result: tuple[str | None, list[ParsedCall]]) -> tuple[str, list[tuple[str, str]]]:
    return result[0] or "", [(c.name, c.arguments) for c in result[1]]


@pytest.mark.parametrize("text", [c[0] for c in CASES], ids=[str(i) for i in range(len(CASES))])
def test_every_split_gives_the_whole_result(text: str) -> None:
    whole = key(parse_tool_calls(text))
    for cut in range(1, len(text)):
        assert key(streamed(text, [cut])) == whole, cut
    assert key(streamed(text, list(range(1, len(text))))) == whole  # one character at a time


def test_streaming_holds_back_only_what_may_be_a_call() -> None:
    parser = ToolCallParser()
    assert parser.feed("Sure") == ["Sure"]
    assert parser.feed(", one moment \n<tool") == [", one moment"]  # the gap and the partial tag wait
    assert parser.feed('_call>\n{"name": "get_time", ') == []  # inside a block: nothing yet
    out: list[Piece] = parser.feed('"arguments": {}}\n</tool_call>\n')
    assert [(c.name, c.arguments) for c in out if isinstance(c, ParsedCall)] == [("get_time", "{}")]
    assert len(out) == 1 and parser.calls == 1  # the gap before the call: dropped
    assert parser.feed("\n") == [] and parser.feed("OK \n") == ["\n\nOK"]  # text after a call
    assert parser.finish() == [" \n"]  # text's own trailing whitespace stays
    parser = ToolCallParser()
    assert len(parser.feed(TIME + "\n\n")) == 1 and parser.finish() == []  # the last call's separator


def test_chat_message() -> None:
    assert chat_message("plain", "stop", tools=False) == ({"role": "assistant", "content": "plain"}, "stop")
    assert chat_message("", "length", tools=False)[0]["content"] == ""  # no tools: text as it is
    assert chat_message("plain", "stop", tools=True) == ({"role": "assistant", "content": "plain"}, "stop")
    message, finish = chat_message("Checking.\n" + WEATHER, "stop", tools=True)
    assert finish == "tool_calls" and message["content"] == "Checking."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    message, finish = chat_message(TIME, "stop", tools=True)
    assert message["content"] is None and finish == "tool_calls"
    assert chat_message(BAD_JSON, "length", tools=True) == (
        {"role": "assistant", "content": BAD_JSON}, "length")
