"""Greedy tree acceptance without a walk (spec/verify.py) equals the node-by-node walk on random
trees whose drafts often match the target, at every depth."""

from __future__ import annotations

import pytest
import torch

from hotspec.speculative.tree import build_tree
from hotspec.speculative.verify import _walk, verify_greedy

pytestmark = pytest.mark.usefixtures("one_thread")


def walked(tree, logits, max_depth):  # type: ignore[no-untyped-def]
    """The reference: visit nodes in index order, accept a child of the current node that matches."""
    pred = logits.argmax(-1)
    match = tree.tokens == torch.gather(pred, 1, tree.parents)
    cur, path = _walk(tree, max_depth, lambda j, _: match[:, j])
    accept_len = torch.gather(tree.depth, 1, cur.unsqueeze(1)).squeeze(1) + 1
    return path, accept_len, pred.gather(1, cur.unsqueeze(1))[:, 0]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [(4, 1, 5), (6, 8, 16), (3, 4, 10)])
def test_greedy_acceptance_equals_the_walk(seed: int, shape: tuple[int, int, int]) -> None:
    steps, k, n = shape
    g = torch.Generator().manual_seed(seed)
    b, vocab = 64, 12
    # Candidates in the draft loop's global order: k at depth 1, then k*k per step from k parents.
    scores, tokens, parents = [], [], []
    front = torch.zeros(b, k)
    front_idx = None
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
    tree = build_tree(torch.randint(0, vocab, (b,), generator=g), torch.cat(scores, 1),
                      torch.cat(tokens, 1), torch.cat(parents, 1), n, steps)
    # The target's argmax at a node is mostly the token of one of its children (a good draft).
    logits = torch.randn(b, n, vocab, generator=g)
    for i in range(b):
        for j in range(n):
            children = (tree.parents[i] == j).nonzero().view(-1)
            children = children[children != 0]
            if len(children) and torch.rand(1, generator=g) < 0.8:
                c = children[torch.randint(len(children), (1,), generator=g)]
                logits[i, j, tree.tokens[i, c]] += 10.0
    acc = verify_greedy(tree, logits, steps)
    path, accept_len, bonus = walked(tree, logits, steps)
    assert torch.equal(acc.accept_len, accept_len)
    assert torch.equal(acc.path, path)
    assert torch.equal(acc.bonus, bonus)
    assert accept_len.max() > 2  # the cases exercise deep paths


def test_acceptance_by_depth_from_the_histogram():
    """Accept lengths 1 (only the root's bonus), 2 and 4: depth 1 is reached by every pass and
    accepted by two; depth 2 reached by two and accepted by one; depth 3 by one and one."""
    from collections import Counter

    from hotspec.speculative.stats import SpecStats

    stats = SpecStats(accept_hist=Counter({1: 3, 2: 1, 4: 1}))
    assert stats.acceptance_by_depth() == [(1, 5, 2), (2, 2, 1), (3, 1, 1)]
    assert SpecStats().acceptance_by_depth() == []
