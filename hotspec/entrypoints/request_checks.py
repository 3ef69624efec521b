"""Checks every API request passes before it reaches the engine: the API key, the body-size limit,
the JSON body against its schema, and the model name."""

from __future__ import annotations

import hmac
import json
import re
import sys
from typing import Any, TypeVar

from fastapi import Request
from pydantic import ValidationError

from hotspec.entrypoints.api_errors import APIError, validation_error
from hotspec.entrypoints.protocol import UnsupportedParameterError, _SamplingRequest
from hotspec.entrypoints.server_state import ServerSettings

R = TypeVar("R", bound=_SamplingRequest)
MAX_DEPTH = 32  # an OpenAI request nests 5 levels (body, messages, message, content, part)
_SURROGATE = re.compile("[\ud800-\udfff]")


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
    except RecursionError:
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except ValueError:  # Python's limit on int digits
        raise APIError(400, "the request body holds an integer of more than "
                       f"{sys.get_int_max_str_digits()} digits", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}",
                       code="invalid_json")
    check_json(data)
    return data


def check_json(data: Any) -> None:
    """Refuse what JSON allows but nothing downstream can take: nesting deeper than MAX_DEPTH
    (validation and error messages recurse) and lone UTF-16 surrogates ("\\ud800" parses to a str
    that is not Unicode: tokenizers and UTF-8 encoders raise on it). Iterative, so any depth is
    safe to walk."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path)  # before the key is part of a path in a message
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, path: str) -> None:
    if _SURROGATE.search(text):
        raise APIError(400, f"{path or 'the body'} contains a lone UTF-16 surrogate (an unpaired "
                       "\\ud800-\\udfff escape), which is not valid Unicode", param=path or None,
                       code="invalid_json")


def _too_deep() -> APIError:
    return APIError(400, f"the request body nests JSON deeper than {MAX_DEPTH} levels",
                    code="invalid_json")


async def parse_request(request: Request, settings: ServerSettings, model: type[R]) -> R:
    """The request's body as `model`, after every check above."""
    check_api_key(request, settings)
    data = await read_json(request, settings.max_body_bytes)
    try:
        model.refuse_unsupported(data)
    except UnsupportedParameterError as e:
        raise APIError(400, str(e), param=e.param, code="unsupported_parameter") from None
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
