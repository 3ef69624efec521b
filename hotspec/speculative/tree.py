"""EAGLE-2 dynamic draft tree: from scored candidates to the tree the target verifies.

Candidates come from the draft loop in global order: the `topk` depth-1 tokens, then `topk * topk`
children per later step. A child's score is its parent's score plus its own log-probability, so
scores strictly decrease along every path (log-probs are clamped below 0): the best N-1
candidates by score are ancestor-closed, and sorting them by global index puts every parent before
its children. Node 0 of the tree is the root (the last committed token, not yet in the KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotspec.layers import fused
from hotspec.runtime.phase_io import PhaseIO

# Log-probabilities are capped here so that a child never ties its parent's score.
MAX_LOGP = -1e-6
# The largest tree the CUDA kernels (tree_kernel, accept_kernel) take: a node's ancestor set is
# one int64 word; larger trees run torch.
KERNEL_MAX_NODES = 64


@dataclass(kw_only=True)
class DraftTree(PhaseIO):
    """What `draft` proposes and `verify` scores."""

    tokens: torch.Tensor  # [B, N] target token ids; column 0 is the root
    parents: torch.Tensor  # [B, N] tree index of the parent; the root's is 0 (itself)
    depth: torch.Tensor  # [B, N] 0 for the root
    mask: torch.Tensor  # [B, N, N] bool, node i attends to node j iff j is i or an ancestor of i

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def build_tree(root: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor,
               parents: torch.Tensor, num_draft_tokens: int, max_depth: int) -> DraftTree:
    """root: [B]; scores/tokens/parents: [B, G] candidates in global order (parents are global
    indices, -1 for depth-1 candidates). One kernel on CUDA (speculative/tree_kernel.py) for
    trees of at most 64 nodes, else torch."""
    if fused.enabled(scores) and num_draft_tokens <= KERNEL_MAX_NODES:
        from hotspec.speculative.tree_kernel import build_tree as kernel

        return kernel(root, scores, tokens, parents, num_draft_tokens, max_depth)
    return build_tree_torch(root, scores, tokens, parents, num_draft_tokens, max_depth)


def build_tree_torch(root: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor,
                     parents: torch.Tensor, num_draft_tokens: int, max_depth: int) -> DraftTree:
    """build_tree in torch ops: the CPU path, and the reference the kernel is tested against."""
    b, _ = scores.shape
    n = num_draft_tokens
    dev = scores.device
    sel = torch.topk(scores, n - 1, dim=1).indices.sort(dim=1).values  # [B, N-1]
    global_to_tree = torch.zeros_like(parents)
    global_to_tree.scatter_(1, sel, torch.arange(1, n, device=dev).expand(b, -1))
    par_global = torch.gather(parents, 1, sel)
    par_tree = torch.where(par_global < 0, 0, torch.gather(global_to_tree, 1, par_global.clamp(min=0)))
    tree_parents = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=dev), par_tree], dim=1)
    tree_tokens = torch.cat([root.view(b, 1), torch.gather(tokens, 1, sel)], dim=1)
    eye = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n)
    mask = eye
    rows = tree_parents.unsqueeze(-1).expand(b, n, n)
    for _ in range(max_depth):  # each pass adds one more generation of ancestors
        mask = eye | torch.gather(mask, 1, rows)
    depth = mask.sum(-1) - 1
    return DraftTree(tokens=tree_tokens, parents=tree_parents, depth=depth, mask=mask)
