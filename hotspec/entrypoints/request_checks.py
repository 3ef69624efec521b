"""Checks every API request passes before it reaches the engine: the API key, the body-size limit,
the JSON body against its schema, and the model name."""

from __future__ import annotations

import hmac
import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from hotspec.entrypoints.api_errors import APIError, validation_error
from hotspec.entrypoints.server_state import ServerSettings

M = TypeVar("M", bound=BaseModel)


def check_api_key(request: Request, settings: ServerSettings) -> None:
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


async def read_json(request: Request, limit: int) -> dict[str, Any]:
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


async def parse_request(request: Request, settings: ServerSettings, model: type[M]) -> M:
    """The request's body as `model`, after every check above."""
    check_api_key(request, settings)
    data = await read_json(request, settings.max_body_bytes)
    try:
        body = model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    name = getattr(body, "model", None)
    if name != settings.served_model_name:
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                       f"'{settings.served_model_name}' (see /v1/models)", param="model",
                       code="model_not_found")
    return body
