"""Host work a handler needs (chat template, tokenizer, detokenizer) run where it costs least: on
the event loop when the text is short, in a worker thread when it is long enough to hold other
requests up.

A short chat tokenizes in less time than the hand-off to a worker thread and back takes (a queue
put, a thread wake-up, the loop's wake-up), so short prompts reach the engine sooner inline; a
long prompt goes to the thread so the loop keeps streaming other requests' tokens meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INLINE_CHARS = 2_000  # at most this much text (or token ids) is handled on the event loop


async def run_sized(fn: Callable[[], T], size: int) -> T:
    """fn() inline when `size` (characters or tokens of the text it handles) is at most
    INLINE_CHARS, else in a worker thread."""
    if size <= INLINE_CHARS:
        return fn()
    return await asyncio.to_thread(fn)
