"""Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server answers goes through `APIError`, including FastAPI's own (unknown route,
wrong method, request validation: mapped to 400, never 422) and unexpected exceptions (500).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

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


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return APIError(500, f"internal server error: {type(exc).__name__}").response()
