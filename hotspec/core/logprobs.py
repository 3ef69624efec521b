"""A generated token's log-probability under the target model, and its most likely alternatives:
what `SamplingParams.logprobs` asks for and the OpenAI API's `logprobs` return.

The values are the target's raw distribution at that position, log_softmax of its logits in
float32 before temperature, top-k, top-p or min-p (vLLM's default, "raw logprobs"), so a greedy
and a sampled request report the same numbers for the same text, and a speculative step reports
what plain decoding would (its verify pass scores every accepted token at the same position).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs allows


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    # the `logprobs` most likely tokens at this position, most likely first: (token id, logprob)
    top: tuple[tuple[int, float], ...] = ()


def token_logprob_rows(tokens: list[int], logprobs: list[list[float]], top_ids: list[list[int]],
                       n: int) -> list[TokenLogprob]:
    """A request's TokenLogprobs from a step's read-back rows (layers/logprobs.py's layout: per
    position the chosen token's logprob then the alternatives'), `n` alternatives each."""
    return [TokenLogprob(t, lp[0], tuple(zip(ids[:n], lp[1 : 1 + n])))
            for t, lp, ids in zip(tokens, logprobs, top_ids)]
