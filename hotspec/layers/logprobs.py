"""Log-probabilities of chosen tokens and the most likely alternatives, inside a step's graph:
the raw target distribution (log_softmax of the float32 logits, core/logprobs.py) at every
emitted position, computed by each program's `[logprobs]` graphs, which run only the steps where
a request asks (`SamplingParams.logprobs`)."""

from __future__ import annotations

import torch

from hotspec.core.logprobs import MAX_LOGPROBS


def token_logprobs(logits: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V], chosen [R] long -> ([R, 1 + MAX_LOGPROBS] float32: the chosen token's
    logprob, then the top alternatives' best first; [R, MAX_LOGPROBS] long: their ids). A
    vocabulary smaller than MAX_LOGPROBS pads with -inf and id -1."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    k = min(MAX_LOGPROBS, lp.shape[-1])
    top_lp, top_ids = lp.topk(k, dim=-1)
    if k < MAX_LOGPROBS:
        pad = MAX_LOGPROBS - k
        top_lp = torch.cat([top_lp, top_lp.new_full((lp.shape[0], pad), float("-inf"))], 1)
        top_ids = torch.cat([top_ids, top_ids.new_full((lp.shape[0], pad), -1)], 1)
    return torch.cat([lp.gather(1, chosen.view(-1, 1)), top_lp], 1), top_ids
