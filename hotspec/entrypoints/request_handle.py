"""The event-loop side of a served request: its events, its handle, and how results arrive.

The engine thread never touches a handle's queue or future itself: it hands (handle, item) pairs to
`deliver`, scheduled on the handle's event loop with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from hotspec.core.logprobs import TokenLogprob
from hotspec.core.request import Request
from hotspec.errors import HotspecError


class EngineDeadError(HotspecError, RuntimeError):
    """The engine thread is not running (never started, stopped, or crashed)."""


class RequestFailedError(HotspecError, RuntimeError):
    """The engine failed while computing this request (an internal error, not the request's)."""


@dataclass
class RequestEvent:
    """Output of one engine step for one request. The last event has `finish_reason` set:
    "stop" or "length" (done), "abort" (cancelled) or "error" (`error` says what failed)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # generated so far, this event's tokens included
    # with SamplingParams.logprobs: one per token of `token_ids`, in order
    logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs, on the request's first event: one per prompt token, the
    # first None (nothing before it)
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def __reduce__(self) -> tuple[type[RequestEvent], tuple[object, ...]]:
        """Pickled as its fields in order (the engine process sends every step's events through
        a pipe): a tuple, where a dataclass's default pickles its __dict__, keys and all."""
        return (RequestEvent, (self.text, self.token_ids, self.finish_reason, self.error,
                               self.prompt_tokens, self.completion_tokens, self.logprobs,
                               self.prompt_logprobs))


@dataclass(eq=False)
class RequestHandle:
    """The event-loop side of one request. `req` is set by the engine thread and read only there."""

    loop: asyncio.AbstractEventLoop
    accepted: asyncio.Future[None] | None = None
    req: Request | None = None
    finished: bool = False  # event-loop side: the final event was received
    # events not read yet, and the future `stream` waits on while there are none (a list and a
    # future instead of an asyncio.Queue: a token is one append and at most one wake-up)
    _pending: list[RequestEvent] = field(default_factory=list)
    _waiter: asyncio.Future[None] | None = None

    def put(self, event: RequestEvent) -> None:
        """On the event loop: queue an event for `stream`."""
        self._pending.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def stream(self) -> AsyncIterator[list[RequestEvent]]:
        """Events as they arrive, coalesced: each item is every event queued at that moment (a
        slow consumer catches up in one chunk). Ends after the final event."""
        while not self.finished:
            if not self._pending:
                self._waiter = self.loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            batch, self._pending = self._pending, []
            self.finished = batch[-1].finish_reason is not None
            yield batch


def deliver(items: list[tuple[RequestHandle, object]]) -> None:
    """On the event loop: resolve submissions and queue events. An item is an event (a stream
    item), or the outcome of the handle's submission (None: accepted; an exception: rejected)."""
    for handle, item in items:
        fut = handle.accepted
        if isinstance(item, RequestEvent):
            if fut is not None and not fut.done():  # an abort/stop raced the acceptance
                fut.set_exception(EngineDeadError(item.error or "the request was cancelled"))
            handle.put(item)
        elif fut is not None and not fut.done():
            if item is None:
                fut.set_result(None)
            else:
                assert isinstance(item, BaseException)
                fut.set_exception(item)
