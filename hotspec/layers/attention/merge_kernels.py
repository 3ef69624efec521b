"""Merging the kv splits of flash-decoding (layers/attention/triton_kernels.py, SPLIT): each split
wrote its normalised partial output and log2-sum-exp; the merged row weights each partial by
2^(lse_s - max), over their sum.

Two ways to run it, one formula:
  * `combine_splits`, a kernel after the attention kernel (every phase with splits);
  * fused (decode, HOTSPEC_ATTN_FUSED_COMBINE): the attention program of a (request, kv head)
    that finishes last merges that kv head's query heads itself, all of them in one set of loads
    (`merge_group`; triton_kernels.paged_attn_fwd, FUSE), which saves a kernel boundary per layer.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hotspec.layers import pdl


@triton.jit
def merge_row(OPART, LSE, OUT, t, hq, stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,
              stride_ot, stride_oh, num_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """Merge the num_splits partial outputs of (token t, q head hq) into OUT."""
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    l_ptrs = LSE + s * stride_ls + t * stride_lt + hq
    o_ptrs = OPART + s[:, None] * stride_ps + t * stride_pt + hq * stride_ph + d[None, :]
    o_ok = s_ok[:, None] & d_ok[None, :]
    lse = tl.load(l_ptrs, mask=s_ok, other=float("-inf"))
    o = tl.load(o_ptrs, mask=o_ok, other=0.0)
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx)
    w_sum = tl.sum(w, 0)
    w_sum = tl.where(w_sum == 0.0, 1.0, w_sum)
    out = tl.sum(o * w[:, None], 0) / w_sum
    tl.store(OUT + t * stride_ot + hq * stride_oh + d, out.to(OUT.dtype.element_ty), mask=d_ok)


@triton.jit
def merge_group(OPART, LSE, OUT, t, h0, stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,
                stride_ot, stride_oh, num_splits, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """merge_row for the GROUP query heads h0, h0 + 1, ... of token t at once ([GROUP_PAD,
    BLOCK_S, BLOCK_D] partials in registers: one round of loads, not GROUP), read past L1 (other
    programs of the same kernel wrote them). The same formula; the sums may round differently."""
    g = tl.arange(0, GROUP_PAD)
    g_ok = g < GROUP
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    hq = h0 + g
    gs_ok = g_ok[:, None] & s_ok[None, :]
    lse = tl.load(LSE + s[None, :] * stride_ls + t * stride_lt + hq[:, None], mask=gs_ok,
                  other=float("-inf"), cache_modifier=".cg")
    o = tl.load(OPART + s[None, :, None] * stride_ps + t * stride_pt + hq[:, None, None] * stride_ph
                + d[None, None, :], mask=gs_ok[:, :, None] & d_ok[None, None, :], other=0.0,
                cache_modifier=".cg")
    mx = tl.max(lse, 1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx[:, None])
    w_sum = tl.sum(w, 1)
    w_sum = tl.where(w_sum == 0.0, 1.0, w_sum)
    out = tl.sum(o * w[:, :, None], 1) / w_sum[:, None]
    tl.store(OUT + t * stride_ot + hq[:, None] * stride_oh + d[None, :],
             out.to(OUT.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def combine_splits(
    OPART, LSE, OUT,
    stride_ps, stride_pt, stride_ph, stride_ls, stride_lt, stride_ot, stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False,
):
    """Merge the per-split partial outputs of one (token, q head): weights 2^(lse_s - max)."""
    pdl.launch_dependents(PDL)  # the kernel after it (o_proj's GEMV) may launch now
    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this
    merge_row(OPART, LSE, OUT, tl.program_id(0).to(tl.int64), tl.program_id(1), stride_ps,
              stride_pt, stride_ph, stride_ls, stride_lt, stride_ot, stride_oh, num_splits,
              HEAD_DIM, BLOCK_S, BLOCK_D)
