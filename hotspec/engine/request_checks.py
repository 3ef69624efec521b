"""What the engine refuses before a request is queued: every check raises InvalidRequestError
with what to fix, and changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotspec.engine.engine import Engine


def check_request(engine: Engine, prompt_token_ids: list[int], params: SamplingParams) -> None:
    """The prompt fits the vocabulary and the context, the parameters fit the model."""
    if not prompt_token_ids:
        raise InvalidRequestError("empty prompt: give at least one token or character")
    vocab = engine.model_config.vocab_size
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    room = engine.max_model_len  # (a prompt of room - 1 tokens gets one token)
    if len(prompt_token_ids) >= room:
        limit = ("the KV cache's capacity; shorten the prompt or give the KV cache more memory"
                 if engine.max_model_len == engine.kv_capacity - engine.worker.reserve + 1 else
                 "max_model_len; shorten the prompt or raise max_model_len")
        raise InvalidRequestError(
            f"prompt of {len(prompt_token_ids)} tokens does not fit the context of "
            f"{engine.max_model_len} tokens (at most {room - 1} prompt tokens leave room to "
            f"generate); the context is limited by {limit}")
    bad = [t for t in (params.logit_bias or {}) if t >= vocab]
    if bad:
        raise InvalidRequestError(f"logit_bias token ids {bad[:5]} are outside the vocabulary "
                                  f"[0, {vocab})")
    if params.stop and engine.tokenizer is None:
        raise InvalidRequestError("stop strings need a tokenizer; this engine was started with "
                                  "skip_tokenizer_init: use stop_token_ids instead")
