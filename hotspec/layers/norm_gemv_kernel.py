"""RMSNorm (after the residual add) fused into the GEMV that reads it, for up to 16 rows.

One row (`_norm_gemv_kernel`): a decode step at batch 1 runs two add+RMSNorm kernels per
layer, each a few microseconds of launch and ramp-up for a few KB of data. Here every program of
the GEMV computes the norm of the one row itself (the row is a few KB, read from L2) and program 0
stores the new residual, so the norm costs no kernel of its own. Rounded where
layers/fused_kernels._rms_norm_kernel rounds, and tiled like layers/gemv_kernels' M == 1 path
(its GemvConfig, without split-K). On by default where a GEMV config exists
(layers/fused.norm_gemv_config); HOTSPEC_NORM_GEMV=0 turns it off.

2..16 rows (`_norm_gemm_kernel`, HOTSPEC_NORM_GEMV_ROWS=16: an A/B switch, off until the H200
measures it): the same for the few rows of a speculative step (verify's tree at batch 1), tiled
like gemv_kernels' tl.dot path. Each program first sums each row's squares over K in tiles (the
rows come from L2), then streams its weight panel, normalising the input tile by tile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl
from hotspec.layers.gemv_kernels import MAX_M, GemvConfig

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
def _norm_gemv_kernel(X, R, G, W, Y, S, N, K, eps, stride_wn, HAS_RES: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_ROW: tl.constexpr,
                      PDL: tl.constexpr = False, PF_COLS: tl.constexpr = -1):
    pid = tl.program_id(0)
    if PDL:  # weights to L2 before waiting for the kernel before (layers/pdl.py)
        pdl.launch_dependents(PDL)
        pdl.prefetch_rows(W, tl.cast(pid, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N), N, 0, K, K,
                          stride_wn, 32, PF_COLS)
        pdl.wait(PDL)
    inv = row_rms(X, R, S, K, eps, pid, HAS_RES, BLOCK_ROW)
    # the GEMV, its input normalised tile by tile
    offs_n = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + offs_k
        k_ok = kk < K
        w = tl.load(W + offs_n[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * normed_tile(X, R, G, kk, k_ok, inv, HAS_RES)[None, :]
    tl.store(Y + offs_n, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=n_ok)


@triton.jit
def _norm_gemm_kernel(X, R, G, W, Y, S, M, N, K, eps, stride_xm, stride_rm, stride_sm, stride_wn,
                      stride_ym, HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, F32_DOT: tl.constexpr, PDL: tl.constexpr = False,
                      PF_COLS: tl.constexpr = -1):
    pid = tl.program_id(0)
    dt = X.dtype.element_ty
    offs_n = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    if PDL:  # weights to L2 before waiting for the kernel before (layers/pdl.py)
        pdl.launch_dependents(PDL)
        pdl.prefetch_rows(W, offs_n, N, 0, K, K, stride_wn, 32, PF_COLS)
        pdl.wait(PDL)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = X + offs_m[:, None].to(tl.int64) * stride_xm
    r_rows = R + offs_m[:, None].to(tl.int64) * stride_rm
    # pass 1: each row's sum of squares of its stream s = x + residual (rounded to the dtype)
    sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + offs_k
        ok = m_ok[:, None] & (kk < K)[None, :]
        sf = stream(x_rows + kk[None, :], r_rows + kk[None, :], ok, HAS_RES).to(tl.float32)
        sq += tl.sum(sf * sf, axis=1)
    inv = tl.rsqrt(sq / K + eps)
    # pass 2: the GEMM, its input normalised tile by tile; program 0 stores the new stream
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + offs_k
        k_ok = kk < K
        ok = m_ok[:, None] & k_ok[None, :]
        w = tl.load(W + offs_n[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")
        s = stream(x_rows + kk[None, :], r_rows + kk[None, :], ok, HAS_RES)
        if HAS_RES:
            if pid == 0:
                tl.store(S + offs_m[:, None].to(tl.int64) * stride_sm + kk[None, :], s, mask=ok)
        normed = (s.to(tl.float32) * inv[:, None]).to(dt).to(tl.float32)
        g = tl.load(G + kk, mask=k_ok, other=0.0).to(tl.float32)
        h = (g[None, :] * normed).to(dt)
        if F32_DOT:  # the interpreter's bf16 dot multiplies raw bit patterns: go through fp32
            acc = tl.dot(h.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(h, tl.trans(w), acc)
    y_ptr = Y + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              w: torch.Tensor, config: GemvConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) @ w.T, x + residual) for x [M, K], 1 <= M <= 16 (residual None:
    the norm of x, and x itself), as fused_kernels.rms_norm then gemv compute it, in one kernel.
    Split-K configs are not supported (every program would recompute the norm per slice), nor,
    above one row, column blocks under 16 (tl.dot's minimum)."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"norm_gemv: x [M <= {MAX_M}, K] and w [N, K], got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype or norm_weight.dtype != x.dtype:
        raise ValueError("norm_gemv: bf16/fp16 x, w and norm weight of one dtype only")
    if config.SPLIT_K != 1:
        raise ValueError("norm_gemv: split-K configs are not supported")
    if x.stride(1) != 1 or w.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("norm_gemv: unit stride along K")
    m = x.shape[0]
    if m > 1 and config.BLOCK_N < 16:
        raise ValueError(f"norm_gemv: more than one row uses tl.dot, which needs BLOCK_N >= 16 "
                         f"(got {config.BLOCK_N})")
    n, k = w.shape
    use_pdl = pdl.enabled(x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    s = torch.empty_like(x) if residual is not None else x
    r = residual if residual is not None else x
    grid = (triton.cdiv(n, config.BLOCK_N),)
    launch = {"PDL": use_pdl, "PF_COLS": pdl.prefetch_cols(w), "num_warps": config.num_warps,
              "num_stages": config.num_stages, **({"launch_pdl": True} if use_pdl else {})}
    if m == 1:
        _norm_gemv_kernel[grid](
            x, r, norm_weight, w, y, s, n, k, eps, w.stride(0), HAS_RES=residual is not None,
            BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, BLOCK_ROW=triton.next_power_of_2(k), **launch)
    else:
        _norm_gemm_kernel[grid](
            x, r, norm_weight, w, y, s, m, n, k, eps, x.stride(0), r.stride(0), s.stride(0), w.stride(0),
            y.stride(0), HAS_RES=residual is not None, BLOCK_M=MAX_M, BLOCK_N=config.BLOCK_N,
            BLOCK_K=config.BLOCK_K, F32_DOT=_INTERPRET, **launch)
    return y, s
