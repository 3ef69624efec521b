"""Tool calls read back from generated text, Hermes / Qwen2.5 style: each
`<tool_call>{"name": "...", "arguments": {...}}</tool_call>` (whitespace around the JSON allowed)
is a call; a block whose JSON is not such an object, or that never closes, stays text.

One parser serves whole and streamed answers: ToolCallParser takes the text in pieces and gives
back content pieces (str) and calls (ParsedCall) as soon as they are certain. It holds back only
what may still become part of a call: text that may be the start of `<tool_call>`, the whitespace
before it, and an open block until its `</tool_call>`. The whitespace right before a call, and
the whitespace that ends the text after the last call, are dropped (the template's separators,
not content). Any split of the same text gives the same pieces once adjacent content is joined;
`parse_tool_calls` is the whole-text form.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from hotspec.entrypoints.tool_request import CALL_BEGIN, CALL_END


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = field(default_factory=_call_id)

    def as_dict(self) -> dict[str, Any]:
        """The call as a message's `tool_calls` entry."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


Piece = str | ParsedCall


def read_call(block: str) -> ParsedCall | None:
    """The call a block's JSON holds (between the tags), or None: not an object with a string
    `name` and an object `arguments`."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
            and isinstance(obj.get("arguments"), dict)):
        return None
    return ParsedCall(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False))


def _partial_begin(text: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of CALL_BEGIN."""
    for k in range(min(len(CALL_BEGIN) - 1, len(text)), 0, -1):
        if text.endswith(CALL_BEGIN[:k]):
            return k
    return 0


class ToolCallParser:
    """Feed text as it arrives; see the module doc."""

    def __init__(self) -> None:
        self.buf = ""  # text not given back yet
        self.gap = ""  # whitespace before the open block: dropped if it is a call
        self.in_call = False  # buf starts inside a block (after its CALL_BEGIN)
        self.after_call = False  # no text given back since the last call
        self.calls = 0  # calls given back so far

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while True:
            if self.in_call:
                end = self.buf.find(CALL_END)
                if end < 0:
                    return out
                block, self.buf, self.in_call = self.buf[:end], self.buf[end + len(CALL_END):], False
                call = read_call(block)
                if call is None:
                    out.append(self.gap + CALL_BEGIN + block + CALL_END)
                    self.after_call = False
                else:
                    out.append(call)
                    self.calls += 1
                    self.after_call = True
                self.gap = ""
                continue
            start = self.buf.find(CALL_BEGIN)
            if start >= 0:
                before = self.buf[:start]
                text_part = before.rstrip()
                self.gap = before[len(text_part):]
                self.buf, self.in_call = self.buf[start + len(CALL_BEGIN):], True
                if text_part:
                    out.append(text_part)
                    self.after_call = False
                continue
            cut = len(self.buf) - _partial_begin(self.buf)
            while cut > 0 and self.buf[cut - 1].isspace():
                cut -= 1
            if cut:
                out.append(self.buf[:cut])
                self.buf, self.after_call = self.buf[cut:], False
            return out

    def finish(self) -> list[Piece]:
        """The text held back at the end (an unclosed block is text)."""
        rest = (self.gap + CALL_BEGIN + self.buf) if self.in_call else self.buf
        if self.after_call and rest.isspace():
            rest = ""
        self.buf, self.gap, self.in_call = "", "", False
        return [rest] if rest else []


def split_pieces(pieces: list[Piece]) -> tuple[str, list[ParsedCall]]:
    """(the content pieces joined, the calls)."""
    return ("".join(p for p in pieces if isinstance(p, str)),
            [p for p in pieces if isinstance(p, ParsedCall)])


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content: the text outside calls, None when empty; the calls in order)."""
    parser = ToolCallParser()
    content, calls = split_pieces(parser.feed(text) + parser.finish())
    return content or None, calls


def chat_message(text: str, finish_reason: str | None,
                 tools: bool) -> tuple[dict[str, Any], str | None]:
    """A whole chat answer's message and finish reason: with `tools`, its calls parsed into
    `tool_calls` (the content null when nothing else is left) and the finish reason
    `tool_calls` when there are any."""
    if not tools:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = parse_tool_calls(text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if not calls:
        return message, finish_reason
    message["tool_calls"] = [c.as_dict() for c in calls]
    return message, "tool_calls"
