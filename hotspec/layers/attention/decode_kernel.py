"""A decode-only paged attention kernel without tensor cores (HOTSPEC_ATTN_DECODE=sum).

At decode a program owns one kv head h of request b (one query row) and one kv split. The general
kernel (triton_kernels.paged_attn_fwd) folds the GROUP query heads into the M side of an MMA tile
padded to 16 rows, so at GROUP = 4 three quarters of every dot are padding, and each tile goes
through shared memory for the MMA operand layouts. Here the scores and the weighted sum are plain
fp32 products summed in registers: s[g, n] = sum_d q[g, d] k[n, d] over a [GROUP, BLOCK_N,
HEAD_DIM] broadcast, and acc[g, d] += sum_n p[g, n] v[n, d]. Products of 16-bit inputs are exact
in fp32; the sums run in fp32, in another order than the MMA's, and p is not rounded to 16 bits
before the second sum, so the output differs from the MMA kernel's by rounding only.

Everything else is as paged_attn_fwd's decode path: the kv range [0, kv_len) read through the
block table (kv_len from the device), split into `num_splits` chunks computed on the device, each
split writing its normalised partial and log2-sum-exp for merge_kernels.combine_splits; with ROPE
the program whose chunk holds the new token rotates and stores that token's K and V first (the
fold, bit for bit as fused_kernels.rope_store), and q is rotated on load.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.layers.attention.triton_kernels import _rotate


@triton.jit
def paged_decode_fwd(
    Q, K, V, OUT, BT, KVL, OPART, LSE,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_bt, stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,
    scale_log2, num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, SPLIT: tl.constexpr,
    PDL: tl.constexpr = False, PDL_WAIT: tl.constexpr = False,
    ROPE: tl.constexpr = False, KN=None, VN=None, POS=None, LOC=None, COS=None, SIN=None,
    stride_knt=0, stride_knh=0, stride_vnt=0, stride_vnh=0, stride_cs=0,
):
    pdl.launch_dependents(PDL)  # the kernel after it (o_proj's GEMV) may launch now
    sp = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this

    kv_len = tl.load(KVL + b).to(tl.int32)
    tok = b.to(tl.int64)  # one query row per request
    g = tl.arange(0, GROUP_PAD)
    head = h * GROUP + g
    g_ok = g < GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    qd_ok = g_ok[:, None] & d_ok[None, :]
    q_row = Q + tok * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_row + d[None, :], mask=qd_ok, other=0.0)  # [G, D]
    if ROPE:  # q arrives unrotated: rotate it as fused_kernels.rope_store does
        pos = tl.load(POS + tok).to(tl.int64)
        q = _rotate(q, q_row, pos, COS, SIN, stride_cs, d[None, :], qd_ok, HEAD_DIM)
    q = q.to(tl.float32)

    if SPLIT:
        per = tl.cdiv(kv_len, num_splits)
        chunk = tl.cdiv(per, BLOCK_N) * BLOCK_N
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, kv_len)
    else:
        lo = 0
        hi = kv_len

    if ROPE:  # the program whose kv range holds the new token stores its K and V first
        new = kv_len - 1
        if (lo <= new) & (new < hi):
            slot = tl.load(LOC + tok).to(tl.int64)
            pos_new = tl.load(POS + tok).to(tl.int64)
            k_src = KN + tok * stride_knt + h * stride_knh
            kr = _rotate(tl.load(k_src + d, mask=d_ok, other=0.0), k_src, pos_new, COS, SIN,
                         stride_cs, d, d_ok, HEAD_DIM)
            tl.store(K + slot * stride_kt + h * stride_kh + d, kr.to(K.dtype.element_ty), mask=d_ok)
            vr = tl.load(VN + tok * stride_vnt + h * stride_vnh + d, mask=d_ok, other=0.0)
            tl.store(V + slot * stride_vt + h * stride_vh + d, vr.to(V.dtype.element_ty), mask=d_ok)
        tl.debug_barrier()  # the stores above are seen by this program's own loads below

    # Every tile is a 3-D tensor [G, N, D] (or one with size 1 in some of those) in the layout
    # of the K/V loads, so the two sums and the softmax need no layout conversion in the loop.
    bt_row = BT + b.to(tl.int64) * stride_bt
    k_base = K + h * stride_kh
    v_base = V + h * stride_vh
    n = tl.arange(0, BLOCK_N)
    d3 = d[None, None, :]
    q3 = q[:, None, :]  # [G, 1, D]
    m_i = tl.full([GROUP_PAD, 1, 1], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD, 1, 1], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, 1, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + n
        n_ok = offs < hi
        blk = tl.load(bt_row + offs // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = (blk * PAGE + (offs % PAGE))[None, :, None]  # [1, N, 1]
        kv_ok = n_ok[None, :, None] & (d3 < HEAD_DIM)
        k = tl.load(k_base + slot * stride_kt + d3, mask=kv_ok, other=0.0).to(tl.float32)
        v = tl.load(v_base + slot * stride_vt + d3, mask=kv_ok, other=0.0).to(tl.float32)
        s = tl.sum(q3 * k, 2, keep_dims=True) * scale_log2  # [G, N, 1]
        s = tl.where(n_ok[None, :, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1, keep_dims=True))  # finite: a tile holds an index < hi
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, 1, keep_dims=True)
        acc = acc * alpha + tl.sum(p * v, 1, keep_dims=True)  # [G, 1, D]
        m_i = m_new
    m_i = tl.reshape(m_i, [GROUP_PAD])
    l_i = tl.reshape(l_i, [GROUP_PAD])
    acc = tl.reshape(acc, [GROUP_PAD, BLOCK_D])

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if SPLIT:
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        p_ptrs = OPART + sp * stride_ps + tok * stride_pt + head[:, None] * stride_ph + d[None, :]
        tl.store(p_ptrs, out, mask=qd_ok)
        tl.store(LSE + sp * stride_ls + tok * stride_lt + head, lse, mask=g_ok)
    else:
        o_ptrs = OUT + tok * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=qd_ok)
