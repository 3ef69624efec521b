"""From a parsed request to its answer: sampling parameters, submission to the engine thread (the
engine's errors turned into API errors), and the response, streamed or whole."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.logprobs_format import LogprobsFormat
from hotspec.entrypoints.protocol import _SamplingRequest
from hotspec.entrypoints.request_handle import (
    EngineDeadError,
    RequestEvent,
    RequestFailedError,
    RequestHandle,
)
from hotspec.entrypoints.responses import collect, stream_sse
from hotspec.entrypoints.server_state import EngineClient, ServerState
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

_SP_FIELD = re.compile(r"^SamplingParams\.(\w+) ")


def _invalid(e: InvalidRequestError, param: str | None = None) -> APIError:
    message = str(e)
    match = _SP_FIELD.match(message)
    if match:  # "SamplingParams.top_p must be ..." -> param top_p, "top_p must be ..."
        param, message = match.group(1), message[len("SamplingParams."):]
    param = getattr(e, "param", param)
    return APIError(400, message, param=param)


def or_400(fn: Callable[[], Any]) -> Any:
    """`fn()`, an InvalidRequestError from it answered as a 400."""
    try:
        return fn()
    except InvalidRequestError as e:
        raise _invalid(e) from None


async def _submit(engine: EngineClient, ids: list[int], params: SamplingParams) -> RequestHandle:
    try:
        return await engine.submit(ids, params)
    except InvalidRequestError as e:
        raise _invalid(e, "prompt") from None
    except EngineDeadError as e:
        raise APIError(503, f"the engine is not running: {e}") from None
    except RequestFailedError as e:
        raise APIError(500, str(e)) from None


async def answer(request: Request, s: ServerState, body: _SamplingRequest, ids: list[int], *,
                 default_max_tokens: int, id_prefix: str,
                 chunks: Callable[[fmt.Meta, bool, LogprobsFormat | None], fmt.ChunkWriter],
                 whole: Callable[[fmt.Meta, list[RequestEvent], LogprobsFormat | None], dict[str, Any]],
                 logprobs: Callable[[int], LogprobsFormat]) -> Response:
    """Run the request `body` on prompt `ids`; answer with `chunks` (stream) or `whole`, choices'
    logprobs written by `logprobs(n)` when the request asks for n alternatives. A max_tokens the
    context cannot hold is refused with the numbers (as vLLM does); without one, a request
    generates at most `default_max_tokens` and what the context leaves."""
    requested, room = body.requested_max_tokens, s.max_model_len - len(ids)
    if requested is not None and requested > room:
        raise APIError(400, f"This model's maximum context length is {s.max_model_len} tokens. "
                       f"However, you requested {len(ids) + requested} tokens ({len(ids)} in the "
                       f"prompt, {requested} for the completion). Reduce the prompt or max_tokens.",
                       param="max_tokens")
    params = or_400(lambda: body.sampling_params(max(1, min(default_max_tokens, room))))
    lp = None if params.logprobs is None else logprobs(params.logprobs)
    handle = await _submit(s.engine, ids, params)
    meta = fmt.Meta(id_prefix + uuid.uuid4().hex, int(time.time()), s.settings.served_model_name)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return stream_sse(s.engine, handle, chunks(meta, include_usage, lp))
    return await collect(request, s.engine, handle, lambda events: whole(meta, events, lp))
