"""The trainer's TTT attention (no dense mask) equals scaled_dot_product_attention over the dense
TTT mask, in value and in gradient, with GQA and every unroll depth."""

from __future__ import annotations

import pytest
import torch

from hotspec.training.head_forward import dense_ttt_attention, ttt_attention

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("steps", [1, 2, 5])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])
def test_ttt_attention_equals_dense_mask(steps: int, heads: tuple[int, int]) -> None:
    hq, hk = heads
    g = torch.Generator().manual_seed(steps * 10 + hq)
    b, t, d = 2, 9, 8
    # [B, T, Hq, D] transposed, as the head's projections give it (not contiguous)
    q_leaf = torch.randn(b, t, hq, d, generator=g, dtype=torch.float64, requires_grad=True)
    q = q_leaf.transpose(1, 2)
    cache = [(torch.randn(b, hk, t, d, generator=g, dtype=torch.float64, requires_grad=True),
              torch.randn(b, hk, t, d, generator=g, dtype=torch.float64, requires_grad=True))
             for _ in range(steps)]
    leaves = [q_leaf] + [x for kv in cache for x in kv]
    w = torch.randn(b, hq, t, d, generator=g, dtype=torch.float64)

    fast = ttt_attention(q, cache, 0.3)
    grads_fast = torch.autograd.grad((fast * w).sum(), leaves)
    ref = dense_ttt_attention(q, cache, 0.3)
    grads_ref = torch.autograd.grad((ref * w).sum(), leaves)

    torch.testing.assert_close(fast, ref)
    for a, r in zip(grads_fast, grads_ref):
        torch.testing.assert_close(a, r)


def test_ttt_attention_keeps_no_score_matrix_for_backward() -> None:
    """Under autograd the [B, Hq, T, T] scores are recomputed in backward, not saved: the tensors
    kept for backward hold O(B * H * T * D) elements, whatever T."""
    b, hq, hk, t, d, steps = 2, 4, 2, 64, 8, 3
    q = torch.randn(b, hq, t, d, dtype=torch.float64, requires_grad=True)
    cache = [(torch.randn(b, hk, t, d, dtype=torch.float64, requires_grad=True),
              torch.randn(b, hk, t, d, dtype=torch.float64, requires_grad=True))
             for _ in range(steps)]
    saved: list[int] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = ttt_attention(q, cache, 0.3)
    assert saved and max(saved) <= b * hq * t * d < b * hq * t * t
    leaves = [q] + [x for kv in cache for x in kv]
    ref = torch.autograd.grad(dense_ttt_attention(q, cache, 0.3).sum(), leaves)
    cache.append((torch.zeros_like(cache[0][0]), torch.zeros_like(cache[0][1])))  # the next step's
    # the recomputation in backward sees the steps of the forward, not those appended since
    for a, r in zip(torch.autograd.grad(out.sum(), leaves), ref):
        torch.testing.assert_close(a, r)
