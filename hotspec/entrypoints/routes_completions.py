"""/v1/completions: a prompt (text or token ids) continued, streamed or whole; with `echo`, the
answer starts with the prompt."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response

from hotspec.entrypoints import logprobs_format as lpf
from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.offload import run_sized
from hotspec.entrypoints.protocol import CompletionRequest
from hotspec.entrypoints.request_checks import parse_request
from hotspec.entrypoints.server_state import ServerState
from hotspec.entrypoints.submission import answer, or_400

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def add_routes(app: FastAPI, s: ServerState) -> None:
    texts = lpf.token_texts(s.tokenizer)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse_request(request, s.settings, CompletionRequest)
        prompt = or_400(body.single_prompt)
        ids = await _tokenize(s.tokenizer, prompt)
        echo = await _echo(body, prompt, ids, s.tokenizer, texts) if body.echo else None
        return await answer(request, s, body, ids, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
                            id_prefix="cmpl-", chunks=functools.partial(fmt.completion_chunks, echo=echo),
                            whole=functools.partial(fmt.completion_choices, echo=echo),
                            logprobs=functools.partial(lpf.CompletionLogprobs, texts))


async def _echo(body: CompletionRequest, prompt: str | list[int], ids: list[int],
                tok: PreTrainedTokenizerBase | None, texts: Callable[[int], str]) -> fmt.Echo:
    """What `echo` puts first: the prompt as sent, a token-id prompt decoded ("" without a
    tokenizer, as the completion's text is); with logprobs, the prompt tokens' entries."""
    text = prompt if isinstance(prompt, str) else await run_sized(lambda: _decode(tok, ids), len(ids))
    if body.logprobs is None:
        return fmt.Echo(text)
    return fmt.Echo(text, functools.partial(lpf.CompletionLogprobs(texts, body.logprobs).prompt, ids, text))


async def _tokenize(tok: PreTrainedTokenizerBase | None, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt  # token ids: the engine checks them against the vocabulary
    if tok is None:
        raise APIError(400, "this server has no tokenizer (skip_tokenizer_init): send the prompt "
                       "as a list of token ids", param="prompt")
    encode = tok.encode
    return await run_sized(lambda: encode(prompt), len(prompt))  # same as LLM.generate


def _decode(tok: PreTrainedTokenizerBase | None, ids: list[int]) -> str:
    """A token-id prompt's text: "" without a tokenizer, or for ids no tokenizer can hold (the
    engine refuses those at submission, saying why)."""
    if tok is None:
        return ""
    try:
        return str(tok.decode(ids))
    except OverflowError:
        return ""
