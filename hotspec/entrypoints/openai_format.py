"""OpenAI response bodies: completions, chat completions, their streamed chunks, model lists. A
choice's `logprobs` is null unless the request asked for them (a LogprobsFormat is given). With
completions' `echo` (an Echo is given), a choice's text and logprobs start with the prompt's. With
`n`, an answer has n choices (index 0..n-1), one engine request's events each; `usage` counts the
prompt once and sums the choices' completion tokens. A chat answer to a request with tools has
its tool calls parsed out of the text (tool_parser.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hotspec.core.logprobs import TokenLogprob
from hotspec.entrypoints.logprobs_format import LogprobsFormat, joined
from hotspec.entrypoints.request_handle import RequestEvent
from hotspec.entrypoints.tool_parser import ToolCallParser, chat_message, split_pieces

PromptLogprobsFormat = Callable[[list[TokenLogprob | None] | None], dict[str, Any]]


@dataclass(frozen=True)
class Meta:
    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Echo:
    """Completions' `echo`: the prompt's `text` comes first in the choice; `logprobs` (with the
    request's logprobs) writes the prompt's part of them from the first event's prompt_logprobs."""

    text: str
    logprobs: PromptLogprobsFormat | None = None

    def head(self, first: RequestEvent) -> tuple[str, dict[str, Any] | None]:
        """The prompt's text and logprobs part (None: not asked for), given the first event."""
        return self.text, None if self.logprobs is None else self.logprobs(first.prompt_logprobs)


_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # (one, not one a chunk)


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event; compact JSON never contains a raw newline, so one data line."""
    return f"data: {_COMPACT.encode(obj)}\n\n"


def usage(*lasts: RequestEvent) -> dict[str, int]:
    """The counts of an answer, from each choice's last event: the prompt once, every choice's
    completion tokens."""
    prompt, completion = lasts[0].prompt_tokens, sum(e.completion_tokens for e in lasts)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def model_list(name: str, max_model_len: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "hotspec", "max_model_len": max_model_len}]}


def text_of(events: Sequence[RequestEvent]) -> str:
    return "".join(e.text for e in events)


def logprobs_of(logprobs: LogprobsFormat | None, events: Sequence[RequestEvent],
                start: int = 0) -> dict[str, Any] | None:
    """The `logprobs` of a choice made of `events`: null when not asked for."""
    return None if logprobs is None else logprobs(events, start)


def _answer(meta: Meta, obj: str, choices: list[dict[str, Any]],
            events: Sequence[Sequence[RequestEvent]]) -> dict[str, Any]:
    return {"id": meta.id, "object": obj, "created": meta.created, "model": meta.model,
            "choices": choices, "usage": usage(*(e[-1] for e in events))}


def completion_choices(meta: Meta, events: Sequence[Sequence[RequestEvent]],
                       logprobs: LogprobsFormat | None = None, echo: Echo | None = None) -> dict[str, Any]:
    """The whole answer to /v1/completions, from all of each choice's events (choice i's are
    `events[i]`)."""
    choices = []
    for i, evs in enumerate(events):
        head, head_logprobs = ("", None) if echo is None else echo.head(evs[0])
        choices.append({"index": i, "text": head + text_of(evs),
                        "logprobs": joined(head_logprobs, logprobs_of(logprobs, evs, len(head))),
                        "finish_reason": evs[-1].finish_reason})
    return _answer(meta, "text_completion", choices, events)


def completion(meta: Meta, events: Sequence[RequestEvent], logprobs: LogprobsFormat | None = None,
               echo: Echo | None = None) -> dict[str, Any]:
    """The whole answer to /v1/completions with one choice, from all of its events."""
    return completion_choices(meta, [events], logprobs, echo)


def chat_completion_choices(meta: Meta, events: Sequence[Sequence[RequestEvent]],
                            logprobs: LogprobsFormat | None = None, tools: bool = False) -> dict[str, Any]:
    """The whole answer to /v1/chat/completions, from all of each choice's events; with `tools`,
    each message's tool calls parsed (tool_parser.chat_message)."""
    choices = []
    for i, evs in enumerate(events):
        message, finish_reason = chat_message(text_of(evs), evs[-1].finish_reason, tools)
        choices.append({"index": i, "message": message, "logprobs": logprobs_of(logprobs, evs),
                        "finish_reason": finish_reason})
    return _answer(meta, "chat.completion", choices, events)


def chat_completion(meta: Meta, events: Sequence[RequestEvent],
                    logprobs: LogprobsFormat | None = None) -> dict[str, Any]:
    """The whole answer to /v1/chat/completions with one choice, from all of its events."""
    return chat_completion_choices(meta, [events], logprobs)


class ChunkWriter(Protocol):
    """The chunks of a streamed answer: `start`'s first, then `step`'s for each batch of events of
    choice `index` as it arrives."""

    def start(self) -> list[dict[str, Any]]: ...

    def step(self, batch: Sequence[RequestEvent], index: int = 0) -> list[dict[str, Any]]: ...


