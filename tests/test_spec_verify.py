"""Greedy tree acceptance without a walk (spec/verify.py) equals the node-by-node walk on random
trees whose drafts often match the target, at every depth."""

from __future__ import annotations

import pytest
import torch
from tree_cases import candidates, matching_logits

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
    scores, tokens, parents = candidates(b, steps, k, vocab, g)
    tree = build_tree(torch.randint(0, vocab, (b,), generator=g), scores, tokens, parents, n, steps)
    # The target's argmax at a node is mostly the token of one of its children (a good draft).
    logits = matching_logits(tree, vocab, g)
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

    from hotspec.core.spec_stats import SpecStats

    stats = SpecStats(accept_hist=Counter({1: 3, 2: 1, 4: 1}))
    assert stats.acceptance_by_depth() == [(1, 5, 2), (2, 2, 1), (3, 1, 1)]
    assert SpecStats().acceptance_by_depth() == []
    assert SpecStats(accept_hist=Counter({1: 4})).acceptance_by_depth() == [(1, 4, 0)]
