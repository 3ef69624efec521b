"""The pre-norm step and the projection after it for a few token rows, in one kernel: verify's,
draft_extend's and the tree draft's rows (2..MAX_ROWS), where decode's one-row fusions
(layers/norm_gemv_kernel.py) do not apply.

    s = x + residual                    (rounded to the dtype; program column 0 stores it)
    y = rms_norm(s) * g @ W.T           [M, N]
    glu: W = [gate | up] (2N rows), y = silu(s_gate) * s_up   [M, N]   (the MLP's input to down)

A program owns BLOCK_M rows and BLOCK_N output columns and streams its weight panel in
[BLOCK_N, BLOCK_K] tiles through tl.dot; the row tiles of x (a few KB, from L2) are read in the
same loop. The norm costs no pass of its own: the loop multiplies the tile by g and accumulates
each row's sum of squares beside the products, and the row's 1/rms scales the accumulator once
at the end, since rms_norm(s) * g @ W.T = (1/rms) * ((s * g) @ W.T). So the rounding differs
from rms_norm then linear (there the normed row is rounded before g multiplies it; here s * g is
rounded, and the product is scaled in fp32 before its one rounding): within bf16 rounding of it,
not bit-equal. With glu the program holds the gate and the up accumulator of the same columns
and applies silu(gate) * up as fused_kernels.silu_mul rounds it (gate and up rounded to the dtype,
silu rounded, the product rounded), so neither the [M, 2N] gate_up output nor a silu_mul kernel
exists.

PDL (layers/pdl.py): every launch has the attribute; a program pulls its weight panel into L2 when
the weight fits a third of L2 (pdl.prefetch_cols), signals that the next kernel may launch, then
waits for the kernel before: nothing else is read before the wait.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)

MAX_ROWS = 64  # the most rows one launch handles (a row block of at most 64)
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class RowsConfig:
    BLOCK_N: int = 64
    BLOCK_K: int = 128
    num_warps: int = 4
    num_stages: int = 4


def block_m(m: int) -> int:
    """The row tile for m rows: the power of two >= m, at least 16 (tl.dot's smallest), at most 64."""
    return min(MAX_ROWS, max(16, triton.next_power_of_2(m)))


def choose(m: int, n: int, k: int, glu: bool) -> RowsConfig:
    """The kernel's config for m rows of x [m, k] against an output of n columns (glu: a weight of
    2n rows). Wider column blocks for the single-accumulator projections; the glu kernel holds
    two accumulators, so half the columns."""
    bn = 32 if glu else 64
    if n <= 1024:  # small models: more programs for a small output
        bn = 16 if glu else 32
    bk = next((b for b in (128, 64, 32) if k % b == 0), 128)  # whole tiles where K allows
    return RowsConfig(BLOCK_N=bn, BLOCK_K=bk)


@triton.jit
def _dot(x, w, acc, F32_DOT: tl.constexpr):
    if F32_DOT:  # the interpreter's bf16 dot multiplies raw bit patterns: go through fp32
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _norm_rows_kernel(X, R, G, W, Y, S, M, N, K, eps, stride_xm, stride_rm, stride_sm, stride_wn,
                      stride_ym, HAS_RES: tl.constexpr, GLU: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                      F32_DOT: tl.constexpr, PDL: tl.constexpr = False, PF_COLS: tl.constexpr = -1):
    """Program (m, n): rows [m*BLOCK_M, +BLOCK_M) x output columns [n*BLOCK_N, +BLOCK_N). The row
    blocks of one column block are adjacent in launch order, so they share the panel in L2."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        pdl.launch_dependents(PDL)
        pdl.prefetch_rows(W, offs_n, N, 0, K, stride_wn, 32, PF_COLS)
        if GLU:
            pdl.prefetch_rows(W, offs_n + N, 2 * N, 0, K, stride_wn, 32, PF_COLS)
    pdl.wait(PDL)
    rows = offs_m[:, None].to(tl.int64)
    x_ptr = X + rows * stride_xm + offs_k[None, :]
    r_ptr = R + rows * stride_rm + offs_k[None, :]
    s_ptr = S + rows * stride_sm + offs_k[None, :]
    w_ptr = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    dt = X.dtype.element_ty
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x_ok = m_ok[:, None]
            w_ok = n_ok[:, None]
        else:
            k_ok = (k + offs_k) < K
            x_ok = m_ok[:, None] & k_ok[None, :]
            w_ok = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + k, mask=w_ok, other=0.0, eviction_policy="evict_first")
        if GLU:
            w_up = tl.load(w_ptr + k + N * stride_wn, mask=w_ok, other=0.0,
                           eviction_policy="evict_first")
        x = tl.load(x_ptr + k, mask=x_ok, other=0.0)
        if HAS_RES:
            x = (x.to(tl.float32) + tl.load(r_ptr + k, mask=x_ok, other=0.0).to(tl.float32)).to(dt)
            if pid_n == 0:
                tl.store(s_ptr + k, x, mask=x_ok)
        xf = x.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
        g = tl.load(G + k + offs_k, mask=(k + offs_k) < K, other=0.0).to(tl.float32)
        xg = (xf * g[None, :]).to(dt)
        acc = _dot(xg, w, acc, F32_DOT)
        if GLU:
            acc_up = _dot(xg, w_up, acc_up, F32_DOT)
    inv = tl.rsqrt(ss / K + eps)[:, None]
    y = (acc * inv).to(dt)
    if GLU:  # silu(gate) * up, rounded as fused_kernels._silu_mul_kernel rounds
        gate = y.to(tl.float32)
        up = (acc_up * inv).to(dt).to(tl.float32)
        y = ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt)
    tl.store(Y + rows * stride_ym + offs_n[None, :], y, mask=m_ok[:, None] & n_ok[None, :])


def norm_rows(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              w: torch.Tensor, config: RowsConfig | None = None, *, glu: bool = False,
              use_pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * g @ w.T, x + residual) for x [M, K], 1 <= M <= MAX_ROWS
    (residual None: the norm of x, and x itself). glu: w is [gate | up] [2N, K] and the first
    result is silu(gate) * up [M, N]. bf16/fp16, unit stride along K; anything else raises
    ValueError (callers take the norm and the Linear separately)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"norm_rows: x [M, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}")
    m, k = x.shape
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"norm_rows: M must be in [1, {MAX_ROWS}], got {m}")
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype \
            or norm_weight.dtype != x.dtype:
        raise ValueError("norm_rows: bf16/fp16 x, w and norm weight of one dtype only")
    if x.stride(1) != 1 or w.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("norm_rows: unit stride along K")
    if glu and w.shape[0] % 2:
        raise ValueError(f"norm_rows: a [gate | up] weight has an even row count, got {w.shape[0]}")
    n = w.shape[0] // 2 if glu else w.shape[0]
    cfg = config or choose(m, n, k, glu)
    bm = block_m(m)
    use_pdl = pdl.enabled(x.device) if use_pdl is None else use_pdl
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    s = torch.empty_like(x) if residual is not None else x
    r = residual if residual is not None else x
    grid = (triton.cdiv(m, bm), triton.cdiv(n, cfg.BLOCK_N))
    _norm_rows_kernel[grid](
        x, r, norm_weight, w, y, s, m, n, k, eps, x.stride(0), r.stride(0), s.stride(0), w.stride(0),
        y.stride(0), HAS_RES=residual is not None, GLU=glu, BLOCK_M=bm, BLOCK_N=cfg.BLOCK_N,
        BLOCK_K=cfg.BLOCK_K, EVEN_K=k % cfg.BLOCK_K == 0, F32_DOT=_INTERPRET, PDL=use_pdl,
        PF_COLS=pdl.prefetch_cols(w), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if use_pdl else {}))
    return y, s