class _Chunks:
    """One choice's chunks. Chunks share id/created/model; a chunk goes out when there is text,
    when the request finished (the finish reason rides on the last chunk), or, with logprobs, when
    there are tokens (each chunk carries the logprobs of its own tokens: every token's exactly
    once); with include_usage, every chunk carries `usage: null` (OpenAI's convention)."""

    object = ""

    def __init__(self, meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None,
                 index: int = 0) -> None:
        self.meta, self.include_usage, self.logprobs, self.index = meta, include_usage, logprobs, index
        self.sent_chars = 0  # of the choice's text, in chunks so far (completions' text_offset)
        self.first = True  # no batch stepped yet

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {"id": self.meta.id, "object": self.object, "created": self.meta.created,
               "model": self.meta.model, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, lasts: Sequence[RequestEvent]) -> dict[str, Any]:
        """The chunk with no choices that carries the answer's counts."""
        return {"id": self.meta.id, "object": self.object, "created": self.meta.created,
                "model": self.meta.model, "choices": [], "usage": usage(*lasts)}

    def _choice(self, text: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> list[dict[str, Any]]:
        return []

    def head(self, first: RequestEvent) -> tuple[str, dict[str, Any] | None]:
        """Text and logprobs before the first batch's own: none here."""
        return "", None

    def step(self, batch: Sequence[RequestEvent]) -> list[dict[str, Any]]:
        """The chunks for a batch of events that arrived together."""
        head, head_logprobs = self.head(batch[0]) if self.first else ("", None)
        self.first = False
        text, last = head + text_of(batch), batch[-1]
        tokens = self.logprobs is not None and (head_logprobs is not None
                                                or any(e.token_ids for e in batch))
        if not (text or tokens or last.finish_reason is not None):
            return []
        tail = logprobs_of(self.logprobs, batch, self.sent_chars + len(head))
        self.sent_chars += len(text)
        return [self._chunk(self._choice(text, joined(head_logprobs, tail), last.finish_reason))]


class _CompletionChunks(_Chunks):
    object = "text_completion"

    def __init__(self, meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None,
                 echo: Echo | None = None, index: int = 0) -> None:
        super().__init__(meta, include_usage, logprobs, index)
        self.echo = echo

    def head(self, first: RequestEvent) -> tuple[str, dict[str, Any] | None]:
        """The prompt's text and logprobs with echo."""
        return ("", None) if self.echo is None else self.echo.head(first)

    def _choice(self, text: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None) -> dict[str, Any]:
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


class _ChatChunks(_Chunks):
    object = "chat.completion.chunk"

    def start(self) -> list[dict[str, Any]]:
        return [self._chunk({"index": self.index, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None})]

    def _choice(self, text: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        return {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


class _ToolChatChunks(_ChatChunks):
    """Chat chunks whose text goes through a ToolCallParser: content as it is certain, each call
    in one delta of `tool_calls` once its block closes (index, id, type, name and arguments), the
    finish reason `tool_calls` when there were any."""

    def __init__(self, meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None,
                 index: int = 0) -> None:
        super().__init__(meta, include_usage, logprobs, index)
        self.parser = ToolCallParser()

    def step(self, batch: Sequence[RequestEvent]) -> list[dict[str, Any]]:
        last, first_call = batch[-1], self.parser.calls
        pieces = self.parser.feed(text_of(batch))
        if last.finish_reason is not None:
            pieces += self.parser.finish()
        content, calls = split_pieces(pieces)
        delta: dict[str, Any] = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [{"index": first_call + k, **c.as_dict()} for k, c in enumerate(calls)]
        finish = last.finish_reason
        if finish is not None and self.parser.calls:
            finish = "tool_calls"
        tokens = self.logprobs is not None and any(e.token_ids for e in batch)
        if not (delta or tokens or finish is not None):
            return []
        return [self._chunk({"index": self.index, "delta": delta,
                             "logprobs": logprobs_of(self.logprobs, batch), "finish_reason": finish})]


class _Choices:
    """The chunks of n choices streamed together (they interleave, each with its `index`): each
    choice's own writer, and with include_usage one more chunk with no choices and the answer's
    counts once every choice finished."""

    def __init__(self, writers: Sequence[_Chunks]) -> None:
        self.writers = writers
        self.lasts: dict[int, RequestEvent] = {}  # index -> the choice's final event

    def start(self) -> list[dict[str, Any]]:
        return [chunk for w in self.writers for chunk in w.start()]

    def step(self, batch: Sequence[RequestEvent], index: int = 0) -> list[dict[str, Any]]:
        writer = self.writers[index]
        out = writer.step(batch)
        if batch[-1].finish_reason is not None:
            self.lasts[index] = batch[-1]
            if writer.include_usage and len(self.lasts) == len(self.writers):
                out.append(writer.usage_chunk([self.lasts[i] for i in range(len(self.writers))]))
        return out


def completion_chunks(meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None,
                      echo: Echo | None = None, *, n: int = 1) -> ChunkWriter:
    """The chunks of a streamed /v1/completions answer with n choices."""
    return _Choices([_CompletionChunks(meta, include_usage, logprobs, echo, i) for i in range(n)])


def chat_chunks(meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None, *,
                n: int = 1, tools: bool = False) -> ChunkWriter:
    """The chunks of a streamed /v1/chat/completions answer with n choices; with `tools`, the
    tool calls parsed out of the text."""
    writer = _ToolChatChunks if tools else _ChatChunks
    return _Choices([writer(meta, include_usage, logprobs, i) for i in range(n)])
