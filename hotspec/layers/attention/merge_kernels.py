"""Merging the kv splits of flash-decoding (layers/attention/triton_kernels.py, SPLIT): each split
wrote its normalised partial output and log2-sum-exp; the merged row weights each partial by
2^(lse_s - max), over their sum. A split that saw no keys (lse -inf: past the live length)
weighs 0, and its partial is not read.

The deterministic mode merges otherwise: the splits one after another in split order
(`merge_weights`, `combine_splits_seq`), the same arithmetic as its attention kernel's in-program
merge of a prefill row's chunks, so a row's output is the same bits whether its chunks ran as
splits (decode, verify) or in one program (prefill), and however many splits the batch launched.
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
def merge_weights(mx, lse):
    """One step of the deterministic mode's merge, for the running max `mx` and the next chunk's
    log2-sum-exp `lse`: (the new max, the weight of what is merged so far, the chunk's weight).
    The caller then does osum = osum * a + o * w and wsum = wsum * a + w (no FMA contraction:
    the mode compiles without it), and finally osum / wsum. A chunk without keys (lse -inf)
    changes nothing: a = 1, w = 0."""
    new = tl.maximum(mx, lse)
    safe = tl.where(new == float("-inf"), 0.0, new)
    return new, tl.exp2(mx - safe), tl.exp2(lse - safe)


@triton.jit
def combine_splits_seq(
    OPART, LSE, OUT,
    stride_ps, stride_pt: tl.constexpr, stride_ph: tl.constexpr, stride_ls, stride_lt: tl.constexpr,
    stride_ot: tl.constexpr, stride_oh: tl.constexpr,
    num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_S: tl.constexpr,
    PDL: tl.constexpr = False, PDL_WAIT: tl.constexpr = False,
):
    """The deterministic mode's merge of one (token, q head): its live splits (those before the
    last with keys) in split order, GROUP_S partials loaded at once, each merged by
    `merge_weights`."""
    pdl.launch_dependents(PDL)
    pdl.wait(PDL_WAIT)
    t = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    lse_all = tl.load(LSE + s * stride_ls + t * stride_lt + hq, mask=s < num_splits,
                      other=float("-inf"))
    live = tl.max(tl.where(lse_all > float("-inf"), s + 1, 0), 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    mx = tl.max(tl.full([BLOCK_S], float("-inf"), dtype=tl.float32), 0)
    wsum = tl.sum(tl.zeros([BLOCK_S], dtype=tl.float32), 0)
    osum = tl.zeros([BLOCK_D], dtype=tl.float32)
    for base in range(0, live, GROUP_S):
        for j in tl.static_range(GROUP_S):
            sp = base + j
            ok = sp < live
            lse = tl.load(LSE + sp * stride_ls + t * stride_lt + hq, mask=ok, other=float("-inf"))
            o = tl.load(OPART + sp * stride_ps + t * stride_pt + hq * stride_ph + d,
                        mask=d_ok & ok, other=0.0)
            o = tl.where(lse > float("-inf"), o, 0.0)  # (a split without keys wrote no partial)
            mx, a, w = merge_weights(mx, lse)
            osum = osum * a + o * w
            wsum = wsum * a + w
    out = osum / tl.where(wsum == 0.0, 1.0, wsum)
    tl.store(OUT + t * stride_ot + hq * stride_oh + d, out.to(OUT.dtype.element_ty), mask=d_ok)
