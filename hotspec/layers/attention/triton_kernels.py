"""Triton kernels for paged attention (see triton_backend.py for the host side).

`paged_attn_fwd`: one flash-attention kernel for every phase. A program owns (a block of query
rows [x a KV split], request b, kv head h). The `GROUP = Hq // Hkv` query heads that share kv head
h are folded into the M dimension of the tile: tile row r is query row `q_start + r // GROUP_PAD`
of head `h * GROUP + r % GROUP_PAD` (rows with `r % GROUP_PAD >= GROUP` are dead padding), so a
single decode query still fills a tensor-core tile and K/V are read once per kv head.

Visibility (forward_batch.py): causal, query i sees kv j <= kv_len - q_len + i; custom, kv j <
kv_len - M all visible, the last M follow custom_mask[b, i, j - (kv_len - M)]. Rows i >= q_len
(uniform padding) see kv index 0 only, like the torch reference. The kv loop bound is read from
kv_lens on the device, so the grid never depends on kv lengths (CUDA-graph safe).

With SPLIT, the kv range of a tile is cut into `num_splits` equal chunks (chunk size computed on
the device from kv_len; at least MIN_CHUNK indices, so at a short live length the last splits
get none), each program writes its normalised partial output and log2-sum-exp (-inf for a split
without keys), and `combine_splits` merges them (flash-decoding).

Strides that do not depend on the batch's row count (q, k, v, out per token and head, the partials'
per token and head, the RoPE fold's inputs) are compile-time constants: one specialization per
model shape, with fewer parameter loads at each program's start and ~10 % fewer SASS instructions
at the 8B decode shape. Strides that follow the row count (the partials' per split, the block
table's) stay arguments, so prefill's varying lengths do not compile new kernels.

F32_DOT: dots in fp32 with input_precision="ieee" (no tf32). Set for fp32 inputs, and for every
dtype under TRITON_INTERPRET, whose tl.dot multiplies the raw uint16 bit patterns of bf16 tensors;
there P is still rounded to q's dtype first, to mimic the 16-bit GPU path's numerics.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (the interpreter fix)
from hotspec.layers.attention.merge_kernels import merge_weights

TREE_SLOTS: tl.constexpr = tl.constexpr(64)  # TREE_SEQ: tree slots a packed mask word holds


@triton.jit
def _v_tile(v_base, slot, stride_vt, d, d_ok, n_ok, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """The [N, D] V tile at kv slots `slot` (rows past kv_len read as 0 where MASKED)."""
    if MASKED:
        return tl.load(v_base + slot[:, None] * stride_vt + d[None, :],
                       mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        return tl.load(v_base + slot[:, None] * stride_vt + d[None, :])
    else:
        return tl.load(v_base + slot[:, None] * stride_vt + d[None, :], mask=d_ok[None, :], other=0.0)


@triton.jit
def _attn_blocks(
    acc, l_i, m_i, q, Q, k_base, v_base, bt_row, cm_row, bits, lo, hi, kv_len, lim, real, row_ok,
    start_tree, stride_kt, stride_vt, stride_cmj, scale_log2, d, d_ok, anc, node_depth,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, CUSTOM: tl.constexpr, MASKED: tl.constexpr,
    F32_DOT: tl.constexpr, EVEN_D: tl.constexpr, MASK_BITS: tl.constexpr,
    V_EARLY: tl.constexpr = False, TREE_SEQ: tl.constexpr = False,
):
    """Online-softmax over kv indices [lo, hi) in BLOCK_N steps. MASKED=False: every index is
    < kv_len and visible to every real row (padding rows still see index 0 only). V_EARLY: the
    V tile's loads are issued right after the K tile's instead of after the scores (see
    TritonBackend._v_early). TREE_SEQ: index start_tree + j reads the tile's tree node's
    ancestor at depth j (`anc`: the node's ancestors among the tree slots, `node_depth`: each
    slot's depth), so the node's keys are the sequence a decode step of its token reads, and
    its visibility is causal (`lim`)."""
    n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        offs = start + n
        if MASKED:
            n_ok = offs < kv_len
            src = offs
            if TREE_SEQ:
                rel = offs - start_tree
                hit = anc[None, :] & (node_depth[None, :] == rel[:, None])
                slot_of = tl.sum(tl.where(hit, tl.arange(0, TREE_SLOTS)[None, :], 0), 1)
                src = tl.maximum(tl.where(rel >= 0, start_tree + slot_of, offs), 0)
            blk = tl.load(bt_row + src // PAGE, mask=n_ok, other=0).to(tl.int64)
            slot = blk * PAGE + (src % PAGE)
            kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None],
                         mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [D, N]
        else:
            blk = tl.load(bt_row + offs // PAGE).to(tl.int64)
            slot = blk * PAGE + (offs % PAGE)
            if EVEN_D:
                kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None])
            else:
                kt = tl.load(k_base + slot[None, :] * stride_kt + d[:, None], mask=d_ok[:, None],
                             other=0.0)
        if V_EARLY:
            v = _v_tile(v_base, slot, stride_vt, d, d_ok, offs < kv_len, MASKED, EVEN_D)
        kt = kt.to(Q.dtype.element_ty)
        if F32_DOT:
            s = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * scale_log2
        if MASKED:
            if CUSTOM and not TREE_SEQ:
                rel = offs - start_tree
                in_tree = rel >= 0
                if MASK_BITS:  # bit j of the row's word: tree slot j visible (M <= 64)
                    shift = tl.minimum(tl.maximum(rel, 0), 63).to(tl.int64)
                    cm = (bits[:, None] >> shift[None, :]) & 1
                else:
                    cm = tl.load(cm_row[:, None] + rel[None, :] * stride_cmj,
                                 mask=(real & row_ok)[:, None] & (in_tree & n_ok)[None, :], other=0)
                vis = (~in_tree)[None, :] | (cm != 0)
                vis = tl.where(real[:, None], vis, (offs == 0)[None, :])
            else:
                vis = offs[None, :] <= lim[:, None]
            vis = vis & n_ok[None, :]
        else:
            vis = real[:, None] | (offs == 0)[None, :]
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if not V_EARLY:
            v = _v_tile(v_base, slot, stride_vt, d, d_ok, offs < kv_len, MASKED, EVEN_D)
        v = v.to(Q.dtype.element_ty)
        if F32_DOT:  # p rounded to q's dtype as on the 16-bit tensor-core path
            pv = tl.dot(p.to(Q.dtype.element_ty).to(tl.float32), v.to(tl.float32),
                        input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _rotate(x, base, pos, COS, SIN, stride_cs, d, ok, HEAD_DIM: tl.constexpr):
    """Rotate-half RoPE of x (elements d of the head at `base`, at position `pos`), computed as
    fused_kernels._rope_store_kernel computes it and rounded to x's dtype: the first half
    fma(x1, cos, (-x2) * sin), the second fma(x2, cos, x1 * sin) (cos, sin: [pos, d mod
    HEAD_DIM/2]). The fma is spelled out so that no compiler contraction choice can make the two
    kernels' bits differ."""
    half: tl.constexpr = HEAD_DIM // 2
    low = d < half
    dh = tl.where(low, d, d - half)
    partner = tl.load(base + tl.where(low, d + half, d - half), mask=ok, other=0.0).to(tl.float32)
    cos = tl.load(COS + pos * stride_cs + dh, mask=ok, other=0.0)
    sin = tl.load(SIN + pos * stride_cs + dh, mask=ok, other=0.0)
    rot = tl.where(low, -partner, partner)
    return tl.fma(x.to(tl.float32), cos, rot * sin).to(x.dtype)


@triton.jit
def paged_attn_fwd(
    Q, K, V, OUT, BT, KVL, QL, CUQ, CM, OPART, LSE,
    stride_qt: tl.constexpr, stride_qh: tl.constexpr, stride_kt: tl.constexpr, stride_kh: tl.constexpr,
    stride_vt: tl.constexpr, stride_vh: tl.constexpr, stride_ot: tl.constexpr, stride_oh: tl.constexpr,
    stride_bt, stride_cmb, stride_cmi, stride_cmj,
    stride_ps, stride_pt: tl.constexpr, stride_ph: tl.constexpr, stride_ls, stride_lt: tl.constexpr,
    scale_log2, width, m_custom, num_splits, num_chunks,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    RAGGED: tl.constexpr, CUSTOM: tl.constexpr, SPLIT: tl.constexpr, F32_DOT: tl.constexpr,
    MASK_BITS: tl.constexpr = False, PDL: tl.constexpr = False, PDL_WAIT: tl.constexpr = False,
    ROPE: tl.constexpr = False, V_EARLY: tl.constexpr = False, MIN_CHUNK: tl.constexpr = 0,
    TREE_SEQ: tl.constexpr = False, DET_CHUNK: tl.constexpr = 0,
    KN=None, VN=None, POS=None, LOC=None,
    COS=None, SIN=None,
    stride_knt: tl.constexpr = 0, stride_knh: tl.constexpr = 0, stride_vnt: tl.constexpr = 0,
    stride_vnh: tl.constexpr = 0, stride_cs: tl.constexpr = 0,
):
    pdl.launch_dependents(PDL)  # the kernel after it (o_proj's GEMV) may launch now
    pid0 = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    if SPLIT:
        qb = pid0 // num_splits
        sp = pid0 % num_splits
    else:
        qb = pid0
        sp = 0
    pdl.wait(PDL_WAIT)  # PDL-launched itself (pdl.chained): nothing is read before this

    q_len = tl.load(QL + b).to(tl.int32)
    kv_len = tl.load(KVL + b).to(tl.int32)
    if RAGGED:
        q_base = tl.load(CUQ + b).to(tl.int64)
        n_rows = q_len  # rows of this request present in q / out
    else:
        q_base = b.to(tl.int64) * width
        n_rows = width
    q_start = qb * BLOCK_Q

    r = tl.arange(0, BLOCK_M)
    qi = q_start + r // GROUP_PAD  # query row inside the request
    g = r % GROUP_PAD
    head = h * GROUP + g
    row_ok = (qi < n_rows) & (g < GROUP)  # rows that exist in q / out
    real = qi < q_len  # rows that are not padding
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    tok = q_base + qi
    q_ptrs = Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if ROPE:  # q arrives unrotated (the RoPE fold): rotate it as fused_kernels.rope_store does
        pos = tl.load(POS + tok, mask=row_ok, other=0).to(tl.int64)
        q = _rotate(q, Q + tok[:, None] * stride_qt + head[:, None] * stride_qh, pos[:, None],
                    COS, SIN, stride_cs, d[None, :], row_ok[:, None] & d_ok[None, :], HEAD_DIM)
    if F32_DOT:
        q = q.to(tl.float32)

    # kv range this tile can see: [0, end)
    tslot = tl.arange(0, TREE_SLOTS).to(tl.int64)
    anc = tslot < 0
    node_depth = tslot
    if CUSTOM:
        start_tree = kv_len - m_custom
        end = kv_len
        lim = kv_len  # unused
        if TREE_SEQ:  # (BLOCK_Q == 1, MASK_BITS) the tile's rows: tree node q_start's heads
            word = tl.load(CM + b.to(tl.int64) * stride_cmb + q_start * stride_cmi,
                           mask=q_start < q_len, other=0)
            anc = (((word >> tslot) & 1) != 0) & (tslot < m_custom)
            node_depth = tl.load(POS + q_base + tslot, mask=tslot < m_custom, other=-1) - start_tree
            end = start_tree + tl.sum(anc.to(tl.int32), 0)  # the node's own kv length
            lim = tl.where(real, end - 1, 0)
    else:
        start_tree = kv_len  # unused
        q_hi = tl.minimum(q_start + BLOCK_Q, q_len) - 1  # last real row of the tile
        end = tl.minimum(tl.maximum(kv_len - q_len + q_hi + 1, 1), kv_len)
        lim = tl.where(real, kv_len - q_len + qi, 0)  # inclusive per-row bound
    # a tile of padding rows only needs kv index 0; a tile outside the request does no work
    end = tl.where(q_start < q_len, end, tl.minimum(kv_len, 1))
    end = tl.where(q_start < n_rows, end, 0)
    if SPLIT and DET_CHUNK > 0:  # program sp: chunks sp, sp + num_splits, ... of num_chunks
        lo = sp * DET_CHUNK
        hi = end
    elif SPLIT:
        per = tl.cdiv(end, num_splits)
        chunk = tl.cdiv(per, BLOCK_N) * BLOCK_N
        if MIN_CHUNK > 0:  # the splits past the live length get nothing (lse -inf: skipped)
            chunk = tl.maximum(chunk, MIN_CHUNK)
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, end)
    else:
        lo = 0
        hi = end

    if ROPE:  # the program whose kv range holds a new token stores its K and V first
        if CUSTOM:  # verify (one query tile): tree node i's K and V at kv index seq + i
            n_new = m_custom
        else:  # decode: the request's one row, at kv index kv_len - 1
            n_new = 1
        for i in range(0, n_new):
            new = kv_len - n_new + i
            mine = (lo <= new) & (new < hi)
            if SPLIT and DET_CHUNK > 0:  # (the program of the chunk that holds it)
                mine = (new < hi) & ((new // DET_CHUNK) % num_splits == sp)
            if mine:
                t_new = q_base + i
                slot = tl.load(LOC + t_new).to(tl.int64)
                pos_new = tl.load(POS + t_new).to(tl.int64)
                k_src = KN + t_new * stride_knt + h * stride_knh
                kr = _rotate(tl.load(k_src + d, mask=d_ok, other=0.0), k_src, pos_new, COS, SIN,
                             stride_cs, d, d_ok, HEAD_DIM)
                tl.store(K + slot * stride_kt + h * stride_kh + d, kr.to(K.dtype.element_ty),
                         mask=d_ok)
                vr = tl.load(VN + t_new * stride_vnt + h * stride_vnh + d, mask=d_ok, other=0.0)
                tl.store(V + slot * stride_vt + h * stride_vh + d, vr.to(V.dtype.element_ty),
                         mask=d_ok)
        tl.debug_barrier()  # the stores above are seen by this program's own loads below

    # kv blocks every real row of the tile sees whole ([0, full)) need no mask at all
    if CUSTOM:
        full = start_tree
    else:
        full = kv_len - q_len + q_start + 1
    full = (tl.maximum(tl.minimum(full, end), 0) // BLOCK_N) * BLOCK_N

    bt_row = BT + b.to(tl.int64) * stride_bt
    cm_row = CM + b.to(tl.int64) * stride_cmb + qi.to(tl.int64) * stride_cmi
    k_base = K + h * stride_kh
    v_base = V + h * stride_vh
    bits = tl.zeros([BLOCK_M], dtype=tl.int64)
    if MASK_BITS:  # CM holds one int64 word per query row: [B, width] at strides (cmb, cmi)
        bits = tl.load(cm_row, mask=real & row_ok, other=0)
    if SPLIT and DET_CHUNK > 0:  # each of the program's chunks: its partial, or -inf past the keys
        # (the combine stops at the last chunk with keys)
        for c_lo in range(lo, num_chunks * DET_CHUNK, num_splits * DET_CHUNK):
            c = c_lo // DET_CHUNK
            if c_lo < hi:
                o_c, lse_c = _attn_range(
                    q, Q, k_base, v_base, bt_row, cm_row, bits, c_lo,
                    tl.minimum(c_lo + DET_CHUNK, hi), full, kv_len, lim, real, row_ok, start_tree,
                    stride_kt, stride_vt, stride_cmj, scale_log2, d, d_ok, anc, node_depth, PAGE,
                    BLOCK_M, BLOCK_N, BLOCK_D, CUSTOM, F32_DOT, BLOCK_D == HEAD_DIM, MASK_BITS,
                    V_EARLY, TREE_SEQ)
                tl.store(OPART + c * stride_ps + tok[:, None] * stride_pt + head[:, None] * stride_ph
                         + d[None, :], o_c, mask=row_ok[:, None] & d_ok[None, :])
                tl.store(LSE + c * stride_ls + tok * stride_lt + head, lse_c, mask=row_ok)
            else:
                tl.store(LSE + c * stride_ls + tok * stride_lt + head, float("-inf"), mask=row_ok)
        return
    if DET_CHUNK > 0 and not SPLIT:  # the chunks one after another, merged as the combine merges
        mx = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        wsum = tl.zeros([BLOCK_M], dtype=tl.float32)
        osum = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for c_lo in range(lo, hi, DET_CHUNK):
            o_c, lse_c = _attn_range(
                q, Q, k_base, v_base, bt_row, cm_row, bits, c_lo, tl.minimum(c_lo + DET_CHUNK, hi),
                full, kv_len, lim, real, row_ok, start_tree, stride_kt, stride_vt, stride_cmj,
                scale_log2, d, d_ok, anc, node_depth, PAGE, BLOCK_M, BLOCK_N, BLOCK_D, CUSTOM,
                F32_DOT, BLOCK_D == HEAD_DIM, MASK_BITS, V_EARLY, TREE_SEQ)
            mx, a, w = merge_weights(mx, lse_c)
            osum = osum * a[:, None] + o_c * w[:, None]
            wsum = wsum * a + w
        out = osum / tl.where(wsum == 0.0, 1.0, wsum)[:, None]
        lse = mx  # (unused)
    else:
        out, lse = _attn_range(
            q, Q, k_base, v_base, bt_row, cm_row, bits, lo, hi, full, kv_len, lim, real, row_ok,
            start_tree, stride_kt, stride_vt, stride_cmj, scale_log2, d, d_ok, anc, node_depth,
            PAGE, BLOCK_M, BLOCK_N, BLOCK_D, CUSTOM, F32_DOT, BLOCK_D == HEAD_DIM, MASK_BITS,
            V_EARLY, TREE_SEQ)
    if SPLIT:
        p_ptrs = OPART + sp * stride_ps + tok[:, None] * stride_pt + head[:, None] * stride_ph + d[None, :]
        tl.store(p_ptrs, out, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE + sp * stride_ls + tok * stride_lt + head, lse, mask=row_ok)
    else:
        o_ptrs = OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _attn_range(
    q, Q, k_base, v_base, bt_row, cm_row, bits, lo, hi, full, kv_len, lim, real, row_ok,
    start_tree, stride_kt, stride_vt, stride_cmj, scale_log2, d, d_ok, anc, node_depth,
    PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CUSTOM: tl.constexpr, F32_DOT: tl.constexpr, EVEN_D: tl.constexpr, MASK_BITS: tl.constexpr,
    V_EARLY: tl.constexpr, TREE_SEQ: tl.constexpr,
):
    """The tile's rows attended over kv indices [lo, hi) (the blocks below `full` unmasked): their
    normalised output [BLOCK_M, BLOCK_D] (fp32, 0 for a row that saw no key) and log2-sum-exp
    (-inf for such a row)."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, l_i, m_i = _attn_blocks(
        acc, l_i, m_i, q, Q, k_base, v_base, bt_row, cm_row, bits, lo, tl.minimum(hi, full), kv_len,
        lim, real, row_ok, start_tree, stride_kt, stride_vt, stride_cmj, scale_log2, d, d_ok,
        anc, node_depth, PAGE, BLOCK_N, CUSTOM, False, F32_DOT, EVEN_D, MASK_BITS,
        V_EARLY, TREE_SEQ)
    acc, l_i, m_i = _attn_blocks(
        acc, l_i, m_i, q, Q, k_base, v_base, bt_row, cm_row, bits, tl.maximum(lo, full), hi, kv_len,
        lim, real, row_ok, start_tree, stride_kt, stride_vt, stride_cmj, scale_log2, d, d_ok,
        anc, node_depth, PAGE, BLOCK_N, CUSTOM, True, F32_DOT, EVEN_D, MASK_BITS,
        V_EARLY, TREE_SEQ)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    return acc / l_safe[:, None], tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))


def is_interpreted() -> bool:
    """True when these kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(paged_attn_fwd, InterpretedFunction)
