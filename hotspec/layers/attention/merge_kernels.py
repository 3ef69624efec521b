"""Merging the kv splits of flash-decoding (layers/attention/triton_kernels.py, SPLIT): each split
wrote its normalised partial output and log2-sum-exp; the merged row weights each partial by
2^(lse_s - max), over their sum. A split that saw no keys (lse -inf: past the live length)
weighs 0, and its partial is not read.
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
