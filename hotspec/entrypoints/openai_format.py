"""OpenAI response bodies: completions, chat completions, their streamed chunks, model lists. A
choice's `logprobs` is null unless the request asked for them (a LogprobsFormat is given)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hotspec.entrypoints.logprobs_format import LogprobsFormat
from hotspec.entrypoints.request_handle import RequestEvent


@dataclass(frozen=True)
class Meta:
    id: str
    created: int
    model: str


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event; compact JSON never contains a raw newline, so one data line."""
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def usage(ev: RequestEvent) -> dict[str, int]:
    return {"prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens,
            "total_tokens": ev.prompt_tokens + ev.completion_tokens}


def model_list(name: str, max_model_len: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "hotspec", "max_model_len": max_model_len}]}


def text_of(events: Sequence[RequestEvent]) -> str:
    return "".join(e.text for e in events)


def logprobs_of(logprobs: LogprobsFormat | None, events: Sequence[RequestEvent],
                start: int = 0) -> dict[str, Any] | None:
    """The `logprobs` of a choice made of `events`: null when not asked for."""
    return None if logprobs is None else logprobs(events, start)


def completion(meta: Meta, events: Sequence[RequestEvent],
               logprobs: LogprobsFormat | None = None) -> dict[str, Any]:
    """The whole answer to /v1/completions, from all of the request's events."""
    last = events[-1]
    return {"id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "text": text_of(events),
                         "logprobs": logprobs_of(logprobs, events),
                         "finish_reason": last.finish_reason}],
            "usage": usage(last)}


def chat_completion(meta: Meta, events: Sequence[RequestEvent],
                    logprobs: LogprobsFormat | None = None) -> dict[str, Any]:
    """The whole answer to /v1/chat/completions, from all of the request's events."""
    last = events[-1]
    return {"id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text_of(events)},
                         "logprobs": logprobs_of(logprobs, events),
                         "finish_reason": last.finish_reason}],
            "usage": usage(last)}


class ChunkWriter(Protocol):
    def start(self) -> list[dict[str, Any]]: ...

    def step(self, batch: Sequence[RequestEvent]) -> list[dict[str, Any]]: ...


class _Chunks:
    """Chunks share id/created/model; a chunk goes out when there is text, when the request
    finished (the finish reason rides on the last chunk), or, with logprobs, when there are
    tokens (each chunk carries the logprobs of its own tokens: every token's exactly once); with
    include_usage, every chunk carries `usage: null` and one more chunk with no choices carries
    the counts (OpenAI's convention)."""

    object = ""

    def __init__(self, meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None) -> None:
        self.meta, self.include_usage, self.logprobs = meta, include_usage, logprobs
        self.sent_chars = 0  # of the choice's text, in chunks so far (completions' text_offset)

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {"id": self.meta.id, "object": self.object, "created": self.meta.created,
               "model": self.meta.model, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def _choice(self, text: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> list[dict[str, Any]]:
        return []

    def step(self, batch: Sequence[RequestEvent]) -> list[dict[str, Any]]:
        """The chunks for a batch of events that arrived together."""
        out = []
        text, last = text_of(batch), batch[-1]
        tokens = self.logprobs is not None and any(e.token_ids for e in batch)
        if text or tokens or last.finish_reason is not None:
            logprobs = logprobs_of(self.logprobs, batch, self.sent_chars)
            out.append(self._chunk(self._choice(text, logprobs, last.finish_reason)))
            self.sent_chars += len(text)
        if last.finish_reason is not None and self.include_usage:
            out.append({"id": self.meta.id, "object": self.object, "created": self.meta.created,
                        "model": self.meta.model, "choices": [], "usage": usage(last)})
        return out


class _CompletionChunks(_Chunks):
    object = "text_completion"

    def _choice(self, text: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


class _ChatChunks(_Chunks):
    object = "chat.completion.chunk"

    def start(self) -> list[dict[str, Any]]:
        return [self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None})]

    def _choice(self, text: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_chunks(meta: Meta, include_usage: bool,
                      logprobs: LogprobsFormat | None = None) -> ChunkWriter:
    return _CompletionChunks(meta, include_usage, logprobs)


def chat_chunks(meta: Meta, include_usage: bool, logprobs: LogprobsFormat | None = None) -> ChunkWriter:
    return _ChatChunks(meta, include_usage, logprobs)
