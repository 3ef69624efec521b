"""One decode row's input RMSNorm, qkv projection, RoPE and KV-cache store in one kernel.

At batch 1 the layer's attention block otherwise starts with two kernels: the norm-GEMV for qkv
(layers/norm_gemv_kernel.py), then fused_kernels.rope_store, a few microseconds of launch for a
few KB. RoPE ("rotate half") mixes output rows j and j + D/2 of each q or k head, so here a
program owns `PAIRS` such row pairs of one head instead of `BLOCK_N` consecutive rows: it streams
both rows' weights, rotates the two results and stores them where rope_store would (q to a fresh
[Hq, D] tensor, k and v to the token's cache slot). v heads are paired the same way, unrotated.
The GEMV itself is the norm-GEMV's, tile for tile, so every value is rounded where the separate
kernels round it (HOTSPEC_QKV_ROPE=1, an A/B switch, off until the H200 measures it:
layers/fused.qkv_rope_config).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl
from hotspec.layers.gemv_kernels import GemvConfig
from hotspec.layers.norm_gemv_kernel import normed_tile, row_rms


@triton.jit
def _qkv_rope_kernel(X, R, G, W, S, Q_OUT, K_CACHE, V_CACHE, POS, LOC, COS, SIN, K, eps, stride_wn,
                     stride_qh, stride_kc, stride_kh, stride_vc, stride_vh, stride_cs,
                     HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, HAS_RES: tl.constexpr,
                     PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_ROW: tl.constexpr,
                     PDL: tl.constexpr = False, PF_COLS: tl.constexpr = -1):
    pid = tl.program_id(0)
    dt = X.dtype.element_ty
    head = (pid * PAIRS) // HALF  # q heads, then k heads, then v heads (qkv_proj's row order)
    j = (pid * PAIRS) % HALF + tl.arange(0, PAIRS)
    rows1 = tl.cast(head, tl.int64) * (2 * HALF) + j
    rows2 = rows1 + HALF
    if PDL:  # weights to L2 before waiting for the kernel before (layers/pdl.py)
        pdl.launch_dependents(PDL)
        pdl.prefetch_rows(W, rows1, (HQ + 2 * HKV) * 2 * HALF, 0, K, K, stride_wn, 32, PF_COLS)
        pdl.prefetch_rows(W, rows2, (HQ + 2 * HKV) * 2 * HALF, 0, K, K, stride_wn, 32, PF_COLS)
        pdl.wait(PDL)
    inv = row_rms(X, R, S, K, eps, pid, HAS_RES, BLOCK_ROW)
    # the two rows of each pair, their input normalised tile by tile (as norm_gemv does)
    offs_k = tl.arange(0, BLOCK_K)
    acc1 = tl.zeros((PAIRS, BLOCK_K), dtype=tl.float32)
    acc2 = tl.zeros((PAIRS, BLOCK_K), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + offs_k
        k_ok = kk < K
        h = normed_tile(X, R, G, kk, k_ok, inv, HAS_RES)
        w1 = tl.load(W + rows1[:, None] * stride_wn + kk[None, :], mask=k_ok[None, :], other=0.0,
                     eviction_policy="evict_first")
        w2 = tl.load(W + rows2[:, None] * stride_wn + kk[None, :], mask=k_ok[None, :], other=0.0,
                     eviction_policy="evict_first")
        acc1 += w1.to(tl.float32) * h[None, :]
        acc2 += w2.to(tl.float32) * h[None, :]
    # qkv's values as the separate GEMV stores them, then rope_store's arithmetic
    y1 = tl.sum(acc1, axis=1).to(dt).to(tl.float32)
    y2 = tl.sum(acc2, axis=1).to(dt).to(tl.float32)
    slot = tl.load(LOC).to(tl.int64)
    if head < HQ + HKV:
        pos = tl.load(POS).to(tl.int64)
        cos = tl.load(COS + pos * stride_cs + j)
        sin = tl.load(SIN + pos * stride_cs + j)
        o1 = y1 * cos + (-y2) * sin
        o2 = y2 * cos + y1 * sin
        if head < HQ:
            dst = Q_OUT + head * stride_qh
        else:
            dst = K_CACHE + slot * stride_kc + (head - HQ) * stride_kh
        tl.store(dst + j, o1.to(dst.dtype.element_ty))
        tl.store(dst + HALF + j, o2.to(dst.dtype.element_ty))
    else:
        dst = V_CACHE + slot * stride_vc + (head - HQ - HKV) * stride_vh
        tl.store(dst + j, y1.to(dst.dtype.element_ty))
        tl.store(dst + HALF + j, y2.to(dst.dtype.element_ty))


def qkv_rope(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
             w: torch.Tensor, config: GemvConfig, num_heads: int, num_kv_heads: int,
             positions: torch.Tensor, loc: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For one row x [1, H] (residual as norm_gemv takes it): rotated q [1, Hq, D] and the new
    stream x + residual; k and v (k rotated) go to cache row loc[0]. w is qkv_proj's weight
    [(Hq + 2 Hkv) * D, H]; cos, sin [max_pos, D/2] float32. The config is the norm-GEMV's for w:
    its BLOCK_N / 2 row pairs per program must divide D / 2."""
    n, k = w.shape
    d = n // (num_heads + 2 * num_kv_heads)
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != k or d * (num_heads + 2 * num_kv_heads) != n:
        raise ValueError(f"qkv_rope: one row x [1, {k}] and w [(Hq + 2 Hkv) * D, {k}], got "
                         f"{tuple(x.shape)}, {tuple(w.shape)} for {num_heads}/{num_kv_heads} heads")
    pairs = config.BLOCK_N // 2
    if config.SPLIT_K != 1 or pairs < 1 or (d // 2) % pairs:
        raise ValueError(f"qkv_rope: a config without split-K whose BLOCK_N / 2 divides D / 2 = "
                         f"{d // 2}, got {config}")
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or cos.stride(1) != 1:
        raise ValueError("qkv_rope: caches and cos/sin tables need unit stride along D")
    use_pdl = pdl.enabled(x.device)
    q = torch.empty((1, num_heads, d), dtype=x.dtype, device=x.device)
    s = torch.empty_like(x) if residual is not None else x
    _qkv_rope_kernel[(n // (2 * pairs),)](
        x, residual if residual is not None else x, norm_weight, w, s, q, k_cache, v_cache,
        positions, loc, cos, sin, k, eps, w.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), cos.stride(0),
        HQ=num_heads, HKV=num_kv_heads, HALF=d // 2, HAS_RES=residual is not None, PAIRS=pairs,
        BLOCK_K=config.BLOCK_K, BLOCK_ROW=triton.next_power_of_2(k), PDL=use_pdl,
        PF_COLS=pdl.prefetch_cols(w), num_warps=config.num_warps, num_stages=config.num_stages,
        **({"launch_pdl": True} if use_pdl else {}))
    return q, s
