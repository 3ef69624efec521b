"""Merging the kv splits of flash-decoding (layers/attention/triton_kernels.py, SPLIT): each split
wrote its normalised partial output and log2-sum-exp; the merged row weights each partial by
2^(lse_s - max), over their sum. A split that saw no keys (lse -inf: past the live length)
weighs 0, and its partial is not read.

Two places merge: `combine_splits`, a kernel of its own (one program per token and query head),
and `merge_tile`, called by the attention program that finishes a tile's splits last (MERGE:
no second kernel; the split programs count themselves in on a per-tile counter).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hotspec.layers import pdl


@triton.jit
def combine_splits(
    OPART, LSE, OUT,
    stride_ps, stride_pt: tl.constexpr, stride_ph: tl.constexpr, stride_ls, stride_lt: tl.constexpr,
    stride_ot: tl.constexpr, stride_oh: tl.constexpr,
    num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False,
):
    """Merge the per-split partial outputs of one (token, q head): weights 2^(lse_s - max)."""
    pdl.launch_dependents(PDL)  # the kernel after it (o_proj's GEMV) may launch now
    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this
    t = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    l_ptrs = LSE + s * stride_ls + t * stride_lt + hq
    o_ptrs = OPART + s[:, None] * stride_ps + t * stride_pt + hq * stride_ph + d[None, :]
    lse = tl.load(l_ptrs, mask=s_ok, other=float("-inf"))
    o_ok = (s_ok & (lse > float("-inf")))[:, None] & d_ok[None, :]
    o = tl.load(o_ptrs, mask=o_ok, other=0.0)
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx)
    w_sum = tl.sum(w, 0)
    w_sum = tl.where(w_sum == 0.0, 1.0, w_sum)
    out = tl.sum(o * w[:, None], 0) / w_sum
    tl.store(OUT + t * stride_ot + hq * stride_oh + d, out.to(OUT.dtype.element_ty), mask=d_ok)


@triton.jit
def merge_tile(OPART, LSE, OUT, tok, head, row_ok, d, d_ok, num_splits, stride_ps, stride_pt,
               stride_ph, stride_ls, stride_lt, stride_ot, stride_oh):
    """Merge the num_splits partials of a tile's rows (token `tok`, query head `head`, [BLOCK_M])
    into OUT, weighing as combine_splits does. The partials were written by other programs of
    this launch: read through L2 (.cg), after the counter's acquire."""
    mx = tl.full(tok.shape, float("-inf"), tl.float32)
    for s in range(0, num_splits):
        lse = tl.load(LSE + s * stride_ls + tok * stride_lt + head, mask=row_ok,
                      other=float("-inf"), cache_modifier=".cg")
        mx = tl.maximum(mx, lse)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w_sum = tl.zeros(tok.shape, tl.float32)
    acc = tl.zeros([tok.shape[0], d.shape[0]], tl.float32)
    for s in range(0, num_splits):
        lse = tl.load(LSE + s * stride_ls + tok * stride_lt + head, mask=row_ok,
                      other=float("-inf"), cache_modifier=".cg")
        ok = (row_ok & (lse > float("-inf")))[:, None] & d_ok[None, :]
        o = tl.load(OPART + s * stride_ps + tok[:, None] * stride_pt + head[:, None] * stride_ph
                    + d[None, :], mask=ok, other=0.0, cache_modifier=".cg")
        w = tl.exp2(lse - mx)
        w_sum += w
        acc += o * w[:, None]
    w_sum = tl.where(w_sum == 0.0, 1.0, w_sum)
    out = acc / w_sum[:, None]
    tl.store(OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
