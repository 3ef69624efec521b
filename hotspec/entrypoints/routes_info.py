"""The server's informational routes: /health, /metrics and /v1/models."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.request_checks import check_api_key
from hotspec.entrypoints.server_state import ServerState

UNHEALTHY_AFTER_FAILED_STEPS = 3  # consecutive failed steps: the device is probably gone


def add_routes(app: FastAPI, s: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        ok = s.engine.is_alive and \
            s.engine.consecutive_step_errors < UNHEALTHY_AFTER_FAILED_STEPS
        return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await s.metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        check_api_key(request, s.settings)
        return JSONResponse(fmt.model_list(s.settings.served_model_name, s.max_model_len))
