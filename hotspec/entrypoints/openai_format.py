"""OpenAI response bodies: completions, chat completions, their streamed chunks, model lists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

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


def completion(meta: Meta, text: str, last: RequestEvent) -> dict[str, Any]:
    return {"id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": last.finish_reason}],
            "usage": usage(last)}


def chat_completion(meta: Meta, text: str, last: RequestEvent) -> dict[str, Any]:
    return {"id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": last.finish_reason}],
            "usage": usage(last)}


class ChunkWriter(Protocol):
    def start(self) -> list[dict[str, Any]]: ...

    def step(self, text: str, last: RequestEvent) -> list[dict[str, Any]]: ...


class _Chunks:
    """Chunks share id/created/model; a chunk goes out when there is text or the request finished
    (the finish reason rides on the last chunk); with include_usage, every chunk carries
    `usage: null` and one more chunk with no choices carries the counts (OpenAI's convention)."""

    object = ""

    def __init__(self, meta: Meta, include_usage: bool) -> None:
        self.meta, self.include_usage = meta, include_usage

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {"id": self.meta.id, "object": self.object, "created": self.meta.created,
               "model": self.meta.model, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def _choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> list[dict[str, Any]]:
        return []

    def step(self, text: str, last: RequestEvent) -> list[dict[str, Any]]:
        out = []
        if text or last.finish_reason is not None:
            out.append(self._chunk(self._choice(text, last.finish_reason)))
        if last.finish_reason is not None and self.include_usage:
            out.append({"id": self.meta.id, "object": self.object, "created": self.meta.created,
                        "model": self.meta.model, "choices": [], "usage": usage(last)})
        return out


class _CompletionChunks(_Chunks):
    object = "text_completion"

    def _choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


class _ChatChunks(_Chunks):
    object = "chat.completion.chunk"

    def start(self) -> list[dict[str, Any]]:
        return [self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None})]

    def _choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def completion_chunks(meta: Meta, include_usage: bool) -> ChunkWriter:
    return _CompletionChunks(meta, include_usage)


def chat_chunks(meta: Meta, include_usage: bool) -> ChunkWriter:
    return _ChatChunks(meta, include_usage)
