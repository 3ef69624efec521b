"""A choice's `logprobs` in the OpenAI API, from the engine's TokenLogprob entries: chat's
`{"content": [...]}` and legacy completions' `{"tokens", "token_logprobs", "top_logprobs",
"text_offset"}`, for a whole answer or for the tokens of one streamed chunk.

Entries are one per generated token, in order, a stop token whose text is not emitted included
(as vLLM does); with completions' `echo`, one per prompt token before them. A token's text is
the tokenizer's decoding of that id alone (as vLLM reports it; `token_id:<id>` without a
tokenizer), so a token holding part of a character reads "\\ufffd".
JSON has no infinity: a logprob below -9999 (or NaN) is reported as -9999.0, vLLM's floor. An
event with tokens but no entries (an engine that does not fill them) makes the whole part null.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hotspec.core.logprobs import TokenLogprob
from hotspec.entrypoints.request_handle import RequestEvent

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LOGPROB_FLOOR = -9999.0
TEXT_CACHE_SIZE = 1 << 16  # token texts kept: the same ids recur (every alternative is decoded)


class LogprobsFormat(Protocol):
    """The `logprobs` of a choice for `events`; `start` is the character offset in the choice's
    text where the first event's text begins (completions' text_offset counts from there)."""

    def __call__(self, events: Sequence[RequestEvent], start: int) -> dict[str, Any] | None: ...


def token_texts(tokenizer: PreTrainedTokenizerBase | None) -> Callable[[int], str]:
    """Token id -> its text: `tokenizer.decode([id])`, or `token_id:<id>` without a tokenizer."""

    @functools.lru_cache(maxsize=TEXT_CACHE_SIZE)
    def text(token_id: int) -> str:
        if tokenizer is None:
            return f"token_id:{token_id}"
        return str(tokenizer.decode([token_id]))

    return text


def clamp(logprob: float) -> float:
    """`logprob` as JSON can carry it: -inf and NaN become LOGPROB_FLOOR."""
    return float(logprob) if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def entries(event: RequestEvent) -> list[TokenLogprob] | None:
    """The event's entries; None when it has tokens but no entries (not filled by the engine)."""
    if event.logprobs is None:
        return [] if not event.token_ids else None
    return event.logprobs


class ChatLogprobs:
    """Chat's choice `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}, ...]}`, with
    the `top` most likely alternatives of each token, most likely first."""

    def __init__(self, text: Callable[[int], str], top: int) -> None:
        self.text, self.top = text, top

    def __call__(self, events: Sequence[RequestEvent], start: int = 0) -> dict[str, Any] | None:
        content: list[dict[str, Any]] = []
        for event in events:
            got = entries(event)
            if got is None:
                return None
            content += [self.token(e) for e in got]
        return {"content": content}

    def token(self, e: TokenLogprob) -> dict[str, Any]:
        """One entry of `content`."""
        return {**self.item(e.token_id, e.logprob),
                "top_logprobs": [self.item(i, lp) for i, lp in e.top[:self.top]]}

    def item(self, token_id: int, logprob: float) -> dict[str, Any]:
        """A token's text, logprob and UTF-8 bytes."""
        s = self.text(token_id)
        return {"token": s, "logprob": clamp(logprob), "bytes": list(s.encode("utf-8"))}


class CompletionLogprobs:
    """Completions' choice `logprobs` (OpenAI's legacy shape). `top_logprobs[i]` maps the `top`
    most likely texts to their logprobs, most likely first, plus the chosen token's when it is
    not among them (so up to top + 1, as OpenAI's API says; texts that decode alike keep the
    likelier). `text_offset[i]` is where token i's text starts in the choice's text: each engine
    event's first token at the event's own text, the next ones after their predecessors' token
    texts, never past the end of the event's text (a stop token or a skipped special token sits
    at the end of the text before it). With `echo`, `prompt` writes the prompt's part the same
    way, its text the first one: an entry the engine has no value for (the first token's, or
    every one when it does not fill them) is null in `token_logprobs` and `top_logprobs`."""

    def __init__(self, text: Callable[[int], str], top: int) -> None:
        self.text, self.top = text, top

    def __call__(self, events: Sequence[RequestEvent], start: int = 0) -> dict[str, Any] | None:
        out = empty_completion_logprobs()
        pos = start
        for event in events:
            got = entries(event)
            if got is None:
                return None
            pos = self.add(out, [(e.token_id, e) for e in got], pos, pos + len(event.text))
        return out

    def prompt(self, token_ids: Sequence[int], text: str,
               got: Sequence[TokenLogprob | None] | None) -> dict[str, Any]:
        """The prompt's part of an echoed choice: one entry per prompt token, from 0 over the
        prompt's `text`; `got` is the first event's prompt_logprobs (None, or a list of another
        length: not filled, every entry null)."""
        if got is None or len(got) != len(token_ids):
            got = [None] * len(token_ids)
        out = empty_completion_logprobs()
        self.add(out, list(zip(token_ids, got)), 0, len(text))
        return out

    def add(self, out: dict[str, Any], items: Sequence[tuple[int, TokenLogprob | None]], pos: int,
            end: int) -> int:
        """Append the entries of a text span [pos, end) to `out`; returns `end`."""
        for token_id, e in items:
            s = self.text(token_id)
            out["tokens"].append(s)
            out["token_logprobs"].append(None if e is None else clamp(e.logprob))
            out["top_logprobs"].append(None if e is None else self.alternatives(e))
            out["text_offset"].append(min(pos, end))
            pos += len(s)
        return end

    def alternatives(self, e: TokenLogprob) -> dict[str, float]:
        """One entry of `top_logprobs`."""
        out: dict[str, float] = {}
        for token_id, logprob in e.top[:self.top]:
            out.setdefault(self.text(token_id), clamp(logprob))
        out.setdefault(self.text(e.token_id), clamp(e.logprob))
        return out


def empty_completion_logprobs() -> dict[str, Any]:
    """Completions' `logprobs` with no entries."""
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def joined(head: dict[str, Any] | None, tail: dict[str, Any] | None) -> dict[str, Any] | None:
    """Completions' `logprobs` of two spans, `head` first (None: no head); null when `tail` is
    (the engine did not fill the entries)."""
    if head is None or tail is None:
        return tail
    return {key: head[key] + tail[key] for key in head}
