"""A running answer's events relayed to its client: streamed as server-sent events, or collected
into one JSON body. An answer is one engine request per choice (`n`); their events are relayed as
they arrive, each with its choice's index. Either way, a client that goes away cancels every one
of them, and so does a choice that fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.request_handle import RequestEvent, RequestHandle
from hotspec.entrypoints.server_state import EngineClient

Batch = list[RequestEvent]


def abort_unfinished(engine: EngineClient, handles: Sequence[RequestHandle]) -> None:
    """Cancel every request of the answer that has not finished (nobody will read it)."""
    for handle in handles:
        if not handle.finished:
            engine.abort(handle)


async def _next(stream: AsyncIterator[Batch]) -> Batch:
    return await anext(stream)


async def merged(handles: Sequence[RequestHandle]) -> AsyncGenerator[tuple[int, Batch], None]:
    """The handles' batches of events as they arrive, each with its handle's index; ends once
    every handle's final event is out."""
    if len(handles) == 1:
        async for batch in handles[0].stream():
            yield 0, batch
        return
    streams = [h.stream() for h in handles]
    pending = {asyncio.ensure_future(_next(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):  # in index order
                i = pending.pop(task)
                batch = task.result()
                if batch[-1].finish_reason is None:
                    pending[asyncio.ensure_future(_next(streams[i]))] = i
                yield i, batch
    finally:
        for task in pending:
            task.cancel()


def stream_sse(engine: EngineClient, handles: Sequence[RequestHandle],
               chunks: fmt.ChunkWriter) -> StreamingResponse:
    """The answer as server-sent events; an error in any choice ends the stream with an error
    event (the other choices are cancelled). Events that are ready together go out in one write
    (one send on the socket: the role chunk; each batch's chunks; the last batch's with the usage
    chunk and [DONE]), so a token costs the server one system call and the client one read."""

    async def events() -> AsyncIterator[str]:
        ended = 0  # choices whose final event is out
        try:
            if head := "".join(map(fmt.sse, chunks.start())):
                yield head
            async with contextlib.aclosing(merged(handles)) as batches:
                async for index, batch in batches:
                    last = batch[-1]
                    if last.finish_reason == "error":
                        yield fmt.sse(APIError(500, last.error or "internal error").body())
                        break
                    if last.finish_reason == "abort":  # cancelled by us: nobody is listening
                        return
                    out = "".join(map(fmt.sse, chunks.step(batch, index)))
                    ended += last.finish_reason is not None
                    if ended == len(handles):  # the answer's end: [DONE] rides along
                        yield out + "data: [DONE]\n\n"
                        return
                    if out:
                        yield out
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the response task was cancelled) or the stream ended
            abort_unfinished(engine, handles)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _failure(events: Sequence[Batch]) -> APIError | None:
    """Why the answer cannot be given: a choice that failed (500) or was cancelled (400)."""
    for evs in events:
        reason = evs[-1].finish_reason if evs else None
        if reason == "error":
            return APIError(500, evs[-1].error or "internal error")
        if reason == "abort":
            return APIError(400, "the request was cancelled")  # the client is gone: never read
    return None


async def collect(request: Request, engine: EngineClient, handles: Sequence[RequestHandle],
                  build: Callable[[list[Batch]], dict[str, Any]]) -> Response:
    """Wait for the whole result (every choice's events, for `build`); a client that disconnects
    meanwhile cancels every choice, and a choice that fails cancels the others."""

    async def watch() -> None:  # the body is read: the next message is the disconnect
        try:
            while (await request.receive())["type"] != "http.disconnect":
                pass
        finally:  # a disconnect, or the connection failing under us: nobody will read the result
            abort_unfinished(engine, handles)

    watcher = asyncio.create_task(watch())
    events: list[Batch] = [[] for _ in handles]
    try:
        async with contextlib.aclosing(merged(handles)) as batches:
            async for index, batch in batches:
                events[index] += batch
                if batch[-1].finish_reason in ("error", "abort"):
                    break
    finally:
        watcher.cancel()
        abort_unfinished(engine, handles)
    failure = _failure(events)
    if failure is not None:
        raise failure
    return JSONResponse(build(events))
