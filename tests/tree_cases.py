"""Random draft candidates in the draft loop's global order, and trees whose drafts often match."""

from __future__ import annotations

import torch


def candidates(b: int, steps: int, k: int, vocab: int, g: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, tokens, parents) [B, G]: k candidates at depth 1, then k*k per later step, the
    children of the k best of the step before (parents: global indices, -1 at depth 1)."""
    scores, tokens, parents = [], [], []
    front = torch.zeros(b, k)
    front_idx = torch.zeros(b, k, dtype=torch.long)
    offset = 0
    for s in range(steps):
        width = k if s == 0 else k * k
        logp = -torch.rand(b, width, generator=g) - 1e-3
        tok = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(b * (width // k))])
        tokens.append(tok.view(b, width))
        if s == 0:
            sc, par = logp, torch.full((b, k), -1)
        else:
            sc = front.repeat_interleave(k, 1) + logp
            par = front_idx.repeat_interleave(k, 1)
        scores.append(sc)
        parents.append(par)
        pick = torch.topk(sc, k, dim=1).indices
        front, front_idx = sc.gather(1, pick), offset + pick
        offset += width
    return torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1)


def matching_logits(tree, vocab: int, g: torch.Generator, p: float = 0.8) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """[B, N, V] logits whose argmax at a node is, with probability p, one of its children's tokens."""
    b, n = tree.tokens.shape
    logits = torch.randn(b, n, vocab, generator=g)
    for i in range(b):
        for j in range(n):
            children = (tree.parents[i] == j).nonzero().view(-1)
            children = children[children != 0]
            if len(children) and torch.rand(1, generator=g) < p:
                c = children[torch.randint(len(children), (1,), generator=g)]
                logits[i, j, tree.tokens[i, c]] += 10.0
    return logits
