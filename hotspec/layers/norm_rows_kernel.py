"""An RMSNorm (after the residual add) folded into the projection that reads it, for a narrow
hidden size (K <= NORM_ROWS_MAX_K: SmolLM2's 576, Qwen2.5-0.5B's 896; Qwen's biased qkv too) in
the deterministic mode, where every Linear is the tiled GEMM of layers/rows_kernel.py at every
row count (fused.norm_rows_ok).

Without the fold each pre-norm projection costs a norm kernel of its own: two launches a layer
of a few microseconds for a few KB each, where a small model's phases are launch-bound
(benchmarks/RESULTS.md). Here a program owns 16 rows and BLOCK_N output columns and
reads its rows in BLOCK_K chunks twice: first to add the residual (rounded to the dtype; the
programs of column block 0 store the new stream) and sum the squares, then (from L1/L2) to
normalise and scale each chunk, rounded where fused_kernels._rms_norm_kernel rounds, and multiply
it by the chunk of its weight panel (with glu: the gate and up panels, silu(gate) * up in
rows_kernel's epilogue); a whole row in registers beside two weight panels would spill. The
tile is always 16 rows and the chunks fixed, so a row's norm reduces over one layout at every row
count: a row's bits do not depend on the batch (the deterministic mode rests on it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)
from hotspec.layers.gemv_kernels import mac
from hotspec.layers.rows_kernel import _INTERPRET, _finish, tile_start

NORM_ROWS_MAX_K = 1024  # the widest row the fold reads as one tile
BLOCK_M = 16  # rows a program owns (fixed: the norm's reduction layout must not follow the batch)
BLOCK_N = 32
BLOCK_K = 64  # K is read in chunks: a whole 1,024-wide row and two weight panels spill registers
NUM_STAGES = 1  # software-pipelined chunks (lab/benchmarks/prenorm_bench.py FOLD_TILES tunes these)


@triton.jit
def _stream_chunk(X, R, S, rows, ks, m_ok, K, stride_xm, stride_rm, stride_sm,
                  HAS_RES: tl.constexpr, store, dt: tl.constexpr):
    """Columns ks of the rows' stream, x + residual rounded to the dtype (stored to S when
    `store`), in fp32."""
    ok = m_ok[:, None] & (ks < K)[None, :]
    x = tl.load(X + rows * stride_xm + ks[None, :], mask=ok, other=0.0)
    if HAS_RES:
        r = tl.load(R + rows * stride_rm + ks[None, :], mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
        if store:
            tl.store(S + rows * stride_sm + ks[None, :], x, mask=ok)
    return x.to(tl.float32)


@triton.jit
def _norm_rows_kernel(X, R, G, W, Y, S, B, M, N, K, eps, stride_xm, stride_rm, stride_wn,
                      stride_ym, stride_sm, HAS_RES: tl.constexpr, GLU: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, F32_DOT: tl.constexpr, PDL: tl.constexpr = False,
                      PF_COLS: tl.constexpr = -1):
    pid_m, pid_n, offs_m, offs_n, offs_k, m_ok, n_ok, rows = tile_start(
        W, M, N, K, stride_wn, GLU, BLOCK_M, BLOCK_N, BLOCK_K, PDL, PF_COLS)
    dt = X.dtype.element_ty
    # pass 1: the rows' sum of squares over K, a BLOCK_K chunk at a time (the stream stored once)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xf = _stream_chunk(X, R, S, rows, offs_k + k0, m_ok, K, stride_xm, stride_rm, stride_sm,
                           HAS_RES, pid_n == 0, dt)
        ss += tl.sum(xf * xf, axis=1)
    inv = tl.rsqrt(ss / K + eps)
    # pass 2: each chunk normalised, scaled and multiplied by its weight panel (x from L1/L2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = offs_k + k0
        k_ok = ks < K
        xf = _stream_chunk(X, R, S, rows, ks, m_ok, K, stride_xm, stride_rm, stride_sm, HAS_RES,
                           False, dt)
        normed = (xf * inv[:, None]).to(dt).to(tl.float32)
        g = tl.load(G + ks, mask=k_ok, other=0.0).to(tl.float32)
        h = (g[None, :] * normed).to(dt)
        w_ptr = W + offs_n[:, None] * stride_wn + ks[None, :]
        w_ok = n_ok[:, None] & k_ok[None, :]
        acc = mac(acc, tl.load(w_ptr, mask=w_ok, other=0.0, eviction_policy="evict_first"), h,
                  BLOCK_M, F32_DOT)
        if GLU:
            acc_up = mac(acc_up, tl.load(w_ptr + N * stride_wn, mask=w_ok, other=0.0,
                                         eviction_policy="evict_first"), h, BLOCK_M, F32_DOT)
    _finish(acc, acc_up, B, Y + rows * stride_ym + offs_n[None, :], offs_n, n_ok,
            m_ok[:, None] & n_ok[None, :], dt, GLU, HAS_BIAS)


def folds(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether norm_rows_linear takes x [M, K] (K at most NORM_ROWS_MAX_K, unit strides along K,
    16-bit x and w of one dtype)."""
    return (x.dim() == 2 and x.shape[1] <= NORM_ROWS_MAX_K and x.stride(1) == 1
            and w.stride(1) == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and w.dtype == x.dtype and w.shape[1] == x.shape[1])


def norm_rows_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                     eps: float, w: torch.Tensor, *, glu: bool = False,
                     bias: torch.Tensor | None = None, use_pdl: bool | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) @ w.T (+ bias), x + residual) for x [M, K] (residual None: the norm
    of x, and x); glu: w is [gate | up] and the result silu(gate) * up. Inputs `folds` refuses
    raise ValueError."""
    if not folds(x, w) or (residual is not None and (residual.shape != x.shape
                                                     or residual.stride(1) != 1)):
        raise ValueError(f"norm_rows_linear: x [M, <= {NORM_ROWS_MAX_K}] and w [N, K] of one "
                         f"16-bit dtype, unit stride along K; got {tuple(x.shape)} {x.dtype}, "
                         f"{tuple(w.shape)} {w.dtype}")
    m, k = x.shape
    n = w.shape[0] // 2 if glu else w.shape[0]
    use_pdl = pdl.enabled(x.device) if use_pdl is None else use_pdl
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    s = torch.empty_like(x) if residual is not None else x
    if m == 0:
        return y, s
    r = residual if residual is not None else x
    _norm_rows_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        x, r, norm_weight, w, y, s, bias if bias is not None else w, m, n, k, float(eps),
        x.stride(0), r.stride(0), w.stride(0), y.stride(0), s.stride(0),
        HAS_RES=residual is not None, GLU=glu, HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, F32_DOT=_INTERPRET,
        PDL=use_pdl, PF_COLS=pdl.prefetch_cols(w), num_warps=4, num_stages=NUM_STAGES,
        **({"launch_pdl": True} if use_pdl else {}))
    return y, s
