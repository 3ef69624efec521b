"""From a parsed request to its answer: sampling parameters (a grammar among them compiled first,
grammar_check.py), submission to the engine thread (the engine's errors turned into API errors),
and the response, streamed or whole. With `n`, one engine request per choice on the same prompt
token ids (the engine shares the prompt's KV blocks between them), submitted together; one
refused is the answer's error, the others are cancelled."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response

from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.logprobs_format import LogprobsFormat
from hotspec.entrypoints.protocol import _SamplingRequest, choice_params
from hotspec.entrypoints.request_handle import (
    EngineDeadError,
    RequestEvent,
    RequestFailedError,
    RequestHandle,
)
from hotspec.entrypoints.responses import abort_unfinished, collect, stream_sse
from hotspec.entrypoints.server_state import EngineClient, ServerState
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

_SP_FIELD = re.compile(r"^SamplingParams\.(\w+) ")
_ENGINE_FIELD = re.compile(r"^(logit_bias) ")  # the engine's messages about a field, not the prompt


class ChunksFactory(Protocol):
    """The writer of a streamed answer's chunks with n choices."""

    def __call__(self, meta: fmt.Meta, include_usage: bool, logprobs: LogprobsFormat | None, *,
                 n: int = 1) -> fmt.ChunkWriter: ...


WholeFactory = Callable[[fmt.Meta, list[list[RequestEvent]], LogprobsFormat | None], dict[str, Any]]


def _invalid(e: InvalidRequestError, param: str | None = None) -> APIError:
    message = str(e)
    match = _SP_FIELD.match(message)
    if match:  # "SamplingParams.top_p must be ..." -> param top_p, "top_p must be ..."
        param, message = match.group(1), message[len("SamplingParams."):]
    elif match := _ENGINE_FIELD.match(message):  # "logit_bias token ids [...] are outside ..."
        param = match.group(1)
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


async def submit_choices(engine: EngineClient, ids: list[int],
                         params: Sequence[SamplingParams]) -> list[RequestHandle]:
    """One request per SamplingParams, submitted together (in order); when one is refused, the
    accepted ones are cancelled and the first refusal raised. Cancelled meanwhile (the client went
    away), none is left running."""
    tasks = [asyncio.ensure_future(_submit(engine, ids, p)) for p in params]
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:
        for task in tasks:  # a pending submission aborts its own request when cancelled
            task.cancel()
        abort_unfinished(engine, [t.result() for t in tasks
                                  if t.done() and not t.cancelled() and t.exception() is None])
        raise
    handles = [t.result() for t in tasks if t.exception() is None]
    refused = [e for t in tasks if (e := t.exception()) is not None]
    if refused:
        abort_unfinished(engine, handles)
        raise refused[0]
    return handles


async def answer(request: Request, s: ServerState, body: _SamplingRequest, ids: list[int], *,
                 default_max_tokens: int, id_prefix: str,
                 chunks: ChunksFactory, whole: WholeFactory,
                 logprobs: Callable[[int], LogprobsFormat]) -> Response:
    """Run the request `body` on prompt `ids`, its n choices as n engine requests; answer with
    `chunks` (stream) or `whole` (each choice's events), choices' logprobs written by
    `logprobs(k)` when the request asks for k alternatives. A max_tokens the context cannot hold
    is refused with the numbers (as vLLM does); without one, a request generates at most
    `default_max_tokens` and what the context leaves."""
    requested, room = body.requested_max_tokens, s.max_model_len - len(ids)
    if requested is not None and requested > room:
        raise APIError(400, f"This model's maximum context length is {s.max_model_len} tokens. "
                       f"However, you requested {len(ids) + requested} tokens ({len(ids)} in the "
                       f"prompt, {requested} for the completion). Reduce the prompt or max_tokens.",
                       param="max_tokens")
    params = or_400(lambda: body.sampling_params(max(1, min(default_max_tokens, room))))
    if params.grammar is not None:
        await s.grammars.check(params.grammar)  # a grammar that does not compile never reaches the engine
    lp = None if params.logprobs is None else logprobs(params.logprobs)
    n = body.num_choices
    handles = await submit_choices(s.engine, ids, choice_params(params, n))
    meta = fmt.Meta(id_prefix + uuid.uuid4().hex, int(time.time()), s.settings.served_model_name)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return stream_sse(s.engine, handles, chunks(meta, include_usage, lp, n=n))
    return await collect(request, s.engine, handles, lambda events: whole(meta, events, lp))
