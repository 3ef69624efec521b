"""Verification: which drafted tokens the target accepts, and the bonus token after them.

Both rules walk the tree nodes in index order (parents before children). `cur` is the deepest
accepted node; a node is a candidate when its parent is `cur`.

Greedy: accept child x iff x == argmax p(. | path to cur). The output is the target's own greedy
continuation, longest matching path plus the target's argmax after it (the bonus token).

Stochastic (tree rejection sampling, SpecInfer / EAGLE): let r be the residual distribution at
`cur`, initially the shaped target distribution p(. | path). The draft proposes each child
deterministically (top-k), i.e. with q = delta_x. For each child x in order:
    accept with probability min(1, r(x) / q(x)) = r(x);     then r := p(. | path + x) and descend
    on rejection, r := norm(max(r - q, 0)), i.e. remove x from r and renormalise.
When no child remains, the bonus token is drawn from r. Each emitted token is therefore an exact
draw from the target distribution (greedy rows are the special case r = one-hot(argmax)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotspec.layers import fused
from hotspec.layers.argmax import argmax
from hotspec.layers.sampler import random_uniform, sample_from_probs
from hotspec.speculative.tree import KERNEL_MAX_NODES, DraftTree

STREAM_COIN, STREAM_BONUS = 1, 2


@dataclass
class Acceptance:
    path: torch.Tensor  # [B, D+1] tree indices of accepted nodes (root first), 0-padded
    accept_len: torch.Tensor  # [B] accepted nodes incl. the root = tokens emitted this step
    bonus: torch.Tensor  # [B] the target's token after the accepted path


def _walk(tree: DraftTree, max_depth: int, accept_fn) -> tuple[torch.Tensor, torch.Tensor]:
    b, n = tree.tokens.shape
    dev = tree.tokens.device
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    path = torch.zeros(b, max_depth + 1, dtype=torch.long, device=dev)
    for j in range(1, n):
        candidate = tree.parents[:, j] == cur
        ok = candidate & accept_fn(j, candidate)
        jj = torch.full_like(cur, j)
        cur = torch.where(ok, jj, cur)
        d = tree.depth[:, j : j + 1]
        path.scatter_(1, d, torch.where(ok.unsqueeze(1), jj.unsqueeze(1), path.gather(1, d)))
    return cur, path


@dataclass
class Commit:
    """The verdict with what the KV commit and draft_extend need of it, per path position d < W."""

    acc: Acceptance
    tokens: torch.Tensor  # [B, W] the path's tokens (the root's past the accepted length)
    src: torch.Tensor  # [B, W] KV slot of path node d (the trash slot past the accepted length)
    dst: torch.Tensor  # [B, W] KV slot of seq + d (likewise)


def commit_rows(tree: DraftTree, acc: Acceptance, slots: torch.Tensor, trash: int) -> Commit:
    """The commit of `acc`: slots [B, >= W] are those of kv indices seq + 0, 1, ..."""
    w = acc.path.shape[1]
    keep = torch.arange(w, device=slots.device).unsqueeze(0) < acc.accept_len.unsqueeze(1)
    src = torch.where(keep, torch.gather(slots, 1, acc.path), trash)
    dst = torch.where(keep, slots[:, :w], trash)
    return Commit(acc, torch.gather(tree.tokens, 1, acc.path), src, dst)


def greedy_accept(tree: DraftTree, pred: torch.Tensor, slots: torch.Tensor, trash: int,
                  max_depth: int) -> Commit:
    """verify_greedy from the target's argmax `pred` [B, N] at every node, and its commit_rows:
    one kernel on CUDA (speculative/accept_kernel.py) for trees of at most 64 nodes."""
    if fused.enabled(pred) and tree.num_nodes <= KERNEL_MAX_NODES and slots.stride(1) == 1:
        from hotspec.speculative.accept_kernel import greedy_accept as kernel

        path, a, bonus, tokens, src, dst = kernel(pred, tree.tokens, tree.parents, tree.depth,
                                                  tree.mask, slots, trash, max_depth)
        return Commit(Acceptance(path, a, bonus), tokens, src, dst)
    return commit_rows(tree, verify_greedy(tree, pred, max_depth, argmaxed=True), slots, trash)


def verify_greedy(tree: DraftTree, logits: torch.Tensor, max_depth: int,
                  argmaxed: bool = False) -> Acceptance:
    """logits: [B, N, V] target logits at every tree node (argmaxed: their argmax [B, N]).

    No walk: node j is on the accepted path iff it and every ancestor match the target's argmax
    after their parent (one `any` over the tree mask). Siblings carry distinct tokens, so at most
    one node per depth qualifies and the deepest one ends the path `_walk` would find, in a
    handful of kernels instead of about eight per node."""
    pred = logits if argmaxed else argmax(logits)  # [B, N]
    b, n = tree.tokens.shape
    match = tree.tokens == torch.gather(pred, 1, tree.parents)
    match[:, 0] = True  # the root is committed already
    ok = ~(tree.mask & ~match.unsqueeze(1)).any(-1)  # [B, N]: the whole path to j matches
    cur = torch.where(ok, tree.depth, -1).argmax(1)  # the deepest such node
    on_path = torch.gather(tree.mask, 1, cur.view(b, 1, 1).expand(b, 1, n)).squeeze(1)
    # path[d] = the node of depth d on the path; other nodes land in a spare column, cut off.
    slot = torch.where(on_path, tree.depth.clamp(max=max_depth), max_depth + 1)
    nodes = torch.arange(n, device=pred.device).expand(b, n)
    path = torch.zeros(b, max_depth + 2, dtype=torch.long, device=pred.device).scatter_(1, slot, nodes)
    bonus = torch.gather(pred, 1, cur.unsqueeze(1)).squeeze(1)
    return Acceptance(path[:, :max_depth + 1], torch.gather(tree.depth, 1, cur.unsqueeze(1)).squeeze(1) + 1,
                      bonus)


def verify_stochastic(tree: DraftTree, probs: torch.Tensor, max_depth: int, seeds: torch.Tensor,
                      offsets: torch.Tensor) -> Acceptance:
    """probs: [B, N, V] shaped target distribution at every node (one-hot rows for greedy)."""
    n = tree.num_nodes
    coins = random_uniform(seeds, offsets, n, stream=STREAM_COIN)  # [B, N]
    residual = probs[:, 0].clone()

    def accept(j: int, candidate: torch.Tensor) -> torch.Tensor:
        nonlocal residual
        x = tree.tokens[:, j : j + 1]
        ok = candidate & (coins[:, j] < torch.gather(residual, 1, x).squeeze(1))
        rejected = residual.scatter(1, x, 0.0)
        rejected = rejected / rejected.sum(-1, keepdim=True).clamp_min(1e-30)
        residual = torch.where((candidate & ~ok).unsqueeze(1), rejected, residual)
        residual = torch.where(ok.unsqueeze(1), probs[:, j], residual)
        return ok

    cur, path = _walk(tree, max_depth, accept)
    bonus = sample_from_probs(residual, seeds, offsets, stream=STREAM_BONUS)
    return Acceptance(path, torch.gather(tree.depth, 1, cur.unsqueeze(1)).squeeze(1) + 1, bonus)
