"""The projections of a few token rows (verify, draft_extend and the tree draft: 2..16 rows)
as Triton tl.dot GEMMs, PDL-chained like decode's GEMVs, and the MLP's silu(gate) * up as the
gate_up projection's epilogue.

    y = x @ W.T                                  [M, N]
    glu: W = [gate | up] (2N rows), y = silu(x @ Wg.T) * (x @ Wu.T)    [M, N]

A program owns the (up to) 16 rows and BLOCK_N output columns and streams its weight panel (with glu:
the gate rows and the up rows of the same columns, two accumulators) in [BLOCK_N, BLOCK_K] tiles;
x's row tiles (a few KB, from L2) feed tl.dot directly. The glu epilogue rounds as
fused_kernels.silu_mul does after a GEMM (gate and up rounded to the dtype, silu rounded, the
product rounded), so it equals gate_up then silu_mul up to the fp32 summation order, and neither
the [M, 2N] gate_up output nor the silu_mul kernel exists.

The RMSNorm before the projection is its own PDL-chained kernel in the engine: the GEMM's loop
must stay loads feeding tl.dot, or its loads stop being pipelined (at the 8B shape a norm
inside the loop measured 2-3x slower: benchmarks/RESULTS.md).

PDL (layers/pdl.py): every launch has the attribute; a program pulls its weight panel into L2 when
the weight fits a third of L2 (pdl.prefetch_cols), signals that the next kernel may launch, then
waits for the kernel before: nothing else is read before the wait.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hotspec.layers import pdl, triton_interpret  # noqa: F401  (triton_interpret: the interpreter fix)
from hotspec.layers.gemv_kernels import GemvConfig, mac

MAX_ROWS = 16  # the most rows one launch handles: one 16-row tile (taller tiles measured slower
# than cuBLAS at the 8B shape's 32 rows)
SMEM_BUDGET = 200 * 1024  # bytes of pipelined x and weight tiles (the H200 has 227 KB a block)
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def choose(n: int, k: int, glu: bool) -> GemvConfig:
    """The tiles for x [rows, k] against n output columns (glu: a weight of 2n rows), as a
    gemv_kernels config (this kernel has no split-K and ignores PIPE), from
    lab/benchmarks/rows_bench.py on the H200: 256-wide K tiles (masked where K is not a
    multiple: SmolLM2's 576 still runs fastest so), 64 columns for a wide single-accumulator
    output and 32 with glu (two accumulators) or a narrow output, 4 stages (3 for the 8B-sized
    glu panel). The pipelined tiles are kept within SMEM_BUDGET."""
    bn = 32 if glu or n <= 2048 else 64
    bk = min(256, triton.next_power_of_2(k))
    stages = 3 if glu and n > 2048 else 4
    while stages * (MAX_ROWS + bn * (2 if glu else 1)) * bk * 2 > SMEM_BUDGET:
        if stages > 2:
            stages -= 1
        else:
            bk //= 2
    return GemvConfig(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=stages)


@triton.jit
def _rows_kernel(X, W, Y, B, M, N, K, stride_xm, stride_wn, stride_ym, GLU: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, F32_DOT: tl.constexpr, HAS_BIAS: tl.constexpr = False,
                 PDL: tl.constexpr = False, PF_COLS: tl.constexpr = -1):
    """Program (n, m): rows [m*BLOCK_M, +BLOCK_M) (masked past M) x output columns
    [n*BLOCK_N, +BLOCK_N). A row's result depends on its own x row and the tiles alone, never on
    M or the other rows (the deterministic mode's batch invariance rests on it)."""
    pid_n = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
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
    w_ptr = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x_ok = m_ok[:, None]
            w_ok = n_ok[:, None]
        else:
            k_ok = (k + offs_k) < K
            x_ok = m_ok[:, None] & k_ok[None, :]
            w_ok = n_ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + k, mask=x_ok, other=0.0)
        w = tl.load(w_ptr + k, mask=w_ok, other=0.0, eviction_policy="evict_first")
        acc = mac(acc, w, x, BLOCK_M, F32_DOT)
        if GLU:
            w_up = tl.load(w_ptr + k + N * stride_wn, mask=w_ok, other=0.0,
                           eviction_policy="evict_first")
            acc_up = mac(acc_up, w_up, x, BLOCK_M, F32_DOT)
    dt = X.dtype.element_ty
    if HAS_BIAS:  # added in fp32 before the one rounding
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dt)
    if GLU:  # silu(gate) * up, rounded as fused_kernels._silu_mul_kernel rounds
        gate = y.to(tl.float32)
        up = acc_up.to(dt).to(tl.float32)
        y = ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt)
    tl.store(Y + rows * stride_ym + offs_n[None, :], y, mask=m_ok[:, None] & n_ok[None, :])


def _check(x: torch.Tensor, w: torch.Tensor, glu: bool, what: str) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{what}: x [M, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or w.dtype != x.dtype:
        raise ValueError(f"{what}: bf16/fp16/fp32 x and w of one dtype only")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{what}: unit stride along K")
    if glu and w.shape[0] % 2:
        raise ValueError(f"{what}: a [gate | up] weight has an even row count, got {w.shape[0]}")


def rows_linear(x: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None, *,
                glu: bool = False, bias: torch.Tensor | None = None,
                use_pdl: bool | None = None, block_m: int = MAX_ROWS) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) in MAX_ROWS-row tiles; glu: w is [gate | up] [2N, K] and the
    result is silu(x @ gate.T) * (x @ up.T) [M, N]. bf16/fp16 (fp32 through fp32 dots), unit
    stride along K; anything else raises ValueError (callers take F.linear). The engine's fast
    path sends it 2..MAX_ROWS rows; the deterministic mode every row count (layers/linear.py).
    block_m: rows a tile holds (a power of two >= 16; the benchmarks' question is which one the
    deterministic mode should fix)."""
    _check(x, w, glu, "rows_linear")
    if bias is not None and (glu or bias.shape != (w.shape[0],)):
        raise ValueError("rows_linear: a bias of w's row count, without glu")
    m, k = x.shape
    n = w.shape[0] // 2 if glu else w.shape[0]
    cfg = config or choose(n, k, glu)
    use_pdl = pdl.enabled(x.device) if use_pdl is None else use_pdl
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    _rows_kernel[(triton.cdiv(n, cfg.BLOCK_N), triton.cdiv(m, block_m))](
        x, w, y, bias if bias is not None else w, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        GLU=glu, BLOCK_M=block_m, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K,
        EVEN_K=k % cfg.BLOCK_K == 0, F32_DOT=_INTERPRET or x.dtype == torch.float32,
        HAS_BIAS=bias is not None, PDL=use_pdl, PF_COLS=pdl.prefetch_cols(w),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if use_pdl else {}))
    return y
