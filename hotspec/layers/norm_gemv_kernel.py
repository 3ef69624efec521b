"""RMSNorm (after the residual add) fused into the GEMV that reads it, for a decode row (or a few
rows side by side).

A decode step at batch 1 runs two add+RMSNorm kernels per layer, each a few microseconds of
launch and ramp-up for a few KB of data. Here every program of the GEMV computes the norm of the
one row itself (the row is a few KB, read from L2) and program 0 stores the new residual, so the
norm costs no kernel of its own. Rounded where layers/fused_kernels._rms_norm_kernel rounds, and
tiled like layers/gemv_kernels' M == 1 path (its GemvConfig, without split-K, PIPE included). On
where a GEMV config exists (layers/fused.norm_gemv_config). Several rows run as that one-row
program per row in one launch (a grid axis ordered so a column block's rows run side by side
and can share its weights through L2): up to fused.ROW_GEMV_MAX rows, where the few-row tl.dot GEMM would
otherwise need the norm as a kernel of its own (folded into the tl.dot loop it measured 1.4-3x
slower).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl
from hotspec.layers.gemv_kernels import MAX_M, GemvConfig


@triton.jit
def stream(XP, RP, mask, HAS_RES: tl.constexpr):
    """x + residual at pointers XP / RP, rounded to x's dtype (x alone without HAS_RES)."""
    x = tl.load(XP, mask=mask, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(RP, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def row_rms(X, R, S, K, eps, pid, HAS_RES: tl.constexpr, BLOCK_ROW: tl.constexpr):
    """The reciprocal RMS of one row's stream s = x + residual (rounded to the dtype; x alone
    without HAS_RES), the whole row read at once; program 0 stores s to S."""
    cols = tl.arange(0, BLOCK_ROW)
    row_ok = cols < K
    s = stream(X + cols, R + cols, row_ok, HAS_RES)
    if HAS_RES:
        if pid == 0:
            tl.store(S + cols, s, mask=row_ok)
    sf = s.to(tl.float32)
    return tl.rsqrt(tl.sum(sf * sf, axis=0) / K + eps)


@triton.jit
def normed_tile(X, R, G, kk, k_ok, inv, HAS_RES: tl.constexpr):
    """Columns kk of norm(x + residual) * g for one row, as fp32 values rounded where
    fused_kernels._rms_norm_kernel rounds (the stream, the normalised value, the product)."""
    dt = X.dtype.element_ty
    x = stream(X + kk, R + kk, k_ok, HAS_RES)
    normed = (x.to(tl.float32) * inv).to(dt).to(tl.float32)
    g = tl.load(G + kk, mask=k_ok, other=0.0).to(tl.float32)
    return (g * normed).to(dt).to(tl.float32)


@triton.jit
def _norm_gemv_kernel(X, R, G, W, Y, S, N, K, eps, stride_wn, stride_xm, stride_rm, stride_sm,
                      stride_ym, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_ROW: tl.constexpr, PDL: tl.constexpr = False,
                      PF_COLS: tl.constexpr = -1, PRELOAD: tl.constexpr = False,
                      PIPE: tl.constexpr = 1, ROWS=1, B=None, HAS_BIAS: tl.constexpr = False):
    """Program (n, r) of ROWS rows: row r's columns [n*BLOCK_N, +BLOCK_N), computed as a launch of
    row r alone computes them (rows side by side, a column block's adjacent in launch order so
    they can share its weights through L2; the first row's programs prefetch them)."""
    pid = tl.program_id(0) // ROWS
    row = (tl.program_id(0) % ROWS).to(tl.int64)
    X += row * stride_xm
    R += row * stride_rm
    S += row * stride_sm
    Y += row * stride_ym
    offs_n = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    if PDL:  # weights to L2 (and with PRELOAD a tile to registers) before the wait (layers/pdl.py)
        pdl.launch_dependents(PDL)
        if row == 0:
            pdl.prefetch_rows(W, offs_n, N, 0, K, stride_wn, 32, PF_COLS)
    w0 = pdl.preload(W, offs_n, N, 0, stride_wn, BLOCK_K, PRELOAD)
    pdl.wait(PDL)
    inv = row_rms(X, R, S, K, eps, pid, HAS_RES, BLOCK_ROW)
    # the GEMV, its input normalised tile by tile
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    k_start = 0
    if PIPE == 2:  # the next tile's loads in flight during this tile's products (gemv_kernels)
        if PRELOAD:
            w_cur = w0
        else:
            w_cur = tl.load(W + offs_n[:, None] * stride_wn + offs_k[None, :],
                            mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0,
                            eviction_policy="evict_first")
        k_cur = 0
        k2 = offs_k[None, :]  # the input as [1, BLOCK_K] tiles: the weight tile's layout
        for k in range(BLOCK_K, K, BLOCK_K):
            kk = k + offs_k
            w_nxt = tl.load(W + offs_n[:, None] * stride_wn + kk[None, :],
                            mask=n_ok[:, None] & (kk < K)[None, :], other=0.0,
                            eviction_policy="evict_first")
            kc = k_cur + k2
            acc += w_cur.to(tl.float32) * normed_tile(X, R, G, kc, kc < K, inv, HAS_RES)
            w_cur = w_nxt
            k_cur = k
        kc = k_cur + k2
        acc += w_cur.to(tl.float32) * normed_tile(X, R, G, kc, kc < K, inv, HAS_RES)
        k_start = K  # (the loop below runs no step)
    elif PRELOAD:  # the first tile (whole), loaded before the wait: the loop's first step
        acc += w0.to(tl.float32) * normed_tile(X, R, G, offs_k, offs_k < K, inv, HAS_RES)[None, :]
        k_start = BLOCK_K
    for k in range(k_start, K, BLOCK_K):
        kk = k + offs_k
        k_ok = kk < K
        w = tl.load(W + offs_n[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * normed_tile(X, R, G, kk, k_ok, inv, HAS_RES)[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:  # in fp32 before the one rounding, as F.linear's epilogue adds it
        y += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(Y + offs_n, y.to(Y.dtype.element_ty), mask=n_ok)


def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              w: torch.Tensor, config: GemvConfig, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) @ w.T, x + residual) for rows x [M, K] (residual None: the norm
    of x, and x itself), as fused_kernels.rms_norm then gemv compute it, in one kernel: each row
    as its one-row launch computes it (M rows side by side, up to gemv_kernels.MAX_M). Split-K
    configs are not supported (every program would recompute the norm per slice). bias [N]: the
    projection's (Qwen2's qkv), added in fp32 before the rounding."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"norm_gemv: x [M <= {MAX_M}, K] and w [N, K], got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"norm_gemv: residual {tuple(residual.shape)} must be x's shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype or norm_weight.dtype != x.dtype:
        raise ValueError("norm_gemv: bf16/fp16 x, w and norm weight of one dtype only")
    if config.SPLIT_K != 1:
        raise ValueError("norm_gemv: split-K configs are not supported")
    if bias is not None and (bias.shape != (w.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"norm_gemv: a bias is [N={w.shape[0]}] in x's dtype, got "
                         f"{tuple(bias.shape)} {bias.dtype}")
    if config.PIPE not in (1, 2):
        raise ValueError(f"norm_gemv: PIPE is 1 or 2 (weight tiles in registers), got {config.PIPE}")
    if x.stride(1) != 1 or w.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("norm_gemv: unit stride along K")
    (m, k), n = x.shape, w.shape[0]
    use_pdl = pdl.enabled(x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    s = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None else x
    r = residual if residual is not None else x
    _norm_gemv_kernel[(triton.cdiv(n, config.BLOCK_N) * m,)](
        x, r, norm_weight, w, y, s, n, k, eps, w.stride(0), x.stride(0), r.stride(0), s.stride(0),
        y.stride(0), HAS_RES=residual is not None,
        BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, BLOCK_ROW=triton.next_power_of_2(k),
        PDL=use_pdl, PF_COLS=pdl.prefetch_cols(w),
        PRELOAD=pdl.preloads(use_pdl, True, k, config.BLOCK_K), PIPE=config.PIPE, ROWS=m,
        B=y if bias is None else bias, HAS_BIAS=bias is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages, **({"launch_pdl": True} if use_pdl else {}))
    return y, s
