"""Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server answers goes through `APIError`, including FastAPI's own (unknown route,
wrong method, request validation: mapped to 400, never 422) and unexpected exceptions (500). Each
is logged as one line (method, path, status, message); only an unexpected exception adds its
traceback. The connection stays open for the client's next request either way.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("hotspec.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 500: "internal_error",
          503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def validation_error(e: ValidationError | RequestValidationError) -> APIError:
    """pydantic's errors as one 400: every problem, each with the field's dotted path."""
    problems = []
    first: str | None = None
    for err in e.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        first = first or loc or None
        got = ""
        if "input" in err and err.get("type") != "missing":
            shown = repr(err["input"])
            got = f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
        problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}{got}")
    return APIError(400, "invalid request: " + "; ".join(problems), param=first)


def _answer(request: Request, exc: APIError) -> JSONResponse:
    level = logging.INFO if exc.status < 500 else logging.ERROR  # a client's mistake, or ours
    log.log(level, "%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
    return exc.response()


class CatchAll:
    """ASGI middleware inside Starlette's error middleware: an unexpected exception is answered
    with a 500 here, so Starlette never re-raises it into the server (which would log a second
    traceback and close the connection). A response already started can only be cut short."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_marking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_marking)
        except Exception as exc:
            if started:
                raise
            log.exception("%s %s -> 500: unhandled %s", scope["method"], scope["path"],
                          type(exc).__name__)
            await APIError(500, f"internal server error: {type(exc).__name__}").response()(
                scope, receive, send)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _answer(request, validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _answer(request, APIError(exc.status_code, str(exc.detail)))

    app.add_middleware(CatchAll)
