"""The Triton kernel of speculative/frontier.py: one program per request computes its k*k child scores,
selects the k best (k passes over at most 256 values in registers, each the largest (value,
smallest index) pair strictly after the previous pick) and copies each pick's score, token,
global index, parent feature row and parent mask row (| its own next slot)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.speculative.frontier import Frontier


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _frontier_kernel(F_SCORE, LOGP, IDS, H_FEAT, F_MASK, OWNS, C_SCORE, N_SCORE, N_TOK, N_GLOBAL,
                     N_FEAT, N_MASK, base, H, M, stride_h, stride_nh,
                     K: tl.constexpr, KK: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_M: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, KK)
    valid = c < K * K
    parent_of = c // K
    f = tl.load(F_SCORE + b * K + parent_of, mask=valid, other=0.0)
    lp = tl.load(LOGP + b * K * K + c, mask=valid, other=0.0)
    score = f + lp
    tl.store(C_SCORE + b * K * K + c, score, mask=valid)
    raw = score
    # a NaN score (a padded row's NaN logits) ranks as -inf, so every pick is a real child
    # (layers/fused_kernels._topk_logp_kernel does the same); the pick keeps its own score
    score = tl.where(valid & (score == score), score, float("-inf"))
    hcols = tl.arange(0, BLOCK_H)
    mcols = tl.arange(0, BLOCK_M)
    pv = tl.max(tl.full((KK,), float("inf"), tl.float32), 0)
    pi = tl.min(tl.full((KK,), -1, tl.int32), 0)
    for jj in tl.static_range(K):
        ok = valid & ((score < pv) | ((score == pv) & (c > pi)))
        sv = tl.where(ok, score, float("-inf"))
        bv = tl.max(sv, 0)
        bi = tl.min(tl.where(ok & (sv == bv), c, 2147483647), 0)
        parent = bi // K
        tl.store(N_SCORE + b * K + jj, tl.sum(tl.where(c == bi, raw, 0.0), 0))
        tl.store(N_TOK + b * K + jj, tl.load(IDS + b * K * K + bi))
        tl.store(N_GLOBAL + b * K + jj, bi.to(tl.int64) + base)
        row = tl.load(H_FEAT + (b * K + parent) * stride_h + hcols, mask=hcols < H)
        tl.store(N_FEAT + (b * K + jj) * stride_nh + hcols, row, mask=hcols < H)
        pm = tl.load(F_MASK + (b * K + parent) * M + mcols, mask=mcols < M, other=0)
        own = tl.load(OWNS + jj * M + mcols, mask=mcols < M, other=0)
        tl.store(N_MASK + (b * K + jj) * M + mcols, pm | own, mask=mcols < M)
        pv = bv
        pi = bi


def next_frontier(f_score: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor,
                  h_feat: torch.Tensor, f_mask: torch.Tensor, owns_next: torch.Tensor, base: int
                  ) -> Frontier:
    """As speculative/frontier.py's next_frontier_torch (same shapes and dtypes)."""
    b, k = f_score.shape
    hdim = h_feat.shape[1]
    m = f_mask.shape[2]
    dev = f_score.device
    f_score, logp, ids = f_score.contiguous(), logp.contiguous(), ids.contiguous()
    f_mask, owns_next = f_mask.contiguous(), owns_next.contiguous()
    c_score = torch.empty((b, k * k), dtype=torch.float32, device=dev)
    n_score = torch.empty((b, k), dtype=torch.float32, device=dev)
    n_tok = torch.empty((b, k), dtype=torch.long, device=dev)
    n_global = torch.empty((b, k), dtype=torch.long, device=dev)
    n_feat = torch.empty((b * k, hdim), dtype=h_feat.dtype, device=dev)
    n_mask = torch.empty((b, k, m), dtype=torch.bool, device=dev)
    if b:
        _frontier_kernel[(b,)](
            f_score, logp, ids, h_feat, f_mask.view(torch.uint8), owns_next.view(torch.uint8),
            c_score, n_score, n_tok, n_global, n_feat, n_mask.view(torch.uint8), base, hdim, m,
            h_feat.stride(0), n_feat.stride(0), K=k, KK=_pow2(k * k), BLOCK_H=_pow2(hdim),
            BLOCK_M=_pow2(max(m, 1)), num_warps=4)
    return c_score, n_score, n_tok, n_global, n_feat, n_mask
