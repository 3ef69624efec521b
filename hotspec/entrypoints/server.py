"""OpenAI-compatible HTTP server (FastAPI): /v1/completions, /v1/chat/completions, /v1/models,
/health, /metrics.

The Engine runs on its own thread (AsyncEngine); handlers only parse, tokenize (in a worker
thread), submit, and relay events, so no handler ever blocks the event loop on the engine. Prompts
are built exactly as the offline `LLM` builds them (`generate`: tokenizer.encode(prompt); `chat`:
the chat template, then encode without special tokens), so greedy results are the same.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from hotspec.engine.engine import Engine
from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError, install_handlers, validation_error
from hotspec.entrypoints.async_engine import (
    AsyncEngine,
    EngineDeadError,
    RequestEvent,
    RequestFailedError,
    RequestHandle,
)
from hotspec.entrypoints.metrics import EngineMetrics
from hotspec.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    UnsupportedParameterError,
    _SamplingRequest,
)
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

M = TypeVar("M", bound=BaseModel)
UNHEALTHY_AFTER_FAILED_STEPS = 3  # consecutive failed steps: the device is probably gone
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_body_bytes: int = 4 * 2**20


@dataclass
class _State:
    engine: Engine
    async_engine: AsyncEngine
    metrics: EngineMetrics
    settings: ServerSettings


def create_app(engine: Engine, settings: ServerSettings) -> FastAPI:
    """An app serving `engine`. The engine thread starts with the app (lifespan) and stops with
    it; until then, and afterwards, the Engine may be driven directly (tests reuse one engine)."""
    metrics = EngineMetrics()
    metrics.describe_engine(engine)
    state = _State(engine, AsyncEngine(engine, observer=metrics), metrics, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.async_engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.async_engine.shutdown)

    app = FastAPI(title="hotspec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hotspec = state
    install_handlers(app)
    _routes(app, state)
    return app


def _routes(app: FastAPI, s: _State) -> None:
    @app.get("/health")
    async def health() -> Response:
        ok = s.async_engine.is_alive and \
            s.async_engine.consecutive_step_errors < UNHEALTHY_AFTER_FAILED_STEPS
        return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(s.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        _check_api_key(request, s.settings)
        return JSONResponse(fmt.model_list(s.settings.served_model_name, s.engine.max_model_len))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, s, CompletionRequest)
        prompt = _or_400(body.single_prompt)
        ids = await _tokenize_completion(s.engine, prompt)
        params = _sampling_params(body, COMPLETIONS_DEFAULT_MAX_TOKENS)
        handle = await _submit(s, ids, params)
        meta = fmt.Meta("cmpl-" + uuid.uuid4().hex, int(time.time()), s.settings.served_model_name)
        if body.stream:
            chunks = fmt.completion_chunks(meta, _include_usage(body))
            return _sse(s, handle, chunks)
        return await _collect(request, s, handle, lambda text, ev: fmt.completion(meta, text, ev))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, s, ChatCompletionRequest)
        ids = await _tokenize_chat(s.engine, [m.as_template_input() for m in body.messages])
        params = _sampling_params(body, s.engine.max_model_len)  # default: up to the context limit
        handle = await _submit(s, ids, params)
        meta = fmt.Meta("chatcmpl-" + uuid.uuid4().hex, int(time.time()), s.settings.served_model_name)
        if body.stream:
            return _sse(s, handle, fmt.chat_chunks(meta, _include_usage(body)))
        return await _collect(request, s, handle, lambda text, ev: fmt.chat_completion(meta, text, ev))


# -- request parsing -------------------------------------------------------------------------------
def _check_api_key(request: Request, settings: ServerSettings) -> None:
    if settings.api_key is None:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if not auth:
        raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             settings.api_key.encode()):
        raise APIError(401, "incorrect API key provided", code="invalid_api_key")


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    too_large = APIError(413, f"request body larger than the server's limit of {limit} bytes "
                         "(--max-body-bytes)", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # counted as it arrives: chunked bodies have no length
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}",
                       code="invalid_json")
    return data


async def _parse(request: Request, s: _State, model: type[M]) -> M:
    _check_api_key(request, s.settings)
    data = await _read_json(request, s.settings.max_body_bytes)
    try:
        body = model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    name = getattr(body, "model", None)
    if name != s.settings.served_model_name:
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                       f"'{s.settings.served_model_name}' (see /v1/models)", param="model",
                       code="model_not_found")
    return body


_SP_FIELD = re.compile(r"^SamplingParams\.(\w+) ")


def _invalid(e: InvalidRequestError, param: str | None = None) -> APIError:
    message = str(e)
    match = _SP_FIELD.match(message)
    if match:  # "SamplingParams.top_p must be ..." -> param top_p, "top_p must be ..."
        param, message = match.group(1), message[len("SamplingParams."):]
    param = getattr(e, "param", param)
    return APIError(400, message, param=param)


def _or_400(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except InvalidRequestError as e:
        raise _invalid(e) from None


def _sampling_params(body: _SamplingRequest, default_max_tokens: int) -> SamplingParams:
    return _or_400(lambda: body.sampling_params(default_max_tokens))


def _include_usage(body: _SamplingRequest) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


async def _tokenize_completion(engine: Engine, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt  # token ids: the engine checks them against the vocabulary
    tok = engine.tokenizer
    if tok is None:
        raise APIError(400, "this server has no tokenizer (skip_tokenizer_init): send the prompt "
                       "as a list of token ids", param="prompt")
    return await asyncio.to_thread(tok.encode, prompt)  # same as LLM.generate


async def _tokenize_chat(engine: Engine, messages: list[dict[str, str]]) -> list[int]:
    tok = engine.tokenizer
    if tok is None:
        raise APIError(400, "this server has no tokenizer (skip_tokenizer_init): use "
                       "/v1/completions with token ids", param="messages")

    def render() -> list[int]:  # same as LLM.chat
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok.encode(text, add_special_tokens=False)

    try:
        return await asyncio.to_thread(render)
    except Exception as e:  # noqa: BLE001 - jinja raises its own errors from inside the template
        if type(e).__module__.startswith("jinja2") or isinstance(e, ValueError):
            raise APIError(400, f"the chat template rejected these messages: {e}",
                           param="messages") from None
        raise


async def _submit(s: _State, ids: list[int], params: SamplingParams) -> RequestHandle:
    try:
        return await s.async_engine.submit(ids, params)
    except InvalidRequestError as e:
        raise _invalid(e, "prompt") from None
    except EngineDeadError as e:
        raise APIError(503, f"the engine is not running: {e}") from None
    except RequestFailedError as e:
        raise APIError(500, str(e)) from None


# -- responses -------------------------------------------------------------------------------------
def _sse(s: _State, handle: RequestHandle, chunks: fmt.ChunkWriter) -> StreamingResponse:
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
                for chunk in chunks.step("".join(e.text for e in batch), last):
                    yield fmt.sse(chunk)
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the response task was cancelled) or the stream ended
            if not handle.finished:
                s.async_engine.abort(handle)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _collect(request: Request, s: _State, handle: RequestHandle,
                   build: Callable[[str, RequestEvent], dict[str, Any]]) -> Response:
    """Wait for the whole result; a client that disconnects meanwhile cancels the request."""

    async def watch() -> None:  # the body is read: the next message is the disconnect
        try:
            while (await request.receive())["type"] != "http.disconnect":
                pass
        finally:  # a disconnect, or the connection failing under us: nobody will read the result
            s.async_engine.abort(handle)

    watcher = asyncio.create_task(watch())
    text: list[str] = []
    last: RequestEvent | None = None
    try:
        async for batch in handle.stream():
            text += [e.text for e in batch]
            last = batch[-1]
    finally:
        watcher.cancel()
        if not handle.finished:
            s.async_engine.abort(handle)
    assert last is not None
    if last.finish_reason == "error":
        raise APIError(500, last.error or "internal error")
    if last.finish_reason == "abort":
        raise APIError(400, "the request was cancelled")  # the client is gone: never read
    return JSONResponse(build("".join(text), last))


# -- running ---------------------------------------------------------------------------------------
class BackgroundServer:
    """uvicorn on a daemon thread (tests, notebooks): `with BackgroundServer(app) as srv: srv.url`.
    Port 0 (default) binds a free port, read back once the server listens."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="hotspec-uvicorn", daemon=True)
        self.host = host
        self.port = port

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start (see the log above)")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def run(engine: Engine, settings: ServerSettings, host: str, port: int) -> None:
    """Serve until interrupted (the `hotspec serve` command)."""
    uvicorn.run(create_app(engine, settings), host=host, port=port, log_level="info",
                timeout_graceful_shutdown=10)


__all__ = ["BackgroundServer", "ServerSettings", "UnsupportedParameterError", "create_app", "run"]
