"""The draft loop's frontier step (spec/frontier.py): the Triton kernel against the torch code it
replaces, on the CPU in Triton's interpreter at small shapes and on CUDA at real ones."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.speculative.frontier import next_frontier_torch  # noqa: E402
from hotspec.speculative.frontier_kernel import next_frontier  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _check(b: int, k: int, h: int, m: int, dtype: torch.dtype) -> None:
    g = torch.Generator(device=DEV).manual_seed(b * 100 + k)
    f_score = -torch.rand(b, k, device=DEV, generator=g) * 5
    logp = -torch.rand(b * k, k, device=DEV, generator=g) * 5  # distinct: no ties to order
    ids = torch.randint(0, 50_000, (b * k, k), device=DEV, generator=g)
    h_feat = torch.randn(b * k, h, device=DEV, generator=g).to(dtype)
    f_mask = torch.rand(b, k, m, device=DEV, generator=g) < 0.3
    owns = torch.rand(k, m, device=DEV, generator=g) < 0.2
    ref = next_frontier_torch(f_score, logp, ids, h_feat, f_mask, owns, 17)
    out = next_frontier(f_score, logp, ids, h_feat, f_mask, owns, 17)
    names = ("child scores", "scores", "tokens", "global indices", "features", "masks")
    for name, a, r in zip(names, out, ref):
        assert a.dtype == r.dtype and a.shape == r.shape, name
        assert torch.equal(a, r), f"{name} differ"


@pytest.mark.parametrize("b,k,h,m", [(1, 8, 40, 24), (3, 4, 33, 12), (2, 1, 16, 4), (2, 10, 20, 90)])
def test_frontier_kernel_matches_torch(b, k, h, m):
    _check(b, k, h, m, torch.float32)


def test_frontier_kernel_copies_bf16_features_exactly():
    _check(2, 8, 48, 40, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 16, 64])
@pytest.mark.parametrize("k,h,m", [(8, 576, 40), (10, 4096, 90), (1, 576, 5)])
def test_frontier_kernel_real_shapes(b, k, h, m):
    _check(b, k, h, m, torch.bfloat16)


def test_frontier_kernel_nan_scores_pick_real_children():
    """A row of NaN scores (NaN log-probabilities from NaN draft logits, as topk_logp now keeps
    them) still picks k distinct children in range, so the tokens, features and masks it gathers
    are real rows; a row with some NaNs picks among the others, best first."""
    b, k, h, m = 2, 4, 16, 12
    g = torch.Generator(device=DEV).manual_seed(3)
    f_score = -torch.rand(b, k, device=DEV, generator=g) * 5
    logp = -torch.rand(b * k, k, device=DEV, generator=g) * 5
    logp[:k] = float("nan")  # request 0: every child NaN
    logp[k, :2] = float("nan")  # request 1: two children of its first parent NaN
    ids = torch.randint(0, 50_000, (b * k, k), device=DEV, generator=g)
    h_feat = torch.randn(b * k, h, device=DEV, generator=g)
    f_mask = torch.rand(b, k, m, device=DEV, generator=g) < 0.3
    owns = torch.rand(k, m, device=DEV, generator=g) < 0.2
    out = next_frontier(f_score, logp, ids, h_feat, f_mask, owns, 17)
    glob = out[3] - 17
    assert ((glob >= 0) & (glob < k * k)).all()
    assert glob[0].tolist() == [0, 1, 2, 3] and out[1][0].isnan().all()
    score1 = (f_score[1].repeat_interleave(k) + logp[k:].reshape(-1)).nan_to_num(float("-inf"))
    assert torch.equal(glob[1], torch.topk(score1, k).indices)
    assert torch.equal(out[2], ids.view(b, k * k).gather(1, glob))
