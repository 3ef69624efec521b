"""A running request's events relayed to its client: streamed as server-sent events, or collected
into one JSON body. Either way, a client that goes away cancels its request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.request_handle import RequestEvent, RequestHandle
from hotspec.entrypoints.server_state import EngineClient


def stream_sse(engine: EngineClient, handle: RequestHandle, chunks: fmt.ChunkWriter) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        try:
            for head in chunks.start():
                yield fmt.sse(head)
            async for batch in handle.stream():
                last = batch[-1]
                if last.finish_reason == "error":
                    yield fmt.sse(APIError(500, last.error or "internal error").body())
                    break
                if last.finish_reason == "abort":  # cancelled by us: nobody is listening
                    return
                for chunk in chunks.step(batch):
                    yield fmt.sse(chunk)
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the response task was cancelled) or the stream ended
            if not handle.finished:
                engine.abort(handle)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def collect(request: Request, engine: EngineClient, handle: RequestHandle,
                  build: Callable[[list[RequestEvent]], dict[str, Any]]) -> Response:
    """Wait for the whole result (every event, for `build`); a client that disconnects meanwhile
    cancels the request."""

    async def watch() -> None:  # the body is read: the next message is the disconnect
        try:
            while (await request.receive())["type"] != "http.disconnect":
                pass
        finally:  # a disconnect, or the connection failing under us: nobody will read the result
            engine.abort(handle)

    watcher = asyncio.create_task(watch())
    events: list[RequestEvent] = []
    try:
        async for batch in handle.stream():
            events += batch
    finally:
        watcher.cancel()
        if not handle.finished:
            engine.abort(handle)
    assert events
    last = events[-1]
    if last.finish_reason == "error":
        raise APIError(500, last.error or "internal error")
    if last.finish_reason == "abort":
        raise APIError(400, "the request was cancelled")  # the client is gone: never read
    return JSONResponse(build(events))
