"""The draft loop's frontier step (spec/frontier.py): the Triton kernel against the torch code it
replaces, on the CPU in Triton's interpreter at small shapes and on CUDA at real ones."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.spec.frontier import next_frontier_torch  # noqa: E402
from hotspec.spec.frontier_kernel import next_frontier  # noqa: E402

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
