"""What one engine step gives back for each request it advanced."""

from __future__ import annotations

from dataclasses import dataclass

from hotspec.core.logprobs import TokenLogprob
from hotspec.core.request import Request


@dataclass
class StepOutput:
    request: Request
    text_delta: str
    new_token_ids: list[int]
    # with params.logprobs: one per new token, in order (core/logprobs.py)
    logprobs: list[TokenLogprob] | None = None
    # with params.prompt_logprobs, on the request's first output: one per prompt token (first None)
    prompt_logprobs: list[TokenLogprob | None] | None = None
