"""Top-k of the draft head's log-probabilities in one kernel.

Every draft step (and draft_extend) picks the frontier's children with

    logp, idx = topk(log_softmax(logits), k);  logp = min(logp, max_logp)

(draft indices; DraftHead.to_target_ids maps them), which torch runs as about four kernels
(log-softmax, top-k values and indices, clamp). Inside the draft
loop's CUDA graph each launch costs a few microseconds while the work is a few KB, so on CUDA this
is one Triton program per row: an online log-sum-exp pass, then k selection passes, each taking
the largest (value, smallest index) strictly after the previous pick in that order. Ties therefore
go to the smaller draft index (torch.topk leaves their order unspecified); the draft only proposes,
so the choice among equal scores never changes what verification accepts.

`topk_logp` dispatches: the Triton kernel for CUDA tensors (layers/fused.py), else the torch code.
"""

from __future__ import annotations

import torch

from hotspec.layers import fused


def topk_logp_torch(logits: torch.Tensor, k: int, max_logp: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: (float32 [T, k] clamped log-probabilities, int64 [T, k] draft indices)."""
    top = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
    return top.values.clamp(max=max_logp), top.indices


def topk_logp(logits: torch.Tensor, k: int, max_logp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """As `topk_logp_torch`, for logits [T, V] of any float dtype."""
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"top-k of {k} over a draft vocabulary of {logits.shape[-1]}")
    if fused.enabled(logits) and logits.dim() == 2 and logits.stride(1) == 1:
        from hotspec.layers.fused_kernels import topk_logp as kernel

        return kernel(logits, k, max_logp)
    return topk_logp_torch(logits, k, max_logp)
