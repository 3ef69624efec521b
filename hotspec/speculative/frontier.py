"""The draft loop's frontier step: from a frontier's k*k children, the next frontier.

Draft step s expands each of the k frontier nodes of every request into its k best children
(top-k of the head's log-probabilities). The children's scores are the parent's score plus their
own log-probability; the next frontier is the k best children, and it inherits its parents'
feature rows and attention-mask rows (a node sees its ancestors' scratch KV), plus its own slot
for the next step:

    c_score[b, i*k + c] = f_score[b, i] + logp[b*k + i, c]                          [B, k*k]
    j = top-k(c_score[b])  (descending; ties to the smaller index)                   [B, k]
    next: score = c_score[j], token = ids[j], global index = j + base,
          feature = h_feat[b*k + j // k], mask = f_mask[b, j // k] | owns_next

In torch that is about ten small kernels, in a loop that is launch-bound; on CUDA it is one Triton
program per request (speculative/frontier_kernel.py). Dispatch through layers/fused.py's policy.
"""

from __future__ import annotations

import torch

from hotspec.layers import fused

Frontier = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def next_frontier_torch(f_score: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor,
                        h_feat: torch.Tensor, f_mask: torch.Tensor, owns_next: torch.Tensor,
                        base: int) -> Frontier:
    """f_score [B, k] f32, logp/ids [B*k, k], h_feat [B*k, H], f_mask [B, k, M] bool, owns_next
    [k, M] bool -> (c_score [B, k*k], score [B, k], token [B, k], global [B, k], feature
    [B*k, H], mask [B, k, M])."""
    b, k = f_score.shape
    c_score = (f_score.unsqueeze(2) + logp.view(b, k, k)).view(b, k * k)
    j = torch.topk(c_score, k, dim=1).indices
    parent = j // k
    feat = torch.gather(h_feat.view(b, k, -1), 1, parent.unsqueeze(2).expand(b, k, h_feat.shape[-1]))
    mask = torch.gather(f_mask, 1, parent.unsqueeze(2).expand(b, k, f_mask.shape[2])) | owns_next
    return (c_score, torch.gather(c_score, 1, j), torch.gather(ids.view(b, k * k), 1, j), j + base,
            feat.reshape(b * k, -1), mask)


def next_frontier(f_score: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor,
                  h_feat: torch.Tensor, f_mask: torch.Tensor, owns_next: torch.Tensor,
                  base: int) -> Frontier:
    """As `next_frontier_torch`; one kernel on CUDA."""
    if fused.enabled(h_feat) and h_feat.stride(1) == 1:
        from hotspec.speculative.frontier_kernel import next_frontier as kernel

        return kernel(f_score, logp, ids, h_feat, f_mask, owns_next, base)
    return next_frontier_torch(f_score, logp, ids, h_feat, f_mask, owns_next, base)
