"""A choice's `logprobs` in the OpenAI API, from the engine's TokenLogprob entries: chat's
`{"content": [...]}` and legacy completions' `{"tokens", "token_logprobs", "top_logprobs",
"text_offset"}`, for a whole answer or for the tokens of one streamed chunk.

Entries are one per generated token, in order, a stop token whose text is not emitted included
(as vLLM does). A token's text is the tokenizer's decoding of that id alone (as vLLM reports it;
`token_id:<id>` without a tokenizer), so a token holding part of a character reads "\\ufffd".
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
    at the end of the text before it)."""

    def __init__(self, text: Callable[[int], str], top: int) -> None:
        self.text, self.top = text, top

    def __call__(self, events: Sequence[RequestEvent], start: int = 0) -> dict[str, Any] | None:
        tokens: list[str] = []
        token_logprobs: list[float] = []
        top_logprobs: list[dict[str, float]] = []
        text_offset: list[int] = []
        pos = start
        for event in events:
            got = entries(event)
            if got is None:
                return None
            end = pos + len(event.text)
            for e in got:
                s = self.text(e.token_id)
                tokens.append(s)
                token_logprobs.append(clamp(e.logprob))
                top_logprobs.append(self.alternatives(e))
                text_offset.append(min(pos, end))
                pos += len(s)
            pos = end
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": text_offset}

    def alternatives(self, e: TokenLogprob) -> dict[str, float]:
        """One entry of `top_logprobs`."""
        out: dict[str, float] = {}
        for token_id, logprob in e.top[:self.top]:
            out.setdefault(self.text(token_id), clamp(logprob))
        out.setdefault(self.text(e.token_id), clamp(e.logprob))
        return out
