"""OpenAI-compatible HTTP server (FastAPI): /v1/completions, /v1/chat/completions, /v1/models,
/health, /metrics.

`hotspec serve` runs the Engine in a process of its own (ProcessEngine, create_process_app);
create_app runs one on a thread of this process (AsyncEngine: for an engine built in Python, as
the tests and BackgroundServer do). Either way handlers only parse, tokenize (in a worker
thread), submit, and relay events, so no handler ever blocks the event loop on the engine. Prompts
are built exactly as the offline `LLM` builds them (`generate`: tokenizer.encode(prompt); `chat`:
the chat template, then encode without special tokens), so greedy results are the same.

A request goes through request_checks (API key, body limit, schema, model name), then its route
(routes_completions, routes_chat: the prompt as token ids), then submission (sampling parameters,
a grammar compiled by grammar_check, AsyncEngine.submit) and responses (an SSE stream or one JSON
body). routes_info serves /health, /metrics and /v1/models.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from hotspec.engine.engine import Engine
from hotspec.entrypoints import routes_chat, routes_completions, routes_info
from hotspec.entrypoints.api_errors import install_handlers
from hotspec.entrypoints.async_engine import AsyncEngine
from hotspec.entrypoints.background_server import BackgroundServer
from hotspec.entrypoints.engine_process import ProcessEngine
from hotspec.entrypoints.grammar_check import GrammarCheck, checkpoint_vocab_size
from hotspec.entrypoints.metrics import EngineMetrics
from hotspec.entrypoints.protocol import UnsupportedParameterError
from hotspec.entrypoints.server_state import ServerSettings, ServerState


def create_app(engine: Engine, settings: ServerSettings) -> FastAPI:
    """An app serving `engine` on a thread of this process. The engine thread starts with the app
    (lifespan) and stops with it; until then, and afterwards, the Engine may be driven directly
    (tests reuse one engine)."""
    metrics = EngineMetrics()
    metrics.describe_engine(engine)

    async def render() -> bytes:
        return metrics.render()

    vocab = engine.model_config.vocab_size
    return _app(ServerState(AsyncEngine(engine, observer=metrics), engine.tokenizer,
                            engine.max_model_len, render, settings,
                            GrammarCheck(engine.tokenizer, lambda: vocab)), start=True)


def create_process_app(client: ProcessEngine, settings: ServerSettings) -> FastAPI:
    """An app serving the engine `client` runs in its own process (started already, so a model
    that fails to load fails before the server listens); the app stops it on exit."""
    tokenizer = None
    if not client.cfg.skip_tokenizer_init:
        from hotspec.models.loader import load_tokenizer, resolve_model_path

        tokenizer = load_tokenizer(resolve_model_path(client.cfg.model))
    grammars = GrammarCheck(tokenizer, lambda: checkpoint_vocab_size(client.cfg.model))
    return _app(ServerState(client, tokenizer, client.max_model_len, client.metrics, settings,
                            grammars), start=False)


# FastAPI's native OpenTelemetry (FastAPI >= 0.16x) off: it asks at each request whether a global
# tracer, meter or logger provider is configured, work on every request's path (lab/app_overhead.py
# --step-ms profiles it); the server's observability is its Prometheus /metrics.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def _app(state: ServerState, start: bool) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if start:
            state.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.engine.shutdown)

    app = FastAPI(title="hotspec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  **_NO_TELEMETRY)
    app.state.hotspec = state
    install_handlers(app)
    for routes in (routes_info, routes_completions, routes_chat):
        routes.add_routes(app, state)
    return app


def run(app: FastAPI, host: str, port: int) -> None:
    """Serve until interrupted (the `hotspec serve` command)."""
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=10)


__all__ = ["BackgroundServer", "ProcessEngine", "ServerSettings", "UnsupportedParameterError",
           "create_app", "create_process_app", "run"]
